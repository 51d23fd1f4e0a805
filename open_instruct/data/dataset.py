"""Datasets -> tokenized prompts with their verifier labels, plus a report of what was kept and why.

Rows follow open-instruct's RLVR format: `messages` (the chat; the key is --sft_messages_key),
`ground_truth` (the label; --ground_truths_key) and `dataset` (the verifier name(s), not the
origin). A mixer list `NAME WEIGHT ...` picks rows from each source (see `select_rows`); each
selected row is validated, chat-templated and length-filtered. Nothing is dropped silently:
every skipped or filtered row is counted per source and reason in `DatasetReport`, and in
strict mode (the default) the first malformed row stops the run with a message naming the
dataset, split, row and fix. Validation of all sources runs before any tokenization, so a
bad row in the last dataset fails in seconds, not after tokenizing the others.

Reading sources lives in `open_instruct.data.sources`, per-row rules and tokenization in
`open_instruct.data.rows`, the tokenized-result cache in `open_instruct.data.cache`.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from open_instruct.config.data import EMBEDDED_DATASET_NAME
from open_instruct.data import cache as data_cache
from open_instruct.data.rows import (
    ENV_CONFIG_KEY,
    TEMPLATE_ERROR,
    TOOLS_KEY,
    VERIFIER_KEY,
    BadRow,
    RowSettings,
    encode_texts,
    parse_row,
    render_prompt,
    row_tool_schemas,
)
from open_instruct.data.sources import DatasetError, RawRows, Source, open_source
from open_instruct.messages import AgentRequest

__all__ = [
    "DatasetError",
    "DatasetReport",
    "PromptDataset",
    "PromptRow",
    "SourceReport",
    "load_prompt_dataset",
    "mixer_entries",
    "select_rows",
]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptRow:
    """One tokenized prompt ready to become PromptRequests."""

    source: str  # "<dataset name>:<split>"
    index: int  # row index in the original dataset split (before mixing and filtering): a stable id
    prompt_token_ids: tuple[int, ...]
    ground_truths: tuple[Any, ...]  # one label per verifier
    verifier_names: tuple[str, ...]  # as written in the row; the reward side lower-cases and remaps
    copy: int = 0  # k-th repeat of this row when a row count above the dataset size upsamples it
    agent: AgentRequest | None = None  # tools it may call, environments it plays in (multi-turn rows)

    @property
    def prompt_id(self) -> str:
        """Stable across runs and restarts: source name + split + original row index (+ repeat)."""
        return f"{self.source}:{self.index}" + (f"~{self.copy}" if self.copy else "")


@dataclass(frozen=True)
class SourceReport:
    """What happened to one mixer entry; selected == prompts + too_long + sum(malformed)."""

    name: str
    split: str
    weight: str
    rows_read: int
    rows_selected: int
    prompts: int
    too_long: int  # prompts over --max_prompt_token_length, dropped
    malformed: dict[str, int]  # reason -> rows skipped (only with --dataset_skip_bad_rows)
    malformed_examples: dict[str, str]  # reason -> the first such row's full message, to inspect
    longest_prompt: int  # tokens, among kept prompts
    cache: Literal["hit", "miss", "off"]
    cache_note: str = ""  # the entry path, or why nothing was written

    def line(self) -> str:
        parts = [
            f"{self.name} [{self.split}] weight {self.weight}: "
            f"read {self.rows_read}, selected {self.rows_selected}"
            + (" (upsampled)" if self.rows_selected > self.rows_read else ""),
            f"kept {self.prompts} (longest {self.longest_prompt} tokens)",
            f"too long {self.too_long}",
        ]
        if self.malformed:
            detail = ", ".join(f"{reason} {count}" for reason, count in sorted(self.malformed.items()))
            parts.append(f"skipped malformed {sum(self.malformed.values())} ({detail})")
        parts.append(f"cache {self.cache}" + (f" ({self.cache_note})" if self.cache_note else ""))
        return "; ".join(parts)


@dataclass(frozen=True)
class DatasetReport:
    which: str  # "train" or "eval"
    sources: tuple[SourceReport, ...]
    mix_key: str | None = None  # what --dataset_config_hash (or _eval_hash) takes to reuse this exact mix

    @property
    def total_prompts(self) -> int:
        return sum(s.prompts for s in self.sources)

    def summary(self) -> str:
        lines = [f"{self.which} prompts: {self.total_prompts} from {len(self.sources)} source(s)"]
        if self.mix_key:
            flag = "--dataset_config_hash" if self.which == "train" else "--dataset_config_eval_hash"
            lines[0] += f"; cache key {self.mix_key} ({flag} reuses it)"
        for source in self.sources:
            lines.append("  " + source.line())
            lines += [f"    e.g. {message}" for message in source.malformed_examples.values()]
        return "\n".join(lines)


@dataclass(frozen=True)
class PromptDataset:
    prompts: list[PromptRow]
    report: DatasetReport

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass(frozen=True)
class MixEntry:
    name: str
    split: str
    weight: str  # as given on the command line
    splits_flag: str = "--dataset_mixer_list_splits"  # the flag that chose `split`

    @property
    def label(self) -> str:
        return f"{self.name} [{self.split}]"


# ----------------------------------------------------------------------------- mixer


def mixer_entries(data_cfg, which: Literal["train", "eval"]) -> list[MixEntry]:
    """NAME WEIGHT pairs with their splits. An empty training mix means the embedded dataset."""
    if which == "train":
        mix, splits, flag = (
            data_cfg.dataset_mixer_list,
            data_cfg.dataset_mixer_list_splits,
            "--dataset_mixer_list",
        )
        mix = mix or [EMBEDDED_DATASET_NAME, "1.0"]
    else:
        mix, splits = data_cfg.dataset_mixer_eval_list, data_cfg.dataset_mixer_eval_list_splits
        flag = "--dataset_mixer_eval_list"
    if len(mix) % 2:
        raise DatasetError(f"{flag} takes NAME WEIGHT pairs; got an odd number of values: {' '.join(mix)}")
    names, weights = mix[::2], mix[1::2]
    if len(splits) == 1:
        splits = splits * len(names)
    elif len(splits) != len(names):
        raise DatasetError(
            f"{flag}_splits has {len(splits)} values for {len(names)} datasets in {flag}; "
            "give one split for all datasets or one per dataset"
        )
    entries = [MixEntry(n, s, w, f"{flag}_splits") for n, s, w in zip(names, splits, weights)]
    repeated = [label for label, count in Counter(e.label for e in entries).items() if count > 1]
    if repeated:  # the same rows twice would share prompt ids; a weight expresses the intent
        raise DatasetError(f"{flag}: {', '.join(repeated)} listed twice; give one entry with the combined weight")
    return entries


def parse_weight(entry: MixEntry) -> float:
    try:
        value = float(entry.weight)
    except ValueError:
        raise DatasetError(f"{entry.label}: weight {entry.weight!r} must be a fraction or a row count") from None
    if value <= 0:
        raise DatasetError(f"{entry.label}: weight {entry.weight} must be > 0")
    if value > 1 and not value.is_integer():
        raise DatasetError(f"{entry.label}: weight {entry.weight} > 1 means a row count and must be a whole number")
    return value


def target_rows(entry: MixEntry, available: int) -> int:
    """WEIGHT <= 1: that fraction of the rows (floor, at least 1); > 1: exactly that many rows."""
    value = parse_weight(entry)
    return max(1, int(value * available)) if value <= 1 else int(value)


def select_rows(available: int, target: int, seed: int, label: str) -> list[tuple[int, int]]:
    """(row index, repeat) pairs; deterministic in (seed, label).

    As open-instruct does: a count above the dataset size repeats the whole dataset
    target // available times (repeat k = k-th pass) and fills the rest with a random subset
    without replacement; a smaller count is that random subset alone. Subsets keep the
    original row order (shuffling is the data loader's job).
    """
    full, extra = divmod(target, available)
    chosen = [(index, repeat) for repeat in range(full) for index in range(available)]
    if extra:
        rng = random.Random(f"{seed}|{label}")  # str seeds hash with sha512: stable across processes
        chosen += [(index, full) for index in sorted(rng.sample(range(available), extra))]
    return chosen


# ----------------------------------------------------------------------------- one source


@dataclass
class _Pending:
    """A source that missed the cache: validated, waiting to be tokenized."""

    entry: MixEntry
    cache_path: Any
    rows_read: int
    selection: list[tuple[int, int]]
    parsed: dict[int, tuple[list[dict], list[Any], list[str], AgentRequest | None]]
    bad: dict[int, tuple[str, str]] = field(default_factory=dict)  # row index -> (reason, message)


def _validate(entry: MixEntry, raw: RawRows, settings: RowSettings, seed: int, cache_path) -> _Pending:
    if not raw.rows:
        raise DatasetError(f"{entry.label}: the dataset has no rows")
    selection = select_rows(len(raw.rows), target_rows(entry, len(raw.rows)), seed, entry.label)
    pending = _Pending(entry, cache_path, len(raw.rows), selection, parsed={})
    for index in sorted({index for index, _ in selection}):
        try:
            pending.parsed[index] = parse_row(raw.rows[index], settings)
        except BadRow as bad:
            _record_bad(pending, index, bad, raw.where(index), settings.dataset_skip_bad_rows)
    return pending


def _record_bad(pending: _Pending, index: int, bad: BadRow, where: str, skip: bool) -> None:
    location = f" ({where})" if where else ""
    message = f"{pending.entry.label} row {index}{location}: {bad.message}"
    if not skip:
        raise DatasetError(message + bad.hint)
    pending.bad[index] = (bad.reason, message)


def _tokenize(pending: _Pending, tokenizer, settings: RowSettings) -> tuple[list[dict], SourceReport]:
    texts: dict[int, str] = {}
    for index in sorted(pending.parsed):  # render row by row so a template error names its row
        try:
            messages, _, _, agent = pending.parsed[index]
            tools = row_tool_schemas(agent, settings) if settings.pass_tools_to_chat_template else None
            texts[index] = render_prompt(tokenizer, messages, tools)
        except Exception as error:
            bad = BadRow(TEMPLATE_ERROR, f"the chat template failed ({type(error).__name__}: {error})")
            _record_bad(pending, index, bad, "", settings.dataset_skip_bad_rows)
    tokenized = dict(zip(texts, encode_texts(tokenizer, list(texts.values()), settings.add_bos)))
    records, too_long, shortest_too_long, malformed, examples = [], 0, None, Counter(), {}
    for index, repeat in pending.selection:
        if index in pending.bad:
            reason, message = pending.bad[index]
            malformed[reason] += 1
            examples.setdefault(reason, message)
            continue
        ids = tokenized[index]
        if len(ids) > settings.max_prompt_token_length:
            too_long += 1
            shortest_too_long = min(len(ids), shortest_too_long or len(ids))
            continue
        _, truths, verifiers, agent = pending.parsed[index]
        records.append(
            {
                "index": index,
                "copy": repeat,
                "prompt_token_ids": tuple(ids),
                "ground_truths": tuple(truths),
                "verifier_names": tuple(verifiers),
                "agent": agent,
            }
        )
    label = pending.entry.label
    if not records:
        if too_long:
            raise DatasetError(
                f"{label}: all {too_long} usable selected prompts are longer than --max_prompt_token_length "
                f"{settings.max_prompt_token_length} tokens (shortest: {shortest_too_long}); raise the limit"
                + (f" ({sum(malformed.values())} more rows were malformed)" if malformed else "")
            )
        raise DatasetError(
            f"{label}: every selected row is malformed ({dict(malformed)}); e.g. {next(iter(examples.values()))}"
        )
    report = SourceReport(
        name=pending.entry.name,
        split=pending.entry.split,
        weight=pending.entry.weight,
        rows_read=pending.rows_read,
        rows_selected=len(pending.selection),
        prompts=len(records),
        too_long=too_long,
        malformed=dict(malformed),
        malformed_examples=examples,
        longest_prompt=max(len(r["prompt_token_ids"]) for r in records),
        cache="miss",
    )
    return records, report


def _to_prompts(entry: MixEntry, records: list[dict]) -> list[PromptRow]:
    source = f"{entry.name}:{entry.split}"
    return [PromptRow(source=source, **record) for record in records]


# ----------------------------------------------------------------------------- public API


def load_prompt_dataset(
    data_cfg,
    model_cfg,
    tokenizer,
    which: Literal["train", "eval"],
    verifier_remap: dict[str, str] | None = None,
    *,
    seed: int = 1,
    tools_cfg=None,
    forced_cache_key: str | None = None,
) -> PromptDataset:
    """Load, mix, validate, tokenize (or read from cache) and length-filter the train or eval mix.

    `tokenizer` must already carry the chat template (models.load_tokenizer installs it).
    `verifier_remap` is RewardConfig.verifier_remap ({old: new}); `seed` is --seed (row selection); `tools_cfg`
    (the tools flag group) says which tools rows may name and whether their schemas go into the prompt.
    An empty eval mix gives an empty dataset (nothing is read); an empty train mix means the embedded dataset.
    `forced_cache_key` (--dataset_config_hash): reload the cache entries of the mix recorded under that
    key as they are; no source is read. Raises DatasetError naming the dataset, row and fix for anything
    unusable.
    """
    if forced_cache_key:
        return _forced_mix(data_cfg.dataset_local_cache_dir, forced_cache_key, which)
    settings = _row_settings(data_cfg, model_cfg, tokenizer, verifier_remap, tools_cfg)
    identity = data_cache.tokenizer_identity(tokenizer)
    keys = (settings.sft_messages_key, settings.ground_truths_key, VERIFIER_KEY, TOOLS_KEY, ENV_CONFIG_KEY)
    results: list[tuple[MixEntry, list[dict], SourceReport] | _Pending] = []
    entry_dirs: list[tuple[str, str, str, Path]] = []
    # Phase 1: every source is read and validated (or found in the cache) before anything is tokenized.
    for entry in mixer_entries(data_cfg, which):
        source: Source = open_source(entry.name, entry.split, entry.splits_flag)
        path = None
        if data_cfg.dataset_local_cache_dir:  # "" disables the cache
            cache_inputs = {
                "transform": asdict(settings),
                "tokenizer": identity,
                "chat_template_name": model_cfg.chat_template_name,
            }
            path, cached = _cached(data_cfg.dataset_local_cache_dir, entry, source, seed, cache_inputs)
            entry_dirs.append((entry.name, entry.split, entry.weight, path))
            if cached is not None:
                results.append(cached)
                continue
        results.append(_validate(entry, source.read(keys), settings, seed, path))
    # Phase 2: tokenize what missed the cache, store it.
    prompts: list[PromptRow] = []
    reports: list[SourceReport] = []
    for result in results:
        entry, records, report = _tokenized(result, tokenizer, settings) if isinstance(result, _Pending) else result
        prompts += _to_prompts(entry, records)
        reports.append(report)
    stored = all(r.cache != "off" and os.path.isdir(r.cache_note) for r in reports)
    mix_key = data_cache.store_mix(data_cfg.dataset_local_cache_dir, entry_dirs) if entry_dirs and stored else None
    return PromptDataset(prompts, DatasetReport(which=which, sources=tuple(reports), mix_key=mix_key))


def _forced_mix(cache_dir: str, key: str, which: str) -> PromptDataset:
    flag = "--dataset_config_hash" if which == "train" else "--dataset_config_eval_hash"
    entries = data_cache.load_mix(cache_dir, key)
    if entries is None:
        raise DatasetError(
            f"{flag} {key}: no cached {which} mix with that key in {cache_dir}; run once without it (the data "
            "report prints the key) or drop it"
        )
    prompts, reports = [], []
    for name, split, weight, path in entries:
        cached = data_cache.load_entry(path)
        if cached is None:
            raise DatasetError(f"{flag} {key}: its cache entry {path} is missing or unreadable; drop {flag}")
        records, stored = cached
        entry = MixEntry(name, split, weight)
        prompts += _to_prompts(entry, records)
        reports.append(SourceReport(**{**stored, "cache": "hit", "cache_note": str(path)}))
    return PromptDataset(prompts, DatasetReport(which=which, sources=tuple(reports), mix_key=key))


def _row_settings(data_cfg, model_cfg, tokenizer, verifier_remap: dict[str, str] | None, tools_cfg) -> RowSettings:
    from open_instruct.agents.settings import tool_specs
    from open_instruct.agents.tools import make_tool
    from open_instruct.config.tools import ToolsConfig
    from open_instruct.extensions import registered_environments, registered_tools, verifier_key
    from open_instruct.rewards import available_verifiers

    tools_cfg = tools_cfg or ToolsConfig()
    specs = tool_specs(tools_cfg)
    tools, environments = registered_tools(), registered_environments()
    schemas = tuple((s.call_name, make_tool(s).definition.to_json()) for s in specs if s.kind in tools)

    known = tuple(available_verifiers())
    remap = tuple(sorted((verifier_key(k), verifier_key(v)) for k, v in (verifier_remap or {}).items()))
    for old, new in remap:
        if new not in known:
            raise DatasetError(f"--remap_verifier {old}={new}: {new!r} is not a known verifier ({', '.join(known)})")
    if model_cfg.add_bos and tokenizer.bos_token_id is None:
        raise DatasetError("--add_bos was given but the tokenizer has no BOS token; drop --add_bos for this model")
    return RowSettings(
        sft_messages_key=data_cfg.sft_messages_key,
        ground_truths_key=data_cfg.ground_truths_key,
        max_prompt_token_length=data_cfg.max_prompt_token_length,
        dataset_skip_bad_rows=data_cfg.dataset_skip_bad_rows,
        add_bos=model_cfg.add_bos,
        system_prompt_override=data_cfg.system_prompt_override,
        remap=remap,
        known_verifiers=known,
        tool_names=tuple(s.call_name for s in specs),
        known_environments=tuple(environments),
        tool_schemas=schemas,
        tools_environments=tuple(dict.fromkeys(s.kind for s in specs if s.kind in environments)),
        pass_tools_to_chat_template=tools_cfg.pass_tools_to_chat_template,
    )


def _cached(cache_dir: str, entry: MixEntry, source: Source, seed: int, settings: dict):
    """(cache path, (entry, records, report) on a hit or None) for one mix entry."""
    key = data_cache.cache_key(
        {
            "source": source.fingerprint(),
            "name": entry.name,
            "split": entry.split,
            "weight": repr(parse_weight(entry)),
            "seed": seed,
            **settings,
        }
    )
    path = data_cache.entry_path(cache_dir, entry.label, key)
    cached = data_cache.load_entry(path)
    if cached is None:
        return path, None
    records, stored = cached
    return path, (entry, records, SourceReport(**{**stored, "cache": "hit", "cache_note": str(path)}))


def _tokenized(pending: _Pending, tokenizer, settings: RowSettings) -> tuple[MixEntry, list[dict], SourceReport]:
    """Tokenize a validated source and store the result in the cache (when it is on)."""
    records, report = _tokenize(pending, tokenizer, settings)
    if pending.cache_path is None:
        return pending.entry, records, SourceReport(**{**asdict(report), "cache": "off"})
    failure = data_cache.store_entry(pending.cache_path, records, asdict(report))
    if failure:
        logger.warning("could not cache %s: %s", pending.entry.label, failure)
    return pending.entry, records, SourceReport(**{**asdict(report), "cache_note": failure or str(pending.cache_path)})


def data_inputs(cfg):
    """(model, train data, eval data) configs as the data loader sees them: --system_prompt_override_file read
    into the system prompt, --dataset_skip_cache as a disabled cache. The eval data is None when nothing is
    evaluated (`Config.eval_data`)."""
    train, evaluation = cfg.train_data, cfg.eval_data
    if cfg.data.system_prompt_override_file:
        with open(cfg.data.system_prompt_override_file) as f:
            system_prompt = f.read().strip()
        train, evaluation = (d and replace(d, system_prompt_override=system_prompt) for d in (train, evaluation))
    if cfg.data.dataset_skip_cache:
        train, evaluation = (d and replace(d, dataset_local_cache_dir="") for d in (train, evaluation))
    return cfg.model, train, evaluation


def load_split(cfg, tokenizer, split: str) -> PromptDataset:
    """The "train" or "eval" prompts of a run's configuration, as the run loads them; no eval prompts, and
    nothing read, when the run evaluates nothing."""
    model_cfg, train_data, eval_data = data_inputs(cfg)
    if split == "eval" and eval_data is None:
        return PromptDataset([], DatasetReport(which="eval", sources=()))
    data_cfg, cache_key = (
        (train_data, cfg.data.dataset_config_hash)
        if split == "train"
        else (eval_data, cfg.data.dataset_config_eval_hash)
    )
    return load_prompt_dataset(
        data_cfg,
        model_cfg,
        tokenizer,
        split,
        cfg.reward.verifier_remap,
        seed=cfg.run.seed,
        tools_cfg=cfg.tools,
        forced_cache_key=cache_key,
    )
