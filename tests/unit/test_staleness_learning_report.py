"""The staleness-policy learning benchmark's pure parts: the demo command it runs, the per-action summary and
the report."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import staleness_learning
from benchmarks.stamp import stamp


def run(action: str, seed: int, before: float, after: float, ratio: float) -> dict:
    return {
        "action": action,
        "seed": seed,
        "first_eval_reward": before,
        "last_eval_reward": after,
        "eval_gain": after - before,
        "trained_to_generated_length_ratio": ratio,
        "context_only_token_fraction": 0.1 if action == "mask" else 0.0,
        "full_weight_token_age_max": 1,
        "prompts_requeued": 3,
        "trained_samples_per_s": 20.0 + seed,
    }


def test_each_run_is_the_demo_with_its_policy_seed_and_bound(tmp_path):
    args = argparse.Namespace(
        async_steps=2, max_off_policy_steps=1, total_episodes=640, temperature=1.5, response_length=None
    )
    command = staleness_learning.demo_command("mask", 7, args, tmp_path)
    assert command[1].endswith("scripts/cpu_demo.sh")
    flags = dict(zip(command[2::2], command[3::2]))
    assert flags == {
        "--output_dir": str(tmp_path),
        "--seed": "7",
        "--off_policy_action": "mask",
        "--async_steps": "2",
        "--max_off_policy_steps": "1",
        "--total_episodes": "640",
        "--save_freq": "0",
        "--temperature": "1.5",  # given; --response_length is not, so the demo's stays
    }


def test_the_summary_averages_seeds_per_action_and_the_report_shows_every_run():
    runs = [run("requeue", 1, 0.2, 0.3, 0.9), run("mask", 1, 0.2, 0.4, 1.0), run("requeue", 2, 0.1, 0.3, 0.8)]
    summary = staleness_learning.summarize(runs)
    assert summary["requeue"]["eval_gain"] == pytest.approx(0.15)
    assert summary["requeue"]["eval_gains"] == pytest.approx([0.1, 0.2])
    assert summary["requeue"]["trained_to_generated_length_ratio"] == pytest.approx(0.85)
    assert summary["mask"]["context_only_token_fraction"] == pytest.approx(0.1)
    report = staleness_learning.format_report(
        {"stamp": stamp("staleness_learning"), "setting": "demo", "runs": runs, "summary": summary}
    )
    assert report.count("\nrequeue ") == 2 and "mask: mean eval gain +0.200 (seeds +0.200)" in report
