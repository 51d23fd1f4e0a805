"""Discrete-event simulator of the training pipeline, for cluster-scale projections.

What it answers: how much faster is streaming (in-flight weight sync, `async_steps` ahead) than
synchronous GRPO, or one-step-async with a draining sync, on a cluster we do not have, given
per-engine and per-learner costs measured on one we do (`fit_cost_model`). Time is simulated (a
heap of events, no sleeping); a 32-engine x 256-running, 4096-samples-per-step, 10-step run takes
seconds.

It drives the same scheduling code as `orchestrator.TrainingLoop.run`: the real `PromptFeeder`
(admission under the staleness bound `(learner_version + async_steps + 1) * prompts_per_step`),
the real `ReplayBuffer` (grouping, `ready`/`take` in completion order, same `max_samples`) fed real
`Completion`s with real version spans, and `orchestrator.rollout_metrics` for the staleness numbers.
Only the engines, the learner and the weight transfer are replaced by cost models.

Model and assumptions
* Workload: each prompt has `prompt_tokens` tokens and `samples_per_prompt` samples whose response
  lengths are lognormal (`median_tokens`, `sigma`), rounded, clamped to [1, `max_tokens`]; lengths
  are drawn in admission order from `seed`, so the k-th admitted prompt has the same lengths in
  every mode. With `tool_latency_s`, each sample of >= 2 tokens stops after `length // 2` tokens,
  leaves its engine (freeing the slot) for `tool_latency_s`, then queues at the front of the same
  engine's waiting line; its context is assumed prefix-cached (no second prefill).
* Engine (like `GenerationActor.run`): pulls whole prompts from one shared FIFO (work stealing)
  while it holds fewer than `max_running` samples, the moment it has room; engines with room take
  turns, one prompt each, as getters blocked on one queue do. The scheduler runs at most
  `max_running` samples (the rest of a prompt's samples wait in the engine). Decoding advances in
  steps: each running sample gains one token per step, a step takes `decode_base_s +
  decode_per_seq_s * running`, and the step in which samples start also pays `prefill_per_token_s`
  per prompt token of each (no prefix sharing between the samples of a prompt). New work and pauses
  take effect at the next step boundary.
  The engine is simulated per event, not per token: between two events its running set is fixed,
  so it jumps k steps to the next finish (or to the next boundary after an interruption).
* Learner: takes `prompts_per_step` complete groups as soon as the buffer is `ready`, trains for
  `learner_base_s + learner_per_token_s * tokens / num_learners` (tokens = prompt + response of the
  batch, split over the data-parallel ranks), then syncs weights. As in the real loop the sync
  blocks the learner, happens after every step (also the last), and admission follows it.
* Weight sync: all engines pause, then the transfer takes `weight_sync_pause_s`, then all resume.
  `streaming` pauses in "keep" mode: each engine freezes at its next step boundary and its running
  samples continue afterwards with the new version (they span two versions). `one_step_async` and
  `synchronous` pause in "wait" mode: engines stop pulling, run until nothing is left in them
  (samples out on a tool call are parked until the resume), and the transfer starts when the last
  engine has drained. `synchronous` is async_steps=0: one batch admitted per version, so its
  engines are empty while the learner trains.

Metric definitions (`SimResult`)
* `generation_idle_frac`: engine-time producing no tokens (no sample running, or paused for a
  sync, kept samples or not) over `num_engines * wall_s`. Draining with samples running is busy.
* `engine_underfilled_frac`: engine-time with fewer than `max_running` samples running, or
  paused, over `num_engines * wall_s` (idle time is underfilled too).
* `learner_wait_frac`: learner time waiting for a full batch, over `wall_s`.
* `weight_sync_pause_s_avg`: from the end of a train step to the engines' resume (drain + transfer),
  the simulated `time/weight_sync_pause_s`.
* `version_lag_*`, `multi_version_frac`: as `rollout_metrics` (learner version at training minus
  the sample's oldest weight version), averaged over steps. The feeder bounds admissions, not age:
  with no age policy (the real loop's default) a straggler group is trained whenever it completes,
  so `version_lag_max` exceeds `async_steps + 1` once the longest sample outlasts a few steps.
* `token_lag_avg`: the same lag per response token (a straggler updated in flight is partly fresh);
  `group_latency_s_avg`: admission to a prompt's last sample, per trained prompt.
* `wall_s`: until the last step's sync ends; throughputs are per `wall_s`.
  `steady_trained_samples_per_s` leaves out the first quarter of the steps (`warmup_steps`):
  streaming's first batch waits for the pipeline to fill, which a run of thousands of steps pays
  once. Cluster projections compare steady rates (`AsyncSweep`), the measured validation whole-run
  rates (the CPU benchmark measured whole runs).

Completions carry `range(n)` as response token ids: an O(1)-size immutable int sequence whose
`len()` is the simulated length, so the buffer's token accounting and length metrics are exact
without materializing 16k-token tuples at cluster scale (prompts share one tuple of zeros).

Run: `python -m open_instruct.simulator --measured measured.json --output DIR` (see `main`): the
measured setup's three modes (validation), then the seed's shape with streaming at each
`--async_sweep` lookahead, against the learner-bound ceiling.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import random
import sys
import time
from bisect import bisect_right
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from open_instruct.benchmark_generation import capped_lognormal
from open_instruct.messages import Completion, PromptRequest, SamplingSettings, VersionSpan
from open_instruct.orchestrator import async_steps_needed, rollout_metrics
from open_instruct.prompt_feeder import PromptFeeder
from open_instruct.replay_buffer import AddResult, ReplayBuffer, sample_tokens

MODES = ("synchronous", "one_step_async", "streaming")
_EPS = 1e-9  # seconds; float slack when locating step boundaries


# ---------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int
    samples_per_prompt: int
    num_steps: int
    prompt_tokens: int
    median_tokens: float  # lognormal response length: median ...
    sigma: float  # ... and log-space standard deviation (0 = every response has median_tokens)
    max_tokens: int  # response cap (finish_reason "length")
    tool_latency_s: float = 0.0  # one tool call halfway through each sample; 0 = none
    seed: int = 0


@dataclass(frozen=True)
class CostModel:
    decode_base_s: float  # per engine step, whatever the batch
    decode_per_seq_s: float  # per engine step, per running sample
    prefill_per_token_s: float
    max_running: int  # samples one engine runs at once (KV capacity)
    weight_sync_pause_s: float  # engines frozen per sync (the transfer)
    learner_base_s: float  # per train step
    learner_per_token_s: float  # per trained token on one data-parallel rank

    def step_s(self, running: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * running

    def learner_step_s(self, trained_tokens: int, num_learners: int) -> float:
        return self.learner_base_s + self.learner_per_token_s * trained_tokens / num_learners


@dataclass(frozen=True)
class Cluster:
    num_engines: int
    num_learners: int


# The original request's launch shape (scripts/long_generations_experiment.sh): 6 nodes x 8 GPUs,
# 32 single-GPU engines and 16 learner ranks, 256 prompts x 16 samples per step, 16k responses.
SEED_CLUSTER = Cluster(num_engines=32, num_learners=16)
SEED_CLUSTER_WORKLOAD = Workload(
    prompts_per_step=256, samples_per_prompt=16, num_steps=40, prompt_tokens=512,
    median_tokens=4000, sigma=0.8, max_tokens=16384, seed=0,
)

# A 7B model, one H100 per engine and per learner rank. Assumptions, not measurements:
# * decode: ~12 ms per step at small batch (weights streamed from HBM once per step), +0.12 ms per
#   running sample (KV reads grow with the batch); 256 running -> ~43 ms/step, ~6k tokens/s.
# * prefill ~20k tokens/s; max_running 256 (vLLM's default max_num_seqs; KV for 256 x 16.9k tokens
#   of a GQA 7B fits an 80 GB card only partly, so this is optimistic for the longest samples).
# * learner: 6 x 7e9 FLOPs per trained token at 40% of 989 TFLOP/s bf16 -> 1.06e-4 s per token per
#   rank; 1 s per step for the optimizer and ZeRO collectives.
# * weight sync: 1.5 s to broadcast 15 GB of bf16 weights over NCCL and reload them.
GPU_H100_COST = CostModel(
    decode_base_s=0.012,
    decode_per_seq_s=0.00012,
    prefill_per_token_s=1 / 20_000,
    max_running=256,
    weight_sync_pause_s=1.5,
    learner_base_s=1.0,
    learner_per_token_s=6 * 7e9 / (0.40 * 989e12),
)


# ---------------------------------------------------------------------------------------------------
# Output


class Segment(NamedTuple):
    actor: str  # "learner" or "engine <i>"
    start_s: float
    end_s: float
    kind: str  # engines: generate / idle / sync; learner: wait / train / sync


@dataclass(frozen=True)
class SimResult:
    mode: str
    async_steps: int
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
# The simulation


@dataclass(frozen=True, slots=True)
class _SimPrompt:
    """What `PromptFeeder` reads from a `data.PromptRow`."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    ground_truths: tuple[Any, ...] = ()
    verifier_names: tuple[str, ...] = ()


class _Sample:
    __slots__ = ("engine", "fresh", "generated", "index", "joined_step", "length", "queued_at", "request", "spans",
                 "started_at", "tool_at", "uid")

    def __init__(self, uid: int, request: PromptRequest, index: int, length: int, tool_at: int, engine: _Engine,
                 queued_at: float):
        self.uid = uid  # deterministic tie-break among samples finishing at the same step
        self.request, self.index, self.length, self.tool_at = request, index, length, tool_at
        self.generated = 0
        self.joined_step = 0
        self.spans: list[VersionSpan] = []
        self.engine, self.queued_at, self.started_at = engine, queued_at, 0.0
        self.fresh = True  # still needs its prefill

    def stop_at(self) -> int:
        return self.tool_at if self.generated < self.tool_at else self.length


class _Engine:
    """One engine's state. Between wakes its running set is fixed (a 'phase' of equal steps)."""

    def __init__(self, engine_id: int):
        self.id = engine_id
        self.name = f"engine {engine_id}"
        self.running: dict[int, _Sample] = {}
        self.finish_heap: list[tuple[int, int, _Sample]] = []  # (engine step it stops at, uid, sample)
        self.waiting: deque[_Sample] = deque()  # pulled, not yet scheduled (KV full)
        self.parked: list[_Sample] = []  # back from a tool call during a sync
        self.steps_done = 0
        self.version_steps, self.versions = [0], [0]  # weight version in effect from engine step s on
        self.paused = False
        self.pause_mode: str | None = None  # "keep" / "wait" while a sync is pending
        self.wake_token = 0
        self.wake_at: float | None = None
        self.phase_start = self.phase_prefill = self.phase_dt = 0.0
        self.phase_steps = 0
        self.unprefilled_tokens = 0
        self.acc_t = 0.0
        self.tokens = 0
        self.busy_s = self.idle_s = self.sync_s = self.underfilled_s = 0.0
        self.segments: list[list] = []

    @property
    def launched(self) -> int:
        return len(self.running) + len(self.waiting)


_WAKE, _TOOL_RETURN, _TRAIN_DONE, _TRANSFER_DONE = range(4)


class _Simulation:
    def __init__(self, mode: str, workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int,
                 inflight: bool):
        self.mode, self.w, self.cost, self.cluster = mode, workload, cost, cluster
        self.async_steps, self.inflight = async_steps, inflight
        p, n = workload.prompts_per_step, workload.samples_per_prompt
        prompt_ids = (0,) * workload.prompt_tokens  # shared by every row: only its length matters
        rows = [_SimPrompt(f"sim:{i}", prompt_ids) for i in range((workload.num_steps + async_steps + 1) * p)]
        self.feeder = PromptFeeder(
            rows, prompts_per_step=p, samples_per_prompt=n, async_steps=async_steps,
            sampling=SamplingSettings(max_tokens=workload.max_tokens), seed=workload.seed,
        )
        # The real loop's buffer size: room for async_steps + 2 batches of groups.
        self.buffer = ReplayBuffer(samples_per_prompt=n, max_samples=(async_steps + 2) * p * n, seed=workload.seed)
        self.held_back: list[Completion] = []
        self.lengths_rng = random.Random(workload.seed)
        self.fifo: deque[tuple[PromptRequest, float]] = deque()
        self.lengths: dict[str, list[int]] = {}  # response lengths of admitted, not yet pulled prompts
        self.engines = [_Engine(i) for i in range(cluster.num_engines)]
        self.cursor = 0  # the engine the shared queue serves next
        self.events: list[tuple] = []
        self.counter = 0
        self.now = 0.0
        self.version = 0
        self.steps_trained = 0
        self.learner_state = "wait"
        self.learner_since = 0.0
        self.learner_segments: list[list] = []
        self.learner_wait_s = 0.0
        self.learner_train_s: list[float] = []
        self.sync_pauses: list[float] = []
        self.paused_engines = 0
        self.step_metrics: list[dict[str, float]] = []
        self.done = False

    # ---- event plumbing

    def _push(self, t: float, kind: int, a: Any = None, b: Any = None, c: Any = None) -> None:
        self.counter += 1
        heapq.heappush(self.events, (t, self.counter, kind, a, b, c))

    def run(self) -> SimResult:
        self._admit(0.0)
        self._try_train(0.0)
        while self.events and not self.done:
            t, _, kind, a, b, c = heapq.heappop(self.events)
            self.now = t
            if kind == _WAKE:
                if b == a.wake_token:
                    self._wake(a, t, c)
            elif kind == _TOOL_RETURN:
                self._tool_return(a, t)
            elif kind == _TRAIN_DONE:
                self._train_done(t)
            else:
                self._transfer_done(t)
        if not self.done:
            raise RuntimeError(f"simulation stalled at t={self.now:.3f}s after {self.steps_trained} steps")
        return self._result()

    # ---- engines

    def _account(self, e: _Engine, t: float) -> None:
        d = t - e.acc_t
        if d > 0:
            if e.paused:
                kind, e.sync_s = "sync", e.sync_s + d
            elif not e.running:
                kind, e.idle_s = "idle", e.idle_s + d
            else:
                kind, e.busy_s = "generate", e.busy_s + d
            if e.paused or len(e.running) < self.cost.max_running:
                e.underfilled_s += d
            _add_segment(e.segments, e.acc_t, t, kind)
        e.acc_t = t

    def _wake(self, e: _Engine, t: float, steps: int) -> None:
        self._account(e, t)
        e.wake_at = None
        if steps:
            e.tokens += len(e.running) * steps
            e.steps_done += steps
            e.unprefilled_tokens = 0  # the phase's first step (which carried the prefill) is done
        while e.finish_heap and e.finish_heap[0][0] <= e.steps_done:
            _, uid, sample = heapq.heappop(e.finish_heap)
            del e.running[uid]
            self._leave(e, sample, t)
        self._schedule(e, t)

    def _schedule(self, e: _Engine, t: float) -> None:
        """At a step boundary: pause if asked, pull work, plan the next phase."""
        if e.paused:
            return
        if e.pause_mode == "keep" or (e.pause_mode == "wait" and not e.launched):
            self._pause(e, t)
            return
        while self.fifo and self._can_pull(e):
            self._pull(e, t)
        while e.waiting and len(e.running) < self.cost.max_running:
            sample = e.waiting.popleft()
            sample.joined_step = e.steps_done
            if sample.fresh:
                sample.fresh, sample.started_at = False, t
                e.unprefilled_tokens += len(sample.request.prompt_token_ids)
            e.running[sample.uid] = sample
            heapq.heappush(e.finish_heap, (e.steps_done + sample.stop_at() - sample.generated, sample.uid, sample))
        if e.running:
            k = e.finish_heap[0][0] - e.steps_done
            e.phase_start, e.phase_steps = t, k
            e.phase_prefill = e.unprefilled_tokens * self.cost.prefill_per_token_s
            e.phase_dt = self.cost.step_s(len(e.running))
            self._set_wake(e, t + e.phase_prefill + k * e.phase_dt, k)

    def _set_wake(self, e: _Engine, at: float, steps: int) -> None:
        e.wake_token += 1
        e.wake_at = at
        self._push(at, _WAKE, e, e.wake_token, steps)

    def _poke(self, e: _Engine, t: float) -> None:
        """Something changed for `e` (new prompts, a sample back, a pause): act at the next boundary."""
        if e.paused:
            return
        if e.wake_at is None:
            e.phase_start, e.phase_steps, e.phase_prefill = t, 0, 0.0
            self._set_wake(e, t, 0)
            return
        elapsed = t - e.phase_start
        j = 0 if elapsed <= _EPS else max(1, math.ceil((elapsed - e.phase_prefill) / e.phase_dt - _EPS))
        if j >= e.phase_steps:
            return  # the planned wake is the next boundary anyway
        at = e.phase_start + (e.phase_prefill + j * e.phase_dt if j else 0.0)
        self._set_wake(e, max(at, t), j)  # max: float noise must not move time backwards

    def _can_pull(self, e: _Engine) -> bool:
        # As GenerationActor.run: pull while the engine holds fewer samples than its target.
        return not e.paused and e.pause_mode is None and e.launched < self.cost.max_running

    def _distribute(self, t: float) -> None:
        """Hand queued prompts to engines with room, one prompt per engine per round.

        Idle engines all block on the shared queue, which serves its getters in turn; letting the
        first engine take all it can would leave the others idle (and understate synchronous mode).
        """
        if not self.fifo:
            return
        order = self.engines[self.cursor:] + self.engines[:self.cursor]
        ready = [e for e in order if self._can_pull(e)]
        touched: dict[int, _Engine] = {}
        while self.fifo and ready:
            still = []
            for e in ready:
                if not self.fifo:
                    break
                self._pull(e, t)
                self.cursor = (e.id + 1) % len(self.engines)
                touched[e.id] = e
                if self._can_pull(e):
                    still.append(e)
            ready = still
        for e in touched.values():
            self._poke(e, t)  # the new samples join at the engine's next step boundary

    def _pull(self, e: _Engine, t: float) -> None:
        request, queued_at = self.fifo.popleft()
        for j, length in enumerate(self.lengths.pop(request.prompt_id)):
            tool_at = length // 2 if self.w.tool_latency_s > 0 and length >= 2 else length
            self.counter += 1
            e.waiting.append(_Sample(self.counter, request, j, length, tool_at, e, queued_at))

    def _leave(self, e: _Engine, sample: _Sample, t: float) -> None:
        """A sample stops at a step boundary: finished, or off to its tool call."""
        done = e.steps_done - sample.joined_step
        _extend_spans(sample.spans, e, sample.joined_step, e.steps_done, sample.generated)
        sample.generated += done
        if sample.generated < sample.length:
            self._push(t + self.w.tool_latency_s, _TOOL_RETURN, sample)
            return
        request = sample.request
        completion = Completion(
            prompt_id=request.prompt_id, sample_index=sample.index,
            prompt_token_ids=request.prompt_token_ids, response_token_ids=range(sample.length),  # type: ignore[arg-type]
            behaviour_logprobs=(), finish_reason="length" if sample.length >= self.w.max_tokens else "stop",
            version_spans=tuple(sample.spans), admitted_version=request.admitted_version, engine_id=e.id,
            queued_at=sample.queued_at, started_at=sample.started_at, first_token_at=sample.started_at,
            finished_at=t,
        )
        if self.buffer.add(completion) is AddResult.REJECTED_FULL:
            self.held_back.append(completion)
        self._try_train(t)

    def _tool_return(self, sample: _Sample, t: float) -> None:
        e = sample.engine
        if e.paused or e.pause_mode is not None:
            e.parked.append(sample)  # a paused (or draining) engine takes no new requests
            return
        e.waiting.appendleft(sample)  # a continuing sample goes before new prompts
        if len(e.running) < self.cost.max_running:
            self._poke(e, t)

    # ---- weight sync

    def _request_pause(self, e: _Engine, t: float, mode: str) -> None:
        e.pause_mode = mode
        if e.wake_at is None:
            self._account(e, t)
            self._pause(e, t)
        elif mode == "keep":
            self._poke(e, t)  # freeze at the next step boundary
        # "wait": the engine drains; `_schedule` pauses it once nothing is left in it.

    def _pause(self, e: _Engine, t: float) -> None:
        e.paused = True
        self.paused_engines += 1
        if self.paused_engines == len(self.engines):
            self._push(t + self.cost.weight_sync_pause_s, _TRANSFER_DONE)

    def _transfer_done(self, t: float) -> None:
        self.paused_engines = 0
        self.sync_pauses.append(t - self.learner_since)
        self._learner_to("wait" if self.steps_trained < self.w.num_steps else "end", t)
        if self.steps_trained == self.w.num_steps:
            self._finish(t)
            return
        for e in self.engines:
            self._account(e, t)
            e.paused, e.pause_mode = False, None
            e.version_steps.append(e.steps_done)
            e.versions.append(self.version)
            e.waiting.extendleft(reversed(e.parked))
            e.parked.clear()
        self._admit(t)  # the real loop admits right after the sync
        for e in self.engines:
            self._poke(e, t)  # resume: kept samples continue, queued ones start
        self._try_train(t)

    # ---- learner

    def _learner_to(self, state: str, t: float) -> None:
        _add_segment(self.learner_segments, self.learner_since, t, self.learner_state)
        if self.learner_state == "wait":
            self.learner_wait_s += t - self.learner_since
        self.learner_state, self.learner_since = state, t

    def _admit(self, t: float) -> None:
        requests = self.feeder.admit(self.version)
        if not requests:
            return
        for request in requests:
            self.lengths[request.prompt_id] = self._draw_lengths()
            self.fifo.append((request, t))
        self._distribute(t)

    def _draw_lengths(self) -> list[int]:
        w = self.w
        return [capped_lognormal(self.lengths_rng, w.median_tokens, w.sigma, w.max_tokens)
                for _ in range(w.samples_per_prompt)]

    def _try_train(self, t: float) -> None:
        if self.learner_state != "wait":
            return
        per_step = self.w.prompts_per_step
        # `ready` first: evict only removes groups (so it cannot make a batch ready) and walks the whole
        # buffer; calling it on every sample, as the real loop does per poll, made big runs O(n^2).
        if self.buffer.ready(per_step):
            self.buffer.evict(self.version)
        if not self.buffer.ready(per_step):
            self._admit(t)  # as in wait_for_batch: evictions may have freed admission room
            return
        groups = self.buffer.take(per_step, self.version)
        completions = [c for g in groups for c in g.completions]
        self.step_metrics.append(rollout_metrics(completions, self.version))
        duration = self.cost.learner_step_s(sum(sample_tokens(c) for c in completions), self.cluster.num_learners)
        self.learner_train_s.append(duration)
        self._learner_to("train", t)
        self._push(t + duration, _TRAIN_DONE)
        offered, self.held_back = self.held_back, []
        for completion in offered:
            if self.buffer.add(completion) is AddResult.REJECTED_FULL:
                self.held_back.append(completion)

    def _train_done(self, t: float) -> None:
        self.version += 1
        self.steps_trained += 1
        self._learner_to("sync", t)
        mode = "keep" if self.inflight else "wait"
        for e in self.engines:
            self._request_pause(e, t, mode)

    # ---- results

    def _finish(self, t: float) -> None:
        self.done = True
        for e in self.engines:
            self._account(e, t)
            if e.wake_at is not None and e.running and e.phase_steps:
                steps = math.floor((t - e.phase_start - e.phase_prefill) / e.phase_dt + _EPS)
                e.tokens += len(e.running) * min(e.phase_steps, max(0, steps))

    def _result(self) -> SimResult:
        wall = self.now
        engine_s = wall * len(self.engines)
        trained = self.steps_trained * self.w.prompts_per_step * self.w.samples_per_prompt
        m = self.step_metrics
        ends = [s[1] for s in self.learner_segments if s[2] == "sync"]
        warmup = warmup_steps(len(ends))
        steady_s = ends[-1] - (ends[warmup - 1] if warmup else 0.0) if ends else 0.0
        per_step = self.w.prompts_per_step * self.w.samples_per_prompt
        timeline = [Segment("learner", *s) for s in self.learner_segments]
        for e in self.engines:
            timeline += [Segment(e.name, *s) for s in e.segments]
        return SimResult(
            mode=self.mode,
            async_steps=self.async_steps,
            num_steps=self.steps_trained,
            trained_samples=trained,
            wall_s=wall,
            trained_samples_per_s=trained / wall,
            generated_tokens_per_s=sum(e.tokens for e in self.engines) / wall,
            generation_idle_frac=sum(e.idle_s + e.sync_s for e in self.engines) / engine_s,
            engine_underfilled_frac=sum(e.underfilled_s for e in self.engines) / engine_s,
            learner_wait_frac=self.learner_wait_s / wall,
            learner_step_s_avg=_mean(self.learner_train_s),
            weight_sync_pause_s_avg=_mean(self.sync_pauses),
            version_lag_avg=_mean(s["staleness/version_lag_avg"] for s in m),
            version_lag_max=max((s["staleness/version_lag_max"] for s in m), default=0.0),
            multi_version_frac=_mean(s["staleness/multi_version_frac"] for s in m),
            trained_length_avg=_mean(s["val/sequence_lengths"] for s in m),
            token_lag_avg=_mean(s["staleness/token_lag_avg"] for s in m),
            group_latency_s_avg=_mean(s["time/group_latency_s_avg"] for s in m),
            warmup_steps=warmup,
            steady_trained_samples_per_s=per_step * (len(ends) - warmup) / steady_s if steady_s > 0 else 0.0,
            timeline=tuple(timeline),
        )


def warmup_steps(num_steps: int) -> int:
    """The first quarter of a run (at least one step when there are two): streaming's first batch
    waits for the pipeline to fill, a cost a run of thousands of steps pays once."""
    return max(1, num_steps // 4) if num_steps >= 2 else 0


def _add_segment(segments: list[list], start: float, end: float, kind: str) -> None:
    if end <= start:
        return
    if segments and segments[-1][2] == kind and abs(segments[-1][1] - start) <= _EPS:
        segments[-1][1] = end
    else:
        segments.append([start, end, kind])


def _extend_spans(spans: list[VersionSpan], e: _Engine, first_step: int, end_step: int, offset: int) -> None:
    """Version spans of the tokens an engine generated for a sample during steps [first, end)."""
    i = bisect_right(e.version_steps, first_step) - 1
    step = first_step
    while step < end_step:
        switch = e.version_steps[i + 1] if i + 1 < len(e.version_steps) else end_step
        stop = min(end_step, switch)
        if stop > step:
            start, end, version = offset + step - first_step, offset + stop - first_step, e.versions[i]
            if spans and spans[-1].version == version and spans[-1].end == start:
                spans[-1] = VersionSpan(version, spans[-1].start, end)
            else:
                spans.append(VersionSpan(version, start, end))
        step = stop
        i += 1


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


# ---------------------------------------------------------------------------------------------------
# Public API


def simulate(mode: str, workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int = 1) -> SimResult:
    """Simulate `workload.num_steps` training steps. `async_steps` applies to "streaming" only:
    "synchronous" is async_steps=0 and "one_step_async" is async_steps=1, both with a draining sync."""
    if mode == "synchronous":
        steps, inflight = 0, False
    elif mode == "one_step_async":
        steps, inflight = 1, False
    elif mode == "streaming":
        steps, inflight = async_steps, True
    else:
        raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")
    _validate(workload, cost, cluster, async_steps)
    return _Simulation(mode, workload, cost, cluster, steps, inflight).run()


def _validate(workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int) -> None:
    problems = [
        name for name, ok in (
            ("async_steps >= 0", async_steps >= 0),
            ("prompts_per_step >= 1", workload.prompts_per_step >= 1),
            ("samples_per_prompt >= 1", workload.samples_per_prompt >= 1),
            ("num_steps >= 1", workload.num_steps >= 1),
            ("prompt_tokens >= 0", workload.prompt_tokens >= 0),
            ("median_tokens > 0", workload.median_tokens > 0),
            ("sigma >= 0", workload.sigma >= 0),
            ("max_tokens >= 1", workload.max_tokens >= 1),
            ("tool_latency_s >= 0", workload.tool_latency_s >= 0),
            ("max_running >= 1", cost.max_running >= 1),
            ("decode step time > 0 and not shrinking with the batch",
             cost.decode_base_s + cost.decode_per_seq_s > 0 and cost.decode_per_seq_s >= 0),
            ("num_engines >= 1", cluster.num_engines >= 1),
            ("num_learners >= 1", cluster.num_learners >= 1),
        ) if not ok
    ]
    if problems:
        raise ValueError(f"simulator inputs violate: {', '.join(problems)}")


def run_modes(workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int = 1) -> dict[str, SimResult]:
    return {mode: simulate(mode, workload, cost, cluster, async_steps) for mode in MODES}


def summarize(results: dict[str, SimResult]) -> dict[str, Any]:
    out: dict[str, Any] = {mode: r.as_json() for mode, r in results.items()}
    sync = results["synchronous"].trained_samples_per_s
    out["speedup_streaming_vs_sync"] = results["streaming"].trained_samples_per_s / sync
    out["speedup_one_step_async_vs_sync"] = results["one_step_async"].trained_samples_per_s / sync
    return out


def compare(workload: Workload, cost: CostModel, cluster: Cluster, async_steps: int = 1) -> dict[str, Any]:
    """The three modes' `as_json()` keyed by mode, plus `speedup_streaming_vs_sync` (and one-step-async's)."""
    return summarize(run_modes(workload, cost, cluster, async_steps))


def fit_cost_model(measured: dict[str, Any]) -> CostModel:
    """Least-squares cost model from measurements on a real (small) setup.

    Format (times in seconds):
        {"decode": [{"running": 32, "tokens_per_s": 1800.0}, ...],  # one engine, fixed running samples
         "prefill_tokens_per_s": 20000.0,
         "learner": [{"tokens": 65536, "step_s": 4.2}, ...],  # tokens of the whole batch (all ranks)
         "weight_sync_pause_s": 1.5,
         "max_running": 256,
         "num_learners": 2}  # the data-parallel ranks the learner points were measured on

    Decode: step_s = running / tokens_per_s, fitted as decode_base_s + decode_per_seq_s * running.
    Learner: step_s fitted as learner_base_s + learner_per_token_s * tokens / num_learners. With a
    single distinct x a line cannot be fitted and goes through the origin; a negative intercept is
    refitted through the origin, a negative slope becomes 0 (intercept = mean).
    """
    decode = measured["decode"]
    base, per_seq = _fit_line([p["running"] for p in decode], [p["running"] / p["tokens_per_s"] for p in decode])
    learners = measured.get("num_learners", 1)
    learner = measured["learner"]
    l_base, l_per_token = _fit_line([p["tokens"] / learners for p in learner], [p["step_s"] for p in learner])
    return CostModel(
        decode_base_s=base,
        decode_per_seq_s=per_seq,
        prefill_per_token_s=1.0 / measured["prefill_tokens_per_s"] if measured.get("prefill_tokens_per_s") else 0.0,
        max_running=int(measured["max_running"]),
        weight_sync_pause_s=float(measured["weight_sync_pause_s"]),
        learner_base_s=l_base,
        learner_per_token_s=l_per_token,
    )


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) by least squares."""
    if not xs or len(xs) != len(ys):
        raise ValueError("need at least one (x, y) point to fit")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my / mx if mx else 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope < 0:
        return my, 0.0
    intercept = my - slope * mx
    if intercept < 0:
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return intercept, slope


def workload_from_json(d: dict[str, Any], num_steps: int | None = None) -> Workload:
    return Workload(
        prompts_per_step=int(d["prompts_per_step"]), samples_per_prompt=int(d["samples_per_prompt"]),
        num_steps=int(num_steps or d.get("num_steps", 10)), prompt_tokens=int(d["prompt_tokens"]),
        median_tokens=float(d["median_tokens"]), sigma=float(d["sigma"]), max_tokens=int(d["max_tokens"]),
        tool_latency_s=float(d.get("tool_latency_s") or 0.0), seed=int(d.get("seed", 0)),
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
        }


def needed(result: SimResult) -> int:
    """The trainer's own advice (`scheduling/async_steps_needed`) from this run's group latency."""
    return async_steps_needed(result.group_latency_s_avg, result.learner_step_s_avg + result.weight_sync_pause_s_avg)


def sweep_async_steps(workload: Workload, cost: CostModel, cluster: Cluster, async_steps: list[int]) -> AsyncSweep:
    return AsyncSweep(
        synchronous=simulate("synchronous", workload, cost, cluster),
        one_step_async=simulate("one_step_async", workload, cost, cluster),
        streaming={a: simulate("streaming", workload, cost, cluster, a) for a in async_steps},
    )


def format_sweep(sweep: AsyncSweep) -> str:
    header = ("mode", "async", "samples/s", "speedup", "gen idle", "learner wait", "sync pause s", "lag avg",
              "lag max", "token lag", "group s", "needed")
    runs = [("synchronous", sweep.synchronous), ("one_step_async", sweep.one_step_async)]
    runs += [("streaming", r) for r in sweep.streaming.values()]
    rows = [header] + [(
        mode, str(r.async_steps), f"{r.steady_trained_samples_per_s:.2f}", f"{sweep.speedup(r):.2f}x",
        f"{r.generation_idle_frac:.1%}", f"{r.learner_wait_frac:.1%}", f"{r.weight_sync_pause_s_avg:.2f}",
        f"{r.version_lag_avg:.2f}", f"{r.version_lag_max:.0f}", f"{r.token_lag_avg:.2f}",
        f"{r.group_latency_s_avg:.0f}", str(needed(r)),
    ) for mode, r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    ceiling = sweep.learner_bound_samples_per_s
    lines.append(f"learner-bound ceiling: {ceiling:.2f} samples/s "
                 f"({ceiling / sweep.synchronous.steady_trained_samples_per_s:.2f}x synchronous); streaming reaches "
                 f"{sweep.speedup(sweep.streaming[sweep.chosen_async_steps]):.2f}x at async_steps "
                 f"{sweep.chosen_async_steps}")
    return "\n".join(lines)


def plot_sweep(sweep: AsyncSweep, path: Path) -> None:
    """Speedup and staleness vs async_steps: the trade-off a researcher picks from."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(sweep.streaming)
    runs = [sweep.streaming[a] for a in steps]
    fig, speed = plt.subplots(figsize=(7, 4))
    speed.plot(steps, [sweep.speedup(r) for r in runs], "o-", color="#4c9a2a", label="streaming / synchronous")
    ceiling = sweep.learner_bound_samples_per_s / sweep.synchronous.steady_trained_samples_per_s
    speed.axhline(ceiling, color="#4c9a2a", linestyle=":", label="learner-bound ceiling")
    speed.set_xlabel("--async_steps")
    speed.set_ylabel("trained samples/s vs synchronous")
    speed.set_xticks(steps)
    speed.set_ylim(0, 1.15 * max([ceiling] + [sweep.speedup(r) for r in runs]))
    lag = speed.twinx()
    lag.plot(steps, [r.version_lag_avg for r in runs], "s--", color="#d62728", label="lag avg (oldest token)")
    lag.plot(steps, [r.token_lag_avg for r in runs], "^--", color="#ff7f0e", label="lag avg (per token)")
    lag.set_ylabel("version lag at training")
    lag.set_ylim(bottom=0)
    handles = speed.get_legend_handles_labels()[0] + lag.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="lower right", fontsize=8, bbox_to_anchor=(0.88, 0.15))
    speed.set_title("seed cluster shape (simulated): throughput and staleness vs lookahead", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def format_table(summary: dict[str, Any]) -> str:
    rows = [[title for title, _, _ in _COLUMNS]]
    for mode in MODES:
        r = dict(summary[mode], step_s=summary[mode]["wall_s"] / max(1, summary[mode]["num_steps"]))
        rows.append([fmt.format(r[key]) for _, key, fmt in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.append(f"speedup streaming vs synchronous: {summary['speedup_streaming_vs_sync']:.2f}x; "
                 f"one-step-async vs synchronous: {summary['speedup_one_step_async_vs_sync']:.2f}x")
    return "\n".join(lines)


_COLORS = {"generate": "#4c9a2a", "idle": "#dddddd", "sync": "#d62728", "train": "#1f77b4", "wait": "#ffbf00"}


def plot_timelines(panels: list[tuple[str, SimResult]], path: Path, steps: int = 3, max_engines: int = 32,
                   steady: bool = False) -> None:
    """One panel per (title, result): a row per actor, `steps` steps from the start, or with `steady`
    from the end of the warm-up (the pipeline as a long run sees it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    cols = 2
    rows = math.ceil(len(panels) / cols)
    actors_max = 1 + min(max_engines, max(len({s.actor for s in r.timeline}) - 1 for _, r in panels))
    fig, axes = plt.subplots(rows, cols, figsize=(16, rows * (1.5 + 0.22 * actors_max)), squeeze=False)
    for ax, (title, result) in zip(axes.flat, panels):
        ends = result.step_ends()
        first = result.warmup_steps if steady else 0
        origin = ends[first - 1] if first else 0.0
        horizon = ends[min(first + steps, len(ends)) - 1] if ends else result.wall_s
        actors = ["learner"] + [f"engine {i}" for i in range(max_engines)]
        present = [a for a in actors if any(s.actor == a for s in result.timeline)]
        row_of = {a: i for i, a in enumerate(present)}
        for kind, color in _COLORS.items():
            bars: dict[int, list[tuple[float, float]]] = {}
            for s in result.timeline:
                if s.kind == kind and s.actor in row_of and s.start_s < horizon and s.end_s > origin:
                    start = max(s.start_s, origin)
                    bars.setdefault(row_of[s.actor], []).append((start, min(s.end_s, horizon) - start))
            for row, spans in bars.items():
                ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=color)
        ax.set_yticks(range(len(present)), present, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(origin, horizon)
        ax.set_xlabel("simulated time (s)")
        rate = result.steady_trained_samples_per_s if steady else result.trained_samples_per_s
        shown = f"steps {first + 1}-{min(first + steps, len(ends))}" + (" (steady)" if steady else "")
        ax.set_title(f"{title}: {rate:.2f} samples/s, {shown}", fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in _COLORS.items()], loc="upper center", ncol=len(_COLORS))
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", type=Path, help="JSON of measurements, a workload and a cluster (see fit_cost_model)")
    parser.add_argument("--output", type=Path, default=Path("output/simulator"), help="where simulator.json and the PNGs go")
    parser.add_argument("--seed_steps", type=int, default=SEED_CLUSTER_WORKLOAD.num_steps,
                        help="steps of the seed-cluster projection (its first quarter is warm-up)")
    parser.add_argument("--async_steps", type=int, default=1, help="async_steps of the streaming mode on the measured setup")
    parser.add_argument("--async_sweep", default="1,2,3,4",
                        help="comma-separated async_steps of the streaming mode projected at the seed's shape")
    args = parser.parse_args(argv)
    sweep_steps = sorted({int(a) for a in args.async_sweep.split(",") if a.strip()})
    if not sweep_steps or min(sweep_steps) < 1:
        parser.error(f"--async_sweep needs async_steps >= 1, got {args.async_sweep!r}")
    args.output.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    panels: list[tuple[str, SimResult]] = []

    if args.measured:
        data = json.loads(args.measured.read_text())
        cost = fit_cost_model(data)
        workload = workload_from_json(data["workload"])
        cluster = Cluster(int(data["cluster"]["num_engines"]), int(data["cluster"]["num_learners"]))
        started = time.monotonic()
        runs = run_modes(workload, cost, cluster, args.async_steps)
        summary = summarize(runs)
        entry: dict[str, Any] = {"cost_model": asdict(cost), "workload": asdict(workload), "cluster": asdict(cluster),
                                 **summary, "sim_s": time.monotonic() - started}
        print(f"== measured setup ({args.measured}): {cluster.num_engines} engines, {cluster.num_learners} learners")
        print(f"fitted cost model: {cost}")
        print(format_table(summary))
        measured_speedup = data.get("measured_speedup_streaming_vs_sync")
        if measured_speedup:
            error = summary["speedup_streaming_vs_sync"] / measured_speedup - 1
            entry["measured_speedup_streaming_vs_sync"] = measured_speedup
            entry["speedup_relative_error"] = error
            print(f"streaming vs synchronous: predicted {summary['speedup_streaming_vs_sync']:.2f}x, "
                  f"measured {measured_speedup:.2f}x (relative error {error:+.1%})")
        report["measured"] = entry
        panels += [("measured: synchronous", runs["synchronous"]), ("measured: streaming", runs["streaming"])]

    seed = dataclasses.replace(SEED_CLUSTER_WORKLOAD, num_steps=args.seed_steps)
    started = time.monotonic()
    sweep = sweep_async_steps(seed, GPU_H100_COST, SEED_CLUSTER, sweep_steps)
    print(f"== seed cluster projection: {SEED_CLUSTER.num_engines} engines x H100 (assumed costs), "
          f"{SEED_CLUSTER.num_learners} learners, {seed.prompts_per_step}x{seed.samples_per_prompt} samples/step, "
          f"responses lognormal(median {seed.median_tokens:.0f}, sigma {seed.sigma}) capped at {seed.max_tokens}, "
          f"{seed.num_steps} steps (rates after {warmup_steps(seed.num_steps)} warm-up steps)")
    print(format_sweep(sweep))
    report["seed_projection"] = {"cost_model": asdict(GPU_H100_COST), "workload": asdict(seed),
                                 "cluster": asdict(SEED_CLUSTER), **sweep.as_json(), "sim_s": time.monotonic() - started}
    chosen = sweep.streaming[sweep.chosen_async_steps]
    seed_panels = [("seed cluster: synchronous", sweep.synchronous),
                   (f"seed cluster: streaming, async_steps {sweep.chosen_async_steps}", chosen)]

    (args.output / "simulator.json").write_text(json.dumps(report, indent=2))
    if panels:
        plot_timelines(panels, args.output / "simulator_timeline_measured.png")
    plot_timelines(seed_panels, args.output / "simulator_timeline.png", steady=True)
    plot_sweep(sweep, args.output / "simulator_async_sweep.png")
    print(f"wrote simulator.json, simulator_timeline.png (seed shape), simulator_async_sweep.png"
          f"{' and simulator_timeline_measured.png' if panels else ''} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
