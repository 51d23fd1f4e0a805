"""Length-shaping verifiers `max_length` and `up_to_max_length`.

Both read the response length from `VerifierInput.response_token_count` (tokens, as generated)
and a target length T: the ground truth when it is a number or a numeric string (a 1-element
list is unwrapped), otherwise `RewardSettings.max_length_target` when the ground truth is
empty/None. A non-numeric, non-empty ground truth is a data error and raises.

With n the response token count:

- `max_length`:       score = max(0, 1 - |n - T| / T)   (1 exactly at the target, 0 at 0 or 2T tokens)
- `up_to_max_length`: score = 1 if n <= T else max(0, 1 - (n - T) / T)   (only overshoot is penalised)

open-instruct divides the deviation by a fixed constant instead (`--max_length_verifier_max_length`,
default 32768, so its scores barely move below a few thousand tokens). Scaling by the target keeps the
score in [0, 1] and comparable across targets; given that flag explicitly, its value is the divisor D
(`RewardSettings.max_length_normalizer`) in place of T, and the score is still clipped at 0 where
open-instruct's goes negative.
"""

from __future__ import annotations

import math
from typing import Any

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult


def target_length(ground_truth: Any, settings: RewardSettings) -> float:
    if isinstance(ground_truth, (list, tuple)) and len(ground_truth) == 1:
        ground_truth = ground_truth[0]
    if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
        target = float(settings.max_length_target)
    elif isinstance(ground_truth, bool):
        raise ValueError(f"length target must be a number, got {ground_truth!r}")
    else:
        try:
            target = float(ground_truth)
        except (TypeError, ValueError):
            raise ValueError(f"length target must be a number, got {ground_truth!r}") from None
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"length target must be a positive finite number, got {target}")
    return target


@register_verifier("max_length")
def max_length(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    target = target_length(inp.ground_truth, settings)
    n = inp.response_token_count
    score = max(0.0, 1.0 - abs(n - target) / (settings.max_length_normalizer or target))
    return VerifierResult(score=score, extracted=str(n), details={"target": target})


@register_verifier("up_to_max_length")
def up_to_max_length(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    target = target_length(inp.ground_truth, settings)
    n = inp.response_token_count
    score = 1.0 if n <= target else max(0.0, 1.0 - (n - target) / (settings.max_length_normalizer or target))
    return VerifierResult(score=score, extracted=str(n), details={"target": target})
