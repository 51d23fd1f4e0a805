"""Repeated, interleaved benchmark runs and what a reader may conclude from them: medians with their spread.

One run per mode measures the machine's mood as much as the mode (on a shared 2-core machine three
streaming modes that did identical work once differed by 24%). So every mode runs in every round, in
the same order (A B C A B C ...: slow drifts of the machine hit every mode alike), and a mode is
reported by its median over the rounds with the min-max spread. A ratio of two modes is computed per
round (the two ran minutes apart) and reported the same way, never without its spread.

Pure functions on the per-run result dicts of `e2e_runs.run_mode`; tested on CPU without the stack.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence

# The per-run numbers summarized as median [min-max] across rounds.
SPREAD_KEYS = (
    "trained_samples_per_s",
    "generated_tokens_per_s",
    "generation_idle_frac",
    "learner_wait_frac",
    "weight_sync_pause_s_avg",
    "version_lag_avg",
    "version_lag_max",
    "token_lag_avg",
    "trained_to_generated_length_ratio",
    "context_only_token_fraction",
    "full_weight_token_age_max",
    "learner_bound_samples_per_s",
    "generation_bound_samples_per_s",
    "requeued_prompts",
    "dropped_prompts",
    "aborted_tokens",
    "reprefill_tokens",
    "preempted_requests",
    "recomputed_tokens",
    "versions_spanned_max",
    "longest_sample_tokens",
)


def interleaved(rounds: int, *axes: Sequence[str]) -> list[tuple]:
    """(round, *one item of each axis) in run order, rounds outermost: every combination once per round,
    in the same order each round (A B C A B C, not A A B B C C)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return list(itertools.product(range(rounds), *axes))


def spread(values: Iterable[float]) -> dict[str, float]:
    values = list(values)
    if not values:
        raise ValueError("spread of no values")
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def learner_bound_samples_per_s(run: dict) -> float:
    """The rate this run's learner would sustain if it never waited for samples: train and sync back to
    back, at the step and pause times it measured (with the engine busy alongside, as in streaming)."""
    steps = run["learner_steps"]
    busy = sum(s["step_s"] for s in steps) / len(steps) + run["weight_sync_pause_s_avg"]
    return run["samples_per_step"] / busy


def generation_bound_samples_per_s(run: dict) -> float:
    """The rate this run would reach if its engines never idled (at the rate they trained while busy): the
    ceiling when generation, not the learner, is the bottleneck."""
    busy = 1.0 - run["generation_idle_frac"]
    return run["trained_samples_per_s"] / busy if busy > 0 else float("inf")


def pipeline_ceiling(run: dict) -> tuple[float, str]:
    """The lower of the learner-bound and generation-bound rates, and which one it is."""
    learner, generation = learner_bound_samples_per_s(run), generation_bound_samples_per_s(run)
    return (learner, "learner") if learner <= generation else (generation, "generation")


def summarize_mode(runs: list[dict]) -> dict:
    """One mode over its rounds: median/min/max of each `SPREAD_KEYS` number the runs have."""
    summary: dict = {"mode": runs[0]["mode"], "rounds": len(runs)}
    for key in SPREAD_KEYS:
        if all(key in run for run in runs):
            summary[key] = spread(run[key] for run in runs)
    return summary


def paired_ratio(numerator: list[dict], denominator: list[dict], key: str = "trained_samples_per_s") -> dict:
    """`key` of one mode over another's, per round (runs of a round ran back to back), as a spread."""
    if len(numerator) != len(denominator):
        raise ValueError(f"rounds differ: {len(numerator)} vs {len(denominator)}")
    per_round = [n[key] / d[key] for n, d in zip(numerator, denominator)]
    return {**spread(per_round), "per_round": per_round}


def format_spread(s: dict[str, float], fmt: str = ".2f") -> str:
    """`median [min-max]`, or the bare value when every round measured the same."""
    if s["min"] == s["max"]:
        return f"{s['median']:{fmt}}"
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"
