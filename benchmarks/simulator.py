"""The cluster simulator's command (the simulation itself is `simulation`):

    python -m benchmarks.simulator --measured measured.json --output DIR

the measured setup's modes (validation: the engine's costs fitted on calibration batches, then on the runs'
own engine steps, of every mode and of the other modes only, `simulation_validation`), then the long-reasoning
shape with streaming at each `--async_sweep` lookahead, against the learner-bound ceiling (`simulation_projection`,
where `LONG_REASONING_CLUSTER` and `LONG_REASONING_WORKLOAD` define the shape); tables by `simulation_reports`,
plots by `simulator_plots`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.simulation_projection import LONG_REASONING_WORKLOAD, project_long_reasoning
from benchmarks.simulation_reports import format_projection
from benchmarks.simulation_validation import validate_on_measurements
from benchmarks.simulator_plots import plot_sweep, plot_timelines
from benchmarks.stamp import ResultFileError, results_page, stamp


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", type=Path, help="measurements, a workload and a cluster (see fit_cost_model)")
    parser.add_argument("--output", type=Path, default=Path("output/simulator"), help="for simulator.json and PNGs")
    parser.add_argument(
        "--projection_steps",
        type=int,
        default=LONG_REASONING_WORKLOAD.num_steps,
        help="steps of the projection at the long-reasoning shape (its first quarter is warm-up)",
    )
    parser.add_argument("--async_steps", type=int, default=1, help="streaming's async_steps on the measured setup")
    parser.add_argument(
        "--async_sweep",
        default="1,2,3,4,5,6,8",
        help="comma-separated async_steps of streaming projected at the long-reasoning shape",
    )
    args = parser.parse_args(argv)
    args.sweep_steps = sorted({int(a) for a in args.async_sweep.split(",") if a.strip()})
    if not args.sweep_steps or min(args.sweep_steps) < 1:
        parser.error(f"--async_sweep needs async_steps >= 1, got {args.async_sweep!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    # The simulated runs' defaults (simulation.simulate_training); validation replays the measured runs' own.
    policy = "projection: K = each row's --async_steps (8 with auto), requeue; validation: the measured runs' own"
    report: dict[str, Any] = {"stamp": stamp("simulator", policy)}
    with results_page(args.output / "simulator.md", "The cluster-scale simulator", report["stamp"]):
        if not simulate(args, report):
            return 2
    print(f"wrote simulator.json, simulator.md and the plots to {args.output}")
    return 0


def simulate(args, report: dict[str, Any]) -> bool:
    """Validation on --measured (when given) and the projection at the long-reasoning shape, printed and
    written; False when the measurements cannot be read."""
    if args.measured:
        try:
            report["measured"], runs = validate_on_measurements(args.measured, args.async_steps)
        except ResultFileError as error:
            print(f"simulator: --measured {error}", file=sys.stderr)
            return False
        panels = [("measured: synchronous", runs["synchronous"]), ("measured: streaming", runs["streaming"])]
        plot_timelines(panels, args.output / "simulator_timeline_measured.png")
    report["long_reasoning_projection"], sweep = project_long_reasoning(args.projection_steps, args.sweep_steps)
    print(format_projection(report["long_reasoning_projection"], sweep))
    (args.output / "simulator.json").write_text(json.dumps(report, indent=2))
    projection_panels = [
        ("long-reasoning shape: synchronous", sweep.synchronous),
        (
            f"long-reasoning shape: streaming, async_steps {sweep.chosen_async_steps}",
            sweep.streaming[sweep.chosen_async_steps],
        ),
    ]
    plot_timelines(projection_panels, args.output / "simulator_timeline.png", steady=True)
    plot_sweep(sweep, args.output / "simulator_async_sweep.png")
    return True


if __name__ == "__main__":
    sys.exit(main())
