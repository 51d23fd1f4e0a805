"""The simulation checked against a measured run (`benchmarks.e2e`'s measured.json): its modes simulated with
the cost model fitted on the measurements, each against the rate measured."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.calibration import fit_cost_model, step_time_error, steps_of
from benchmarks.simulated_world import Cluster, CostModel, Workload
from benchmarks.simulation import (
    MODES,
    SimResult,
    run_modes,
    simulate,
    summarize,
    workload_from_json,
)
from benchmarks.simulation_replay import Replay
from benchmarks.simulation_reports import format_per_mode_validation, format_step_calibrated, format_table
from benchmarks.stamp import read_result


def validate_on_measurements(path: Path, async_steps: int) -> tuple[dict[str, Any], dict[str, SimResult]]:
    """The measured setup's three modes with the cost model fitted to it, against the measured speedup."""
    data = read_result(path, "e2e")
    cost = fit_cost_model(data)
    workload = workload_from_json(data["workload"])
    cluster = Cluster(int(data["cluster"]["num_engines"]), int(data["cluster"]["num_learners"]))
    started = time.monotonic()
    # The same staleness bound as the measured run (older files have none: the lookahead's), and its prompts
    # and lengths where the file has them.
    replay = Replay.from_json(data["replay"]) if "replay" in data else None
    bound = data.get("max_off_policy_steps")
    runs = run_modes(workload, cost, cluster, async_steps, bound, replay)
    measured_rates = data.get("measured_trained_samples_per_s", {})
    if "streaming_auto" in measured_rates:
        auto = simulate_e2e_mode("streaming_auto", workload, cost, cluster, async_steps, bound, replay)
        runs["streaming_auto"] = auto
    summary = summarize(runs)
    entry: dict[str, Any] = {
        "cost_model": asdict(cost),
        "workload": asdict(workload),
        "cluster": asdict(cluster),
        "replayed": replay is not None,  # the measured runs' prompts and lengths, not drawn ones
        **summary,
        "sim_s": time.monotonic() - started,
    }
    print(f"== measured setup ({path}): {cluster.num_engines} engines, {cluster.num_learners} learners")
    print(f"fitted cost model: {cost}")
    print(format_table(summary, runs))
    measured_speedup = data.get("measured_speedup_streaming_vs_sync")
    if measured_speedup:
        error = summary["speedup_streaming_vs_sync"] / measured_speedup - 1
        entry["measured_speedup_streaming_vs_sync"] = measured_speedup
        entry["speedup_relative_error"] = error
        print(
            f"streaming vs synchronous: predicted {summary['speedup_streaming_vs_sync']:.2f}x, "
            f"measured {measured_speedup:.2f}x (relative error {error:+.1%})"
        )
    if measured_rates:
        entry["per_mode"] = per_mode_validation(summary, measured_rates)
        print(format_per_mode_validation(entry["per_mode"]))
    if measured_rates and data.get("engine_steps"):
        entry["step_calibrated"] = step_calibrated_validation(data, workload, cluster, async_steps, replay)
        print(format_step_calibrated(entry["step_calibrated"]))
    return entry, runs


E2E_SIMULATED = (*MODES, "streaming_auto")  # the e2e benchmark's modes the simulator runs


def simulate_e2e_mode(
    mode: str,
    workload: Workload,
    cost: CostModel,
    cluster: Cluster,
    async_steps: int,
    bound: int | None,
    replay: Replay | None,
) -> SimResult:
    """One of the e2e benchmark's modes; its `streaming_auto` is streaming with --async_steps auto."""
    if mode == "streaming_auto":
        return simulate("streaming", workload, cost, cluster, "auto", bound, replay=replay)
    return simulate(mode, workload, cost, cluster, async_steps, bound, replay=replay)


def step_calibrated_validation(
    data: dict[str, Any], workload: Workload, cluster: Cluster, async_steps: int, replay: Replay | None
) -> dict[str, Any]:
    """Each measured mode predicted with the engine's costs fitted on the training runs' own engine steps
    (`calibration.fit_cost_model(steps_of_modes=...)`): the steps of every mode, and those of the other modes
    only, which leaves the predicted mode's own steps out of its calibration. `step_time_error`: how far the
    all-modes fit is off on the mode's own steps, summed (its steps cost what the others' predict, or not)."""
    measured_rates = data["measured_trained_samples_per_s"]
    bound = data.get("max_off_policy_steps")
    traced = {run["mode"] for run in data["engine_steps"]}
    pooled = fit_cost_model(data, steps_of_modes=traced)
    per_mode = {}
    for mode in [m for m in measured_rates if m in traced and m in E2E_SIMULATED]:
        others = fit_cost_model(data, steps_of_modes=traced - {mode})
        median = measured_rates[mode]["median"]
        predicted_all = simulate_e2e_mode(mode, workload, pooled, cluster, async_steps, bound, replay)
        predicted_others = simulate_e2e_mode(mode, workload, others, cluster, async_steps, bound, replay)
        rows = steps_of(data, {mode})
        per_mode[mode] = {
            "measured_median": median,
            "predicted_all_modes": predicted_all.trained_samples_per_s,
            "error_all_modes": predicted_all.trained_samples_per_s / median - 1,
            "predicted_other_modes": predicted_others.trained_samples_per_s,
            "error_other_modes": predicted_others.trained_samples_per_s / median - 1,
            "steps": len(rows),
            "step_time_error": step_time_error(pooled, rows),
        }
    return {"cost_model_all_modes": asdict(pooled), "per_mode": per_mode}


def per_mode_validation(summary: dict[str, Any], measured_rates: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Each simulated mode's whole-run rate against the measured median (and min-max over the rounds)."""
    out = {}
    for mode in measured_rates:
        if mode not in summary:
            continue
        measured, predicted = measured_rates[mode], summary[mode]["trained_samples_per_s"]
        out[mode] = {
            "predicted": predicted,
            "measured_median": measured["median"],
            "measured_min": measured["min"],
            "measured_max": measured["max"],
            "relative_error": predicted / measured["median"] - 1,
            "within_measured_spread": measured["min"] <= predicted <= measured["max"],
        }
    return out
