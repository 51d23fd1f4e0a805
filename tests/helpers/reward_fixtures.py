"""Test-only verifiers for the reward pool tests.

They live in an importable module (not in the test file) because the pool's worker processes
receive verifier functions by reference and must be able to import them: `helpers.reward_fixtures`, with
tests/ on `sys.path` (pytest puts it there for tests/conftest.py), a path the worker processes inherit.
"""

from __future__ import annotations

import os
import time

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult


@register_verifier("test_fixed")
def fixed_score(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    """Scores whatever number the ground truth holds."""
    return VerifierResult(score=float(inp.ground_truth))


@register_verifier("test_raise")
def raising(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    raise RuntimeError(f"boom on {inp.prediction!r}")


@register_verifier("test_sleep")
def sleeping(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    """Ground truth: {"seconds": float, "pid_file": optional path to record the worker's pid, "log_file": optional
    path to append "<pid> <start> <end>" to (monotonic clock, shared by the processes of one machine)}."""
    if inp.ground_truth.get("pid_file"):
        with open(inp.ground_truth["pid_file"], "w") as f:
            f.write(str(os.getpid()))
    started = time.monotonic()
    time.sleep(inp.ground_truth["seconds"])
    if inp.ground_truth.get("log_file"):
        with open(inp.ground_truth["log_file"], "a") as f:
            f.write(f"{os.getpid()} {started} {time.monotonic()}\n")
    return VerifierResult(score=1.0)


@register_verifier("test_bad_score")
def bad_score(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    return VerifierResult(score=float(inp.ground_truth))  # e.g. "nan" or "2.0"


@register_verifier("test_crash")
def crashing(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    os._exit(3)  # a worker dying mid-call, like a segfault or an OOM kill
