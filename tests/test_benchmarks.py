"""Smoke runs of the benchmarks with the real stack: each mode produces the JSON contract and its plots.

The numbers themselves are measured by the benchmarks, not asserted here (see README); these runs are
tiny so they fit in CI.
"""

from __future__ import annotations

import json

import pytest


MODE_KEYS = {"mode", "trained_samples_per_s", "generated_tokens_per_s", "generation_idle_frac", "learner_wait_frac",
             "weight_sync_pause_s_avg", "version_lag_avg", "version_lag_max"}


@pytest.mark.slow
def test_replay_benchmark_sweeps_response_lengths(tmp_path):
    from open_instruct import benchmark_replay

    result = benchmark_replay.main(["--response_lengths", "32", "96", "--max_prompts", "4", "--samples", "2",
                                    "--kv_cache_gib", "0.1", "--output", str(tmp_path)])
    assert [r["response_length_cap"] for r in result["sweep"]] == [32, 96]
    for row in result["sweep"]:
        assert row["samples"] == 8 and row["generated_tokens"] > 0
        assert 0 <= row["engine_idle_frac"] <= 1 and row["ttft_s"]["p50"] >= 0
        assert row["completion_s"]["max"] >= row["completion_s"]["p50"] > 0
        assert row["response_tokens"]["max"] <= row["response_length_cap"]
    assert json.loads((tmp_path / "replay.json").read_text())["prompts"] == 4
    assert (tmp_path / "utilization_vs_length.png").stat().st_size > 0


@pytest.mark.slow
def test_end_to_end_benchmark_reports_every_mode(tmp_path):
    from open_instruct import benchmark_e2e

    result = benchmark_e2e.main(["--steps", "2", "--prompts", "4", "--samples", "2", "--median_tokens", "12",
                                 "--max_tokens", "48", "--tool_median_tokens", "8", "--tool_latency_s", "0.2",
                                 "--calibrate", "1", "4", "--output", str(tmp_path)])
    assert set(result["workloads"]) == {"heavy_tail", "tool_latency"}
    for workload in result["workloads"].values():
        assert set(workload["modes"]) == {"synchronous", "one_step_async", "streaming"}
        for mode, r in workload["modes"].items():
            assert MODE_KEYS <= set(r) and r["mode"] == mode and r["steps"] == 2
            assert r["trained_samples_per_s"] > 0 and r["buffer_peak_samples"] <= r["buffer_cap_samples"]
        assert workload["modes"]["synchronous"]["version_lag_max"] == 0  # nothing runs ahead when synchronous
        assert workload["speedup_streaming_vs_sync"] > 0
    assert result["peak_memory_gib"] > 0
    saved = json.loads((tmp_path / "e2e.json").read_text())
    assert saved["workloads"]["heavy_tail"]["speedup_streaming_vs_sync"] == result["workloads"]["heavy_tail"]["speedup_streaming_vs_sync"]
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert [d["running"] for d in measured["decode"]] == [1, 4] and measured["prefill_tokens_per_s"] > 0
    for name in ("heavy_tail", "tool_latency"):
        assert (tmp_path / f"timeline_{name}.png").stat().st_size > 0


def test_mfu_and_mbu_from_model_dimensions():
    from open_instruct.benchmark_replay import GPU_PEAKS, dense_params, utilization

    params = dense_params(hidden=4096, layers=32, vocab=128_000)  # a Llama-3-8B-like shape
    assert 6.9e9 < params < 7.1e9
    # 10k tokens/s at 100 decode steps/s on an H100.
    u = utilization(params, 10_000, 100, *GPU_PEAKS["H100"])
    assert u["mfu"] == pytest.approx(2 * params * 10_000 / 989e12)
    assert u["mbu"] == pytest.approx(2 * params * 100 / 3.35e12)
    assert 0 < u["mfu"] < 1 and 0 < u["mbu"] < 1
