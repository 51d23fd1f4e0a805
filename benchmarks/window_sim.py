"""Benchmark: does `--max_off_policy_steps auto` find the staleness bound a user would have to sweep for?

In the simulator (the real training loop on simulated engines and learners, `simulation.simulate`), at the
long-reasoning shape (heavy-tailed 16k-token responses, 32 engines, 16 learners, assumed H100 costs) with
`--async_steps auto` and `--off_policy_action mask`: the self-tuning window against every fixed K, for a policy
that moves slowly and one that moves fast. How fast a policy moves is `PolicyDrift.per_version`, the spread of the
importance weights per version of lag (a higher learning rate is a larger drift); the simulated learners report
the `offpolicy/ess_frac` and `offpolicy/truncated_frac` it implies for the tokens they train.

Per policy speed: each fixed K's steady throughput and its worst health after the warm-up, which fixed Ks keep
health inside the limits (--off_policy_min_ess_frac, --off_policy_max_truncated_frac: the defaults), the best
of those, and the window's throughput against it, the K it settled on, and its worst health. Writes
`window_sim.json` and prints the table.

    python -m benchmarks.window_sim --output output/bench/window_sim
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from benchmarks.simulated_world import Cluster, PolicyDrift
from benchmarks.simulation import SimResult, simulate
from benchmarks.simulation_projection import GPU_H100_COST, LONG_REASONING_CLUSTER, LONG_REASONING_WORKLOAD
from benchmarks.stamp import results_page, stamp
from open_instruct.config.staleness import StalenessConfig
from open_instruct.staleness import OffPolicyWindow

LIMITS = StalenessConfig()  # the window's default limits and bounds
# The controller's own judgement of a step's health, so that the benchmarks call "within limits" what it does.
DEFAULT_WINDOW = OffPolicyWindow.adaptive(
    LIMITS.off_policy_window_min,
    LIMITS.off_policy_window_max,
    LIMITS.off_policy_min_ess_frac,
    LIMITS.off_policy_max_truncated_frac,
)
SPEEDS = {"slow": 0.05, "fast": 0.15}  # PolicyDrift.per_version


def within_limits(ess_frac_min: float, truncated_frac_max: float) -> bool:
    """Whether a run's worst step stayed inside the default health limits."""
    return DEFAULT_WINDOW.health_headroom(ess_frac_min, truncated_frac_max) >= 0


def row(name: str, result: SimResult) -> dict:
    return {
        "K": name,
        "samples_per_s": result.steady_trained_samples_per_s,
        "learner_wait_frac": result.learner_wait_frac,
        "window_avg": result.window_avg,
        "window_final": result.window_final,
        "ess_frac_min": result.ess_frac_min,
        "truncated_frac_max": result.truncated_frac_max,
        "healthy": within_limits(result.ess_frac_min, result.truncated_frac_max),
    }


def sweep(workload, cost, cluster: Cluster, drift: float, fixed: list[int]) -> dict:
    """The window and each fixed K at one policy speed, and the comparison."""

    def run(bound):
        return simulate(
            "streaming", workload, cost, cluster, "auto", bound, "mask", drift=PolicyDrift(drift)
        )  # the lookahead follows its need within the bound

    auto = row("auto", run("auto"))
    rows = [row(str(k), run(k)) for k in fixed]
    inside = [r for r in rows if r["healthy"]]
    best_inside = max(inside, key=lambda r: r["samples_per_s"], default=None)
    best_any = max(rows, key=lambda r: r["samples_per_s"])
    return {
        "drift_per_version": drift,
        "auto": auto,
        "fixed": rows,
        "best_fixed_within_limits": best_inside["K"] if best_inside else None,
        "best_fixed_any": best_any["K"],
        "auto_vs_best_within_limits": auto["samples_per_s"] / best_inside["samples_per_s"] if best_inside else None,
        "auto_vs_best_any": auto["samples_per_s"] / best_any["samples_per_s"],
    }


def format_sweep(speed: str, entry: dict) -> str:
    lines = [
        f"-- policy {speed} (drift {entry['drift_per_version']} per version of lag)",
        f"{'K':>5} {'samples/s':>10} {'learner wait':>13} {'K avg':>6} {'ess min':>8} {'trunc max':>10}  within limits",
    ]
    for r in [entry["auto"], *entry["fixed"]]:
        lines.append(
            f"{r['K']:>5} {r['samples_per_s']:>10.2f} {r['learner_wait_frac']:>13.1%} {r['window_avg']:>6.1f} "
            f"{r['ess_frac_min']:>8.3f} {r['truncated_frac_max']:>10.4f}  {'yes' if r['healthy'] else 'NO'}"
        )
    best = entry["best_fixed_within_limits"]
    ratio = entry["auto_vs_best_within_limits"]
    lines.append(
        f"auto / best fixed K within the limits (K={best}): {ratio:.3f}x" if ratio else "no fixed K within the limits"
    )
    lines.append(
        f"auto / best fixed K whatever its health (K={entry['best_fixed_any']}): {entry['auto_vs_best_any']:.3f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("output/bench/window_sim"))
    parser.add_argument("--steps", type=int, default=80, help="training steps per run (the first quarter is warm-up)")
    parser.add_argument("--fixed", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8], help="the fixed Ks to compare")
    args = parser.parse_args(argv)
    workload = dataclasses.replace(LONG_REASONING_WORKLOAD, num_steps=args.steps)
    started = time.monotonic()
    limits = f"ess >= {LIMITS.off_policy_min_ess_frac:g}, truncated <= {LIMITS.off_policy_max_truncated_frac:g}"
    policy = f"K per row: fixed {', '.join(map(str, args.fixed))}, or auto ({limits}); mask"
    out = {"steps": args.steps, "speeds": {}, "stamp": stamp("window_sim", policy)}
    title = "The self-tuning off-policy window in the simulator"
    with results_page(args.output / "window_sim.md", title, out["stamp"]):
        print(
            f"== --max_off_policy_steps auto vs fixed K, simulated at the long-reasoning shape ({args.steps} "
            f"steps, --async_steps auto, --off_policy_action mask; limits ess_frac >= "
            f"{LIMITS.off_policy_min_ess_frac}, truncated_frac <= {LIMITS.off_policy_max_truncated_frac}; health and "
            "rates after the warm-up)"
        )
        for speed, drift in SPEEDS.items():
            out["speeds"][speed] = sweep(workload, GPU_H100_COST, LONG_REASONING_CLUSTER, drift, args.fixed)
            print(format_sweep(speed, out["speeds"][speed]), flush=True)
    out["sim_s"] = time.monotonic() - started
    (args.output / "window_sim.json").write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
