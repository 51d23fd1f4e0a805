"""Benchmark: does a staleness policy cost learning? The main job on the embedded default (`scripts/cpu_demo.sh`,
real vLLM engine, DeepSpeed learner, Ray) once per `--off_policy_action` and seed, over the same number of steps,
with a bound that bites: generation runs two steps ahead (`--async_steps 2`) of a bound of one
(`--max_off_policy_steps 1`), so a third of the groups are over it when they train. (With the demo's own
`--async_steps 1` the bound catches a handful of groups in 200 steps, and the runs differ only by chance.)

Per run: the eval reward before training and after it (the demo's eval split, greedy), the gain, and what the
policy did to lengths and ages: trained / generated length ratio, the share of trained samples' tokens kept as
context only, the oldest token trained at full weight, prompts requeued, trained samples per second. Writes
`staleness_learning.json` and `staleness_learning.md` (stamped) and prints the table.

    python -m benchmarks.staleness_learning --output output/bench/staleness_learning
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.stamp import REPO, describe, stamp

SUMMARY_KEYS = (
    "first_eval_reward",
    "last_eval_reward",
    "trained_to_generated_length_ratio",
    "context_only_token_fraction",
    "full_weight_token_age_max",
    "prompts_requeued",
    "steps_trained",
    "episodes",
    "elapsed_s",
)


def shared_flags(args) -> dict:
    """The flags every run adds to the demo's: the lookahead, the bound and the length of the run."""
    flags = {
        "async_steps": args.async_steps,
        "max_off_policy_steps": args.max_off_policy_steps,
        "total_episodes": args.total_episodes,
        "save_freq": 0,
    }
    # a longer tail than the demo's: more samples outlive a weight update
    return flags | {name: getattr(args, name) for name in ("temperature", "response_length") if getattr(args, name)}


def as_tokens(flags: dict) -> list[str]:
    return [token for name, value in flags.items() for token in (f"--{name}", str(value))]


def demo_command(action: str, seed: int, args, out: Path) -> list[str]:
    """The demo's own command line, with this run's policy, seed, bound and length (later flags win)."""
    own = {"output_dir": out, "seed": seed, "off_policy_action": action}
    return ["bash", str(REPO / "scripts" / "cpu_demo.sh"), *as_tokens(own | shared_flags(args))]


def run_once(action: str, seed: int, args, root: Path) -> dict:
    out = root / f"{action}_seed{seed}"
    log = root / f"{action}_seed{seed}.log"
    with open(log, "w") as stream:
        done = subprocess.run(demo_command(action, seed, args, out), cwd=REPO, stdout=stream, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"the {action} run with seed {seed} failed (exit {done.returncode}); see {log}")
    summary = json.loads((out / "summary.json").read_text())
    run = {"action": action, "seed": seed, **{key: summary.get(key) for key in SUMMARY_KEYS}}
    run["staleness_policy"] = summary["staleness_policy"]  # as the run itself parsed its flags
    run["eval_gain"] = run["last_eval_reward"] - run["first_eval_reward"]
    run["trained_samples_per_s"] = run["episodes"] / run["elapsed_s"]
    return run


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per action: the mean over seeds of each number, and the gains seed by seed."""
    by_action: dict[str, list[dict]] = {}
    for run in runs:
        by_action.setdefault(run["action"], []).append(run)
    keys = ("eval_gain", "last_eval_reward", "trained_to_generated_length_ratio", "context_only_token_fraction")
    summary = {}
    for action, group in by_action.items():
        summary[action] = {key: statistics.fmean(r[key] for r in group) for key in (*keys, "trained_samples_per_s")}
        summary[action]["full_weight_token_age_max"] = max(r["full_weight_token_age_max"] for r in group)
        summary[action]["eval_gains"] = [r["eval_gain"] for r in group]
    return summary


def format_report(results: dict) -> str:
    header = (
        "action",
        "seed",
        "eval before",
        "eval after",
        "gain",
        "trained/gen len",
        "context-only tok",
        "oldest trained",
        "requeued",
        "samples/s",
    )
    rows = [header]
    for r in results["runs"]:
        rows.append(
            (
                r["action"],
                str(r["seed"]),
                f"{r['first_eval_reward']:.3f}",
                f"{r['last_eval_reward']:.3f}",
                f"{r['eval_gain']:+.3f}",
                f"{r['trained_to_generated_length_ratio']:.3f}",
                f"{r['context_only_token_fraction']:.3f}",
                f"{r['full_weight_token_age_max']:.0f}",
                f"{r['prompts_requeued']}",
                f"{r['trained_samples_per_s']:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [describe(results["stamp"]), results["setting"], ""]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.append("")
    for action, s in results["summary"].items():
        gains = ", ".join(f"{gain:+.3f}" for gain in s["eval_gains"])
        lines.append(
            f"{action}: mean eval gain {s['eval_gain']:+.3f} (seeds {gains}), "
            f"trained/gen len {s['trained_to_generated_length_ratio']:.3f}, oldest trained token "
            f"{s['full_weight_token_age_max']:.0f}, {s['trained_samples_per_s']:.1f} samples/s"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", nargs="+", default=["requeue", "mask"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--async_steps", type=int, default=2)
    parser.add_argument("--max_off_policy_steps", type=int, default=1)
    parser.add_argument("--total_episodes", type=int, default=25600, help="the demo's 200 steps of 128 samples")
    parser.add_argument("--temperature", type=float, default=None, help="default: the demo's (1.0)")
    parser.add_argument("--response_length", type=int, default=None, help="default: the demo's (32)")
    parser.add_argument("--output", default="output/bench/staleness_learning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    root = Path(args.output).resolve()
    root.mkdir(parents=True, exist_ok=True)
    runs = [run_once(action, seed, args, root) for seed in args.seeds for action in args.actions]  # interleaved
    results = {
        "stamp": stamp("staleness_learning", {f"{r['action']} seed {r['seed']}": r["staleness_policy"] for r in runs}),
        "setting": " ".join(["scripts/cpu_demo.sh", *as_tokens(shared_flags(args))]),
        "runs": runs,
        "summary": summarize(runs),
    }
    (root / "staleness_learning.json").write_text(json.dumps(results, indent=2))
    report = format_report(results)
    (root / "staleness_learning.md").write_text(
        f"# Staleness policies and learning: measured tables\n\n```\n{report}\n```\n"
    )
    print(report)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
