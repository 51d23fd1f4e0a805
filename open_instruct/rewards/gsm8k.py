"""`gsm8k` verifier: the last number in the response must equal the gold number as a string.

Mirrors open-instruct (post #1530): commas between digits are removed, the **last** optionally
signed integer or decimal anywhere in the output is taken (think block included), and compared
with the gold after lower-casing. Being a string comparison, `7.50` != `7.5` and `18.00` != `18`;
units, `$` and `%` around the number do not matter because only the number is extracted.
Small deliberate differences: a leading `+` is dropped, the gold is stripped and has its own
thousands commas removed, a 1-element list gold is unwrapped, and an empty extraction scores 0.
"""

from __future__ import annotations

import re
from typing import Any

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult

_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
_NUMBER = re.compile(r"[-+]?\d*\.\d+|[-+]?\d+")


def _strip_commas(text: str) -> str:
    return _DIGIT_COMMA.sub("", text)


def extract_last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(_strip_commas(text))
    if not numbers:
        return None
    return numbers[-1].removeprefix("+")


def _gold_text(ground_truth: Any) -> str:
    if isinstance(ground_truth, (list, tuple)):
        if len(ground_truth) != 1:
            raise ValueError(f"gsm8k expects one gold answer, got {len(ground_truth)}: {ground_truth!r}")
        ground_truth = ground_truth[0]
    return _strip_commas(str(ground_truth).strip()).removeprefix("+").lower()


@register_verifier("gsm8k")
def gsm8k(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    gold = _gold_text(inp.ground_truth)
    number = extract_last_number(inp.prediction)
    # open-instruct falls back to the whole output when there is no number; this only matters for
    # non-numeric golds, which GSM8K does not have, but keep it for parity.
    extracted = number if number is not None else inp.prediction.strip()
    score = float(bool(extracted) and extracted.lower() == gold)
    return VerifierResult(score=score, extracted=extracted)
