"""`passthrough`: scores 0 whatever the response, for environment-only datasets.

Rows of a multi-turn environment carry `dataset: passthrough`; their reward is the environment's (per
--reward_aggregator), so the verifier must add nothing to it.
"""

from __future__ import annotations

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult


@register_verifier("passthrough")
def passthrough(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    return VerifierResult(0.0)
