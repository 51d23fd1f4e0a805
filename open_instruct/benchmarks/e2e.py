"""Benchmark: synchronous vs one-step-ahead async vs streaming training, same machine, same prompts.

One set of actors (vLLM engine, DeepSpeed learner, weight sync) runs the real training loop
(`orchestrator.TrainingLoop`) in each mode:

* synchronous      `--async_steps 0 --inflight_updates False`: admit a batch, wait for its
                   longest sample, train, sync (engines idle while the learner trains);
* one_step_async   `--async_steps 1 --inflight_updates False`: the next batch generates while
                   the learner trains; each sync waits for running samples to finish;
* streaming        `--async_steps 1 --inflight_updates True`: this project's design; samples
                   keep running through syncs with their KV cache; groups over
                   `--max_off_policy_steps` are requeued (`--off_policy_action requeue`);
* streaming_auto   `--async_steps auto --inflight_updates True`: streaming whose lookahead grows
                   while the learner waits (up to `--max_off_policy_steps`): more samples in flight
                   when they spend their time parked on tools; a draining sync cannot do this, as
                   every extra step ahead is more to wait for at each sync;
* streaming_reprefill: streaming with `--inflight_update_kv reprefill`: each sync aborts the
                   running samples, which keep their tokens and logprobs and continue after one
                   fresh prefill of prompt + tokens under the new weights (the approach of verl,
                   AReaL and slime), against streaming's kept KV cache;
* streaming_drop, streaming_downweight, streaming_mask: the same with `--off_policy_action drop` /
                   `downweight` / `mask`, to show what each action costs and how it biases trained
                   lengths (mask trains late groups whole, their too-old tokens as context only).

Measured so that a reader can trust a ratio (`rounds.py`): engine and learner each get their own
cores (`--pin`, through the CPU split of `--single_gpu_mode`: vLLM's engine process on one half, the
learner on the other, the engine actor's event loop and this driver beside the learner, as separate
GPUs would be), the modes run interleaved (A B C A B C) for `--rounds` rounds, and every number is
reported as the median over rounds with its min-max spread; a ratio of two modes is taken per round.
Each workload also gets its learner-bound ceiling: the rate of a learner that never waits, at the step
and sync times streaming measured.

Three workloads, each with the same prompts in every mode (a sample's shape is a function of
its id): `heavy_tail`, response lengths drawn from a lognormal (exact, ignore_eos); `tool_latency`,
shorter responses with a real tool call halfway through each sample (the production multi-turn
path: parser, http tool, observation tokens, next turn; the tool server answers after an
exponentially distributed wait, as APIs do); and `env_turns`, samples that play guess_number for
`--env_calls` turns through the real environment.

Per mode: trained samples/s, generated tokens/s, generation idle fraction, learner wait
fraction, weight-sync pause, staleness (version lag mean/max), the trained/generated length ratio.
Also measured (on the same pinned stack): the engine's decode time on heavy-tail batches of several
sizes at the start of every round (`--calibrate`), prefill speed, and learner step time vs tokens,
written as `measured.json` with each mode's median rate and the runs' prompts and lengths: the input
`open_instruct.benchmarks.simulator` fits its cost model on and replays to validate it. Writes `e2e.json`
and `e2e.md` (the tables, stamped with date, commit and machine), `timeline_<workload>.png` (engine
occupancy and learner steps over time, synchronous vs streaming, last round) and prints the tables.

    python -m open_instruct.benchmarks.e2e --output output/bench/e2e
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import threading
import time
from pathlib import Path

from open_instruct.benchmarks import rounds as rounds_lib
from open_instruct.benchmarks.calibration import step_rows
from open_instruct.benchmarks.stamp import describe, read_result, stamp
from open_instruct.benchmarks.workloads import LatencyToolServer, ShapedGenerationActor, ShapedWorkload, run_config
from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.messages import SamplingSettings
from open_instruct.prompt_feeder import make_request

logger = logging.getLogger(__name__)

MODES = {  # name -> (--async_steps, inflight_updates, inflight_update_kv, off_policy_action)
    "synchronous": ("0", False, "keep", "requeue"),
    "one_step_async": ("1", False, "keep", "requeue"),
    "streaming": ("1", True, "keep", "requeue"),
    "streaming_auto": ("auto", True, "keep", "requeue"),
    "streaming_reprefill": ("1", True, "reprefill", "requeue"),
    "streaming_drop": ("1", True, "keep", "drop"),
    "streaming_downweight": ("1", True, "keep", "downweight"),
    "streaming_mask": ("1", True, "keep", "mask"),
}


class TimedLearners:
    """The learner group, recording each step and its samples' engine intervals for the timeline plot, and each
    step's time against the batch's tokens (prompt + response of every sample, as the simulator charges them;
    the learner skips zero-advantage rows, so the fitted cost per token includes how many it skipped)."""

    def __init__(self, learners, timeline: list):
        self.learners, self.timeline = learners, timeline
        self.steps: list[dict] = []
        self.start_latencies: list[float] = []  # per trained sample: from its prompt's admission to its start

    def train_step(self, groups, step: int):
        from open_instruct.replay_buffer import sample_tokens

        report = self.learners.train_step(groups, step)
        self.timeline.append(("learner", report.started_at, report.finished_at))
        self.timeline += [(f"engine {c.engine_id}", c.started_at, c.finished_at) for g in groups for c in g.completions]
        self.start_latencies += [c.started_at - c.queued_at for g in groups for c in g.completions if c.queued_at]
        tokens = sum(sample_tokens(c) for g in groups for c in g.completions)
        self.steps.append({"tokens": tokens, "step_s": report.finished_at - report.started_at})
        return report

    def __getattr__(self, name: str):
        return getattr(self.learners, name)


class TimedSync:
    def __init__(self, sync, timeline: list):
        self.sync, self.timeline = sync, timeline

    def push(self, version: int, step_end_time: float | None = None) -> dict[str, float]:
        started = time.time()
        metrics = self.sync.push(version, step_end_time=step_end_time)
        self.timeline.append(("weight sync", started, time.time()))
        return metrics


class PeakMemory:
    """Peak PSS of this process and all its descendants (Ray, engines, learners), sampled in a thread."""

    def __init__(self, interval_s: float = 1.0):
        import psutil

        self.root = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for process in [self.root, *self.root.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    total += process.memory_full_info().pss
            self.peak = max(self.peak, total)
            self._stop.wait(interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def mode_config(base, mode: str, output_dir: Path):
    async_steps, inflight, kv, action = MODES[mode]
    generation = dataclasses.replace(
        base.generation, async_steps=async_steps, inflight_updates=inflight, inflight_update_kv=kv
    )
    return dataclasses.replace(
        base,
        generation=generation,
        staleness=dataclasses.replace(base.staleness, off_policy_action=action),
        run=dataclasses.replace(base.run, output_dir=str(output_dir)),
    )


def run_mode(stack, cfg, mode: str, tokenizer, rows) -> tuple[dict, list]:
    from open_instruct.orchestrator import SystemClock, TrainingLoop
    from open_instruct.tracking import RunLog

    sync = stack.sync.with_settings(generation=cfg.generation)
    stack.pool.ledger = DeliveryLedger()
    stack.pool.call_all("reset_stats")
    sync.push(0)  # every mode starts at version 0, so staleness numbers compare across modes
    timeline: list = []
    learners = TimedLearners(stack.learners, timeline)
    loop = TrainingLoop(
        cfg,
        engines=stack.pool,
        learners=learners,
        weight_sync=TimedSync(sync, timeline),
        clock=SystemClock(),
        log=RunLog(cfg),
        train_rows=rows,
        tokenizer=tokenizer,
    )
    loop.run()
    result = {"mode": mode, **measured_run(cfg, list(loop.log.history)), "learner_steps": learners.steps}
    result["start_latency_s_median"] = statistics.median(learners.start_latencies)
    result["learner_bound_samples_per_s"] = rounds_lib.learner_bound_samples_per_s(result)
    result["generation_bound_samples_per_s"] = rounds_lib.generation_bound_samples_per_s(result)
    return result, timeline


def measured_run(cfg, history: list[dict]) -> dict:
    """One mode's run, from its step metrics: rates, idle and wait fractions, staleness and length bias."""
    wall = sum(h["time/step_s"] for h in history)
    samples = cfg.rollout_batch_size * len(history)
    syncs = [h["time/weight_sync_pause_s"] for h in history if "time/weight_sync_pause_s" in h]
    return {
        "steps": len(history),
        "samples_per_step": cfg.rollout_batch_size,
        "wall_s": wall,
        "trained_samples_per_s": samples / wall,
        "generated_tokens_per_s": sum(h["perf/generated_tokens_per_s"] * h["time/step_s"] for h in history) / wall,
        "generation_idle_frac": sum(h["time/generation_idle_frac"] * h["time/step_s"] for h in history) / wall,
        "learner_wait_frac": sum(h["time/learner_wait_s"] for h in history) / wall,
        "weight_sync_pause_s_avg": sum(syncs) / len(syncs) if syncs else 0.0,
        "version_lag_avg": sum(h["staleness/version_lag_avg"] for h in history) / len(history),
        "version_lag_max": max(h["staleness/version_lag_max"] for h in history),
        "multi_version_frac": sum(h["staleness/multi_version_frac"] for h in history) / len(history),
        "token_lag_avg": sum(h["staleness/token_lag_avg"] for h in history) / len(history),
        "group_latency_s_avg": sum(h["time/group_latency_s_avg"] for h in history) / len(history),
        # < 1: the mode trained shorter samples than it generated (streaming trains stragglers late).
        "trained_to_generated_length_ratio": history[-1]["buffer/trained_to_generated_length_ratio"],
        # The same bias per token: response tokens of trained samples left out of the loss for their age (mask).
        "context_only_token_fraction": history[-1]["buffer/context_only_token_fraction"],
        "full_weight_token_age_max": history[-1]["buffer/full_weight_token_age_max"],
        "max_off_policy_steps": cfg.staleness_policy.flag_value,
        "off_policy_action": cfg.staleness_policy.action.value,
        "requeued_prompts": history[-1]["offpolicy/requeued_prompts_total"],
        "dropped_prompts": history[-1]["offpolicy/dropped_prompts_total"],
        "aborted_tokens": history[-1]["offpolicy/aborted_tokens_total"],
        # Prompt + kept tokens prefilled again after reprefill syncs (0 when the KV cache is kept).
        "reprefilled_samples": history[-1]["weight_sync/reprefilled_samples_total"],
        "reprefill_tokens": history[-1]["weight_sync/reprefill_tokens_total"],
        "buffer_peak_samples": max(h["buffer/size_samples"] for h in history),
        "buffer_cap_samples": cfg.replay_buffer_max_samples,
        **_agent_columns(history),
    }


def _agent_columns(history: list[dict]) -> dict:
    """Multi-turn workloads: calls and turns per sample, tool wait, and the share of sample time parked on tools."""
    if "agent/turns_per_sample" not in history[-1]:
        return {}

    def average(key: str) -> float:
        return sum(h.get(key, 0.0) for h in history) / len(history)

    return {
        "turns_per_sample": average("agent/turns_per_sample"),
        "tool_calls_per_sample": average("tools/aggregate/calls_per_sample"),
        "tool_runtime_s_avg": average("tools/aggregate/runtime_s_avg"),
        "tool_failures": sum(
            h.get("tools/aggregate/errors", 0.0) + h.get("tools/aggregate/timeouts", 0.0) for h in history
        ),
        "parked_on_tools_frac": average("time/parked_on_tools_frac"),
    }


def warm_up_engine(stack, rows, workload: ShapedWorkload) -> None:
    """The first requests of a fresh engine are several times slower (one-off set-up): not in any timing."""

    stack.pool.call_all("set_workload", workload)
    sampling = SamplingSettings(max_tokens=workload.max_tokens, ignore_eos=True)
    stack.pool.generate([make_request(rows[i], f"warmup:{i}", sampling, 1, 1, 0) for i in range(8)])


def calibrate_decode(stack, rows, workload: ShapedWorkload, batch_sizes: list[int], tag: str) -> list[dict]:
    """Engine 0 on one batch of each size, every sample as long as `workload` makes it (the heavy tail and its
    long contexts included), each sample generated and scored as in the training runs (`GenerationActor.generate`:
    the same per-sample path, without the prompt and result queues). The batches' prompt ids are their own
    (`tag` tells rounds apart): the training runs never see these lengths."""

    stack.pool.call_all("set_workload", workload)
    sampling = SamplingSettings(max_tokens=workload.max_tokens, ignore_eos=True)
    batches = []
    for index, size in enumerate(batch_sizes):
        requests = [
            make_request(rows[i % len(rows)], f"calib{tag}.{index}:{i}", sampling, 1, 1, 0) for i in range(size)
        ]
        started = time.monotonic()
        completions = stack.pool.generate(requests)
        elapsed = time.monotonic() - started
        samples = [[len(c.prompt_token_ids), len(c.response_token_ids)] for c in completions]
        batches.append({"samples": samples, "elapsed_s": elapsed, "round": tag})
    return batches


def measure_queue_overhead(stack, rows, prompts: int, samples_per_prompt: int, tag: str) -> dict:
    """The same short samples (8 tokens) once through the prompt and result queues the training runs use and
    once as a direct batch (`generate`): the difference, per sample, is what the queue path costs on top."""
    pool = stack.pool
    pool.call_all("set_workload", None)  # these requests carry their own exact length
    short = SamplingSettings(max_tokens=8, ignore_eos=True)

    def batch(name: str) -> list:
        return [make_request(rows[i], f"{name}{tag}:{i}", short, samples_per_prompt, 1, 0) for i in range(prompts)]

    pool.ledger = DeliveryLedger()
    pool.start_loops()
    started, expected, delivered = time.monotonic(), prompts * samples_per_prompt, 0
    pool.submit(batch("queued"))
    while delivered < expected:
        delivered += len(pool.poll(timeout_s=1.0))
    queue_s = time.monotonic() - started
    pool.stop("abort")
    started = time.monotonic()
    pool.generate(batch("direct"))
    return {"samples": expected, "queue_s": queue_s, "direct_s": time.monotonic() - started, "round": tag}


def measure_prefill(stack, rows) -> float:
    """Prompt tokens/s of engine 0 on 32 prompts of 8x a dataset prompt, one token each."""

    stack.pool.call_all("set_workload", None)  # these requests carry their own exact length
    long_prompt = dataclasses.replace(rows[0], prompt_token_ids=tuple(rows[0].prompt_token_ids) * 8)
    one_token = SamplingSettings(max_tokens=1, ignore_eos=True)
    requests = [make_request(long_prompt, f"prefill:{i}", one_token, 1, 1, 0) for i in range(32)]
    started = time.monotonic()
    stack.pool.generate(requests)
    return sum(len(r.prompt_token_ids) for r in requests) / (time.monotonic() - started)


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


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--median_tokens", type=int, default=48)
    parser.add_argument("--sigma", type=float, default=1.3)
    parser.add_argument("--max_tokens", type=int, default=1024)
    parser.add_argument("--tool_latency_s", type=float, default=1.5)
    parser.add_argument("--tool_median_tokens", type=int, default=32)
    parser.add_argument("--env_calls", type=int, default=2, help="guess_number turns per sample in env_turns")
    parser.add_argument("--workloads", nargs="+", default=["heavy_tail", "tool_latency", "env_turns"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=3, help="every mode runs once per round, interleaved")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engine and learner on their own cores (the CPU split of --single_gpu_mode)",
    )
    parser.add_argument("--max_off_policy_steps", type=int, default=2, help="the staleness bound of every mode")
    parser.add_argument(
        "--calibrate",
        type=int,
        nargs="*",
        default=[4, 8, 16, 32, 48, 64],
        help="sizes of the heavy-tail batches, run at the start of every round, that the simulator's decode cost "
        "is fitted on (none, or no heavy_tail workload: no measured.json)",
    )
    parser.add_argument("--output", default="output/bench/e2e")
    parser.add_argument(
        "--summarize",
        metavar="E2E_JSON",
        help="measure nothing: summarize the runs of an earlier e2e.json again (its stamp kept) into --output",
    )
    args = parser.parse_args(argv)
    if not {"synchronous", "streaming"} <= set(args.modes):
        parser.error("--modes must include synchronous and streaming: the benchmark reports their ratio")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


# Response tokens beyond a workload's model tokens: call texts and observations of the multi-turn workloads.
CALL_HEADROOM_TOKENS = 128


def base_config(args, out: Path, tool_flags: list[str]):
    """The grpo_fast flags every mode shares; modes differ only in the flags of `MODES` (mode_config)."""
    flags = {"max_off_policy_steps": args.max_off_policy_steps, "single_gpu_mode": args.pin, "output_dir": out}
    return run_config(args, args.max_tokens + CALL_HEADROOM_TOKENS, flags, tuple(tool_flags))


def summarize_workload(workload: dict, runs: dict[str, list[dict]]) -> dict:
    """Each mode's median and spread over the rounds, ratios per round, and the ceilings of streaming's runs:
    learner-bound (a learner that never waits), generation-bound (an engine that never idles) and the lower
    of the two, which binds."""
    sync = runs["synchronous"]
    ratios = {f"{mode}_vs_synchronous": rounds_lib.paired_ratio(r, sync) for mode, r in runs.items() if r is not sync}
    for other in ("one_step_async", "streaming_reprefill"):
        if other in runs:
            ratios[f"streaming_vs_{other}"] = rounds_lib.paired_ratio(runs["streaming"], runs[other])
    if {"streaming_auto", "one_step_async"} <= set(runs):
        ratios["streaming_auto_vs_one_step_async"] = rounds_lib.paired_ratio(
            runs["streaming_auto"], runs["one_step_async"]
        )
    for action in ("streaming_drop", "streaming_downweight", "streaming_mask"):  # against streaming (requeue)
        if action in runs:
            ratios[f"{action}_vs_streaming"] = rounds_lib.paired_ratio(runs[action], runs["streaming"])
    streaming = runs["streaming"]
    ceilings = [rounds_lib.pipeline_ceiling(r) for r in streaming]
    binding = statistics.mode(kind for _, kind in ceilings)  # which ceiling binds in most rounds
    return {
        "workload": workload,
        "modes": {mode: rounds_lib.summarize_mode(r) for mode, r in runs.items()},
        "ratios": ratios,
        "learner_bound_ceiling_samples_per_s": rounds_lib.spread(r["learner_bound_samples_per_s"] for r in streaming),
        "generation_bound_ceiling_samples_per_s": rounds_lib.spread(
            rounds_lib.generation_bound_samples_per_s(r) for r in streaming
        ),
        "ceiling_binding": binding,
        "streaming_of_ceiling": rounds_lib.spread(
            r["trained_samples_per_s"] / ceiling for r, (ceiling, _) in zip(streaming, ceilings)
        ),
        "speedup_streaming_vs_sync": ratios["streaming_vs_synchronous"]["median"],
        "runs": runs,
    }


def run_rounds(
    stack, base, workloads: dict[str, ShapedWorkload], tokenizer, rows, out: Path, args, calibration: dict | None
) -> dict:
    """Every (round, workload, mode) on the same actors and prompts, rounds outermost; the last round's
    synchronous and streaming timelines are drawn. With `calibration`, each round starts with the decode
    calibration batches and the queue path's overhead (added to its "decode" and "queue_overhead"), so
    that a machine whose speed drifts moves them and the modes alike, and the heavy-tail runs' engine steps
    go to its "engine_steps"."""
    from tqdm import tqdm

    runs = {name: {mode: [] for mode in args.modes} for name in args.workloads}
    timelines: dict[str, dict] = {name: {} for name in args.workloads}
    order = rounds_lib.interleaved(args.rounds, args.workloads, args.modes)
    current, calibrated_round = None, None
    for round_index, name, mode in tqdm(order, desc="e2e runs", unit="run"):
        if calibration is not None and round_index != calibrated_round:
            heavy = workloads["heavy_tail"]
            calibration["decode"] += calibrate_decode(stack, rows, heavy, args.calibrate, str(round_index))
            overhead = measure_queue_overhead(stack, rows, 4 * args.prompts, args.samples, str(round_index))
            calibration["queue_overhead"].append(overhead)
            calibrated_round, current = round_index, None
        if name != current:
            stack.pool.call_all("set_workload", workloads[name])
            current = name
        logger.info("round %d, workload %s, mode %s", round_index, name, mode)
        cfg = mode_config(base, mode, out / name / f"round{round_index}" / mode)
        traced = calibration is not None and name == "heavy_tail"
        if traced:
            stack.pool.call_all("start_step_trace")
        result, timelines[name][mode] = run_mode(stack, cfg, mode, tokenizer, rows)
        if traced:
            steps = [row for trace in stack.pool.call_all("take_step_trace") for row in step_rows(trace)]
            calibration["engine_steps"].append({"mode": mode, "round": round_index, "steps": steps})
        runs[name][mode].append({**result, "round": round_index})
    for name in args.workloads:
        plot_timeline(
            {m: timelines[name][m] for m in ("synchronous", "streaming")},
            out / f"timeline_{name}.png",
            f"{name}: synchronous vs streaming (same prompts, round {args.rounds - 1})",
        )
    return {name: summarize_workload(dataclasses.asdict(workloads[name]), runs[name]) for name in args.workloads}


def measured_for_simulator(args, calibration: dict, heavy: dict, max_running: int, replay: dict) -> dict:
    """What `calibration.fit_cost_model` fits (see its docstring) and each mode's measured median, from the
    heavy-tail workload's runs, with what `simulation_replay.Replay` needs to replay their prompts and lengths."""
    runs = heavy["runs"]
    return {
        **calibration,
        "replay": replay,
        "learner": [s for mode_runs in runs.values() for run in mode_runs for s in run["learner_steps"]],
        "weight_sync_pause_s": heavy["modes"]["streaming"]["weight_sync_pause_s_avg"]["median"],
        # streaming's: its engine has room when prompts come, so the latency is the queue's and the pull's alone
        "start_latency_s": statistics.median(run["start_latency_s_median"] for run in runs["streaming"]),
        "max_running": max_running,
        "num_learners": 1,
        "workload": {
            "prompts_per_step": args.prompts,
            "samples_per_prompt": args.samples,
            "num_steps": args.steps,
            "prompt_tokens": 20,
            "median_tokens": args.median_tokens,
            "sigma": args.sigma,
            "max_tokens": args.max_tokens,
            "tool_latency_s": 0.0,
        },
        "cluster": {"num_engines": 1, "num_learners": 1},
        "max_off_policy_steps": args.max_off_policy_steps,
        "pinned": args.pin,
        "rounds": args.rounds,
        "measured_speedup_streaming_vs_sync": heavy["speedup_streaming_vs_sync"],
        "measured_trained_samples_per_s": {
            mode: summary["trained_samples_per_s"] for mode, summary in heavy["modes"].items()
        },
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.summarize:
        return summarize_again(Path(args.summarize), Path(args.output))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from open_instruct.cluster import Stack
    from open_instruct.data import dataset as data
    from open_instruct.data.models import load_tokenizer, resolve_model_path

    workloads = {
        "heavy_tail": ShapedWorkload("heavy_tail", args.median_tokens, args.sigma, args.max_tokens),
        "tool_latency": ShapedWorkload(
            "tool_latency", args.tool_median_tokens, 0.5, args.max_tokens, args.tool_latency_s
        ),
        "env_turns": ShapedWorkload(
            "env_turns", args.tool_median_tokens, 0.5, args.max_tokens, env_calls=args.env_calls
        ),
    }
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    tool_server = LatencyToolServer(args.tool_latency_s)
    base = base_config(args, out, tool_server.tool_flags())
    tokenizer = load_tokenizer(base.model)
    rows = data.load_prompt_dataset(base.train_data, base.model, tokenizer, "train", {}, seed=1).prompts
    results: dict = {"stamp": stamp("e2e"), "rounds": args.rounds, "pinned": args.pin, "workloads": {}}
    with PeakMemory() as memory:
        stack = Stack(base, resolve_model_path(None), tokenizer.pad_token_id, ShapedGenerationActor, (None,))
        if args.pin and stack.placement.learner_cores:
            # The driver (the training loop and its Ray calls) beside the learner, off the engine's core.
            os.sched_setaffinity(0, stack.placement.learner_cores)
        try:
            warm_up_engine(stack, rows, workloads["heavy_tail"])
            calibration = None
            if args.calibrate and "heavy_tail" in args.workloads:
                calibration = {
                    "decode": [],
                    "queue_overhead": [],
                    "engine_steps": [],
                    "prefill_tokens_per_s": measure_prefill(stack, rows),
                    "kv_block_tokens": stack.pool.start_info[0].kv_block_tokens,
                }
            max_running = stack.pool.start_info[0].target_concurrency
            results["workloads"] = run_rounds(stack, base, workloads, tokenizer, rows, out, args, calibration)
        finally:
            stack.close()
            tool_server.close()
    results["peak_memory_gib"] = memory.peak / 2**30
    (out / "e2e.json").write_text(json.dumps(results, indent=1))
    if calibration is not None:
        from open_instruct.benchmarks.simulation_replay import Replay

        replay = Replay.of_rows(base.run.seed, rows, workloads["heavy_tail"]).as_json()
        heavy_runs = results["workloads"]["heavy_tail"]
        measured = measured_for_simulator(args, calibration, heavy_runs, max_running, replay)
        (out / "measured.json").write_text(json.dumps({**measured, "stamp": results["stamp"]}, indent=1))
    write_report(results, out)
    print(f"peak memory (PSS, all processes): {results['peak_memory_gib']:.2f} GiB; wrote {out / 'e2e.json'}")
    return results


def write_report(results: dict, out: Path) -> None:
    report = format_report(results)
    title = "# Streaming vs synchronous training: measured tables\n\n"
    (out / "e2e.md").write_text(f"{title}{describe(results['stamp'])}\n\n```\n{report}\n```\n")
    print(report)


def summarize_again(path: Path, out: Path) -> dict:
    """The summaries of an e2e.json's runs recomputed by this code (a new ceiling or ratio needs no new run)."""
    results = read_result(path, "e2e")
    for name, workload in results["workloads"].items():
        runs = workload["runs"]
        for mode_runs in runs.values():
            for run in mode_runs:
                run["generation_bound_samples_per_s"] = rounds_lib.generation_bound_samples_per_s(run)
        results["workloads"][name] = summarize_workload(workload["workload"], runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps(results, indent=1))
    write_report(results, out)
    return results


_COLUMNS = (  # (title, key, format): median [min-max] over the rounds
    ("samples/s", "trained_samples_per_s", ".2f"),
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


if __name__ == "__main__":
    main()
