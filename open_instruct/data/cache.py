"""On-disk cache of tokenized prompts, one entry per mixer source, keyed by everything that shapes them.

Tokenizing a few hundred thousand chat-templated prompts takes minutes; restarts and
sweeps repeat it with identical inputs. The key hashes the source content, the mixer
weight and seed, every transform flag, the verifier registry and the tokenizer's identity
(including its chat template and a few probe encodings), plus CACHE_VERSION, so any change
that could alter a prompt, a label or a skip decision misses. Entries are written to a
temporary directory and renamed, so a killed run never leaves a half-written entry.

Layout: <cache dir>/<readable source slug>-<key>/{prompts.arrow, report.json}. Prompt ids
are Arrow list<int32>; labels are JSON text because their shape varies (str, list, nested).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Bump when row processing changes what a cached entry would contain.
CACHE_VERSION = "1"
# Fixed strings whose encodings fingerprint a tokenizer beyond its name (a retrained vocab keeps the name).
_PROBES = (
    "Hello, world!",
    " 12345 + 678 = ?",
    "<think>x</think><answer>y</answer>",
    "naïve café 日本語 🙂",
    "\n\n \t",
)


def tokenizer_identity(tokenizer) -> dict[str, Any]:
    encodings = [list(tokenizer.encode(text, add_special_tokens=False)) for text in _PROBES]
    return {
        "name_or_path": getattr(tokenizer, "name_or_path", None),
        "vocab_size": len(tokenizer),
        "bos_token_id": getattr(tokenizer, "bos_token_id", None),
        "eos_token_id": getattr(tokenizer, "eos_token_id", None),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "probe_encodings": hashlib.blake2b(json.dumps(encodings).encode(), digest_size=16).hexdigest(),
    }


def cache_key(parts: dict[str, Any]) -> str:
    payload = json.dumps({"cache_version": CACHE_VERSION, **parts}, sort_keys=True, default=repr)
    return hashlib.blake2b(payload.encode(), digest_size=12).hexdigest()


def entry_path(cache_dir: str | os.PathLike, label: str, key: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")[-80:]
    return Path(cache_dir) / f"{slug}-{key}"


def agent_to_json(agent) -> str:
    """A row's AgentRequest as one JSON string ("" when the row has none)."""
    if agent is None:
        return ""
    envs = [[env.name, [list(kv) for kv in env.reset_kwargs]] for env in agent.envs]
    return json.dumps({"tools": list(agent.tools), "envs": envs, "max_steps": agent.max_steps})


def agent_from_json(text: str):
    from open_instruct.messages import AgentRequest, EnvSpec

    if not text:
        return None
    raw = json.loads(text)
    envs = tuple(EnvSpec(name, tuple((k, v) for k, v in kwargs)) for name, kwargs in raw["envs"])
    return AgentRequest(tools=tuple(raw["tools"]), envs=envs, max_steps=raw["max_steps"])


def load_entry(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """(prompt records, stored report fields), or None when absent or unreadable (then it is rebuilt)."""
    if not (path / "report.json").exists():
        return None
    try:
        import pyarrow as pa

        with pa.memory_map(str(path / "prompts.arrow")) as source:
            table = pa.ipc.open_file(source).read_all()
        columns = table.to_pydict()
        records = [
            {
                "index": index,
                "copy": copy,
                "prompt_token_ids": tuple(ids),
                "ground_truths": tuple(json.loads(truths)),
                "verifier_names": tuple(names),
                "agent": agent_from_json(agent),
            }
            for index, copy, ids, truths, names, agent in zip(
                columns["index"],
                columns["copy"],
                columns["prompt_token_ids"],
                columns["ground_truths"],
                columns["verifier_names"],
                columns["agent"],
            )
        ]
        return records, json.loads((path / "report.json").read_text())
    except Exception as error:
        logger.warning("ignoring unreadable dataset cache entry %s (%s: %s)", path, type(error).__name__, error)
        return None


def store_entry(path: Path, records: list[dict[str, Any]], report: dict[str, Any]) -> str | None:
    """Write an entry atomically; returns None, or why it was not written (the run goes on without it)."""
    import pyarrow as pa

    try:
        truths = [json.dumps(list(r["ground_truths"])) for r in records]
    except TypeError as error:  # labels that are not JSON (exotic parquet types): skip caching, not training
        return f"labels are not JSON-serializable ({error})"
    table = pa.table(
        {
            "index": pa.array([r["index"] for r in records], pa.int64()),
            "copy": pa.array([r["copy"] for r in records], pa.int32()),
            "prompt_token_ids": pa.array([list(r["prompt_token_ids"]) for r in records], pa.list_(pa.int32())),
            "ground_truths": pa.array(truths, pa.string()),
            "verifier_names": pa.array([list(r["verifier_names"]) for r in records], pa.list_(pa.string())),
            "agent": pa.array([agent_to_json(r.get("agent")) for r in records], pa.string()),
        }
    )
    staging = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
        with (
            pa.OSFile(str(staging / "prompts.arrow"), "wb") as sink,
            pa.ipc.new_file(sink, table.schema) as writer,
        ):
            writer.write_table(table)
        (staging / "report.json").write_text(json.dumps(report, indent=1))
        os.rename(staging, path)
    except OSError as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if path.exists():  # another process wrote the same entry first; theirs is identical
            return None
        return f"{type(error).__name__}: {error}"
    return None


def store_mix(cache_dir: str | os.PathLike, entries: list[tuple[str, str, str, Path]]) -> str | None:
    """Record which entries (name, split, weight, entry dir) make up one mix; returns the mix's key.

    `--dataset_config_hash <key>` then reloads exactly these entries without reading any source or
    tokenizer (open-instruct's forced cache key). None when the record cannot be written."""
    rows = [{"name": n, "split": s, "weight": w, "entry": p.name} for n, s, w, p in entries]
    key = cache_key({"mix": rows})
    path = Path(cache_dir) / f"mix-{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Per process: two runs recording the same mix at once must not rename each other's file away.
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(rows, indent=1))
        staging.replace(path)
    except OSError as error:
        logger.warning("could not record the dataset mix %s: %s", path, error)
        return None
    return key


def load_mix(cache_dir: str | os.PathLike, key: str) -> list[tuple[str, str, str, Path]] | None:
    """The entries `store_mix` recorded under `key`, or None when there is no such record."""
    path = Path(cache_dir) / f"mix-{key}.json"
    if not path.exists():
        return None
    return [(r["name"], r["split"], r["weight"], Path(cache_dir) / r["entry"]) for r in json.loads(path.read_text())]
