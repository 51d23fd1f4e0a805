"""The e2e benchmark's runs: each mode of the real training loop on one stack, interleaved in rounds, with the
engine's decode and prefill calibrated and the learner's step timed (`e2e` is the command, `e2e_reports` the
tables and plots)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
import threading
import time
from pathlib import Path

from benchmarks import rounds as rounds_lib
from benchmarks.calibration import step_rows
from benchmarks.e2e_reports import plot_timeline
from benchmarks.workloads import ShapedWorkload
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


class TimedWeightSync:
    def __init__(self, sync, timeline: list):
        self.inner, self.timeline = sync, timeline

    def sync(self, version: int, step_end_time: float | None = None) -> dict[str, float]:
        started = time.time()
        metrics = self.inner.sync(version, step_end_time=step_end_time)
        self.timeline.append(("weight sync", started, time.time()))
        return metrics


class PeakMemory:
    """Peak PSS of this process and all its descendants (Ray, engines, learners), sampled in a thread: in all
    (`peak`) and per role (`peak_by_role`): the driver, each kind of Ray actor with everything under it (an
    engine actor's vLLM process), and Ray's own daemons."""

    def __init__(self, interval_s: float = 1.0):
        import psutil

        self.root = psutil.Process()
        self.peak = 0
        self.peak_by_role: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        import psutil

        while not self._stop.is_set():
            seen = {}  # pid -> (parent pid, process title, PSS)
            for process in [self.root, *self.root.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    title = (process.cmdline() or [""])[0]
                    seen[process.pid] = (process.ppid(), title, process.memory_full_info().pss)
            by_role: dict[str, int] = {}
            for pid, (_, _, pss) in seen.items():
                role = process_role(pid, seen, self.root.pid)
                by_role[role] = by_role.get(role, 0) + pss
            self.peak = max(self.peak, sum(by_role.values()))
            for role, pss in by_role.items():
                self.peak_by_role[role] = max(self.peak_by_role.get(role, 0), pss)
            self._stop.wait(interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


RAY_OWN_PROCESSES = ("IDLE", "DashboardAgent", "RuntimeEnvAgent")  # titled `ray::...` like actors


def process_role(pid: int, processes: dict[int, tuple[int, str, int]], driver_pid: int) -> str:
    """ "driver", the class of the Ray actor the process is or runs under (an actor's process title is
    `ray::Class.method`), or "ray daemons" (Ray's own processes and idle workers). `processes`: pid -> (parent
    pid, title, PSS) of the driver's tree."""
    if pid == driver_pid:
        return "driver"
    while pid in processes and pid != driver_pid:
        parent, title, _ = processes[pid]
        actor = title.removeprefix("ray::").split(".")[0].split(" ")[0] if title.startswith("ray::") else ""
        if actor and actor not in RAY_OWN_PROCESSES:
            return actor
        pid = parent
    return "ray daemons"


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
    sync.sync(0)  # every mode starts at version 0, so staleness numbers compare across modes
    timeline: list = []
    learners = TimedLearners(stack.learners, timeline)
    loop = TrainingLoop(
        cfg,
        engines=stack.pool,
        learners=learners,
        weights=TimedWeightSync(sync, timeline),
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
        # The KV cache outgrown: requests vLLM preempted and the prompt + tokens it prefilled again for them.
        "preempted_requests": history[-1]["engines/preempted_requests_total"],
        "recomputed_tokens": history[-1]["engines/recomputed_tokens_total"],
        "versions_spanned_max": max(h["staleness/versions_spanned_max"] for h in history),
        "longest_sample_tokens": max(h["val/sequence_lengths_max"] for h in history),
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
    """The first requests of a fresh engine are several times slower (one-off set-up): not in any timing. At
    most 1,024 tokens a sample: the set-up is done by then, and real lengths would take minutes."""
    workload = dataclasses.replace(
        workload, median_tokens=min(workload.median_tokens, 256), max_tokens=min(workload.max_tokens, 1024)
    )
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


# Response tokens beyond a workload's model tokens: call texts and observations of the multi-turn workloads.
CALL_HEADROOM_TOKENS = 128


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
