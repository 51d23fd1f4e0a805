"""Benchmark: how many samples a second one driver can take in, and the largest cluster it serves.

Every finished sample of a run passes through one process: the driver polls it off the result queue actor,
files it in the replay buffer under the staleness policy, and assembles (advantages, packing, the split over
ranks) and ships each step's batch to the learners. Here that path runs for real, the production
`TrainingLoop`, `EnginePool`, result queue actor, `ReplayBuffer` and `LearnerGroup` on a local Ray cluster, with
stand-ins only at its two ends: engine actors that answer each prompt at once with samples of the long-reasoning
lengths (16 per prompt, lognormal around 4,000 tokens, capped at 16k), and learner actors that
return at once. Nothing else limits the rate, so the driver's own cost is what is measured: its CPU seconds
per trained sample (all its threads; Ray's serialisation included) and the queue actors' (another process,
and one more single-threaded stage), and where the driver's time goes (a profiled pass).

The loop is serial: the driver does not take in samples while the learners train, so a step costs the learner
time plus the driver's time for the step's samples. At a cluster whose engines and learners would train R
samples/s, one driver of c seconds per sample trains 1 / (1/R + c) samples/s, and it keeps up only while 1/c
exceeds R. R and the rate with this driver come from the simulator (its `CostModel.driver_per_sample_s` adds c
per sample to every step), the long-reasoning shape (48 GPUs) scaled to 64, 256 and 1,024 GPUs; the closed form
checks it.

    python -m benchmarks.driver_headroom --output output/bench/driver_headroom
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import logging
import pstats
import random
import statistics
import time
from pathlib import Path

from benchmarks.rounds import spread
from benchmarks.simulated_world import Cluster, Workload
from benchmarks.simulation_projection import LONG_REASONING_CLUSTER, LONG_REASONING_GPUS, LONG_REASONING_WORKLOAD
from benchmarks.stamp import results_page, stamp
from open_instruct.messages import (
    Completion,
    EngineStats,
    EngineStopped,
    LearnerReady,
    LearnerStepResult,
    PromptStarted,
    VersionSpan,
)

logger = logging.getLogger(__name__)

CLUSTER_GPUS = (64, 256, 1024)
# Where the driver's time goes: (label, file suffix, function) of the profile's cumulative times, outermost first
# within the step; each stage's own share is its cumulative time less the stages nested in it.
STAGES = (
    ("poll: result queue and unpickling", "generation/pool.py", "poll"),
    ("replay buffer: add, evict, take", "replay_buffer.py", "add"),
    ("assemble: advantages and packing", "batching.py", "assemble"),
    ("learner handle: batch transfer", "learner/group.py", "train_step"),
)


def long_reasoning_workload(prompts_per_step: int, num_steps: int, max_tokens: int = 0) -> Workload:
    """The long-reasoning lengths and group size; `max_tokens` shrinks the cap (and the median with it)."""
    w = LONG_REASONING_WORKLOAD
    if max_tokens and max_tokens < w.max_tokens:
        scale = max_tokens / w.max_tokens
        w = dataclasses.replace(w, max_tokens=max_tokens, median_tokens=max(1, round(w.median_tokens * scale)))
        w = dataclasses.replace(w, prompt_tokens=max(1, round(w.prompt_tokens * scale)))
    return dataclasses.replace(w, prompts_per_step=prompts_per_step, num_steps=num_steps)


class InstantEngine:
    """An engine actor's contract with the pool (`run`, `stats`, `stop`, `abort_stale`, `shutdown`), answering
    every prompt at once: its samples have the workload's lengths, random token ids and logprobs, and rewards
    that differ within a group (so no group is filtered). The result queue's capacity is its only brake."""

    def __init__(self, engine_id: int, workload: Workload):
        rng = random.Random(engine_id)
        self.engine_id, self.workload = engine_id, workload
        self.tokens = tuple(rng.randrange(150_000) for _ in range(workload.max_tokens))
        self.logprobs = tuple(-rng.random() for _ in range(workload.max_tokens))
        self.lengths = random.Random(1000 + engine_id)
        self.completed = self.pulled = 0
        self._stopping = False

    async def run(self, prompts, results):
        from open_instruct.generation.channels import ChannelTimeout

        self._stopping = False
        while not self._stopping:
            try:
                request = await prompts.get_async(timeout=0.2)
            except ChannelTimeout:
                continue
            self.pulled += 1
            await self._push(results, PromptStarted(request.prompt_id, self.engine_id))
            for j in request.samples_to_generate():
                await self._push(results, self.sample(request, j))
        return self.completed

    async def _push(self, results, message) -> None:
        """Into the result queue as soon as it has room; a stop (the run's end) drops what is left."""
        from open_instruct.generation.channels import ChannelTimeout

        while not self._stopping:
            try:
                return await results.put_async(message, timeout=0.2)
            except ChannelTimeout:
                continue

    def sample(self, request, j: int) -> Completion:
        w = self.workload
        length = max(1, min(w.max_tokens, round(w.median_tokens * self.lengths.lognormvariate(0.0, w.sigma))))
        self.completed += 1
        return Completion.of_request(
            request,
            j,
            self.engine_id,
            response_token_ids=self.tokens[:length],
            behaviour_logprobs=self.logprobs[:length],
            finish_reason="length" if length == w.max_tokens else "stop",
            version_spans=(VersionSpan(request.admitted_version, 0, length),),
            reward=float(j % 2),
        )

    def stats(self) -> EngineStats:
        return EngineStats(self.engine_id, 0, 0, 0, 0.0, 0, self.completed, self.pulled, 0.0, 0.0, 0.0, 0.0, 0, 0)

    def stop(self, mode: str = "finish") -> EngineStopped:
        self._stopping = True
        return EngineStopped(self.engine_id, mode, 0, 0, self.completed)

    def abort_stale(self, min_version: int, prompt_ids) -> int:
        return 0

    def shutdown(self) -> None:
        self._stopping = True


class InstantLearner:
    """A learner rank that takes its batch (Ray delivers it whole) and returns at once."""

    def __init__(self, rank: int):
        self.rank = rank

    def rendezvous_address(self, hold: bool = True) -> tuple[str, int]:
        return "127.0.0.1", 0

    def setup(self, host: str, port: int) -> LearnerReady:
        import os

        return LearnerReady(self.rank, os.getpid(), zero_stage=0)

    def train_step(self, batch) -> LearnerStepResult:
        rows = sum(len(micro) for micro in batch.micro_batches)
        return LearnerStepResult(self.rank, {"learner/rows": float(rows)})


class NoWeightSync:
    def sync(self, version: int, step_end_time: float | None = None) -> dict[str, float]:
        return {}


@dataclasses.dataclass
class DriverRun:
    trained_samples: int
    trained_tokens: int
    wall_s: float
    driver_cpu_s: float
    queue_cpu_s: float

    @property
    def driver_cpu_per_sample_s(self) -> float:
        return self.driver_cpu_s / self.trained_samples

    @property
    def queue_cpu_per_sample_s(self) -> float:
        return self.queue_cpu_s / self.trained_samples


def _queue_actor_cpu_s() -> float:
    """CPU seconds so far of the queue actors' processes (the prompt and the result queue)."""
    import psutil

    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        if any("_QueueActor" in part for part in process.info["cmdline"] or ()):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def loop_config(workload: Workload, ranks: int, async_steps: int):
    from benchmarks.simulation import loop_config as simulated_loop_config

    cfg = simulated_loop_config(workload, async_steps, "keep")
    return dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, num_learners_per_node=[ranks]))


def drive(workload: Workload, engines: int, ranks: int, async_steps: int, profile: Path | None = None) -> DriverRun:
    """One run of the real loop between instant engines and learners; with `profile`, under cProfile (its CPU
    time is then the profiler's too: only the profile's shares are read from such a run)."""
    import ray

    from benchmarks.simulation_replay import SimPrompt
    from open_instruct.batching import BatchSettings
    from open_instruct.generation.pool import EnginePool
    from open_instruct.learner.group import LearnerGroup
    from open_instruct.orchestrator import SystemClock, TrainingLoop
    from open_instruct.tracking import MemoryLog

    cfg = loop_config(workload, ranks, async_steps)
    per_step = workload.prompts_per_step * workload.samples_per_prompt
    engine_class, learner_class = ray.remote(num_cpus=0)(InstantEngine), ray.remote(num_cpus=0)(InstantLearner)
    pool = EnginePool([engine_class.remote(i, workload) for i in range(engines)], 0, result_capacity=per_step)
    learners = LearnerGroup([learner_class.remote(r) for r in range(ranks)], BatchSettings.from_config(cfg, 0))
    pool.stats(), learners.setup()  # every actor started before the clock does
    prompt = tuple(range(1, workload.prompt_tokens + 1))
    epoch = (workload.num_steps + async_steps + 1) * workload.prompts_per_step
    rows = [SimPrompt(f"p{i}", prompt) for i in range(epoch)]
    log = MemoryLog()
    loop = TrainingLoop(
        cfg, engines=pool, learners=learners, weights=NoWeightSync(), clock=SystemClock(), log=log, train_rows=rows
    )
    # The main thread's CPU only: the loop's waits on the learners and the queues are not driver cost.
    profiler = cProfile.Profile(time.thread_time) if profile else None
    queue_before, cpu_before, wall_before = _queue_actor_cpu_s(), time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    loop.run()
    if profiler:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall_before, time.process_time() - cpu_before
    queue = _queue_actor_cpu_s() - queue_before
    if profiler:
        profiler.dump_stats(str(profile))
    pool.shutdown()
    for actor in learners.actors:
        ray.kill(actor)
    trained = len(log.history) * per_step
    tokens = sum(int(h["perf/trained_tokens"]) for h in log.history)
    return DriverRun(trained, tokens, wall, cpu, queue)


def _cumulative_s(stats: pstats.Stats, file_suffix: str, function: str) -> float:
    return sum(
        entry[3] for (file, _, name), entry in stats.stats.items() if name == function and file.endswith(file_suffix)
    )


def time_shares(profile: Path) -> dict[str, float]:
    """The driver's time in the loop by stage, as shares of the loop's whole (cProfile's cumulative times; the
    batch transfer is the learner handle's step less its assembly)."""
    stats = pstats.Stats(str(profile))
    total = _cumulative_s(stats, "orchestrator.py", "run")
    assemble = _cumulative_s(stats, "batching.py", "assemble")
    stages = {
        "poll: result queue, unpickling, delivery ledger": _cumulative_s(stats, "generation/pool.py", "poll"),
        "replay buffer: add, evict, take": sum(
            _cumulative_s(stats, "replay_buffer.py", name) for name in ("add", "evict", "take")
        ),
        "assemble: advantages, masks, packing": assemble,
        "learner handle: batch transfer": _cumulative_s(stats, "learner/group.py", "train_step") - assemble,
        "metrics: rollout and buffer gauges": sum(
            _cumulative_s(stats, "metrics.py", name) for name in ("rollout_metrics", "agent_metrics")
        ),
    }
    stages["the rest of the loop"] = total - sum(stages.values())
    return {name: seconds / total for name, seconds in stages.items()}


@dataclasses.dataclass(frozen=True)
class ClusterRow:
    gpus: int
    engines: int
    learners: int
    cluster_samples_per_s: float  # what the simulator trains on its engines and learners, the driver free
    headroom: float  # the driver's and the queue's capacity over that rate
    simulated_samples_per_s: float  # what the simulator trains with this driver's cost per sample in every step
    serial_loop_samples_per_s: float  # the same in closed form: 1 / (1/R + c)


def scaled_shape(gpus: int, steps: int) -> tuple[Cluster, Workload]:
    """The long-reasoning cluster scaled to `gpus`: engines and learners at its 2 : 1, and its prompts per
    step in proportion, so that each engine has as many samples running as at its own size."""
    engines = round(gpus * LONG_REASONING_CLUSTER.num_engines / LONG_REASONING_GPUS)
    prompts = round(LONG_REASONING_WORKLOAD.prompts_per_step * gpus / LONG_REASONING_GPUS)
    workload = dataclasses.replace(LONG_REASONING_WORKLOAD, num_steps=steps, prompts_per_step=prompts)
    return Cluster(num_engines=engines, num_learners=gpus - engines), workload


def simulated_rate(cluster: Cluster, workload: Workload, driver_per_sample_s: float = 0.0) -> float:
    """Trained samples/s the simulator projects (streaming, async_steps 8, the assumed H100 costs) with a driver
    of that cost per sample (0: free)."""
    from benchmarks.simulation import simulate
    from benchmarks.simulation_projection import GPU_H100_COST

    cost = dataclasses.replace(GPU_H100_COST, driver_per_sample_s=driver_per_sample_s)
    return simulate("streaming", workload, cost, cluster, 8).steady_trained_samples_per_s


def cluster_rows(steps: int, driver_s: float, queue_s: float, rate=simulated_rate) -> list[ClusterRow]:
    """The long-reasoning shape scaled to each size in CLUSTER_GPUS and simulated, with a free driver and with
    this one (`rate`: `simulated_rate`, or a stand-in of its signature)."""
    capacity = 1.0 / max(driver_s, queue_s)
    rows = []
    for gpus in CLUSTER_GPUS:
        cluster, workload = scaled_shape(gpus, steps)
        free = rate(cluster, workload)
        rows.append(
            ClusterRow(
                gpus,
                cluster.num_engines,
                cluster.num_learners,
                free,
                capacity / free,
                rate(cluster, workload, driver_s),
                1.0 / (1.0 / free + driver_s),
            )
        )
    return rows


def _ms(values: dict[str, float]) -> str:
    return f"{values['median'] * 1e3:.2f} ms [{values['min'] * 1e3:.2f}-{values['max'] * 1e3:.2f}]"


def format_report(
    runs: list[DriverRun], shares: dict[str, float], rows: list[ClusterRow], at_shape: dict, steps: int
) -> str:
    driver = spread(r.driver_cpu_per_sample_s for r in runs)
    queue = spread(r.queue_cpu_per_sample_s for r in runs)
    closed_form = 1.0 / (1.0 / at_shape["free"] + driver["median"])
    samples, tokens = sum(r.trained_samples for r in runs), sum(r.trained_tokens for r in runs)
    lines = [
        f"driver, {len(runs)} round(s) of {runs[0].trained_samples} samples trained "
        f"({tokens / samples:,.0f} tokens each on average), {statistics.median(r.wall_s for r in runs):.1f} s each "
        "on this machine, everything sharing its cores; per sample, median [min-max] over the rounds:",
        f"  driver CPU: {_ms(driver)} -> at most {1 / driver['median']:,.0f} samples/s, "
        f"{tokens / samples / driver['median']:,.0f} tokens/s on one core",
        f"  queue actors' CPU: {_ms(queue)} -> at most {1 / queue['median']:,.0f} samples/s",
        "where the driver's time goes (a profiled run, the main thread's CPU):",
        *(f"  {name:50s} {share:6.1%}" for name, share in shares.items()),
        f"the simulator at the long-reasoning shape ({LONG_REASONING_GPUS} GPUs, streaming, async_steps 8): "
        f"{at_shape['free']:.2f} samples/s with a free driver, {at_shape['driver']:.2f} with this one "
        f"(closed form 1 / (1/R + c): {closed_form:.2f})",
        f"one driver against that cluster at each size, simulated ({steps} steps each; headroom: the driver's or "
        "the queue's capacity, the lower, over what the cluster trains with a free driver):",
        f"  {'GPUs':>5} {'engines':>7} {'learners':>8} {'free driver samples/s':>21} {'headroom':>8} "
        f"{'with this driver':>16} {'closed form':>11}",
    ]
    for row in rows:
        realised = row.simulated_samples_per_s / row.cluster_samples_per_s
        lines.append(
            f"  {row.gpus:>5} {row.engines:>7} {row.learners:>8} {row.cluster_samples_per_s:>21.1f} "
            f"{row.headroom:>7.2f}x {row.simulated_samples_per_s:>9.1f} ({realised:4.0%}) "
            f"{row.serial_loop_samples_per_s:>11.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="output/bench/driver_headroom")
    parser.add_argument("--engines", type=int, default=4, help="instant engine actors")
    learners, group = LONG_REASONING_CLUSTER.num_learners, LONG_REASONING_WORKLOAD.samples_per_prompt
    parser.add_argument(
        "--ranks", type=int, default=learners, help="instant learner ranks (as many as the long-reasoning shape)"
    )
    parser.add_argument("--prompts_per_step", type=int, default=16, help=f"of {group} samples each")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--async_steps", type=int, default=2)
    cap = LONG_REASONING_WORKLOAD.max_tokens
    parser.add_argument(
        "--max_tokens",
        type=int,
        default=cap,
        help="the length cap (the long-reasoning one by default; the median scales with it)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="measured runs (a profiled one follows)")
    parser.add_argument("--projection_steps", type=int, default=16, help="steps simulated at the long-reasoning shape")
    # A quarter of them warm-up; 1,024 GPUs simulate 87k samples a step, minutes each on one core.
    parser.add_argument("--cluster_steps", type=int, default=8, help="steps simulated at each cluster size")
    args = parser.parse_args(argv)
    from open_instruct.cluster import init_ray, shutdown_ray

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    workload = long_reasoning_workload(args.prompts_per_step, args.steps, args.max_tokens)
    init_ray()
    try:
        runs = [drive(workload, args.engines, args.ranks, args.async_steps) for _ in range(args.rounds)]
        drive(workload, args.engines, args.ranks, args.async_steps, profile=out / "driver.prof")
    finally:
        shutdown_ray()
    shares = time_shares(out / "driver.prof")
    driver_s = statistics.median(r.driver_cpu_per_sample_s for r in runs)
    queue_s = statistics.median(r.queue_cpu_per_sample_s for r in runs)
    shape = scaled_shape(LONG_REASONING_GPUS, args.projection_steps)
    at_shape = {"free": simulated_rate(*shape), "driver": simulated_rate(*shape, driver_s)}
    rows = cluster_rows(args.cluster_steps, driver_s, queue_s)
    policy = loop_config(workload, args.ranks, args.async_steps).staleness_policy.describe()
    report = {
        "stamp": stamp("driver_headroom", policy),
        "workload": dataclasses.asdict(workload),
        "engines": args.engines,
        "ranks": args.ranks,
        "runs": [dataclasses.asdict(r) for r in runs],
        "driver_cpu_per_sample_s": spread(r.driver_cpu_per_sample_s for r in runs),
        "queue_cpu_per_sample_s": spread(r.queue_cpu_per_sample_s for r in runs),
        "time_shares": shares,
        "long_reasoning_samples_per_s": at_shape,
        "clusters": [dataclasses.asdict(row) for row in rows],
    }
    (out / "driver_headroom.json").write_text(json.dumps(report, indent=2))
    with results_page(out / "driver_headroom.md", "One driver's headroom", report["stamp"]):
        print(format_report(runs, shares, rows, at_shape, args.cluster_steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
