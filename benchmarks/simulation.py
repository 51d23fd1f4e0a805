"""Discrete-event simulator of the training pipeline, for cluster-scale projections.

What it answers: how much faster is streaming (in-flight weight sync, `async_steps` ahead) than
synchronous GRPO, or one-step-async with a draining sync, on a cluster we do not have, given
per-engine and per-learner costs measured on one we do (`calibration.fit_cost_model`). Time is
virtual (no sleeping); a 32-engine x 256-running, 4096-samples-per-step run of 40 steps takes
seconds.

It runs the real training loop, `orchestrator.TrainingLoop`, with the real `PromptFeeder`,
`ReplayBuffer` and metrics; only the loop's collaborators are simulated (`simulated_stack`):
engines, learners and the weight sync, driven by cost models on a virtual clock. A change to
the loop therefore shows up in projections without a second edit.

Modes: `synchronous` is async_steps 0 with a draining sync (engines idle while the learner
trains), `one_step_async` async_steps 1 with a draining sync, `streaming` any async_steps with
in-flight updates.

Metric definitions (`SimResult`)
* `generation_idle_frac`: engine-time producing no tokens (no sample running, or paused for a
  sync, kept samples or not) over `num_engines * wall_s`. Draining with samples running is busy.
* `engine_underfilled_frac`: engine-time with fewer than `max_running` samples running, or
  paused, over `num_engines * wall_s` (idle time is underfilled too).
* `learner_wait_frac`: learner time waiting for a full batch (the loop's `time/learner_wait_s`),
  over `wall_s`.
* `weight_sync_pause_s_avg`: from the end of a train step to the engines' resume (drain +
  transfer), the loop's `time/weight_sync_pause_s`.
* `version_lag_*`, `multi_version_frac`, `token_lag_avg`, `group_latency_s_avg`: the loop's own
  `staleness/*` and `time/group_latency_s_avg`, averaged over steps (max for `version_lag_max`).
  The feeder bounds admissions, not age: a straggler group is trained whenever it completes,
  so `version_lag_max` exceeds `async_steps + 1` once the longest sample outlasts a few steps.
* `wall_s`: until the last step's sync ends; throughputs are per `wall_s`.
  `steady_trained_samples_per_s` leaves out the first quarter of the steps (`warmup_steps`):
  streaming's first batch waits for the pipeline to fill, which a run of thousands of steps pays
  once. Cluster projections compare steady rates (`AsyncSweep`), the measured validation whole-run
  rates (the CPU benchmark measured whole runs).

The command is `simulator` (validation on measurements, the projection at the long-reasoning shape);
the other jobs have their modules: `simulation_replay` (a measured run's prompts and lengths),
`simulation_validation`, `simulation_projection`, `simulation_reports`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.simulated_engines import SimEngines
from benchmarks.simulated_stack import SimLearners, SimWeightSync
from benchmarks.simulated_world import (
    Cluster,
    CostModel,
    PolicyDrift,
    Segment,
    SimWorld,
    VirtualClock,
    Workload,
)
from benchmarks.simulation_replay import Replay, SimPrompt
from open_instruct.config.core import Config
from open_instruct.config.data import DataConfig
from open_instruct.config.generation import GenerationConfig
from open_instruct.config.learner import LearnerConfig
from open_instruct.config.run import RunConfig
from open_instruct.config.staleness import StalenessConfig
from open_instruct.metrics import async_steps_needed, mean
from open_instruct.orchestrator import TrainingLoop
from open_instruct.tracking import MemoryLog

MODES = ("synchronous", "one_step_async", "streaming", "streaming_reprefill")


@dataclass(frozen=True)
class SimResult:
    mode: str
    async_steps: int | str
    num_steps: int
    trained_samples: int
    wall_s: float
    trained_samples_per_s: float
    generated_tokens_per_s: float
    generation_idle_frac: float
    engine_underfilled_frac: float
    learner_wait_frac: float
    learner_step_s_avg: float
    weight_sync_pause_s_avg: float
    version_lag_avg: float
    version_lag_max: float
    multi_version_frac: float
    trained_length_avg: float  # response tokens per trained sample (streaming trains short ones first)
    token_lag_avg: float  # per response token: learner version at training - the version that generated it
    group_latency_s_avg: float  # per trained prompt: admission to its last sample's finish
    warmup_steps: int  # steps left out of the steady-state rate (the pipeline filling up)
    steady_trained_samples_per_s: float  # after the warm-up: what a long run sees
    requeued_prompts: int = 0  # over --max_off_policy_steps: admitted again (requeue)
    dropped_prompts: int = 0  # over --max_off_policy_steps: replaced by others (drop)
    aborted_tokens: int = 0  # generated, then aborted when their group could no longer be trained in time
    trained_to_generated_length_ratio: float = 1.0  # < 1: dropping stragglers trained shorter samples
    lookahead_final: int = 0  # the lookahead at the end (where `auto` settled)
    window_final: int = 0  # the staleness bound K at the end (where --max_off_policy_steps auto settled)
    window_avg: float = 0.0  # K averaged over the steps after the warm-up
    ess_frac_min: float = 1.0  # the least effective sample size fraction of a step after the warm-up (with drift)
    truncated_frac_max: float = 0.0  # the largest share of capped importance weights of such a step
    reprefilled_samples: int = 0  # running samples a reprefill sync cut (streaming_reprefill)
    reprefill_tokens: int = 0  # prompt + kept tokens their continuations prefilled again
    timeline: tuple[Segment, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """Every field but the timeline (thousands of segments at cluster scale)."""
        out = asdict(self)
        del out["timeline"]
        return out

    def step_ends(self) -> list[float]:
        """When each step's sync ended (the learner's sync segments)."""
        return [s.end_s for s in self.timeline if s.actor == "learner" and s.kind == "sync"]


def mode_settings(mode: str, async_steps: int | str) -> tuple[str, str]:
    """(--async_steps, the sync's pause mode) of a mode: synchronous and one_step_async drain ("wait") before
    each sync; streaming keeps running samples' KV cache ("keep"); streaming_reprefill cuts them and
    prefills prompt + tokens again after the sync ("reprefill")."""
    if mode == "synchronous":
        return "0", "wait"
    if mode == "one_step_async":
        return "1", "wait"
    if mode == "streaming":
        return str(async_steps), "keep"
    if mode == "streaming_reprefill":
        return str(async_steps), "reprefill"
    raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")


def loop_config(
    workload: Workload,
    async_steps: int | str,
    pause_mode: str,
    max_off_policy_steps: int | str | None = None,
    off_policy_action: str = "requeue",
    window_limits: dict[str, Any] | None = None,
) -> Config:
    """The flags a real run of this workload would pass (one learner rank: the simulated learners
    carry the data-parallel width in their cost model)."""
    w = workload
    prompt_tokens = max(1, w.prompt_tokens)
    return Config(
        run=RunConfig(
            seed=w.seed,
            num_evals=0,
            save_freq=0,
            total_episodes=w.num_steps * w.prompts_per_step * w.samples_per_prompt,
        ),
        data=DataConfig(max_prompt_token_length=prompt_tokens),
        generation=GenerationConfig(
            num_unique_prompts_rollout=w.prompts_per_step,
            num_samples_per_prompt_rollout=w.samples_per_prompt,
            response_length=w.max_tokens,
            async_steps=str(async_steps),
            inflight_updates=pause_mode != "wait",
            inflight_update_kv="reprefill" if pause_mode == "reprefill" else "keep",
        ),
        staleness=StalenessConfig(
            max_off_policy_steps=None if max_off_policy_steps is None else str(max_off_policy_steps),
            off_policy_action=off_policy_action,
            **(window_limits or {}),
        ),
        learner=LearnerConfig(pack_length=prompt_tokens + w.max_tokens),
    )


@contextlib.contextmanager
def _loop_warnings_silenced():
    """The loop's one-time lookahead advice and the window's moves are for a user's run; a sweep prints the
    same numbers."""
    loggers = [logging.getLogger(name) for name in ("open_instruct.orchestrator", "open_instruct.pacing")]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for each, level in zip(loggers, levels):
            each.setLevel(level)


def simulate(
    mode: str,
    workload: Workload,
    cost: CostModel,
    cluster: Cluster,
    async_steps: int | str = 1,
    max_off_policy_steps: int | str | None = None,
    off_policy_action: str = "requeue",
    drift: PolicyDrift | None = None,
    window_limits: dict[str, Any] | None = None,
    replay: Replay | None = None,
) -> SimResult:
    """Simulate `workload.num_steps` training steps. `async_steps` (an int or "auto") applies to
    "streaming" only: "synchronous" is async_steps=0 and "one_step_async" is async_steps=1, both with a
    draining sync. The staleness bound defaults to the lookahead (--max_off_policy_steps; "auto" tunes it
    within `window_limits`, the --off_policy_* flags). `drift`: the learners report the off-policy health
    of what they train. `replay`: a measured run's prompts and lengths instead of drawn ones."""
    steps, pause_mode = mode_settings(mode, async_steps)
    if replay is not None:
        longest_prompt = max(tokens for _, tokens in replay.prompts)
        workload = dataclasses.replace(workload, seed=replay.seed, prompt_tokens=longest_prompt)
    _validate(workload, cost, cluster, async_steps)
    cfg = loop_config(workload, steps, pause_mode, max_off_policy_steps, off_policy_action, window_limits)
    world = SimWorld()
    engines = SimEngines(world, workload, cost, cluster.num_engines, replay.lengths.length if replay else None)
    learners = SimLearners(world, cost, cluster.num_learners, drift)
    sync = SimWeightSync(world, engines, cost, pause_mode)
    if replay is not None:
        rows = replay.rows()
    else:
        prompt_ids = (0,) * workload.prompt_tokens  # shared by every row: only its length matters
        epoch = (workload.num_steps + cfg.lookahead_max + 1) * workload.prompts_per_step
        rows = [SimPrompt(f"sim:{i}", prompt_ids) for i in range(epoch)]
    log = MemoryLog()
    loop = TrainingLoop(
        cfg,
        engines=engines,
        learners=learners,
        weights=sync,
        clock=VirtualClock(world),
        log=log,
        train_rows=rows,
    )
    with _loop_warnings_silenced():
        summary = loop.run()
    lookahead = int(steps) if steps.isdigit() else steps
    final = loop.pacing.lookahead.current
    return _result(mode, lookahead, workload, world.now, engines, learners, sync, log.history, summary, final)


def _result(
    mode: str,
    async_steps: int | str,
    workload: Workload,
    wall: float,
    engines: SimEngines,
    learners: SimLearners,
    sync: SimWeightSync,
    history: list[dict],
    summary: dict,
    lookahead_final: int,
) -> SimResult:
    per_step = workload.prompts_per_step * workload.samples_per_prompt
    timeline, waited = _learner_timeline(learners.steps, sync.syncs)
    for e in engines.engines:
        timeline += [Segment(e.name, *s) for s in e.segments]
    ends = [end for _, end in sync.syncs]
    warmup = warmup_steps(len(ends))
    steady_s = ends[-1] - (ends[warmup - 1] if warmup else 0.0) if ends else 0.0
    engine_s = wall * len(engines.engines)
    trained = len(history) * per_step
    return SimResult(
        mode=mode,
        async_steps=async_steps,
        num_steps=len(history),
        trained_samples=trained,
        wall_s=wall,
        trained_samples_per_s=trained / wall,
        generated_tokens_per_s=sum(e.tokens for e in engines.engines) / wall,
        generation_idle_frac=sum(e.idle_s + e.sync_s for e in engines.engines) / engine_s,
        engine_underfilled_frac=sum(e.underfilled_s for e in engines.engines) / engine_s,
        learner_wait_frac=waited / wall,
        learner_step_s_avg=mean(end - start for start, end in learners.steps),
        weight_sync_pause_s_avg=mean(h["time/weight_sync_pause_s"] for h in history),
        version_lag_avg=mean(h["staleness/version_lag_avg"] for h in history),
        version_lag_max=max((h["staleness/version_lag_max"] for h in history), default=0.0),
        multi_version_frac=mean(h["staleness/multi_version_frac"] for h in history),
        trained_length_avg=mean(h["val/sequence_lengths"] for h in history),
        token_lag_avg=mean(h["staleness/token_lag_avg"] for h in history),
        group_latency_s_avg=mean(h["time/group_latency_s_avg"] for h in history),
        warmup_steps=warmup,
        steady_trained_samples_per_s=per_step * (len(ends) - warmup) / steady_s if steady_s > 0 else 0.0,
        requeued_prompts=summary["prompts_requeued"],
        dropped_prompts=summary["prompts_dropped"],
        aborted_tokens=summary["prompts_aborted_tokens"],
        trained_to_generated_length_ratio=summary["trained_to_generated_length_ratio"],
        lookahead_final=lookahead_final,
        window_final=summary["off_policy_window_final"],
        window_avg=mean(h["offpolicy/window"] for h in history[warmup:]),
        ess_frac_min=min((h.get("offpolicy/ess_frac", 1.0) for h in history[warmup:]), default=1.0),
        truncated_frac_max=max((h.get("offpolicy/truncated_frac", 0.0) for h in history[warmup:]), default=0.0),
        reprefilled_samples=sum(e.reprefilled for e in engines.engines),
        reprefill_tokens=sum(e.reprefill_tokens for e in engines.engines),
        timeline=tuple(timeline),
    )


def _learner_timeline(
    steps: list[tuple[float, float]], syncs: list[tuple[float, float]]
) -> tuple[list[Segment], float]:
    """The learner's wait / train / sync segments (every step syncs), and its total wait."""
    segments, waited, previous_end = [], 0.0, 0.0
    for (train_start, train_end), (sync_start, sync_end) in zip(steps, syncs, strict=True):
        if train_start > previous_end:
            segments.append(Segment("learner", previous_end, train_start, "wait"))
            waited += train_start - previous_end
        segments.append(Segment("learner", train_start, train_end, "train"))
        segments.append(Segment("learner", sync_start, sync_end, "sync"))
        previous_end = sync_end
    return segments, waited


def warmup_steps(num_steps: int) -> int:
    """The first quarter of a run (at least one step when there are two): streaming's first batch
    waits for the pipeline to fill, a cost a run of thousands of steps pays once."""
    return max(1, num_steps // 4) if num_steps >= 2 else 0


def _validate(workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int) -> None:
    problems = [
        name
        for name, ok in (
            (
                "async_steps >= 0 or 'auto'",
                async_steps == "auto" or (isinstance(async_steps, int) and async_steps >= 0),
            ),
            ("prompts_per_step >= 1", workload.prompts_per_step >= 1),
            ("samples_per_prompt >= 2", workload.samples_per_prompt >= 2),
            ("num_steps >= 1", workload.num_steps >= 1),
            ("prompt_tokens >= 0", workload.prompt_tokens >= 0),
            ("median_tokens > 0", workload.median_tokens > 0),
            ("sigma >= 0", workload.sigma >= 0),
            ("max_tokens >= 1", workload.max_tokens >= 1),
            ("tool_latency_s >= 0", workload.tool_latency_s >= 0),
            ("max_running >= 1", cost.max_running >= 1),
            (
                "decode step time > 0 and not shrinking with the batch or the context",
                cost.decode_base_s + cost.decode_per_seq_s + cost.decode_per_context_token_s > 0
                and min(cost.decode_per_seq_s, cost.decode_per_context_token_s) >= 0,
            ),
            ("num_engines >= 1", cluster.num_engines >= 1),
            ("num_learners >= 1", cluster.num_learners >= 1),
        )
        if not ok
    ]
    if problems:
        raise ValueError(f"simulator inputs violate: {', '.join(problems)}")


def run_modes(
    workload: Workload,
    cost: CostModel,
    cluster: Cluster,
    async_steps: int = 1,
    max_off_policy_steps: int | None = None,
    replay: Replay | None = None,
) -> dict[str, SimResult]:
    return {
        mode: simulate(mode, workload, cost, cluster, async_steps, max_off_policy_steps, replay=replay)
        for mode in MODES
    }


def summarize(results: dict[str, SimResult]) -> dict[str, Any]:
    out: dict[str, Any] = {mode: r.as_json() for mode, r in results.items()}
    sync = results["synchronous"].trained_samples_per_s
    out["speedup_streaming_vs_sync"] = results["streaming"].trained_samples_per_s / sync
    out["speedup_one_step_async_vs_sync"] = results["one_step_async"].trained_samples_per_s / sync
    return out


def compare(workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int = 1) -> dict[str, Any]:
    """The three modes' `as_json()` keyed by mode, plus `speedup_streaming_vs_sync` (and one-step-async's)."""
    return summarize(run_modes(workload, cost, cluster, async_steps))


def workload_from_json(d: dict[str, Any], num_steps: int | None = None) -> Workload:
    return Workload(
        prompts_per_step=int(d["prompts_per_step"]),
        samples_per_prompt=int(d["samples_per_prompt"]),
        num_steps=int(num_steps or d.get("num_steps", 10)),
        prompt_tokens=int(d["prompt_tokens"]),
        median_tokens=float(d["median_tokens"]),
        sigma=float(d["sigma"]),
        max_tokens=int(d["max_tokens"]),
        tool_latency_s=float(d.get("tool_latency_s") or 0.0),
        seed=int(d.get("seed", 0)),
    )


def needed(result: SimResult) -> int:
    """The trainer's own advice (`scheduling/async_steps_needed`) from this run's group latency."""
    return async_steps_needed(result.group_latency_s_avg, result.learner_step_s_avg + result.weight_sync_pause_s_avg)
