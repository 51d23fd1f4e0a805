"""One RLVR row -> prompt messages, labels and verifier names; then chat template and tokens.

Split out of `open_instruct.data` so the per-row rules read in one place. `parse_row`
applies open-instruct's semantics (string `dataset` wraps both columns into one-element
lists; list `dataset` needs as many labels; a trailing assistant turn is dropped when
there is more than one message; --system_prompt_override replaces or inserts the system
message) and validates every verifier name against the registry (after --remap_verifier,
case-insensitively), so an unknown name fails at load time instead of silently scoring 0.
Problems raise `BadRow` with a reason (counted in the report) and a message.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from open_instruct.data_sources import ROW_ERROR_KEY, ROW_KEYS_KEY

VERIFIER_KEY = "dataset"  # fixed by the RLVR format: the verifier name(s) of the row
# Malformed-row reasons; the report counts skipped rows per reason.
UNREADABLE = "unreadable row"
MISSING_KEY = "missing key"
WRONG_TYPE = "wrong type"
EMPTY_MESSAGES = "empty messages"
BAD_MESSAGE = "bad message"
UNKNOWN_VERIFIER = "unknown verifier"
LENGTH_MISMATCH = "label/verifier length mismatch"
TEMPLATE_ERROR = "chat template error"
SKIP_HINT = "; fix the row or pass --dataset_skip_bad_rows to skip (and count) such rows"
ENCODE_BATCH = 512


@dataclass(frozen=True)
class RowSettings:
    """Every setting that shapes a prompt or a skip decision; all of it goes into the cache key."""

    messages_key: str
    ground_truths_key: str
    max_prompt_token_length: int
    skip_bad_rows: bool
    add_bos: bool
    system_prompt: str | None
    remap: tuple[tuple[str, str], ...]
    known_verifiers: tuple[str, ...]


class BadRow(Exception):
    def __init__(self, reason: str, message: str, hint: str = SKIP_HINT):
        super().__init__(message)
        self.reason, self.message, self.hint = reason, message, hint


def parse_row(row: dict[str, Any], t: RowSettings) -> tuple[list[dict], list[Any], list[str]]:
    """(prompt messages, labels, verifier names) of a valid row; raises BadRow naming the problem."""
    if ROW_ERROR_KEY in row:
        raise BadRow(UNREADABLE, row[ROW_ERROR_KEY])
    for key, flag in ((t.messages_key, "--sft_messages_key"), (t.ground_truths_key, "--ground_truths_key")):
        if key not in row:
            has = ", ".join(row.get(ROW_KEYS_KEY, ()))
            raise BadRow(MISSING_KEY, f"missing key {key!r} (row has: {has}); {flag} names this column")
    if VERIFIER_KEY not in row:
        has = ", ".join(row.get(ROW_KEYS_KEY, ()))
        raise BadRow(MISSING_KEY, f"missing key {VERIFIER_KEY!r}, the verifier name(s) (row has: {has})")
    messages = _check_messages(row[t.messages_key], t.messages_key)
    verifiers, truths = row[VERIFIER_KEY], row[t.ground_truths_key]
    if truths is None:
        raise BadRow(WRONG_TYPE, f"{t.ground_truths_key!r} is null")
    if isinstance(verifiers, str) and verifiers:
        verifiers, truths = [verifiers], [truths]
    elif isinstance(verifiers, list) and verifiers and all(isinstance(v, str) and v for v in verifiers):
        labels = f"{len(truths)} labels" if isinstance(truths, list) else f"a {type(truths).__name__}"
        if not isinstance(truths, list) or len(truths) != len(verifiers):
            raise BadRow(
                LENGTH_MISMATCH,
                f"{VERIFIER_KEY!r} lists {len(verifiers)} verifier(s) "
                f"but {t.ground_truths_key!r} is {labels}; "
                "a list-typed row pairs label i with verifier i",
            )
    else:
        raise BadRow(
            WRONG_TYPE,
            f"{VERIFIER_KEY!r} must be a verifier name or a non-empty list of names, got {verifiers!r}",
        )
    remap = dict(t.remap)
    for name in verifiers:
        resolved = remap.get(name.lower(), name.lower())
        if resolved not in t.known_verifiers:
            via = f" (remapped to {resolved!r} by --remap_verifier)" if resolved != name.lower() else ""
            close = difflib.get_close_matches(resolved, t.known_verifiers, n=1, cutoff=0.3)
            raise BadRow(
                UNKNOWN_VERIFIER,
                f"unknown verifier {name!r}{via} (known: {', '.join(t.known_verifiers)})",
                f"; use --remap_verifier {name}={close[0] if close else 'NEW'} or --dataset_skip_bad_rows",
            )
    if len(messages) > 1 and messages[-1]["role"] == "assistant":
        messages = messages[:-1]  # ORZ-style rows carry the gold answer as a trailing assistant turn
    if t.system_prompt is not None:
        system = {"role": "system", "content": t.system_prompt}
        messages = [system, *messages[1:]] if messages[0]["role"] == "system" else [system, *messages]
    return messages, truths, verifiers


def _check_messages(messages: Any, key: str) -> list[dict]:
    if not isinstance(messages, list):
        raise BadRow(WRONG_TYPE, f"{key!r} must be a list of {{role, content}} messages, got {type(messages).__name__}")
    if not messages:
        raise BadRow(EMPTY_MESSAGES, f"{key!r} is an empty list")
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRow(
                BAD_MESSAGE,
                f"{key!r} message {position} is a {type(message).__name__}, not {{role, content}}",
            )
        for part in ("role", "content"):
            if message.get(part) is None:
                raise BadRow(BAD_MESSAGE, f"{key!r} message {position} has no {part!r}")
            if not isinstance(message[part], str):
                raise BadRow(
                    BAD_MESSAGE,
                    f"{key!r} message {position} {part!r} must be a string, got {type(message[part]).__name__}",
                )
    return messages


def render_prompt(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_texts(tokenizer, texts: list[str], add_bos: bool) -> list[list[int]]:
    """Tokenize rendered prompts in batches, exactly as apply_chat_template(tokenize=True) would."""
    ids: list[list[int]] = []
    for start in range(0, len(texts), ENCODE_BATCH):
        ids += [list(x) for x in tokenizer(texts[start : start + ENCODE_BATCH], add_special_tokens=False)["input_ids"]]
    if add_bos:  # OLMo-style models need BOS and most templates do not emit it
        bos = tokenizer.bos_token_id
        ids = [x if x[:1] == [bos] else [bos, *x] for x in ids]
    return ids
