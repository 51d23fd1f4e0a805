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

Run: `python -m open_instruct.benchmarks.simulator --measured measured.json --output DIR` (see
`main`): the measured setup's modes (validation: the engine's costs fitted on calibration batches,
then on the runs' own engine steps, of every mode and of the other modes only), then the seed's
shape with streaming at each `--async_sweep` lookahead, against the learner-bound ceiling.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from open_instruct.benchmarks.calibration import fit_cost_model, step_time_error, steps_of
from open_instruct.benchmarks.simulated_stack import (
    Cluster,
    CostModel,
    PolicyDrift,
    Segment,
    SimEngines,
    SimLearners,
    SimWeightSync,
    SimWorld,
    VirtualClock,
    Workload,
)
from open_instruct.benchmarks.simulator_plots import plot_sweep, plot_timelines
from open_instruct.benchmarks.stamp import ResultFileError, read_result, stamp
from open_instruct.benchmarks.workloads import ShapedWorkload
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

__all__ = [
    "GPU_H100_COST",
    "MODES",
    "SEED_CLUSTER",
    "SEED_CLUSTER_WORKLOAD",
    "AsyncSweep",
    "Cluster",
    "CostModel",
    "Replay",
    "Segment",
    "SimResult",
    "Workload",
    "compare",
    "simulate",
    "sweep_async_steps",
]


# ---------------------------------------------------------------------------------------------------
# Inputs


# The original request's launch shape (scripts/long_generations_experiment.sh): 6 nodes x 8 GPUs,
# 32 single-GPU engines and 16 learner ranks, 256 prompts x 16 samples per step, 16k responses.
SEED_CLUSTER = Cluster(num_engines=32, num_learners=16)
SEED_CLUSTER_WORKLOAD = Workload(
    prompts_per_step=256,
    samples_per_prompt=16,
    num_steps=40,
    prompt_tokens=512,
    median_tokens=4000,
    sigma=0.8,
    max_tokens=16384,
    seed=0,
)

# A 7B model, one H100 per engine and per learner rank. Assumptions, not measurements:
# * decode: ~12 ms per step at small batch (weights streamed from HBM once per step), +0.12 ms per
#   running sample (KV reads grow with the batch); 256 running -> ~43 ms/step, ~6k tokens/s.
# * prefill ~20k tokens/s; max_running 256 (vLLM's default max_num_seqs; KV for 256 x 16.9k tokens
#   of a GQA 7B fits an 80 GB card only partly, so this is optimistic for the longest samples).
# * learner: 6 x 7e9 FLOPs per trained token at 40% of 989 TFLOP/s bf16 -> 1.06e-4 s per token per
#   rank; 1 s per step for the optimizer and ZeRO collectives.
# * weight sync: 1.5 s to broadcast 15 GB of bf16 weights over NCCL and reload them.
# * the learner figures above are for open-instruct's step: a separate no-grad pass for pi_old and rows
#   padded to --pack_length. The one measured change, not an assumption: the learner cost is scaled by
#   LEARNER_STEP_RATIO, new / old learner step time at the seed's settings (ZeRO-2, one mini-batch, one row
#   per micro-batch, gradient checkpointing; new = pi_old from the training forward and the token budget
#   that setting now defaults to), measured side by side by `python -m open_instruct.benchmarks.learner_step
#   --parts seed` on the 2-core CPU machine (a random 512x4 Qwen2, 2 ranks, 64 heavy-tailed samples:
#   14.07 s vs 18.73 s per step).
LEARNER_STEP_RATIO = 0.751
GPU_H100_COST = CostModel(
    decode_base_s=0.012,
    decode_per_seq_s=0.00012,
    prefill_per_token_s=1 / 20_000,
    max_running=256,
    weight_sync_pause_s=1.5,
    learner_base_s=1.0 * LEARNER_STEP_RATIO,
    learner_per_token_s=6 * 7e9 / (0.40 * 989e12) * LEARNER_STEP_RATIO,
)


# ---------------------------------------------------------------------------------------------------
# Output


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


# ---------------------------------------------------------------------------------------------------
# The simulation: the real loop with simulated collaborators


@dataclass(frozen=True, slots=True)
class _SimPrompt:
    """What `PromptFeeder` reads from a `data.PromptRow`."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    ground_truths: tuple[Any, ...] = ()
    verifier_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Replay:
    """The prompts and response lengths of a measured run (`benchmarks.e2e` writes them into measured.json).
    A simulation of that run admits the same rows in the same order (the same --seed shuffles them) and gives
    each sample the length the real one had, so that a validation compares costs and schedules, not two draws
    of a heavy tail (the longest of a batch's 32 samples sets a synchronous step's time)."""

    seed: int  # the run's --seed
    prompts: tuple[tuple[str, int], ...]  # (row prompt id, prompt tokens) of every row, in the dataset's order
    lengths: ShapedWorkload  # its `length(sample id)` is the exact response length of each real sample

    @classmethod
    def of_rows(cls, seed: int, rows, lengths: ShapedWorkload) -> Replay:
        """The replay of a run of `rows` (data.PromptRow) under `seed`, whose samples `lengths` shaped."""
        return cls(seed, tuple((row.prompt_id, len(row.prompt_token_ids)) for row in rows), lengths)

    def as_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "prompts": [list(p) for p in self.prompts], "workload": asdict(self.lengths)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Replay:
        prompts = tuple((str(prompt_id), int(tokens)) for prompt_id, tokens in d["prompts"])
        return cls(int(d["seed"]), prompts, ShapedWorkload(**d["workload"]))

    def rows(self) -> list[_SimPrompt]:
        return [_SimPrompt(prompt_id, (0,) * tokens) for prompt_id, tokens in self.prompts]


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
    loggers = [logging.getLogger(name) for name in ("open_instruct.orchestrator", "open_instruct.scheduling")]
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
        rows = [_SimPrompt(f"sim:{i}", prompt_ids) for i in range(epoch)]
    log = MemoryLog()
    loop = TrainingLoop(
        cfg,
        engines=engines,
        learners=learners,
        weight_sync=sync,
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


@dataclass(frozen=True)
class AsyncSweep:
    """Synchronous and one-step-async once, streaming at several async_steps, on one workload.

    Rates are steady-state (`steady_trained_samples_per_s`): the seed's run is thousands of steps,
    and streaming's pipeline fill is paid once. `learner_bound_samples_per_s` is the ceiling any
    schedule can reach (the learner never waits: train + sync back to back)."""

    synchronous: SimResult
    one_step_async: SimResult
    streaming: dict[int, SimResult]
    auto: SimResult | None = None  # streaming with --async_steps auto

    @property
    def learner_bound_samples_per_s(self) -> float:
        r = self.synchronous
        busy = r.learner_step_s_avg + r.weight_sync_pause_s_avg
        return r.trained_samples / r.num_steps / busy

    def speedup(self, result: SimResult) -> float:
        return result.steady_trained_samples_per_s / self.synchronous.steady_trained_samples_per_s

    @property
    def chosen_async_steps(self) -> int:
        """The least lookahead (least staleness) within 5% of the best streaming rate."""
        best = max(self.speedup(r) for r in self.streaming.values())
        return min(a for a, r in self.streaming.items() if self.speedup(r) >= 0.95 * best)

    def as_json(self) -> dict[str, Any]:
        chosen = self.streaming[self.chosen_async_steps]
        return {
            "synchronous": self.synchronous.as_json(),
            "one_step_async": self.one_step_async.as_json(),
            "streaming": chosen.as_json(),  # the contract's streaming mode: the chosen async_steps
            "streaming_async_steps": self.chosen_async_steps,
            "speedup_streaming_vs_sync": self.speedup(chosen),
            "speedup_one_step_async_vs_sync": self.speedup(self.one_step_async),
            "learner_bound_speedup": self.learner_bound_samples_per_s / self.synchronous.steady_trained_samples_per_s,
            "streaming_by_async_steps": {str(a): r.as_json() for a, r in self.streaming.items()},
            "speedup_streaming_vs_sync_by_async_steps": {str(a): self.speedup(r) for a, r in self.streaming.items()},
            "async_steps_needed_by_async_steps": {str(a): needed(r) for a, r in self.streaming.items()},
            **(
                {}
                if self.auto is None
                else {
                    "streaming_auto": self.auto.as_json(),
                    "speedup_streaming_auto_vs_sync": self.speedup(self.auto),
                    "streaming_auto_of_ceiling": self.auto.steady_trained_samples_per_s
                    / self.learner_bound_samples_per_s,
                }
            ),
        }


def needed(result: SimResult) -> int:
    """The trainer's own advice (`scheduling/async_steps_needed`) from this run's group latency."""
    return async_steps_needed(result.group_latency_s_avg, result.learner_step_s_avg + result.weight_sync_pause_s_avg)


def sweep_async_steps(
    workload: Workload, cost: CostModel, cluster: Cluster, async_steps: list[int], auto: bool = True
) -> AsyncSweep:
    return AsyncSweep(
        synchronous=simulate("synchronous", workload, cost, cluster),
        one_step_async=simulate("one_step_async", workload, cost, cluster),
        streaming={a: simulate("streaming", workload, cost, cluster, a) for a in async_steps},
        auto=simulate("streaming", workload, cost, cluster, "auto") if auto else None,
    )


def format_sweep(sweep: AsyncSweep) -> str:
    header = (
        "mode",
        "async",
        "samples/s",
        "speedup",
        "gen idle",
        "learner wait",
        "sync pause s",
        "lag avg",
        "lag max",
        "token lag",
        "group s",
        "needed",
    )
    runs = [("synchronous", sweep.synchronous), ("one_step_async", sweep.one_step_async)]
    runs += [("streaming", r) for r in sweep.streaming.values()]
    runs += [] if sweep.auto is None else [("streaming", sweep.auto)]
    rows = [header] + [
        (
            mode,
            f"auto->{r.lookahead_final}" if r.async_steps == "auto" else str(r.async_steps),
            f"{r.steady_trained_samples_per_s:.2f}",
            f"{sweep.speedup(r):.2f}x",
            f"{r.generation_idle_frac:.1%}",
            f"{r.learner_wait_frac:.1%}",
            f"{r.weight_sync_pause_s_avg:.2f}",
            f"{r.version_lag_avg:.2f}",
            f"{r.version_lag_max:.0f}",
            f"{r.token_lag_avg:.2f}",
            f"{r.group_latency_s_avg:.0f}",
            str(needed(r)),
        )
        for mode, r in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    ceiling = sweep.learner_bound_samples_per_s
    lines.append(
        f"learner-bound ceiling: {ceiling:.2f} samples/s "
        f"({ceiling / sweep.synchronous.steady_trained_samples_per_s:.2f}x synchronous); streaming reaches "
        f"{sweep.speedup(sweep.streaming[sweep.chosen_async_steps]):.2f}x at async_steps "
        f"{sweep.chosen_async_steps}"
    )
    if sweep.auto is not None:
        a = sweep.auto
        lines.append(
            f"--async_steps auto: {sweep.speedup(a):.2f}x synchronous, "
            f"{a.steady_trained_samples_per_s / ceiling:.1%} of the ceiling, settled at {a.lookahead_final}, "
            f"lag max {a.version_lag_max:.0f}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# CLI


_COLUMNS = (
    ("mode", "mode", "{}"),
    ("samples/s", "trained_samples_per_s", "{:.2f}"),
    ("gen tok/s", "generated_tokens_per_s", "{:.0f}"),
    ("gen idle", "generation_idle_frac", "{:.1%}"),
    ("underfilled", "engine_underfilled_frac", "{:.1%}"),
    ("learner wait", "learner_wait_frac", "{:.1%}"),
    ("sync pause s", "weight_sync_pause_s_avg", "{:.2f}"),
    ("lag avg", "version_lag_avg", "{:.2f}"),
    ("lag max", "version_lag_max", "{:.0f}"),
    ("multi-version", "multi_version_frac", "{:.1%}"),
    ("step s", "step_s", "{:.1f}"),
)


def format_table(summary: dict[str, Any], modes: Iterable[str]) -> str:
    rows = [[title for title, _, _ in _COLUMNS]]
    for mode in modes:
        r = dict(summary[mode], mode=mode, step_s=summary[mode]["wall_s"] / max(1, summary[mode]["num_steps"]))
        rows.append([fmt.format(r[key]) for _, key, fmt in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.append(
        f"speedup streaming vs synchronous: {summary['speedup_streaming_vs_sync']:.2f}x; "
        f"one-step-async vs synchronous: {summary['speedup_one_step_async_vs_sync']:.2f}x"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", type=Path, help="measurements, a workload and a cluster (see fit_cost_model)")
    parser.add_argument("--output", type=Path, default=Path("output/simulator"), help="for simulator.json and PNGs")
    parser.add_argument(
        "--seed_steps",
        type=int,
        default=SEED_CLUSTER_WORKLOAD.num_steps,
        help="steps of the seed-cluster projection (its first quarter is warm-up)",
    )
    parser.add_argument("--async_steps", type=int, default=1, help="streaming's async_steps on the measured setup")
    parser.add_argument(
        "--async_sweep",
        default="1,2,3,4,5,6,8",
        help="comma-separated async_steps of streaming projected at the seed's shape",
    )
    args = parser.parse_args(argv)
    args.sweep_steps = sorted({int(a) for a in args.async_sweep.split(",") if a.strip()})
    if not args.sweep_steps or min(args.sweep_steps) < 1:
        parser.error(f"--async_sweep needs async_steps >= 1, got {args.async_sweep!r}")
    return args


def validate_on_measurements(path: Path, async_steps: int) -> tuple[dict[str, Any], dict[str, SimResult]]:
    """The measured setup's three modes with the cost model fitted to it, against the measured speedup."""
    data = read_result(path, "e2e")
    cost = fit_cost_model(data)
    workload = workload_from_json(data["workload"])
    cluster = Cluster(int(data["cluster"]["num_engines"]), int(data["cluster"]["num_learners"]))
    started = time.monotonic()
    # The same staleness bound as the measured run (older files have none: the lookahead's), and its prompts
    # and lengths where the file has them.
    replay = Replay.from_json(data["replay"]) if "replay" in data else None
    bound = data.get("max_off_policy_steps")
    runs = run_modes(workload, cost, cluster, async_steps, bound, replay)
    measured_rates = data.get("measured_trained_samples_per_s", {})
    if "streaming_auto" in measured_rates:
        auto = simulate_e2e_mode("streaming_auto", workload, cost, cluster, async_steps, bound, replay)
        runs["streaming_auto"] = auto
    summary = summarize(runs)
    entry: dict[str, Any] = {
        "cost_model": asdict(cost),
        "workload": asdict(workload),
        "cluster": asdict(cluster),
        "replayed": replay is not None,  # the measured runs' prompts and lengths, not drawn ones
        **summary,
        "sim_s": time.monotonic() - started,
    }
    print(f"== measured setup ({path}): {cluster.num_engines} engines, {cluster.num_learners} learners")
    print(f"fitted cost model: {cost}")
    print(format_table(summary, runs))
    measured_speedup = data.get("measured_speedup_streaming_vs_sync")
    if measured_speedup:
        error = summary["speedup_streaming_vs_sync"] / measured_speedup - 1
        entry["measured_speedup_streaming_vs_sync"] = measured_speedup
        entry["speedup_relative_error"] = error
        print(
            f"streaming vs synchronous: predicted {summary['speedup_streaming_vs_sync']:.2f}x, "
            f"measured {measured_speedup:.2f}x (relative error {error:+.1%})"
        )
    if measured_rates:
        entry["per_mode"] = per_mode_validation(summary, measured_rates)
        print(format_per_mode_validation(entry["per_mode"]))
    if measured_rates and data.get("engine_steps"):
        entry["step_calibrated"] = step_calibrated_validation(data, workload, cluster, async_steps, replay)
        print(format_step_calibrated(entry["step_calibrated"]))
    return entry, runs


E2E_SIMULATED = (*MODES, "streaming_auto")  # the e2e benchmark's modes the simulator runs


def simulate_e2e_mode(
    mode: str,
    workload: Workload,
    cost: CostModel,
    cluster: Cluster,
    async_steps: int,
    bound: int | None,
    replay: Replay | None,
) -> SimResult:
    """One of the e2e benchmark's modes; its `streaming_auto` is streaming with --async_steps auto."""
    if mode == "streaming_auto":
        return simulate("streaming", workload, cost, cluster, "auto", bound, replay=replay)
    return simulate(mode, workload, cost, cluster, async_steps, bound, replay=replay)


def step_calibrated_validation(
    data: dict[str, Any], workload: Workload, cluster: Cluster, async_steps: int, replay: Replay | None
) -> dict[str, Any]:
    """Each measured mode predicted with the engine's costs fitted on the training runs' own engine steps
    (`calibration.fit_cost_model(steps_of_modes=...)`): the steps of every mode, and those of the other modes
    only, which leaves the predicted mode's own steps out of its calibration. `step_time_error`: how far the
    all-modes fit is off on the mode's own steps, summed (its steps cost what the others' predict, or not)."""
    measured_rates = data["measured_trained_samples_per_s"]
    bound = data.get("max_off_policy_steps")
    traced = {run["mode"] for run in data["engine_steps"]}
    pooled = fit_cost_model(data, steps_of_modes=traced)
    per_mode = {}
    for mode in [m for m in measured_rates if m in traced and m in E2E_SIMULATED]:
        others = fit_cost_model(data, steps_of_modes=traced - {mode})
        median = measured_rates[mode]["median"]
        predicted_all = simulate_e2e_mode(mode, workload, pooled, cluster, async_steps, bound, replay)
        predicted_others = simulate_e2e_mode(mode, workload, others, cluster, async_steps, bound, replay)
        rows = steps_of(data, {mode})
        per_mode[mode] = {
            "measured_median": median,
            "predicted_all_modes": predicted_all.trained_samples_per_s,
            "error_all_modes": predicted_all.trained_samples_per_s / median - 1,
            "predicted_other_modes": predicted_others.trained_samples_per_s,
            "error_other_modes": predicted_others.trained_samples_per_s / median - 1,
            "steps": len(rows),
            "step_time_error": step_time_error(pooled, rows),
        }
    return {"cost_model_all_modes": asdict(pooled), "per_mode": per_mode}


def format_step_calibrated(validation: dict[str, Any]) -> str:
    lines = [
        "trained samples/s per mode, the engine's costs fitted on the runs' own engine steps "
        f"({CostModel(**validation['cost_model_all_modes'])}):",
        f"  {'mode':<19} {'measured':>8}  {'all modes':>9} {'error':>7}  {'other modes':>11} {'error':>7}"
        f"  {'steps':>6} {'step time':>9}",
    ]
    for mode, v in validation["per_mode"].items():
        lines.append(
            f"  {mode:<19} {v['measured_median']:8.2f}  {v['predicted_all_modes']:9.2f} {v['error_all_modes']:+7.1%}"
            f"  {v['predicted_other_modes']:11.2f} {v['error_other_modes']:+7.1%}  {v['steps']:6d} "
            f"{v['step_time_error']:+9.1%}"
        )
    return "\n".join(lines)


def per_mode_validation(summary: dict[str, Any], measured_rates: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Each simulated mode's whole-run rate against the measured median (and min-max over the rounds)."""
    out = {}
    for mode in measured_rates:
        if mode not in summary:
            continue
        measured, predicted = measured_rates[mode], summary[mode]["trained_samples_per_s"]
        out[mode] = {
            "predicted": predicted,
            "measured_median": measured["median"],
            "measured_min": measured["min"],
            "measured_max": measured["max"],
            "relative_error": predicted / measured["median"] - 1,
            "within_measured_spread": measured["min"] <= predicted <= measured["max"],
        }
    return out


def format_per_mode_validation(per_mode: dict[str, Any]) -> str:
    lines = ["trained samples/s per mode: predicted vs measured median [min-max over rounds]"]
    for mode, v in per_mode.items():
        lines.append(
            f"  {mode:<19} {v['predicted']:7.2f} vs {v['measured_median']:7.2f} "
            f"[{v['measured_min']:.2f}-{v['measured_max']:.2f}]   error {v['relative_error']:+.1%}"
        )
    return "\n".join(lines)


def project_seed_cluster(num_steps: int, sweep_steps: list[int]) -> tuple[dict[str, Any], AsyncSweep]:
    seed = dataclasses.replace(SEED_CLUSTER_WORKLOAD, num_steps=num_steps)
    started = time.monotonic()
    sweep = sweep_async_steps(seed, GPU_H100_COST, SEED_CLUSTER, sweep_steps)
    print(
        f"== seed cluster projection: {SEED_CLUSTER.num_engines} engines x H100 (assumed costs), "
        f"{SEED_CLUSTER.num_learners} learners, {seed.prompts_per_step}x{seed.samples_per_prompt} samples/step, "
        f"responses lognormal(median {seed.median_tokens:.0f}, sigma {seed.sigma}) capped at {seed.max_tokens}, "
        f"{seed.num_steps} steps (rates after {warmup_steps(seed.num_steps)} warm-up steps)"
    )
    print(format_sweep(sweep))
    chosen = sweep.chosen_async_steps
    reprefill = simulate("streaming_reprefill", seed, GPU_H100_COST, SEED_CLUSTER, chosen)
    comparison = kv_kept_vs_reprefill(sweep.streaming[chosen], reprefill, sweep.synchronous)
    print(format_kv_comparison(comparison, chosen))
    entry = {
        "cost_model": asdict(GPU_H100_COST),
        "workload": asdict(seed),
        "cluster": asdict(SEED_CLUSTER),
        "learner_step_ratio_measured": LEARNER_STEP_RATIO,
        **sweep.as_json(),
        "kv_kept_vs_reprefill": {"async_steps": chosen, **comparison},
        "sim_s": time.monotonic() - started,
    }
    return entry, sweep


_KV_COLUMNS = (  # (title, SimResult field, format)
    ("samples/s", "steady_trained_samples_per_s", "{:.2f}"),
    ("gen idle", "generation_idle_frac", "{:.1%}"),
    ("learner wait", "learner_wait_frac", "{:.1%}"),
    ("sync pause s", "weight_sync_pause_s_avg", "{:.2f}"),
    ("token lag", "token_lag_avg", "{:.2f}"),
    ("lag max", "version_lag_max", "{:.0f}"),
    ("reprefilled", "reprefilled_samples", "{:d}"),
    ("prefill tok recomputed", "reprefill_tokens", "{:,d}"),
)


def kv_kept_vs_reprefill(kept: SimResult, reprefill: SimResult, synchronous: SimResult) -> dict[str, Any]:
    """An in-flight update that keeps running samples' KV cache against one that aborts them and re-prefills
    prompt + tokens (verl, AReaL, slime), same lookahead, same workload."""
    rows = {"kv_kept": kept, "reprefill": reprefill}
    sync_rate = synchronous.steady_trained_samples_per_s
    return {
        **{name: {key: getattr(r, key) for _, key, _ in _KV_COLUMNS} for name, r in rows.items()},
        "speedup_vs_sync": {name: r.steady_trained_samples_per_s / sync_rate for name, r in rows.items()},
        "kv_kept_over_reprefill": kept.steady_trained_samples_per_s / reprefill.steady_trained_samples_per_s,
    }


def format_kv_comparison(comparison: dict[str, Any], async_steps: int) -> str:
    lines = [f"in-flight update at --async_steps {async_steps}: KV cache kept vs abort + re-prefill"]
    rows = [["", *(title for title, _, _ in _KV_COLUMNS), "vs sync"]]
    for name in ("kv_kept", "reprefill"):
        values = comparison[name]
        cells = [fmt.format(values[key]) for _, key, fmt in _KV_COLUMNS]
        rows.append([name, *cells, f"{comparison['speedup_vs_sync'][name]:.2f}x"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.append(f"KV kept / reprefill trained samples/s: {comparison['kv_kept_over_reprefill']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"stamp": stamp("simulator")}
    if args.measured:
        try:
            report["measured"], runs = validate_on_measurements(args.measured, args.async_steps)
        except ResultFileError as error:
            print(f"simulator: --measured {error}", file=sys.stderr)
            return 2
        panels = [("measured: synchronous", runs["synchronous"]), ("measured: streaming", runs["streaming"])]
        plot_timelines(panels, args.output / "simulator_timeline_measured.png")
    report["seed_projection"], sweep = project_seed_cluster(args.seed_steps, args.sweep_steps)
    (args.output / "simulator.json").write_text(json.dumps(report, indent=2))
    seed_panels = [
        ("seed cluster: synchronous", sweep.synchronous),
        (f"seed cluster: streaming, async_steps {sweep.chosen_async_steps}", sweep.streaming[sweep.chosen_async_steps]),
    ]
    plot_timelines(seed_panels, args.output / "simulator_timeline.png", steady=True)
    plot_sweep(sweep, args.output / "simulator_async_sweep.png")
    print(
        f"wrote simulator.json, simulator_timeline.png (seed shape), simulator_async_sweep.png"
        f"{' and simulator_timeline_measured.png' if args.measured else ''} to {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
