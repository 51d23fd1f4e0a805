"""Simulated collaborators for `orchestrator.TrainingLoop`: engines, learners and weight sync on a virtual clock.

The simulator (`simulator.py`) runs the real training loop; only what the loop talks to is
replaced. A `SimWorld` holds a heap of events in virtual time; every blocking call the loop
makes advances it: `SimEngines.poll` until a sample finishes (or its timeout), the learner's
`train_step` by the step's cost, the weight sync until every engine has paused and then by the
transfer's cost. So engines keep generating while the loop trains or syncs, exactly as real
engines do while the driver waits on Ray, and nothing sleeps.

Engine model (like `GenerationActor.run`): an engine pulls whole prompts from one shared FIFO (work
stealing) while it holds fewer than `max_running` samples; engines with room take turns, one prompt
each, as getters blocked on one queue do. The scheduler runs at most `max_running` samples (the rest
of a prompt's samples wait in the engine). Decoding advances in steps: each running sample gains one
token per step, a step takes `decode_base_s + decode_per_seq_s * running +
decode_per_context_token_s * context` (context: the prompt and generated tokens of the running
samples, each sample's in whole `kv_block_tokens` KV blocks, as the engine holds and reports them),
and the step in which samples start also pays `prefill_per_token_s` per prompt token of
each and `per_sample_s` per new sample. An admitted prompt reaches the shared queue `start_latency_s`
later; new work and pauses take effect at the next step boundary.
Between two events an engine's running set is fixed, so it jumps k steps to the next finish (or to
the next boundary after an interruption) instead of simulating every token; the k steps are equal,
each at the phase's mean context. With a tool latency, a sample stops halfway, leaves its engine
(freeing the slot) for the wait, then queues at the front of the same engine's waiting line (its
context assumed prefix-cached).

Weight sync: "keep" pauses each engine at its next step boundary and its running samples
continue afterwards with the new version (they span two versions); "reprefill" pauses there too
but takes the running samples out: after the resume each one joins again and pays the prefill of
prompt + its tokens (`--inflight_update_kv reprefill`); "wait" lets each engine drain first
(samples out on a tool call are parked until the resume). The transfer starts when the last
engine has paused and takes `weight_sync_pause_s`.

Completions carry `range(n)` as response token ids: an O(1)-size immutable int sequence whose
`len()` is the simulated length, so the buffer's token accounting and length metrics are exact
without materializing 16k-token tuples at cluster scale (prompts share one tuple of zeros).
"""

from __future__ import annotations

from benchmarks.simulated_engines import SimEngines
from benchmarks.simulated_world import (
    CostModel,
    PolicyDrift,
    SimWorld,
)
from open_instruct.messages import StepReport
from open_instruct.replay_buffer import sample_tokens


class SimLearners:
    """`num_learners` data-parallel ranks whose step costs `CostModel.learner_step_s` of the batch's tokens;
    with a `drift`, each step also reports the off-policy health its trained tokens' lags imply."""

    def __init__(self, world: SimWorld, cost: CostModel, num_learners: int, drift: PolicyDrift | None = None):
        self.world, self.cost, self.num_learners, self.drift = world, cost, num_learners, drift
        self.steps: list[tuple[float, float]] = []  # (start, end) of each train step

    def train_step(self, groups, step: int) -> StepReport:
        samples = sum(len(g.completions) for g in groups)
        tokens = sum(sample_tokens(c) for g in groups for c in g.completions)
        started = self.world.now
        duration = self.cost.learner_step_s(tokens, self.num_learners)
        driver_s = self.cost.driver_per_sample_s * samples  # the driver's part of the step, before and after it
        self.world.run(until=started + driver_s + duration)  # the engines keep generating meanwhile
        self.steps.append((started, self.world.now))
        metrics = {"learner/step_s": duration, "driver/step_s": driver_s}
        if self.drift is not None:
            metrics |= self.drift.metrics(trained_lags(groups, step))
        return StepReport(metrics, tokens, started, self.world.now)

    def save_model(self, path: str) -> None:
        raise NotImplementedError("simulated runs have no weights to save")

    save_state = load_state = save_model


class SimWeightSync:
    """Pause every engine ("keep" or "reprefill" in flight, or "wait" to drain), transfer, resume with the new
    version."""

    def __init__(self, world: SimWorld, engines: SimEngines, cost: CostModel, pause_mode: str):
        self.world, self.engines, self.cost, self.pause_mode = world, engines, cost, pause_mode
        self.syncs: list[tuple[float, float]] = []  # (step end, engines resumed)

    def sync(self, version: int, step_end_time: float | None = None) -> dict[str, float]:
        started = self.world.now
        self.engines.request_pause(self.pause_mode)
        self.world.run(stop=self.engines.all_paused)
        drained = self.world.now
        self.world.run(until=drained + self.cost.weight_sync_pause_s)
        self.engines.resume(version)
        self.syncs.append((started, self.world.now))
        return {
            "time/weight_sync_pause_s": self.world.now - started,
            "time/weight_sync_drain_s": drained - started,
            "weight_sync/version": float(version),
        }


def trained_lags(groups, learner_version: int) -> list[tuple[int, int]]:
    """(lag, tokens) of every response token the loss sees (the `mask` action leaves older ones out)."""
    return [
        (learner_version - span.version, span.end - span.start)
        for g in groups
        for c in g.completions
        for span in c.token_spans
        if span.version >= g.trained_from_version
    ]
