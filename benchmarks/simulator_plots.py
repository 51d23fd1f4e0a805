"""Plots of simulated runs: per-actor timelines and the async_steps sweep (matplotlib, Agg)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.simulation import SimResult
    from benchmarks.simulation_projection import AsyncSweep

_COLORS = {"generate": "#4c9a2a", "idle": "#dddddd", "sync": "#d62728", "train": "#1f77b4", "wait": "#ffbf00"}


def plot_timelines(
    panels: list[tuple[str, SimResult]], path: Path, steps: int = 3, max_engines: int = 32, steady: bool = False
) -> None:
    """One panel per (title, result): a row per actor, `steps` steps from the start, or with `steady`
    from the end of the warm-up (the pipeline as a long run sees it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    cols = 2
    rows = math.ceil(len(panels) / cols)
    actors_max = 1 + min(max_engines, max(len({s.actor for s in r.timeline}) - 1 for _, r in panels))
    fig, axes = plt.subplots(rows, cols, figsize=(16, rows * (1.5 + 0.22 * actors_max)), squeeze=False)
    for ax, (title, result) in zip(axes.flat, panels):
        ends = result.step_ends()
        first = result.warmup_steps if steady else 0
        origin = ends[first - 1] if first else 0.0
        horizon = ends[min(first + steps, len(ends)) - 1] if ends else result.wall_s
        actors = ["learner"] + [f"engine {i}" for i in range(max_engines)]
        present = [a for a in actors if any(s.actor == a for s in result.timeline)]
        row_of = {a: i for i, a in enumerate(present)}
        for kind, color in _COLORS.items():
            bars: dict[int, list[tuple[float, float]]] = {}
            for s in result.timeline:
                if s.kind == kind and s.actor in row_of and s.start_s < horizon and s.end_s > origin:
                    start = max(s.start_s, origin)
                    bars.setdefault(row_of[s.actor], []).append((start, min(s.end_s, horizon) - start))
            for row, spans in bars.items():
                ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=color)
        ax.set_yticks(range(len(present)), present, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(origin, horizon)
        ax.set_xlabel("simulated time (s)")
        rate = result.steady_trained_samples_per_s if steady else result.trained_samples_per_s
        shown = f"steps {first + 1}-{min(first + steps, len(ends))}" + (" (steady)" if steady else "")
        ax.set_title(f"{title}: {rate:.2f} samples/s, {shown}", fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in _COLORS.items()], loc="upper center", ncol=len(_COLORS))
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(sweep: AsyncSweep, path: Path) -> None:
    """Speedup and staleness vs async_steps: the trade-off a researcher picks from."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(sweep.streaming)
    runs = [sweep.streaming[a] for a in steps]
    fig, speed = plt.subplots(figsize=(7, 4))
    speed.plot(steps, [sweep.speedup(r) for r in runs], "o-", color="#4c9a2a", label="streaming / synchronous")
    ceiling = sweep.learner_bound_samples_per_s / sweep.synchronous.steady_trained_samples_per_s
    speed.axhline(ceiling, color="#4c9a2a", linestyle=":", label="learner-bound ceiling")
    speed.set_xlabel("--async_steps")
    speed.set_ylabel("trained samples/s vs synchronous")
    speed.set_xticks(steps)
    speed.set_ylim(0, 1.15 * max([ceiling] + [sweep.speedup(r) for r in runs]))
    lag = speed.twinx()
    lag.plot(steps, [r.version_lag_avg for r in runs], "s--", color="#d62728", label="lag avg (oldest token)")
    lag.plot(steps, [r.token_lag_avg for r in runs], "^--", color="#ff7f0e", label="lag avg (per token)")
    lag.set_ylabel("version lag at training")
    lag.set_ylim(bottom=0)
    handles = speed.get_legend_handles_labels()[0] + lag.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="lower right", fontsize=8, bbox_to_anchor=(0.88, 0.15))
    speed.set_title("the long-reasoning shape (simulated): throughput and staleness vs lookahead", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
