"""One call through the reward pool with the judge settings a test gives (the LLM-judge tests, with or
without a real server)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from open_instruct.rewards import RewardSettings
from open_instruct.rewards.scoring import RewardScorer


def score_with(settings: RewardSettings, verifier: str = "general-quality"):
    with RewardScorer(replace(settings, verifier_timeout_s=60), max_workers=1) as scorer:
        outcome = asyncio.run(
            scorer.score("s/0", "Paris.", ["Paris"], [verifier], "stop", 2, query="Capital of France?")
        )
        return outcome, scorer.error_counts
