"""Benchmark: `--max_off_policy_steps auto` on the real stack (the CPU demo: vLLM engine, DeepSpeed learner, Ray),
at two learning rates, against fixed bounds.

Each run is `scripts/cpu_demo.sh` with `--async_steps auto` (the lookahead follows its need within the bound) and
one bound: the self-tuning window or a fixed K. The policy's speed is the learning rate: the demo's 3e-4, and 3e-3,
ten times faster. Per run, after the first quarter of the steps (the pipeline filling): trained samples per second
(from the steps' times), the learner's wait, the window's mean and final K, and the worst step's off-policy health
(`offpolicy/ess_frac`, `offpolicy/truncated_frac`) against the default limits; and the eval reward before and
after. Writes `window_cpu.json` and `window_cpu.md` (stamped) and prints the table. One run per setting: on two
shared cores, rates vary by several percent between identical runs.

    python -m benchmarks.window_cpu --output output/bench/window_cpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.stamp import REPO, describe, stamp
from benchmarks.window_sim import LIMITS, within_limits
from open_instruct.metrics import mean


def demo_command(learning_rate: str, bound: str, args, out: Path) -> list[str]:
    flags = {
        "output_dir": out,
        "learning_rate": learning_rate,
        "async_steps": "auto",
        "max_off_policy_steps": bound,
        "total_episodes": args.total_episodes,
        "num_evals": 1,
        "save_freq": 0,
        "seed": args.seed,
    }
    return ["bash", str(REPO / "scripts" / "cpu_demo.sh"), *[t for k, v in flags.items() for t in (f"--{k}", str(v))]]


def run_once(learning_rate: str, bound: str, args, root: Path) -> dict:
    name = f"lr{learning_rate}_K{bound}"
    out, log = root / name, root / f"{name}.log"
    with open(log, "w") as stream:
        done = subprocess.run(demo_command(learning_rate, bound, args, out), cwd=REPO, stdout=stream, stderr=stream)
    if done.returncode != 0:
        raise SystemExit(f"the run {name} failed (exit {done.returncode}); see {log}")
    summary = json.loads((out / "summary.json").read_text())
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [h for h in history if "time/step_s" in h]
    steady = steps[len(steps) // 4 :]
    per_step = summary["episodes"] / max(1, summary["steps_trained"])
    step_s = sum(h["time/step_s"] for h in steady)
    ess = min((h.get("offpolicy/ess_frac", 1.0) for h in steady), default=1.0)
    truncated = max((h.get("offpolicy/truncated_frac", 0.0) for h in steady), default=0.0)
    return {
        "learning_rate": learning_rate,
        "K": bound,
        "samples_per_s": per_step * len(steady) / step_s if step_s > 0 else 0.0,
        "learner_wait_frac": sum(h["time/learner_wait_s"] for h in steady) / step_s if step_s > 0 else 0.0,
        "window_avg": mean(h["offpolicy/window"] for h in steady),
        "window_final": summary["off_policy_window_final"],
        "ess_frac_min": ess,
        "truncated_frac_max": truncated,
        "healthy": within_limits(ess, truncated),
        "eval_before": summary["first_eval_reward"],
        "eval_after": summary["last_eval_reward"],
        "staleness_policy": summary["staleness_policy"],  # as the run itself parsed its flags
    }


def format_report(results: dict) -> str:
    lines = [describe(results["stamp"]), results["setting"], ""]
    lines.append(
        f"{'lr':>6} {'K':>5} {'samples/s':>10} {'learner wait':>13} {'K avg':>6} {'K end':>6} {'ess min':>8} "
        f"{'trunc max':>10} {'in limits':>10} {'eval':>14}"
    )
    for r in results["runs"]:
        lines.append(
            f"{r['learning_rate']:>6} {r['K']:>5} {r['samples_per_s']:>10.1f} {r['learner_wait_frac']:>13.1%} "
            f"{r['window_avg']:>6.1f} {r['window_final']:>6} {r['ess_frac_min']:>8.3f} "
            f"{r['truncated_frac_max']:>10.4f} {'yes' if r['healthy'] else 'NO':>10} "
            f"{r['eval_before']:>6.2f} -> {r['eval_after']:.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning_rates", nargs="+", default=["3e-4", "3e-3"])
    parser.add_argument("--fixed", nargs="*", default=["1", "2", "4"], help="the fixed bounds to compare")
    parser.add_argument("--total_episodes", type=int, default=7680, help="60 steps of the demo's 128 samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=Path("output/bench/window_cpu"))
    args = parser.parse_args(argv)
    root = args.output.resolve()
    root.mkdir(parents=True, exist_ok=True)
    runs = [run_once(lr, bound, args, root) for lr in args.learning_rates for bound in ["auto", *args.fixed]]
    setting = (
        f"scripts/cpu_demo.sh --async_steps auto --total_episodes {args.total_episodes} --seed {args.seed}; limits: "
        f"ess_frac >= {LIMITS.off_policy_min_ess_frac}, truncated_frac <= {LIMITS.off_policy_max_truncated_frac}; "
        "rates and health after the first quarter of the steps"
    )
    policies = {f"lr {r['learning_rate']} K {r['K']}": r["staleness_policy"] for r in runs}
    results = {"stamp": stamp("window_cpu", policies), "setting": setting, "runs": runs}
    (root / "window_cpu.json").write_text(json.dumps(results, indent=2))
    report = format_report(results)
    title = "# The self-tuning off-policy window on CPU: measured table"
    (root / "window_cpu.md").write_text(f"{title}\n\n```\n{report}\n```\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
