"""Where the raw RLVR rows of a mixer entry come from: a local file, a directory, the hub, the embedded set.

Every source yields the same thing, `RawRows`: plain dicts holding only the columns the
trainer reads (extra columns such as `output` can be gigabytes and are dropped as early as
each format allows), plus a way to say where row i lives in a file, so error messages can
name the file and line. Row processing in `open_instruct.data.dataset` is therefore identical for
all sources; only reading differs.

Local JSON/JSONL is read with the json module rather than `datasets.load_dataset("json")`:
Arrow's JSON reader infers one type per column and rejects files where `dataset` is a
string in one row and a list in another (both are valid RLVR rows), and its errors name
neither file line nor row. Parquet is read with pyarrow (a `datasets` dependency) so only
the needed columns are ever decoded. Hub datasets go through `datasets.load_dataset`.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from open_instruct.config.data import EMBEDDED_DATASET_NAME
from open_instruct.data.embedded_default import ensure_embedded_dataset
from open_instruct.errors import UserError

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")
# Marker keys a reader puts into a row it could not read fully; row processing reports them.
ROW_ERROR_KEY = "__error__"  # the row is unreadable (invalid JSON, not an object); value = why
ROW_KEYS_KEY = "__keys__"  # a needed key is missing; value = the keys the row did have
_EMBEDDED_SPLITS = {"train": "train", "test": "eval", "eval": "eval", "validation": "eval"}
# How `datasets` says a loaded dataset lacks the split asked for (arrow_reader; builder when streaming).
_MISSING_SPLIT = re.compile(r"^(?:Unknown split|Bad split)\b.*?(\[[^\]]*\])\.?$")


class DatasetError(UserError, ValueError):
    """A dataset or row that cannot be used; the message names the dataset, row and problem."""


@dataclass
class RawRows:
    """Rows of one source, projected to the needed keys, with their location in the source files."""

    rows: list[dict[str, Any]]
    # (first row index, file, line number per row or None for row-numbered formats), ascending
    segments: list[tuple[int, Path, list[int] | None]] = field(default_factory=list)

    def where(self, index: int) -> str:
        """'train.jsonl line 18' / 'test.parquet row 3'; '' for sources without files (the hub)."""
        if not self.segments:
            return ""
        position = bisect.bisect_right([start for start, _, _ in self.segments], index) - 1
        start, path, lines = self.segments[position]
        if lines is not None:
            return f"{path.name} line {lines[index - start]}"
        return f"{path.name} row {index - start}"


class Source:
    """One dataset split. `fingerprint` identifies its content for the cache without tokenizing."""

    name: str
    split: str

    def fingerprint(self) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, keys: Sequence[str] | None) -> RawRows:
        raise NotImplementedError


@dataclass
class LocalFilesSource(Source):
    """One or more local files read in order as one split (a file, a directory split, the embedded set)."""

    name: str
    split: str
    files: list[Path]

    def fingerprint(self) -> dict[str, Any]:
        # Content hash, not just size + mtime: a rewritten file of equal size within the mtime
        # granularity must not hit a stale cache. Hashing is ~1 GB/s, far cheaper than re-tokenizing.
        return {"files": [_file_fingerprint(path) for path in self.files]}

    def read(self, keys: Sequence[str] | None) -> RawRows:
        raw = RawRows(rows=[])
        for path in self.files:
            start = len(raw.rows)
            lines = _read_file(path, keys, raw.rows)
            raw.segments.append((start, path, lines))
        return raw


@dataclass
class HubSource(Source):
    """A dataset on the HF hub (or in the local `datasets` cache), loaded with `datasets.load_dataset`."""

    name: str
    split: str
    splits_flag: str = "--dataset_mixer_list_splits"  # the flag that asked for `split`, named when it is missing
    _dataset: Any = None

    def _load(self):
        if self._dataset is None:
            import datasets

            self._check_reachable()
            try:
                self._dataset = datasets.load_dataset(self.name, split=self.split)
            except Exception as error:  # network, missing split, unknown repo: say which entry failed
                missing = _MISSING_SPLIT.match(str(error))
                if missing:  # the name is right; the split is not
                    raise DatasetError(
                        missing_split_line(self.name, self.split, self.splits_flag, ast.literal_eval(missing[1]))
                    ) from None
                raise DatasetError(
                    f"{self.name} [{self.split}]: could not load it from the HF hub "
                    f"({type(error).__name__}: {error}); "
                    "a local path must exist, hub names look like OWNER/NAME"
                ) from error
        return self._dataset

    def _check_reachable(self) -> None:
        """One request with a timeout: `datasets` retries an unreachable Hub for most of a minute."""
        from open_instruct.data import hub

        if Path(self.name).exists() or hub.offline():
            return  # a local folder; or offline, where `datasets` reads its cache and fails at once without it
        from huggingface_hub import HfApi

        try:
            HfApi().dataset_info(self.name, timeout=hub.HUB_TIMEOUT_S)
        except Exception as error:
            remedy = "connect to the network, or set HF_HUB_OFFLINE=1 to use a cached copy"
            raise DatasetError(hub.failure_line(error, self.name, remedy)) from None

    def fingerprint(self) -> dict[str, Any]:
        # `datasets` fingerprints the loaded table (it changes when the hub revision does).
        dataset = self._load()
        return {"hub": self.name, "split": self.split, "fingerprint": getattr(dataset, "_fingerprint", None)}

    def read(self, keys: Sequence[str] | None) -> RawRows:
        dataset = self._load()
        columns = list(dataset.column_names)
        if keys is not None:  # drop unused (possibly huge) columns before converting to Python
            dataset = dataset.select_columns([key for key in keys if key in columns])
        rows = dataset.to_list()
        _mark_missing(rows, keys, columns)
        return RawRows(rows=rows)


def missing_split_line(name: str, split: str, splits_flag: str, present: Sequence[str]) -> str:
    """The name is right, the split is not: the line says which split, which flag chose it, and what there is."""
    return (
        f"{name} has no split {split!r} (its splits: {', '.join(present) or 'none'}); {splits_flag} asked for it: "
        "name one it has"
    )


def open_source(name: str, split: str, splits_flag: str = "--dataset_mixer_list_splits") -> Source:
    """Resolve a mixer NAME: the embedded set, a local file or directory, else a hub dataset. `splits_flag`
    (--dataset_mixer_list_splits or --dataset_mixer_eval_list_splits) asked for `split`: a missing split names it."""
    if name == EMBEDDED_DATASET_NAME:
        if split not in _EMBEDDED_SPLITS:
            raise DatasetError(
                missing_split_line(name, split, splits_flag, list(_EMBEDDED_SPLITS))
                + " (test/eval/validation are the same eval rows)"
            )
        return LocalFilesSource(name, split, [ensure_embedded_dataset() / f"{_EMBEDDED_SPLITS[split]}.jsonl"])
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix not in SUPPORTED_SUFFIXES:
            raise DatasetError(f"{name}: unsupported file type {path.suffix!r}; use .jsonl, .json or .parquet")
        # A file holds a single split; the split value only labels it in reports and prompt ids.
        return LocalFilesSource(name, split, [path])
    if path.is_dir():
        return LocalFilesSource(name, split, split_files(path, split, splits_flag))
    if _looks_local(name):
        raise DatasetError(f"{name}: no such file or directory")
    return HubSource(name, split, splits_flag)


def split_files(directory: Path, split: str, splits_flag: str = "--dataset_mixer_list_splits") -> list[Path]:
    """Files of `split` in a directory: SPLIT.ext, SPLIT-*.ext, and the same under data/ (hub layout)."""
    found: set[Path] = set()
    for folder in (directory, directory / "data"):
        for suffix in SUPPORTED_SUFFIXES:
            found.update(folder.glob(f"{split}{suffix}"))
            found.update(folder.glob(f"{split}-*{suffix}"))
    if not found:
        present = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.suffix in SUPPORTED_SUFFIXES)
        raise DatasetError(
            f"{directory} has no files for split {split!r}; {splits_flag} asked for it (looked for "
            f"{split}.jsonl/.json/.parquet and {split}-*.<ext>, also under data/); data files here: "
            f"{', '.join(present) or 'none'}"
        )
    return sorted(found)


def _looks_local(name: str) -> bool:
    # Hub names are NAME or OWNER/NAME; anything else is a path the user expected to exist.
    return name.startswith(("/", ".", "~")) or name.endswith(SUPPORTED_SUFFIXES) or name.count("/") > 1


def _file_fingerprint(path: Path) -> dict[str, Any]:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return {"path": str(path.resolve()), "size": path.stat().st_size, "blake2b": digest.hexdigest()}


def _read_file(path: Path, keys: Sequence[str] | None, out: list[dict]) -> list[int] | None:
    """Append the projected rows of one file to `out`; returns per-row line numbers for line formats."""
    if path.suffix == ".jsonl":
        return _read_json_lines(path, keys, out)
    if path.suffix == ".json":
        text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            if error.msg == "Extra data":  # JSON lines under a .json name (the HF json loader accepts it)
                return _read_json_lines(path, keys, out)
            raise DatasetError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DatasetError(
                f'{path}: expected a JSON list of rows (or {{"data": [rows]}}), got {type(data).__name__}'
            )
        out.extend(_project(row, keys) for row in data)
        return None
    import pyarrow.parquet as pq

    try:
        columns = pq.read_schema(path).names
        present = None if keys is None else [key for key in keys if key in columns]
        rows = pq.read_table(path, columns=present).to_pylist()
    except Exception as error:  # a truncated or non-parquet file: name it
        raise DatasetError(f"{path}: could not read parquet ({type(error).__name__}: {error})") from error
    _mark_missing(rows, keys, columns)
    out.extend(rows)
    return None


def _read_json_lines(path: Path, keys: Sequence[str] | None, out: list[dict]) -> list[int]:
    lines = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            lines.append(number)
            try:
                out.append(_project(json.loads(line), keys))
            except json.JSONDecodeError as error:
                # Kept as a row so it has an index: strict mode names it, skip mode counts it.
                out.append({ROW_ERROR_KEY: f"not valid JSON ({error.msg} at column {error.colno})"})
    return lines


def _project(row: Any, keys: Sequence[str] | None) -> dict[str, Any]:
    """Only the needed keys (drops huge `output` columns early); records what was there if one is missing."""
    if not isinstance(row, dict):
        return {ROW_ERROR_KEY: f"the row is a JSON {type(row).__name__}, expected an object"}
    if keys is None:  # every column
        return row
    projected = {key: row[key] for key in keys if key in row}
    if len(projected) < len(keys):
        projected[ROW_KEYS_KEY] = sorted(row)
    return projected


def _mark_missing(rows: list[dict], keys: Sequence[str] | None, columns: Sequence[str]) -> None:
    if keys is not None and any(key not in columns for key in keys):
        for row in rows:
            row[ROW_KEYS_KEY] = sorted(columns)
