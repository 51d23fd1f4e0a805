"""The benchmarks' one shared tiny run in CI: the e2e benchmark on the real stack, synchronous against streaming,
one round, the heavy-tail and tool-call workloads, written as its JSON contract, its stamped page and its plots.

Every benchmark's smoke run (all modes, two rounds, the simulator fitted on them, faults, LoRA, the windows) is
too long for CI; it is the nightly tier's (tests/nightly/test_benchmarks_quick.py). This run keeps in CI what
all of them rest on: the training loop driven by the benchmark harness in two modes, each sample's shape a
function of its id, a tool call over HTTP, the measured rates, and a page stamped with the policy measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODES = ("synchronous", "streaming")


@pytest.fixture(scope="module")
def tiny_e2e(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    command = [sys.executable, "-m", "benchmarks.e2e", "--output", str(out)]
    command += ["--workloads", "heavy_tail", "tool_latency", "--modes", *MODES, "--rounds", "1", "--steps", "2"]
    command += ["--prompts", "2", "--samples", "2", "--median_tokens", "12", "--max_tokens", "48"]
    command += ["--tool_median_tokens", "8", "--tool_latency_s", "0.2", "--calibrate", "2"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200, env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return out, result.stdout


def test_both_modes_train_and_report_rates_staleness_and_tool_calls(tiny_e2e):
    out, stdout = tiny_e2e
    result = json.loads((out / "e2e.json").read_text())
    assert result["rounds"] == 1 and result["pinned"] and result["lora_r"] == 0
    assert set(result["workloads"]) == {"heavy_tail", "tool_latency"}
    for workload in result["workloads"].values():
        assert set(workload["modes"]) == set(workload["runs"]) == set(MODES)
        for mode, [run] in workload["runs"].items():
            assert run["mode"] == mode and run["round"] == 0 and run["steps"] == 2
            assert run["trained_samples_per_s"] > 0 and run["generated_tokens_per_s"] > 0
            assert 0 <= run["generation_idle_frac"] <= 1 and 0 <= run["learner_wait_frac"] <= 1
            assert run["max_off_policy_steps"] == 2 and run["off_policy_action"] == "requeue"
            assert run["version_lag_max"] <= 2 and run["full_weight_token_age_max"] <= 2
            assert run["buffer_peak_samples"] <= run["buffer_cap_samples"]
        assert workload["runs"]["synchronous"][0]["version_lag_max"] == 0  # nothing runs ahead
        ratio = workload["ratios"]["streaming_vs_synchronous"]
        assert len(ratio["per_round"]) == 1 and workload["speedup_streaming_vs_sync"] == ratio["median"] > 0
    for [run] in result["workloads"]["tool_latency"]["runs"].values():  # a real tool call over HTTP per sample
        assert run["tool_calls_per_sample"] == 1 and run["turns_per_sample"] == 2 and run["tool_failures"] == 0
    assert "streaming / synchronous trained samples/s" in stdout


def test_the_page_is_stamped_with_the_policy_and_the_simulator_gets_its_measurements(tiny_e2e):
    out, _ = tiny_e2e
    result = json.loads((out / "e2e.json").read_text())
    stamp = result["stamp"]
    assert stamp["commit"] and stamp["machine"]["cpu_count"] >= 1
    page = (out / "e2e.md").read_text()
    assert page.startswith("# ") and f"measured {stamp['date']} at commit {stamp['commit']}" in page
    assert "staleness policy" in page
    measured = json.loads((out / "measured.json").read_text())
    assert set(measured["measured_trained_samples_per_s"]) == set(MODES) and measured["prefill_tokens_per_s"] > 0
    assert [(d["round"], len(d["samples"])) for d in measured["decode"]] == [("0", 2)]
    assert measured["replay"]["workload"]["name"] == "heavy_tail"
    for name in ("heavy_tail", "tool_latency"):
        assert (out / f"timeline_{name}.png").stat().st_size > 0
