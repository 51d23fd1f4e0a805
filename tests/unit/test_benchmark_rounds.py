"""How repeated benchmark runs become the numbers a reader sees: interleaved order, medians with spreads,
ratios per round, the learner-bound ceiling, the stamp, and the simulator's per-mode validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import rounds


def _run(mode: str, rate: float, round_index: int = 0, **extra) -> dict:
    return {
        "mode": mode,
        "round": round_index,
        "trained_samples_per_s": rate,
        "samples_per_step": 32,
        "weight_sync_pause_s_avg": 0.5,
        "learner_steps": [{"tokens": 100, "step_s": 1.0}, {"tokens": 100, "step_s": 3.0}],
        **extra,
    }


def test_every_mode_runs_once_per_round_in_the_same_order():
    order = rounds.interleaved(3, ["heavy", "tool"], ["sync", "stream"])
    assert len(order) == 12
    first_round = [(w, m) for r, w, m in order if r == 0]
    assert first_round == [("heavy", "sync"), ("heavy", "stream"), ("tool", "sync"), ("tool", "stream")]
    assert [(w, m) for r, w, m in order if r == 2] == first_round
    assert [r for r, _, _ in order] == sorted(r for r, _, _ in order)  # A B A B, never A A B B
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        rounds.interleaved(0, ["sync"])


def test_a_mode_is_its_median_with_the_spread_of_its_rounds():
    runs = [
        _run("streaming", rate, i, version_lag_max=lag)
        for i, (rate, lag) in enumerate([(9.0, 2), (15.0, 2), (10.0, 1)])
    ]
    summary = rounds.summarize_mode(runs)
    assert summary["mode"] == "streaming" and summary["rounds"] == 3
    assert summary["trained_samples_per_s"] == {"median": 10.0, "min": 9.0, "max": 15.0}
    assert summary["version_lag_max"] == {"median": 2, "min": 1, "max": 2}
    assert "generation_idle_frac" not in summary  # only what every run measured


def test_a_ratio_is_taken_per_round_not_of_the_medians():
    streaming = [_run("streaming", rate, i) for i, rate in enumerate([20.0, 12.0, 30.0])]
    synchronous = [_run("synchronous", rate, i) for i, rate in enumerate([10.0, 10.0, 10.0])]
    ratio = rounds.paired_ratio(streaming, synchronous)
    assert ratio["per_round"] == [2.0, 1.2, 3.0]
    assert (ratio["median"], ratio["min"], ratio["max"]) == (2.0, 1.2, 3.0)
    with pytest.raises(ValueError, match="rounds differ"):
        rounds.paired_ratio(streaming, synchronous[:2])


def test_the_learner_bound_ceiling_is_a_step_of_training_and_syncing_back_to_back():
    # Mean step 2 s + 0.5 s pause per 32 samples.
    assert rounds.learner_bound_samples_per_s(_run("streaming", 10.0)) == pytest.approx(32 / 2.5)


def test_a_spread_prints_with_its_range_unless_every_round_agreed():
    assert rounds.format_spread({"median": 2.0, "min": 1.85, "max": 2.31}) == "2.00 [1.85-2.31]"
    assert rounds.format_spread({"median": 2.0, "min": 2.0, "max": 2.0}, ".1f") == "2.0"
    with pytest.raises(ValueError):
        rounds.spread([])


def test_a_stamp_names_the_date_the_commit_and_the_machine():
    from benchmarks.stamp import describe, stamp

    s = stamp("e2e")
    assert s["date"].endswith("+00:00") and s["machine"]["cpu_count"] >= 1 and s["machine"]["cpu_model"]
    line = describe(s)
    assert line.startswith(f"measured {s['date']}") and f"{s['machine']['cpu_count']} cores" in line
    # A copy of the tree outside git (an sdist) has no commit, and says so.
    assert "no git checkout" in describe({**s, "commit": None, "dirty": False})
    assert "staleness" not in line  # a generation or learner benchmark measures no staleness policy


def test_a_stamp_names_the_staleness_policy_measured_once_or_per_mode():
    from benchmarks.e2e_runs import mode_config
    from benchmarks.stamp import describe, stamp
    from benchmarks.workloads import run_config

    args = argparse.Namespace(steps=2, prompts=2, samples=2, pin=False)
    base = run_config(args, 64, {"max_off_policy_steps": 2})
    policies = {
        mode: mode_config(base, mode, Path("out")).staleness_policy.describe()
        for mode in ("streaming_mask", "streaming_auto")
    }
    assert policies["streaming_mask"] == "K=2, mask"
    per_mode = describe(stamp("e2e", policies)).splitlines()
    assert per_mode[1:] == [
        "staleness policy per mode:",
        "  streaming_mask: K=2, mask",
        "  streaming_auto: K=2, requeue",
    ]
    assert describe(stamp("faults", "K=1, mask")).splitlines()[1] == "staleness policy: K=1, mask"


def test_the_simulator_is_validated_per_mode_against_the_measured_median():
    from benchmarks.simulation_reports import format_per_mode_validation
    from benchmarks.simulation_validation import per_mode_validation

    rates = {"synchronous": 8.8, "one_step_async": 9.0, "streaming": 20.0}
    summary = {mode: {"trained_samples_per_s": rate} for mode, rate in rates.items()}
    measured = {
        "synchronous": {"median": 8.0, "min": 7.5, "max": 9.0},
        "streaming": {"median": 16.0, "min": 15.0, "max": 17.0},
        "streaming_drop": {"median": 15.0, "min": 14.0, "max": 16.0},  # not a simulated mode
    }
    per_mode = per_mode_validation(summary, measured)
    assert set(per_mode) == {"synchronous", "streaming"}
    assert per_mode["synchronous"]["relative_error"] == pytest.approx(0.1)
    assert per_mode["synchronous"]["within_measured_spread"]
    assert per_mode["streaming"]["relative_error"] == pytest.approx(0.25)
    assert not per_mode["streaming"]["within_measured_spread"]
    assert "error +25.0%" in format_per_mode_validation(per_mode)


def test_a_fault_dip_is_measured_against_the_steps_before_it():
    from benchmarks.faults import throughput_dip

    # 10 samples per step; steps of 2 s (the first, start-up, 10 s); the fault at t=16 (during step 4).
    ends = [10.0, 12.0, 14.0, 16.0, 25.0, 30.0, 32.0, 34.0]
    dip = throughput_dip(0.0, ends, 10, fault_at=15.0)
    assert dip["baseline_samples_per_s"] == 5.0  # steps 1 and 2 (the first left out)
    assert dip["deepest_samples_per_s"] == pytest.approx(10 / 9)
    # The first step starting after the fault at >= 90% of 5/s starts at t=30: 15 s of dip, in which the
    # baseline would have trained 75 samples and 30 were (the steps ending at 16, 25 and 30).
    assert dip["recovered"] and dip["dip_s"] == 15.0 and dip["samples_lost"] == 45.0
    assert [r["end_s"] for r in dip["rates"]] == ends
    never = throughput_dip(0.0, ends[:6], 10, fault_at=15.0)
    assert not never["recovered"] and never["dip_s"] == 15.0
    with pytest.raises(ValueError, match="no step"):
        throughput_dip(0.0, ends, 10, fault_at=11.0)


def test_peak_memory_counts_each_process_under_the_actor_it_runs_for():
    """A vLLM engine process counts for the engine actor above it; Ray's agents and idle workers, titled like
    actors, count as Ray's own; the driver is itself."""
    from benchmarks.e2e_runs import process_role

    processes = {  # pid: (parent pid, process title, PSS)
        1: (0, "python", 10),
        2: (1, "/venv/ray/core/src/ray/raylet/raylet", 5),
        3: (2, "ray::ShapedGenerationActor.stream", 7),
        4: (3, "VLLM::EngineCore", 9),
        5: (2, "ray::IDLE", 1),
        6: (2, "ray::LearnerActor.train_step", 3),
        7: (2, "ray::DashboardAgent", 2),
        8: (1, "python -c watcher", 1),
    }
    roles = {pid: process_role(pid, processes, driver_pid=1) for pid in processes}
    assert roles == {
        1: "driver",
        2: "ray daemons",
        3: "ShapedGenerationActor",
        4: "ShapedGenerationActor",
        5: "ray daemons",
        6: "LearnerActor",
        7: "ray daemons",
        8: "ray daemons",
    }
