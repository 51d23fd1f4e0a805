"""What the simulated collaborators share: the workload, the cost model and cluster, the virtual clock and its
event heap (`SimWorld`), and how fast a simulated policy drifts. See `simulated_stack` for the model."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

TIME_EPS = 1e-9  # seconds; float slack when locating step boundaries


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
    # per engine step, per token the running samples attend to (prompt + generated): attention grows with
    # the context (fitted on the CPU stack, it outweighs the per-sample cost past about 50 tokens of context)
    decode_per_context_token_s: float = 0.0
    # engine time per sample for its way through the prompt and result queues (pull, scoring, push), paid
    # in its first step; measured as the queue path's extra time over a direct batch of the same samples
    per_sample_s: float = 0.0
    # from a prompt's admission until an engine can take it: the prompt queue's transit and the engine's pull
    # (`Completion.started_at - queued_at` where the engine had room); the engine steps on meanwhile
    start_latency_s: float = 0.0
    # the KV cache's block: a sample's context counts in whole blocks, as the engine's KV usage does (vLLM's CPU
    # backend: 128 tokens); 1 counts tokens
    kv_block_tokens: int = 1
    # the driver's CPU per trained sample (taking it in, filing it, assembling and shipping its batch): the loop
    # does this between the learners' steps, so it adds to every step (`benchmarks.driver_headroom` measures it)
    driver_per_sample_s: float = 0.0

    def step_s(self, running: int, context_tokens: float = 0.0) -> float:
        return self.decode_base_s + self.decode_per_seq_s * running + self.decode_per_context_token_s * context_tokens

    def start_s(self, prefill_tokens: float, samples: float) -> float:
        """What the step in which samples start pays on top of decoding: their prefill and their queue path."""
        return prefill_tokens * self.prefill_per_token_s + samples * self.per_sample_s

    def learner_step_s(self, trained_tokens: int, num_learners: int) -> float:
        return self.learner_base_s + self.learner_per_token_s * trained_tokens / num_learners


@dataclass(frozen=True)
class Cluster:
    num_engines: int
    num_learners: int


class Segment(NamedTuple):
    actor: str  # "learner" or "engine <i>"
    start_s: float
    end_s: float
    kind: str  # engines: generate / idle / sync; learner: wait / train / sync


class SimWorld:
    """A heap of (time, order, handler, args) events; `run` advances virtual time through them."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple] = []
        self._order = 0

    def at(self, t: float, handler: Callable, *args: Any) -> None:
        self._order += 1
        heapq.heappush(self._events, (t, self._order, handler, args))

    def run(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Process events before `until` in time order; return early once `stop()` holds.

        Events at exactly `until` stay queued: whatever the caller does at that instant (a learner
        step ending, a sync starting) comes first, as a real driver acts before its next poll."""
        while not (stop and stop()):
            if not self._events or self._events[0][0] >= until:
                if until == math.inf:
                    raise RuntimeError(f"simulation stalled at t={self.now:.3f}s: nothing left to happen")
                self.now = max(self.now, until)
                return
            t, _, handler, args = heapq.heappop(self._events)
            self.now = t
            handler(*args)


class VirtualClock:
    def __init__(self, world: SimWorld):
        self.world = world

    def time(self) -> float:
        return self.world.now


@dataclass(frozen=True)
class PolicyDrift:
    """How far the policy moves per learner version, as the spread of the importance weights it causes: a
    token generated `lag` versions before the learner has log(pi_old / mu) ~ Normal(-s^2 / 2, s^2) with
    s = per_version * lag (mean weight 1). A higher learning rate is a larger `per_version`. Gives a step's
    `offpolicy/ess_frac` (1 / mean over tokens of exp(s^2)) and `offpolicy/truncated_frac` (the share of
    weights above `cap`) in expectation, as the real learner measures them on sampled weights."""

    per_version: float
    cap: float = 2.0

    def metrics(self, lags: list[tuple[int, int]]) -> dict[str, float]:
        """`lags`: (lag, tokens) of the step's trained tokens."""
        total = sum(n for _, n in lags)
        if total == 0:
            return {}
        second_moment = sum(n * math.exp((self.per_version * lag) ** 2) for lag, n in lags) / total
        truncated = sum(n * self._above_cap(self.per_version * lag) for lag, n in lags) / total
        return {"offpolicy/ess_frac": 1.0 / second_moment, "offpolicy/truncated_frac": truncated}

    def _above_cap(self, s: float) -> float:
        if s <= 0:
            return 0.0
        return 0.5 * math.erfc((math.log(self.cap) + s * s / 2) / (s * math.sqrt(2)))
