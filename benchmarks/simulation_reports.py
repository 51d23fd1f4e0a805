"""The simulator's tables: per mode, the async_steps sweep, the validation, KV kept against re-prefill. The
results they show are computed elsewhere (`simulation`, `simulation_projection`, `simulation_validation`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from benchmarks.simulated_world import CostModel
from benchmarks.simulation import needed, warmup_steps
from benchmarks.simulation_projection import KV_COMPARED, AsyncSweep

_COLUMNS = (
    ("mode", "mode", "{}"),
    ("samples/s", "trained_samples_per_s", "{:.2f}"),
    ("gen tok/s", "generated_tokens_per_s", "{:.0f}"),
    ("gen idle", "generation_idle_frac", "{:.1%}"),
    ("underfilled", "engine_underfilled_frac", "{:.1%}"),
    ("learner wait", "learner_wait_frac", "{:.1%}"),
    ("sync pause s", "weight_sync_pause_s_avg", "{:.2f}"),
    ("lag avg", "version_lag_avg", "{:.2f}"),
    ("lag max", "version_lag_max", "{:.0f}"),
    ("multi-version", "multi_version_frac", "{:.1%}"),
    ("step s", "step_s", "{:.1f}"),
)


def format_table(summary: dict[str, Any], modes: Iterable[str]) -> str:
    rows = [[title for title, _, _ in _COLUMNS]]
    for mode in modes:
        r = dict(summary[mode], mode=mode, step_s=summary[mode]["wall_s"] / max(1, summary[mode]["num_steps"]))
        rows.append([fmt.format(r[key]) for _, key, fmt in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.append(
        f"speedup streaming vs synchronous: {summary['speedup_streaming_vs_sync']:.2f}x; "
        f"one-step-async vs synchronous: {summary['speedup_one_step_async_vs_sync']:.2f}x"
    )
    return "\n".join(lines)


def format_sweep(sweep: AsyncSweep) -> str:
    header = (
        "mode",
        "async",
        "samples/s",
        "speedup",
        "gen idle",
        "learner wait",
        "sync pause s",
        "lag avg",
        "lag max",
        "token lag",
        "group s",
        "needed",
    )
    runs = [("synchronous", sweep.synchronous), ("one_step_async", sweep.one_step_async)]
    runs += [("streaming", r) for r in sweep.streaming.values()]
    runs += [] if sweep.auto is None else [("streaming", sweep.auto)]
    rows = [header] + [
        (
            mode,
            f"auto->{r.lookahead_final}" if r.async_steps == "auto" else str(r.async_steps),
            f"{r.steady_trained_samples_per_s:.2f}",
            f"{sweep.speedup(r):.2f}x",
            f"{r.generation_idle_frac:.1%}",
            f"{r.learner_wait_frac:.1%}",
            f"{r.weight_sync_pause_s_avg:.2f}",
            f"{r.version_lag_avg:.2f}",
            f"{r.version_lag_max:.0f}",
            f"{r.token_lag_avg:.2f}",
            f"{r.group_latency_s_avg:.0f}",
            str(needed(r)),
        )
        for mode, r in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    ceiling = sweep.learner_bound_samples_per_s
    lines.append(
        f"learner-bound ceiling: {ceiling:.2f} samples/s "
        f"({ceiling / sweep.synchronous.steady_trained_samples_per_s:.2f}x synchronous); streaming reaches "
        f"{sweep.speedup(sweep.streaming[sweep.chosen_async_steps]):.2f}x at async_steps "
        f"{sweep.chosen_async_steps}"
    )
    if sweep.auto is not None:
        a = sweep.auto
        lines.append(
            f"--async_steps auto: {sweep.speedup(a):.2f}x synchronous, "
            f"{a.steady_trained_samples_per_s / ceiling:.1%} of the ceiling, settled at {a.lookahead_final}, "
            f"lag max {a.version_lag_max:.0f}"
        )
    return "\n".join(lines)


def format_step_calibrated(validation: dict[str, Any]) -> str:
    lines = [
        "trained samples/s per mode, the engine's costs fitted on the runs' own engine steps "
        f"({CostModel(**validation['cost_model_all_modes'])}):",
        f"  {'mode':<19} {'measured':>8}  {'all modes':>9} {'error':>7}  {'other modes':>11} {'error':>7}"
        f"  {'steps':>6} {'step time':>9}",
    ]
    for mode, v in validation["per_mode"].items():
        lines.append(
            f"  {mode:<19} {v['measured_median']:8.2f}  {v['predicted_all_modes']:9.2f} {v['error_all_modes']:+7.1%}"
            f"  {v['predicted_other_modes']:11.2f} {v['error_other_modes']:+7.1%}  {v['steps']:6d} "
            f"{v['step_time_error']:+9.1%}"
        )
    return "\n".join(lines)


def format_per_mode_validation(per_mode: dict[str, Any]) -> str:
    lines = ["trained samples/s per mode: predicted vs measured median [min-max over rounds]"]
    for mode, v in per_mode.items():
        lines.append(
            f"  {mode:<19} {v['predicted']:7.2f} vs {v['measured_median']:7.2f} "
            f"[{v['measured_min']:.2f}-{v['measured_max']:.2f}]   error {v['relative_error']:+.1%}"
        )
    return "\n".join(lines)


_KV_COLUMNS = {  # SimResult field: (title, format), for each field of simulation_projection.KV_COMPARED
    "steady_trained_samples_per_s": ("samples/s", "{:.2f}"),
    "generation_idle_frac": ("gen idle", "{:.1%}"),
    "learner_wait_frac": ("learner wait", "{:.1%}"),
    "weight_sync_pause_s_avg": ("sync pause s", "{:.2f}"),
    "token_lag_avg": ("token lag", "{:.2f}"),
    "version_lag_max": ("lag max", "{:.0f}"),
    "reprefilled_samples": ("reprefilled", "{:d}"),
    "reprefill_tokens": ("prefill tok recomputed", "{:,d}"),
}


def format_kv_comparison(comparison: dict[str, Any], async_steps: int) -> str:
    lines = [f"in-flight update at --async_steps {async_steps}: KV cache kept vs abort + re-prefill"]
    rows = [["", *(_KV_COLUMNS[key][0] for key in KV_COMPARED), "vs sync"]]
    for name in ("kv_kept", "reprefill"):
        values = comparison[name]
        cells = [_KV_COLUMNS[key][1].format(values[key]) for key in KV_COMPARED]
        rows.append([name, *cells, f"{comparison['speedup_vs_sync'][name]:.2f}x"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.append(f"KV kept / reprefill trained samples/s: {comparison['kv_kept_over_reprefill']:.2f}x")
    return "\n".join(lines)


def format_projection(entry: dict[str, Any], sweep: AsyncSweep) -> str:
    """`simulation_projection.project_long_reasoning`'s result: its shape, the sweep, KV kept against re-prefill."""
    cluster, w, kv = entry["cluster"], entry["workload"], entry["kv_kept_vs_reprefill"]
    header = (
        f"== projection at the long-reasoning shape: {cluster['num_engines']} engines x H100 (assumed costs), "
        f"{cluster['num_learners']} learners, {w['prompts_per_step']}x{w['samples_per_prompt']} samples/step, "
        f"responses lognormal(median {w['median_tokens']:.0f}, sigma {w['sigma']}) capped at "
        f"{w['max_tokens']}, {w['num_steps']} steps (rates after {warmup_steps(w['num_steps'])} warm-up steps)"
    )
    return "\n".join((header, format_sweep(sweep), format_kv_comparison(kv, kv["async_steps"])))
