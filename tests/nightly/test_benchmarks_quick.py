"""Smoke runs of every benchmark with the real stack: each mode produces the JSON contract and its plots.

The numbers themselves are measured by the benchmarks, not asserted here (see docs/benchmarks.md). Shrunk as they
are, the runs take about 12 minutes together, too long for CI: the nightly tier runs them (scripts/nightly.sh),
and CI runs one shared tiny e2e run (tests/integration/test_benchmarks.py).
Run: `bash scripts/test.sh tests/nightly`.
"""

from __future__ import annotations

import json

import pytest

MODE_KEYS = {
    "mode",
    "trained_samples_per_s",
    "generated_tokens_per_s",
    "generation_idle_frac",
    "learner_wait_frac",
    "weight_sync_pause_s_avg",
    "version_lag_avg",
    "version_lag_max",
}


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """scripts/cpu_benchmarks.sh in QUICK mode: every benchmark of docs/benchmarks.md, shrunk to a smoke run."""
    import os
    import subprocess
    from pathlib import Path

    out = tmp_path_factory.mktemp("bench")
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        ["bash", "scripts/cpu_benchmarks.sh"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "QUICK": "1", "OUT": str(out)},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return out, result.stdout


def test_weight_sync_benchmark_reports_pause_and_bound(quick_bench):
    out, stdout = quick_bench
    report = json.loads((out / "weight_sync.json").read_text())
    assert report["memory_bandwidth_gb_s"] > 0 and report["stamp"]["machine"]["cpu_count"] >= 1
    rows = {row["transport"]: row for row in report["sizes"]}
    assert set(rows) == {"gloo", "shm"}  # measured side by side in one run
    for row in rows.values():
        assert row["sent_mb"] > 0 and row["frozen_s"] >= row["transfer_s"] > 0 and row["bound_s"] > 0
        assert row["requests_completed_full_length"] == row["requests_running"] == 2  # none dropped by the syncs
    assert rows["shm"]["stage_s"] > 0 == rows["gloo"]["stage_s"]  # shm stages before the engine pauses
    assert report["shm_over_gloo_frozen"]["128x2"] == pytest.approx(rows["shm"]["frozen_s"] / rows["gloo"]["frozen_s"])
    assert "frozen/bound" in stdout and "with the shared-memory file / with the gloo group" in stdout


def test_learner_step_benchmark_reports_padding_and_imbalance_of_both_layouts(quick_bench):
    out, _ = quick_bench
    result = json.loads((out / "learner_step.json").read_text())
    shape = result["micro_batches"]["shape"]
    assert shape["token_budget_ranks8"]["batch/padding_frac"] < shape["fixed_rows_ranks8"]["batch/padding_frac"]
    assert result["micro_batches"]["budget_over_fixed"] > 0
    assert all(row["step_s"] > 0 for row in result["micro_batches"]["step"].values())
    at_request = result["request_settings"]  # open-instruct's step vs ours at the long-reasoning settings
    assert at_request["new_over_old"] > 0 and at_request["max_loss_diff"] < 1e-4


def test_replay_benchmark_sweeps_response_lengths(quick_bench):
    out, _ = quick_bench
    result = json.loads((out / "replay" / "replay.json").read_text())
    assert result["stamp"]["date"]
    assert result["prompts"] == 4 and [r["response_length_cap"] for r in result["sweep"]] == [32, 96]
    for row in result["sweep"]:
        assert row["samples"] == 8 and row["generated_tokens"] > 0
        assert 0 <= row["engine_idle_frac"] <= 1 and row["ttft_s"]["p50"] >= 0
        assert row["completion_s"]["max"] >= row["completion_s"]["p50"] > 0
        assert row["response_tokens"]["max"] <= row["response_length_cap"]
    assert (out / "replay" / "utilization_vs_length.png").stat().st_size > 0
    assert (out / "replay" / "embedded_prompts.jsonl").exists()  # the recorded prompt file it replayed


def test_end_to_end_benchmark_reports_every_mode_over_interleaved_rounds(quick_bench):
    out, stdout = quick_bench
    result = json.loads((out / "e2e" / "e2e.json").read_text())
    assert result["rounds"] == 2 and result["pinned"]
    assert result["stamp"]["commit"] and result["stamp"]["machine"]["cpu_count"] >= 1
    assert set(result["workloads"]) == {"heavy_tail", "tool_latency", "env_turns"}
    modes = {"synchronous", "one_step_async", "streaming", "streaming_auto", "streaming_reprefill"}
    modes |= {"streaming_drop", "streaming_downweight", "streaming_mask"}
    for workload in result["workloads"].values():
        assert set(workload["modes"]) == set(workload["runs"]) == modes
        for mode, runs in workload["runs"].items():
            assert [r["round"] for r in runs] == [0, 1]
            for r in runs:
                assert set(r) >= MODE_KEYS and r["mode"] == mode and r["steps"] == 2
                assert r["trained_samples_per_s"] > 0 and r["buffer_peak_samples"] <= r["buffer_cap_samples"]
                assert r["start_latency_s_median"] > 0
                action = r["off_policy_action"]
                assert r["max_off_policy_steps"] == 2 and action in ("requeue", "drop", "downweight", "mask")
                if action in ("requeue", "drop"):
                    assert r["version_lag_max"] <= 2  # the bound holds, whatever the tail
                if action != "downweight":  # no token older than the bound is trained at full weight
                    assert r["full_weight_token_age_max"] <= 2
                assert r["trained_to_generated_length_ratio"] > 0 and r["learner_bound_samples_per_s"] > 0
            rates = sorted(r["trained_samples_per_s"] for r in runs)
            summary = workload["modes"][mode]
            assert summary["rounds"] == 2 and summary["trained_samples_per_s"]["min"] == rates[0]
            assert summary["trained_samples_per_s"]["max"] == rates[1]
        assert all(r["version_lag_max"] == 0 for r in workload["runs"]["synchronous"])  # nothing runs ahead
        ratio = workload["ratios"]["streaming_vs_synchronous"]
        assert ratio["min"] <= ratio["median"] <= ratio["max"] and len(ratio["per_round"]) == 2
        assert workload["speedup_streaming_vs_sync"] == ratio["median"]
        assert len(workload["ratios"]["streaming_auto_vs_one_step_async"]["per_round"]) == 2
        assert workload["learner_bound_ceiling_samples_per_s"]["median"] > 0
    # The multi-turn workloads go through the real path: a tool call over HTTP, environment turns.
    for runs in result["workloads"]["tool_latency"]["runs"].values():
        for r in runs:
            assert r["tool_calls_per_sample"] == 1 and r["turns_per_sample"] == 2 and r["tool_failures"] == 0
            assert r["tool_runtime_s_avg"] > 0 and 0 < r["parked_on_tools_frac"] < 1
    for runs in result["workloads"]["env_turns"]["runs"].values():
        for r in runs:
            assert r["tool_calls_per_sample"] == 2 and r["turns_per_sample"] == 3 and r["tool_failures"] == 0
    assert result["peak_memory_gib"] > 0
    measured = json.loads((out / "e2e" / "measured.json").read_text())
    # One calibration batch per --calibrate size at the start of each round, each sample as long as the
    # heavy-tail workload makes it.
    assert [(d["round"], len(d["samples"])) for d in measured["decode"]] == [("0", 1), ("0", 4), ("1", 1), ("1", 4)]
    assert measured["prefill_tokens_per_s"] > 0
    overheads = measured["queue_overhead"]  # the queue path against a direct batch, once per round
    assert [o["round"] for o in overheads] == ["0", "1"] and all(o["samples"] == 4 * 4 * 2 for o in overheads)
    assert all(o["queue_s"] > 0 and o["direct_s"] > 0 for o in overheads)
    assert all(0 < n <= 48 for d in measured["decode"] for _, n in d["samples"])
    replay = measured["replay"]  # what the simulator replays: the runs' prompts, their order and lengths
    assert replay["workload"]["name"] == "heavy_tail" and len(replay["prompts"]) >= 2 * 4 * 2
    assert set(measured["measured_trained_samples_per_s"]) == modes and measured["pinned"]
    assert measured["start_latency_s"] > 0  # admission to start, where the engine had room (streaming's runs)
    # Every heavy-tail run's engine steps (those that ran straight after the one before) as the engine actor
    # saw them: what the simulator's validation fits the engine's costs on.
    traced = sorted((run["round"], run["mode"]) for run in measured["engine_steps"])
    assert traced == sorted((round_index, mode) for round_index in (0, 1) for mode in modes)
    for run in measured["engine_steps"]:
        assert run["steps"] and all(row[0] >= 0 and min(row[1:]) >= 0 for row in run["steps"])
        assert sum(row[1] for row in run["steps"]) > 0 and max(row[2] for row in run["steps"]) > 0
    for name in ("heavy_tail", "tool_latency", "env_turns"):
        assert (out / "e2e" / f"timeline_{name}.png").stat().st_size > 0
    report = (out / "e2e" / "e2e.md").read_text()
    assert f"measured {result['stamp']['date']} at commit {result['stamp']['commit']}" in report
    for text in (report, stdout):
        assert "streaming / synchronous trained samples/s" in text and "ceilings of streaming's runs" in text


COSTS = ("base_s", "per_seq_s", "per_context_token_s")


def test_simulator_fits_the_measurements_and_projects_the_long_reasoning_shape(quick_bench):
    out, _stdout = quick_bench
    result = json.loads((out / "simulator" / "simulator.json").read_text())
    assert result["stamp"]["commit"]
    measured = result["measured"]
    assert measured["measured_speedup_streaming_vs_sync"] > 0 and "speedup_relative_error" in measured
    assert measured["replayed"] and min(measured["cost_model"][f"decode_{c}"] for c in COSTS) >= 0
    simulated = {"synchronous", "one_step_async", "streaming", "streaming_auto", "streaming_reprefill"}
    assert set(measured["per_mode"]) == simulated
    assert all(v["predicted"] > 0 and v["measured_median"] > 0 for v in measured["per_mode"].values())
    step_calibrated = measured["step_calibrated"]["per_mode"]  # costs fitted on the runs' own engine steps
    assert set(step_calibrated) == simulated
    assert all(v["predicted_all_modes"] > 0 and v["predicted_other_modes"] > 0 for v in step_calibrated.values())
    for mode in ("synchronous", "one_step_async", "streaming"):
        assert set(measured[mode]) >= MODE_KEYS and set(result["long_reasoning_projection"][mode]) >= MODE_KEYS
    assert result["long_reasoning_projection"]["speedup_streaming_vs_sync"] > 1
    auto = result["long_reasoning_projection"]["streaming_auto"]
    assert auto["async_steps"] == "auto" and 1 <= auto["lookahead_final"] <= 8
    assert (out / "simulator" / "simulator_timeline.png").stat().st_size > 0


def test_fault_benchmark_kills_an_engine_mid_run_and_measures_the_recovery(quick_bench):
    out, stdout = quick_bench
    result = json.loads((out / "faults" / "faults.json").read_text())
    assert result["stamp"]["commit"] and set(result["scenarios"]) == {"sigkill_continue"}
    killed = result["scenarios"]["sigkill_continue"]
    assert killed["samples_held"] >= 1 and killed["tokens_held"] > 0 and killed["partial_report_tokens"] == 8
    assert killed["tokens_saved"] >= 0 and killed["tokens_generated_again"] >= 0
    assert killed["noticed_s"] >= 0
    # Nobody waits for the replacement: a short run may end before it is built (None) or before a sync loads it.
    ready, serving = killed["replacement_ready_s"], killed["replacement_serving_s"]
    assert (ready is None or ready >= killed["noticed_s"]) and (serving is None or serving >= ready)
    assert killed["steps"] == 4 and killed["baseline_samples_per_s"] > 0 and len(killed["rates"]) == 4
    assert f"measured {result['stamp']['date']}" in (out / "faults" / "faults.md").read_text()
    assert "its replacement, built in the background, was ready after" in stdout


def test_staleness_learning_benchmark_runs_the_demo_once_per_policy(quick_bench):
    out, stdout = quick_bench
    result = json.loads((out / "staleness_learning" / "staleness_learning.json").read_text())
    assert [(r["action"], r["seed"]) for r in result["runs"]] == [("requeue", 1), ("mask", 1)]
    for run in result["runs"]:
        assert run["steps_trained"] == 2 and run["episodes"] == 256 and run["trained_samples_per_s"] > 0
        assert run["full_weight_token_age_max"] <= 1  # the bound, per token, for both policies
        assert run["eval_gain"] == pytest.approx(run["last_eval_reward"] - run["first_eval_reward"])
    assert set(result["summary"]) == {"requeue", "mask"} and "mask: mean eval gain" in stdout
    assert (out / "staleness_learning" / "staleness_learning.md").read_text().startswith("# Staleness policies")


def test_window_benchmarks_compare_the_self_tuning_window_with_fixed_bounds(quick_bench):
    out, stdout = quick_bench
    simulated = json.loads((out / "window_sim" / "window_sim.json").read_text())
    assert simulated["steps"] == 8 and set(simulated["speeds"]) == {"slow", "fast"}
    for entry in simulated["speeds"].values():
        assert [r["K"] for r in entry["fixed"]] == ["1"] and entry["auto"]["samples_per_s"] > 0
        assert 1 <= entry["auto"]["window_final"] <= 8 and 0 < entry["auto"]["ess_frac_min"] <= 1
    assert "auto / best fixed K whatever its health" in stdout
    real = json.loads((out / "window_cpu" / "window_cpu.json").read_text())
    [run] = real["runs"]  # the demo, 2 steps, with --max_off_policy_steps auto
    assert run["K"] == "auto" and run["learning_rate"] == "3e-4" and run["samples_per_s"] > 0
    assert 1 <= run["window_final"] <= 8 and 0 < run["ess_frac_min"] <= 1
    assert (out / "window_cpu" / "window_cpu.md").read_text().startswith("# The self-tuning off-policy window")


def test_every_benchmark_writes_a_stamped_page_naming_its_staleness_policy(quick_bench):
    """The pages PUBLISH=1 copies into docs/results/: title, stamp (with the policy where a loop trains), table."""
    out, _ = quick_bench
    training = {
        "e2e/e2e.md",
        "faults/faults.md",
        "staleness_learning/staleness_learning.md",
        "window_cpu/window_cpu.md",
        "window_sim/window_sim.md",
        "simulator/simulator.md",
        "e2e_lora/e2e.md",
        "driver_headroom/driver_headroom.md",
        "real_length/e2e.md",
    }
    engines_only = {"generation.md", "weight_sync.md", "replay/replay.md", "lora.md"}
    for page in sorted(training | engines_only):
        text = (out / page).read_text()
        assert text.startswith("# ") and "measured " in text and " at commit " in text, page
        assert ("staleness policy" in text) == (page in training), page
    generation = json.loads((out / "generation.json").read_text())
    assert [m["mode"] for m in generation["modes"]] == ["batched", "streaming"]


def test_lora_benchmark_measures_lora_and_full_fine_tuning_side_by_side(quick_bench):
    out, stdout = quick_bench
    result = json.loads((out / "lora.json").read_text())
    full, lora = result["measured"]["full"], result["measured"]["lora"]
    assert full["step_s"] > 0 and lora["step_s"] > 0 and lora["kept_requests"] == 2  # synced while decoding
    assert lora["sync_mb"] < full["sync_mb"] / 5  # the adapter (r=16 on the tiny model: 17% of it)
    assert result["lora_over_full"]["sync_mb"] == pytest.approx(lora["sync_mb"] / full["sync_mb"])
    assert 0.004 < result["seven_b"]["fraction"] < 0.007  # r=16 all-linear on a 7B: about 0.5%
    projection = result["projection"]
    assert (
        projection["lora"]["cost_model"]["weight_sync_pause_s"]
        < projection["full"]["cost_model"]["weight_sync_pause_s"]
    )
    assert all(projection[mode]["learner_bound_speedup"] > 0 for mode in ("full", "lora"))
    assert "lora / full" in stdout and "7B arithmetic" in stdout and "2 requests decoding at each sync" in stdout
    e2e = (out / "e2e_lora" / "e2e.md").read_text()  # e2e --use_peft: every mode trains an adapter
    assert "(LoRA: every mode trains an r=16 adapter)" in e2e and "streaming / synchronous trained samples/s" in e2e


def test_driver_headroom_benchmark_runs_the_real_loop_between_instant_engines_and_learners(quick_bench):
    out, stdout = quick_bench
    report = json.loads((out / "driver_headroom" / "driver_headroom.json").read_text())
    (run,) = report["runs"]
    assert run["trained_samples"] == 2 * 2 * 16  # every step of 2 prompts x 16 samples trained, none lost
    assert run["trained_tokens"] > run["trained_samples"] and run["driver_cpu_s"] > 0 and run["queue_cpu_s"] > 0
    assert report["driver_cpu_per_sample_s"]["median"] == pytest.approx(run["driver_cpu_s"] / run["trained_samples"])
    assert sum(report["time_shares"].values()) == pytest.approx(1.0)
    assert report["time_shares"]["assemble: advantages, masks, packing"] > 0
    assert [row["gpus"] for row in report["clusters"]] == [64, 256, 1024]
    # Each size simulated: with this driver at most what a free one trains. A cost added to every step moves the
    # simulation's events, which can shift its rate either way in the last digits (QUICK's driver cost is a few
    # milliseconds a step, 30.32658 against 30.32647 samples/s once): a driver is never worth more than noise.
    for row in report["clusters"]:
        assert 0 < row["simulated_samples_per_s"] <= row["cluster_samples_per_s"] * 1.001
    at_shape = report["long_reasoning_samples_per_s"]
    assert 0 < at_shape["driver"] <= at_shape["free"] * 1.001  # the driver's cost is charged to every step
    assert "where the driver's time goes" in stdout


def test_real_length_benchmark_runs_three_modes_through_vllm_preemptions(quick_bench):
    """QUICK's lengths are short, but the set-up is the real one: 8 samples running per engine over a KV cache
    that cannot hold them all, so vLLM preempts and recomputes in every mode."""
    out, _ = quick_bench
    result = json.loads((out / "real_length" / "e2e.json").read_text())
    modes = result["workloads"]["heavy_tail"]["modes"]
    assert list(modes) == ["synchronous", "streaming", "streaming_auto"]
    for summary in modes.values():
        assert summary["preempted_requests"]["min"] > 0 and summary["recomputed_tokens"]["min"] > 0
        assert 0 < summary["longest_sample_tokens"]["max"] <= 1024
    assert modes["synchronous"]["versions_spanned_max"]["max"] == 1 < modes["streaming"]["versions_spanned_max"]["max"]
    assert {"driver", "LearnerActor", "ShapedGenerationActor"} <= set(result["peak_memory_gib_by_role"])
    page = (out / "real_length" / "e2e.md").read_text()
    assert "samples up to 1,024 tokens, 8 running per engine" in page and "peak memory (PSS, GiB" in page
