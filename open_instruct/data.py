"""Datasets -> tokenized prompts with their verifier labels.

Rows follow open-instruct's RLVR format: `messages` (chat), `ground_truth` (label) and
`dataset` (verifier name). NAME in a mixer list may be a hub dataset, a local
JSON/JSONL/parquet file, a directory of them, or the embedded default.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from open_instruct.embedded_default import EMBEDDED_DATASET_NAME, ensure_embedded_dataset

logger = logging.getLogger(__name__)


class DatasetError(ValueError):
    """A dataset or row that cannot be used; names the dataset, row and problem."""


@dataclass(frozen=True)
class PromptRow:
    """One tokenized prompt ready to become PromptRequests."""

    source: str  # dataset name and split
    index: int  # row index within that source
    prompt_token_ids: tuple[int, ...]
    ground_truths: tuple[Any, ...]
    verifier_names: tuple[str, ...]


def load_rows(name: str, split: str) -> list[dict]:
    """Raw rows of one dataset split."""
    if name == EMBEDDED_DATASET_NAME:
        return _read_json_lines(ensure_embedded_dataset() / f"{'eval' if split in ('test', 'eval') else 'train'}.jsonl")
    path = Path(name)
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet"))
        split_files = [p for p in files if p.stem == split or p.stem.startswith(f"{split}-")]
        if not split_files:
            raise DatasetError(f"{name}: no {split}.jsonl/.json/.parquet file in the directory")
        return [row for p in split_files for row in _read_file(p)]
    import datasets

    return list(datasets.load_dataset(name, split=split))


def _read_file(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return _read_json_lines(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data if isinstance(data, list) else list(data.get("data", []))
    if path.suffix == ".parquet":
        import datasets

        return list(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    raise DatasetError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl, .json or .parquet)")


def _read_json_lines(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for line_number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}:{line_number}: not valid JSON ({e.msg})") from None
    return rows


def tokenize_prompt(tokenizer, messages: list[dict], add_bos: bool) -> list[int]:
    """Chat-template the prompt messages (generation prompt appended) into token ids."""
    if len(messages) > 1 and messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # some sets (ORZ math) carry the gold answer as a last assistant turn
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    if add_bos and tokenizer.bos_token_id is not None and (not ids or ids[0] != tokenizer.bos_token_id):
        ids = [tokenizer.bos_token_id, *ids]
    return ids


def rows_to_prompts(
    rows: list[dict], tokenizer, source: str, *, messages_key: str, ground_truths_key: str, add_bos: bool
) -> list[PromptRow]:
    prompts = []
    for index, row in enumerate(rows):
        verifiers = row["dataset"]
        truths = row[ground_truths_key]
        if isinstance(verifiers, str):
            verifiers, truths = [verifiers], [truths]
        prompts.append(
            PromptRow(
                source=source,
                index=index,
                prompt_token_ids=tuple(tokenize_prompt(tokenizer, row[messages_key], add_bos)),
                ground_truths=tuple(truths),
                verifier_names=tuple(verifiers),
            )
        )
    return prompts
