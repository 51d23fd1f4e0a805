"""The e2e benchmark's tables (per workload and mode, medians with their spread) and its timeline plot."""

from __future__ import annotations

from pathlib import Path

from benchmarks import rounds as rounds_lib
from benchmarks.stamp import page_text


def plot_timeline(timelines: dict[str, list], path: Path, title: str) -> None:
    """Per mode: running samples per engine over time (line) and learner steps / syncs (bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(timelines), 1, figsize=(10, 2.6 * len(timelines)), sharex=True)
    for ax, (mode, events) in zip(axes, timelines.items()):
        t0 = min(start for _, start, _ in events)
        engines = sorted({actor for actor, _, _ in events if actor.startswith("engine")})
        for engine in engines:
            edges = sorted(
                [(s - t0, 1) for a, s, _ in events if a == engine] + [(e - t0, -1) for a, _, e in events if a == engine]
            )
            xs, ys, running = [0.0], [0], 0
            for t, delta in edges:
                xs += [t, t]
                ys += [running, running + delta]
                running += delta
            ax.plot(xs, ys, lw=0.8, label=f"{engine}: running samples")
        top = max(ax.get_ylim()[1], 1)
        for actor, color in (("learner", "tab:red"), ("weight sync", "tab:green")):
            bars = [(s - t0, e - s) for a, s, e in events if a == actor]
            ax.broken_barh(bars, (top * 1.02, top * 0.08), color=color, label=f"{actor} busy")
        ax.set_title(mode, fontsize=9)
        ax.set_ylabel("samples")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(results: dict, out: Path) -> None:
    report = format_report(results)
    title = "Streaming vs synchronous training: measured tables"
    if results.get("lora_r"):
        title += f" (LoRA: every mode trains an r={results['lora_r']} adapter)"
    if results.get("running_per_engine"):
        title += (
            f" (samples up to {results['max_tokens']:,} tokens, {results['running_per_engine']} running per engine "
            "over a KV cache that cannot hold them all)"
        )
    (out / "e2e.md").write_text(page_text(title, results["stamp"], report))
    print(report)


_COLUMNS = (  # (title, key, format): median [min-max] over the rounds
    ("samples/s", "trained_samples_per_s", ".3g"),
    ("gen idle", "generation_idle_frac", ".3f"),
    ("learner wait", "learner_wait_frac", ".3f"),
    ("sync pause s", "weight_sync_pause_s_avg", ".3f"),
    ("lag avg", "version_lag_avg", ".2f"),
    ("lag max", "version_lag_max", ".0f"),
    ("token lag", "token_lag_avg", ".2f"),
    ("trained/gen len", "trained_to_generated_length_ratio", ".3f"),
    ("context-only tok", "context_only_token_fraction", ".3f"),
    ("oldest trained", "full_weight_token_age_max", ".0f"),
    ("requeued", "requeued_prompts", ".0f"),
    ("dropped", "dropped_prompts", ".0f"),
    ("aborted tok", "aborted_tokens", ".0f"),
    ("reprefill tok", "reprefill_tokens", ".0f"),
    ("preempted", "preempted_requests", ".0f"),
    ("recomputed tok", "recomputed_tokens", ".0f"),
    ("versions max", "versions_spanned_max", ".0f"),
    ("longest", "longest_sample_tokens", ".0f"),
)


def _aligned(rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, the numbers right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:]))]
        lines.append("  ".join(cells))
    return lines


def format_report(results: dict) -> str:
    """Per workload: each mode's medians [min-max] over the rounds, the ratios per round, the ceiling."""
    lines = [f"{results['rounds']} rounds, modes interleaved; engine and learner pinned: {results['pinned']}"]
    if "peak_memory_gib_by_role" in results:
        roles = ", ".join(f"{role} {gib:.2f}" for role, gib in results["peak_memory_gib_by_role"].items())
        lines.append(f"peak memory (PSS, GiB, over the whole run): {roles}; all {results['peak_memory_gib']:.2f}")
    for name, workload in results["workloads"].items():
        lines += ["", f"{name}: {workload['workload']}"]
        rows = [["mode", *(title for title, _, _ in _COLUMNS)]]
        for mode, summary in workload["modes"].items():
            # "-": a number this run's e2e.json predates (--summarize of an older run)
            cells = (rounds_lib.format_spread(summary[key], fmt) if key in summary else "-" for _, key, fmt in _COLUMNS)
            rows.append([mode, *cells])
        lines += _aligned(rows)
        streaming = workload["runs"]["streaming"]
        if "turns_per_sample" in streaming[-1]:
            s = streaming[-1]
            lines.append(
                f"streaming (last round): {s['turns_per_sample']:.2f} turns and {s['tool_calls_per_sample']:.2f} "
                f"calls per sample, {s['tool_runtime_s_avg']:.2f} s per call, "
                f"{s['parked_on_tools_frac']:.2f} of sample time parked on tools"
            )
        for ratio, value in workload["ratios"].items():
            lines.append(f"{ratio.replace('_vs_', ' / ')} trained samples/s: {rounds_lib.format_spread(value)}x")
        learner = rounds_lib.format_spread(workload["learner_bound_ceiling_samples_per_s"])
        generation = rounds_lib.format_spread(workload["generation_bound_ceiling_samples_per_s"])
        lines.append(
            f"ceilings of streaming's runs: learner-bound {learner} samples/s (train + sync back to back), "
            f"generation-bound {generation} (an engine never idle); {workload['ceiling_binding']} binds, and "
            f"streaming reaches {rounds_lib.format_spread(workload['streaming_of_ceiling'])} of the lower"
        )
    return "\n".join(lines)
