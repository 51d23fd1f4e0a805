"""Soak test: a long run of the real stack at tiny sizes, checked for memory growth, queue growth and leaks.

    .venv/bin/python scripts/soak.py --steps 1000 --output_dir /tmp/soak

Hardware: any x86_64 Linux machine, CPU only. Starts open_instruct/grpo_fast.py on the embedded default
(1 vLLM engine, 1 DeepSpeed learner, 4 prompts x 4 samples, 32 response tokens) in its own session and,
every --interval_s seconds, reads the RSS of every process of that session (driver, Ray daemons and
actors, vLLM engine core and workers), grouped by role. At the end it reports:

* the least-squares slope of the total RSS (MiB per 1,000 steps and per hour) after warm-up, and per role;
* the queue and buffer gauges of metrics.jsonl, max over the second and over the last tenth of the run;
* any process of the session still alive a few seconds after the run exited (listed, then killed).

Writes <output_dir>/soak.json (all numbers and samples), soak_rss.png and grpo.log (the trainer's output).
Exits 0 only when the run exited 0, logged every step, left no process behind, no gauge grew, and the
RSS slope is under --max_rss_slope_mib_per_1k_steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
PROMPTS, SAMPLES, RESPONSE_LENGTH, PACK_LENGTH = 4, 4, 32, 128
BATCH = PROMPTS * SAMPLES
TRAIN_ARGS = [
    *("--num_unique_prompts_rollout", str(PROMPTS), "--num_samples_per_prompt_rollout", str(SAMPLES)),
    *("--response_length", str(RESPONSE_LENGTH), "--pack_length", str(PACK_LENGTH)),
    *("--max_prompt_token_length", "64", "--stop_strings", "</answer>", "--vllm_kv_cache_gib", "0.25"),
    *("--learning_rate", "3e-4", "--lr_scheduler_type", "constant", "--beta", "0", "--async_steps", "1"),
    # Evals and checkpoints are periodic spikes of their own; the soak is about the steady training loop.
    *("--num_evals", "0", "--save_freq", "0"),
]
# Gauges are read once per step, so they jitter by up to about one step's batch; a leak keeps growing.
GAUGE_SLACK = {
    "queue/prompt_depth": PROMPTS,
    "queue/result_depth": BATCH,
    "buffer/size_samples": BATCH,
    "buffer/size_tokens": BATCH * PACK_LENGTH,
    "buffer/reserved_samples": BATCH,
    "buffer/groups_complete": PROMPTS,
    "buffer/groups_incomplete": PROMPTS,
}


def parse_rss_mib(status_text: str) -> float | None:
    """VmRSS of a /proc/<pid>/status text in MiB; None for kernel threads and zombies (no VmRSS line)."""
    kib = next((line.split()[1] for line in status_text.splitlines() if line.startswith("VmRSS:")), None)
    return None if kib is None else int(kib) / 1024


def role_of(cmdline: str) -> str:
    """Short role from a NUL-separated cmdline. Ray retitles actors `ray::Class.method` while a method
    runs, so the method is cut off to keep one role per actor across samples."""
    argv = [a for a in cmdline.split("\0") if a]
    if not argv:
        return "?"
    if argv[0].startswith(("ray::", "VLLM::")):
        return argv[0].split()[0].split(".")[0]
    script = next((a for a in argv[1:] if a.endswith(".py")), None)
    return Path(script or argv[0]).name


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies are already dead and hold no memory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


def sample_rss(sid: int) -> dict[str, float]:
    """MiB of RSS per role over the session's processes; RSS counts shared pages in each process that
    maps them, which overstates the total but moves with it, and the slope is what matters here."""
    roles: dict[str, float] = {}
    for pid in session_pids(sid):
        try:
            rss = parse_rss_mib(Path(f"/proc/{pid}/status").read_text())
            role = role_of(Path(f"/proc/{pid}/cmdline").read_text())
        except OSError:  # exited between the listing and the read
            continue
        if rss is not None:
            roles[role] = roles.get(role, 0.0) + rss
    return roles


def fit_slope(xs: list[float], ys: list[float], scale: float = 1.0) -> float | None:
    """Least-squares slope of ys over xs, times `scale`; None with fewer than 3 points or no spread in xs."""
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return scale * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def rss_slopes(samples: list[dict], last_step: int, warmup_frac: float) -> dict:
    """Slopes over the steady part: samples while steps were running (not start-up, not shutdown,
    where processes come and go), less the first `warmup_frac` of them (allocators and caches filling)."""
    running = [s for s in samples if 1 <= s["step"] < last_step]
    kept = running[int(len(running) * warmup_frac) :]
    steps = [s["step"] for s in kept]
    hours = [s["t"] / 3600 for s in kept]
    roles = sorted({r for s in kept for r in s["roles"]})
    return {
        "samples_used": len(kept),
        "total_mib_per_1k_steps": fit_slope(steps, [s["total_mib"] for s in kept], scale=1000),
        "total_mib_per_hour": fit_slope(hours, [s["total_mib"] for s in kept]),
        "per_role_mib_per_1k_steps": {
            role: fit_slope(steps, [s["roles"].get(role, 0.0) for s in kept], scale=1000) for role in roles
        },
    }


def gauge_growth(rows: list[dict], slack: dict[str, float]) -> dict[str, dict]:
    """Max of each gauge over an early and the last tenth of the steps; grew = last > early + slack.

    The early tenth is the second one: queues start empty and fill during the first (a 20-step run read
    result_depth 0, 2 there and 16..19 everywhere after, which is no leak)."""
    tenth = max(1, len(rows) // 10)
    report = {}
    for key, allowed in slack.items():
        values = [r[key] for r in rows if key in r]
        if not values:
            continue
        early = values[tenth : 2 * tenth] or values[:tenth]
        first, last = max(early), max(values[-tenth:])
        report[key] = {"second_tenth_max": first, "last_tenth_max": last, "grew": last > first + allowed}
    return report


class MetricsTail:
    """Reads the lines appended to metrics.jsonl since the last call (the trainer writes one per step)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.rows, self.step_seen_at = path, 0, [], {}

    def poll(self, now: float) -> int:
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
            self.offset += len(complete)
            for line in filter(str.strip, complete.decode().splitlines()):
                self.rows.append(json.loads(line))
                self.step_seen_at[self.rows[-1]["training_step"]] = now
        return len(self.rows)


def run_and_sample(args, out: Path) -> tuple[int, int, list[dict], MetricsTail]:
    """Run grpo_fast.py in its own session, sampling RSS until it exits (or is killed at --timeout_s);
    returns the session id (the driver's pid), the exit code, the samples and the metrics read."""
    cmd = [sys.executable, str(REPO / "open_instruct" / "grpo_fast.py"), "--output_dir", str(out), *TRAIN_ARGS]
    cmd += ["--total_episodes", str(args.steps * BATCH), *args.extra]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    tail, samples, start = MetricsTail(out / "metrics.jsonl"), [], time.monotonic()
    with open(out / "grpo.log", "w") as log, tqdm(total=args.steps, unit="step") as bar:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            while proc.poll() is None and time.monotonic() - start < args.timeout_s:
                now = time.monotonic() - start
                bar.update(tail.poll(now) - bar.n)
                roles = sample_rss(proc.pid)
                samples.append({"t": now, "step": len(tail.rows), "total_mib": sum(roles.values()), "roles": roles})
                time.sleep(args.interval_s)
        except BaseException:  # Ctrl-C: the run must not outlive the soak
            reap_session(proc.pid, grace_s=0)
            raise
        finally:
            if proc.poll() is None:  # timed out: what it leaves behind is reported as leaked
                proc.kill()
            proc.wait()
        bar.update(tail.poll(time.monotonic() - start) - bar.n)
    return proc.pid, proc.returncode, samples, tail


def reap_session(sid: int, grace_s: float) -> list[dict]:
    """Processes of the session still alive `grace_s` after the driver exited: listed, then SIGKILLed."""
    deadline = time.monotonic() + grace_s
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    leaked = []
    for pid in session_pids(sid):
        try:
            leaked.append({"pid": pid, "cmdline": Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")})
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return leaked


def plot(samples: list[dict], path: Path) -> None:
    """RSS per role over the whole run by time (start-up and shutdown included) and over the running steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    running = [s for s in samples if 1 <= s["step"] < samples[-1]["step"]]  # as in the slope fit
    roles = sorted({r for s in samples for r in s["roles"]})
    for ax, part, x, label in ((axes[0], samples, "t", "seconds"), (axes[1], running, "step", "steps logged")):
        xs = [s[x] for s in part]
        ax.plot(xs, [s["total_mib"] for s in part], label="total", color="black", linewidth=2)
        for role in roles:
            ax.plot(xs, [s["roles"].get(role, 0.0) for s in part], label=role, linewidth=1)
        ax.set(xlabel=label, ylabel="RSS (MiB)")
    axes[0].legend(fontsize=7, loc="upper left", ncol=2)
    fig.suptitle("soak: RSS of the run's processes by role")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate(args, rc: int, tail: MetricsTail, samples: list[dict], leaked: list[dict], wall_s: float) -> dict:
    rows, logged = tail.rows, sorted({r["training_step"] for r in tail.rows})
    slopes = rss_slopes(samples, len(rows), args.warmup_frac)
    gauges = gauge_growth(rows, GAUGE_SLACK)
    seen = [tail.step_seen_at[s] for s in logged]
    slope = slopes["total_mib_per_1k_steps"]
    failures = [
        *([f"grpo_fast.py exited {rc}"] if rc != 0 else []),
        *([f"{len(logged)} of {args.steps} steps logged"] if logged != list(range(args.steps)) else []),
        *([f"{len(leaked)} processes left after exit"] if leaked else []),
        *[f"{k} grew: {g['second_tenth_max']} -> {g['last_tenth_max']}" for k, g in gauges.items() if g["grew"]],
        *(["too few RSS samples for a slope"] if slope is None else []),
        *([f"RSS slope {slope:.1f} MiB/1k steps"] if slope and slope > args.max_rss_slope_mib_per_1k_steps else []),
    ]
    step_s = [r["time/step_s"] for r in rows[1:] if "time/step_s" in r]  # step 0 includes engine warm-up
    return {
        "passed": not failures,
        "failures": failures,
        "exit_code": rc,
        "leaked": leaked,
        "gauges": gauges,
        "steps_requested": args.steps,
        "steps_logged": len(logged),
        "wall_s": wall_s,
        "rss": slopes,
        "startup_s": seen[0] if seen else None,  # to the first step logged: Ray, engine, learner, step 0
        "training_wall_s": seen[-1] - seen[0] if seen else None,
        "step_s_median": statistics.median(step_s) if step_s else None,
        "train_args": TRAIN_ARGS + args.extra,
    }


def summary_lines(r: dict) -> list[str]:
    rss, fmt = r["rss"], lambda v: "n/a" if v is None else f"{v:+.1f}"
    roles = ", ".join(f"{k} {fmt(v)}" for k, v in sorted(rss["per_role_mib_per_1k_steps"].items()))
    gauges = ", ".join(f"{k} {g['second_tenth_max']:g}->{g['last_tenth_max']:g}" for k, g in r["gauges"].items())
    step_s = "n/a" if r["step_s_median"] is None else f"{r['step_s_median']:.3f}"
    return [
        f"soak: {'PASSED' if r['passed'] else 'FAILED'}" + "".join(f"\n  - {f}" for f in r["failures"]),
        f"exit code {r['exit_code']}; {r['steps_logged']}/{r['steps_requested']} steps; wall {r['wall_s']:.0f} s: "
        f"start-up {r['startup_s'] or 0:.0f} s, steps {r['training_wall_s'] or 0:.0f} s; median step {step_s} s",
        f"RSS slope (total, {rss['samples_used']} samples after warm-up): "
        f"{fmt(rss['total_mib_per_1k_steps'])} MiB/1k steps, {fmt(rss['total_mib_per_hour'])} MiB/h",
        f"RSS slope per role (MiB/1k steps): {roles}",
        f"gauges, max second tenth -> last tenth: {gauges}",
        f"leaked processes: {len(r['leaked'])}" + "".join(f"\n  {p['pid']}: {p['cmdline'][:120]}" for p in r["leaked"]),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--output_dir", type=Path, default=Path("/tmp/soak"))
    parser.add_argument("--interval_s", type=float, default=2.0, help="seconds between RSS samples")
    parser.add_argument("--warmup_frac", type=float, default=0.2, help="running samples left out of the slope")
    parser.add_argument("--max_rss_slope_mib_per_1k_steps", type=float, default=50.0)
    parser.add_argument("--exit_grace_s", type=float, default=10.0, help="wait for the session to empty")
    parser.add_argument("--timeout_s", type=float, default=None, help="default: 600 s + 3 s per step")
    parser.add_argument("extra", nargs="*", help="more grpo_fast.py flags after --; later flags win")
    args = parser.parse_args()
    args.timeout_s = args.timeout_s or 600 + 3 * args.steps

    def stop_on_sigterm(signum, frame):  # `timeout` and job control send SIGTERM: reap the run as for Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "trained_prompts.jsonl"):  # the trainer appends to these
        (out / stale).unlink(missing_ok=True)
    started = time.monotonic()
    sid, rc, samples, tail = run_and_sample(args, out)
    wall_s = time.monotonic() - started
    leaked = reap_session(sid, args.exit_grace_s)
    report = evaluate(args, rc, tail, samples, leaked, wall_s)
    (out / "soak.json").write_text(json.dumps({**report, "samples": samples}, indent=1))
    if samples:
        plot(samples, out / "soak_rss.png")
    print("\n".join(summary_lines(report)))
    print(f"details: {out / 'soak.json'}, {out / 'soak_rss.png'}, trainer log {out / 'grpo.log'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
