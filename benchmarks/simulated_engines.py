"""Simulated engines: the engine model of `simulated_stack` (work stealing from one queue, decode in steps,
tool waits, the three weight-sync pauses) on the virtual clock."""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_right
from collections import deque
from collections.abc import Callable

from benchmarks.simulated_world import TIME_EPS, CostModel, SimWorld, Workload
from benchmarks.workloads import capped_lognormal
from open_instruct.generation.channels import LocalChannel
from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.messages import Completion, EngineStats, PromptRequest, VersionSpan


class _Sample:
    __slots__ = (
        "aborted",
        "engine",
        "fresh",
        "generated",
        "index",
        "joined_step",
        "length",
        "reprefill",
        "request",
        "spans",
        "started_at",
        "tool_at",
        "uid",
    )

    def __init__(self, uid: int, request: PromptRequest, index: int, length: int, tool_at: int, engine: _Engine):
        self.uid = uid  # deterministic tie-break among samples finishing at the same step
        self.request, self.index, self.length, self.tool_at = request, index, length, tool_at
        self.generated = 0
        self.joined_step = 0
        self.spans: list[VersionSpan] = []
        self.engine, self.started_at = engine, 0.0
        self.fresh = True  # still needs its prefill
        self.reprefill = False  # cut by a reprefill sync: needs the prefill of prompt + its tokens again
        self.aborted = False  # doomed by the staleness bound: leaves at the next step boundary

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
        self.pause_mode: str | None = None  # "keep" / "reprefill" / "wait" while a sync is pending
        self.wake_token = 0
        self.wake_at: float | None = None
        self.phase_start = self.phase_prefill = self.phase_dt = 0.0
        self.phase_steps = 0
        self.unprefilled_tokens = 0
        self.unstarted_samples = 0  # fresh samples joining at the next step: each pays `per_sample_s` there
        self.acc_t = 0.0
        self.tokens = self.samples = self.pulled = 0
        self.reprefilled = self.reprefill_tokens = 0
        self.busy_s = self.idle_s = self.sync_s = self.underfilled_s = 0.0
        self.segments: list[list] = []

    @property
    def launched(self) -> int:
        return len(self.running) + len(self.waiting)


class SimEngines:
    """The engine pool (`orchestrator.Engines`) over simulated engines; prompts and results travel on
    `LocalChannel`s and the real `DeliveryLedger` checks that every admitted sample is delivered once."""

    def __init__(
        self,
        world: SimWorld,
        workload: Workload,
        cost: CostModel,
        num_engines: int,
        sample_length: Callable[[str], int] | None = None,
    ):
        self.world, self.w, self.cost = world, workload, cost
        self.sample_length = sample_length  # "<prompt id>/<sample index>" -> its response length; None: drawn
        self.engines = [_Engine(i) for i in range(num_engines)]
        self.prompts: LocalChannel[PromptRequest] = LocalChannel(name="prompt queue")
        self.results: LocalChannel[Completion] = LocalChannel(name="result queue")
        self.ledger = DeliveryLedger()
        self.lengths_rng = random.Random(workload.seed)
        self.lengths: dict[str, list[int]] = {}  # response lengths of admitted, not yet pulled prompts
        self.cursor = 0  # the engine the shared queue serves next
        self.paused_engines = 0
        self._uid = 0

    # -- the loop's side

    def start_loops(self) -> None:
        """Simulated engines run from time 0."""

    def submit(self, requests: list[PromptRequest]) -> None:
        w = self.w
        for request in requests:
            self.ledger.admit(request)
            if self.sample_length is not None:  # a replay: each sample as long as the real one was
                lengths = [self.sample_length(f"{request.prompt_id}/{j}") for j in range(request.num_samples)]
            else:  # drawn in admission order: the k-th admitted prompt has the same lengths in every mode
                lengths = [
                    capped_lognormal(self.lengths_rng, w.median_tokens, w.sigma, w.max_tokens)
                    for _ in range(request.num_samples)
                ]
            self.lengths[request.prompt_id] = lengths
        if self.cost.start_latency_s > 0:
            self.world.at(self.world.now + self.cost.start_latency_s, self._arrive, requests)
        else:
            self._arrive(requests)

    def _arrive(self, requests: list[PromptRequest]) -> None:
        for request in requests:
            self.prompts.put(request)
        if requests:
            self._distribute(self.world.now)

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        if timeout_s > 0 and not self.results.depth():
            self.world.run(until=self.world.now + timeout_s, stop=self.results.depth)
        return self.results.get_all()

    def stats(self) -> list[EngineStats]:
        now = self.world.now
        out = []
        for e in self.engines:
            self._account(e, now)
            out.append(
                EngineStats(
                    engine_id=e.id,
                    target_concurrency=self.cost.max_running,
                    running_samples=len(e.running),
                    waiting_requests=len(e.waiting),
                    kv_cache_usage=0.0,
                    generated_tokens=e.tokens,
                    completed_samples=e.samples,
                    prompts_pulled=e.pulled,
                    uptime_s=now,
                    idle_s=e.idle_s,
                    underfilled_s=e.underfilled_s,
                    paused_s=e.sync_s,
                    pauses=0,
                    weight_version=e.versions[-1],
                    reprefilled_samples=e.reprefilled,
                    reprefill_tokens=e.reprefill_tokens,
                )
            )
        return out

    def pool_metrics(self) -> dict[str, float]:
        return {"queue/prompt_depth": self.prompts.depth(), "queue/result_depth": self.results.depth()}

    def stop(self, mode: str = "finish") -> list[Completion]:
        """End of the run: close the books at the current instant (running samples are abandoned)."""
        t = self.world.now
        for e in self.engines:
            self._account(e, t)
            if e.wake_at is not None and e.running and e.phase_steps:
                steps = math.floor((t - e.phase_start - e.phase_prefill) / e.phase_dt + TIME_EPS)
                e.tokens += len(e.running) * min(e.phase_steps, max(0, steps))
        return self.results.get_all()

    # -- the weight sync's side

    def request_pause(self, mode: str) -> None:
        t = self.world.now
        for e in self.engines:
            e.pause_mode = mode
            if e.wake_at is None:
                self._account(e, t)
                self._pause(e)
            elif mode in ("keep", "reprefill"):
                self._poke(e, t)  # freeze at the next step boundary
            # "wait": the engine drains; `_schedule` pauses it once nothing is left in it.

    def all_paused(self) -> bool:
        return self.paused_engines == len(self.engines)

    def resume(self, version: int) -> None:
        """Every engine continues with weight version `version`; kept samples span both versions."""
        t = self.world.now
        self.paused_engines = 0
        for e in self.engines:
            self._account(e, t)
            e.paused, e.pause_mode = False, None
            e.version_steps.append(e.steps_done)
            e.versions.append(version)
            e.waiting.extendleft(reversed(e.parked))
            e.parked.clear()
        for e in self.engines:
            self._poke(e, t)

    def partial_samples(self, prompt_id: str) -> tuple:
        return ()  # a simulation is never resumed

    def abort_stale(self, min_version: int, prompt_ids: list[str]) -> None:
        """As `GenerationActor.abort_stale`: samples whose first token predates `min_version`, and every
        sample of `prompt_ids`, leave at their engine's next step boundary with what they generated."""
        doomed, t = set(prompt_ids), self.world.now
        for e in self.engines:
            for sample in [*e.running.values(), *e.waiting, *e.parked]:
                first = self._first_version(e, sample)
                if sample.request.prompt_id in doomed or (first is not None and first < min_version):
                    sample.aborted = True
            for queue in (e.waiting, e.parked):
                for sample in [s for s in queue if s.aborted]:
                    queue.remove(sample)
                    self._deliver(e, sample, sample.generated, "abort", t)
            if any(s.aborted for s in e.running.values()):
                self._poke(e, t)

    def _first_version(self, e: _Engine, sample: _Sample) -> int | None:
        if sample.spans:
            return sample.spans[0].version
        if sample.uid in e.running and not sample.fresh:  # decoding since `joined_step`
            return e.versions[bisect_right(e.version_steps, sample.joined_step) - 1]
        return None  # not started: its first token will be current

    def _pause(self, e: _Engine) -> None:
        e.paused = True
        self.paused_engines += 1

    # -- engine mechanics

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
            add_segment(e.segments, e.acc_t, t, kind)
        e.acc_t = t

    def _wake(self, e: _Engine, token: int, steps: int) -> None:
        if token != e.wake_token:
            return  # superseded by a later plan
        t = self.world.now
        self._account(e, t)
        e.wake_at = None
        if steps:
            e.tokens += len(e.running) * steps
            e.steps_done += steps
            e.unprefilled_tokens = e.unstarted_samples = 0  # the phase's first step carried their costs
        for sample in [s for s in e.running.values() if s.aborted]:
            del e.running[sample.uid]
            extend_spans(sample.spans, e, sample.joined_step, e.steps_done, sample.generated)
            self._deliver(e, sample, sample.generated + e.steps_done - sample.joined_step, "abort", t)
        while e.finish_heap and e.finish_heap[0][0] <= e.steps_done:
            _, uid, sample = heapq.heappop(e.finish_heap)
            if e.running.pop(uid, None) is not None:  # aborted ones left already
                self._leave(e, sample, t)
        while e.finish_heap and e.finish_heap[0][1] not in e.running:
            heapq.heappop(e.finish_heap)
        self._schedule(e, t)

    def _schedule(self, e: _Engine, t: float) -> None:
        """At a step boundary: pause if asked, pull work, plan the next phase."""
        if e.paused:
            return
        if e.pause_mode == "reprefill":
            self._cut_running(e)
        if e.pause_mode in ("keep", "reprefill") or (e.pause_mode == "wait" and not e.launched):
            self._pause(e)
            return
        while self.prompts.depth() and self._can_pull(e):
            self._pull(e)
        while e.waiting and len(e.running) < self.cost.max_running:
            sample = e.waiting.popleft()
            sample.joined_step = e.steps_done
            if sample.fresh:
                sample.fresh, sample.started_at = False, t
                e.unprefilled_tokens += len(sample.request.prompt_token_ids)
                e.unstarted_samples += 1
            elif sample.reprefill:
                sample.reprefill = False
                recomputed = len(sample.request.prompt_token_ids) + sample.generated
                e.unprefilled_tokens += recomputed
                e.reprefill_tokens += recomputed
            e.running[sample.uid] = sample
            heapq.heappush(e.finish_heap, (e.steps_done + sample.stop_at() - sample.generated, sample.uid, sample))
        if e.running:
            k = e.finish_heap[0][0] - e.steps_done
            e.phase_start, e.phase_steps = t, k
            e.phase_prefill = self.cost.start_s(e.unprefilled_tokens, e.unstarted_samples)
            context = self._phase_context(e, k) if self.cost.decode_per_context_token_s else 0.0
            e.phase_dt = self.cost.step_s(len(e.running), context)
            self._set_wake(e, t + e.phase_prefill + k * e.phase_dt, k)

    def _phase_context(self, e: _Engine, steps: int) -> float:
        """The tokens the running samples attend to, summed, on average over the phase's `steps` steps (each
        step adds one per sample; each sample's counted in whole `kv_block_tokens` blocks): equal steps at that
        cost take as long as the growing ones."""
        block = self.cost.kv_block_tokens
        total = 0
        for sample in e.running.values():
            now = len(sample.request.prompt_token_ids) + sample.generated + e.steps_done - sample.joined_step
            total += held_context_tokens(now, steps, block)
        return total / max(1, steps)

    def _cut_running(self, e: _Engine) -> None:
        """A reprefill sync at a step boundary: the running samples leave with their tokens and wait, first in
        line, for the resume (their KV cache is gone: each will prefill prompt + tokens again)."""
        cut = sorted(e.running.values(), key=lambda sample: sample.uid)
        for sample in cut:
            extend_spans(sample.spans, e, sample.joined_step, e.steps_done, sample.generated)
            sample.generated += e.steps_done - sample.joined_step
            sample.reprefill = True
        e.running.clear()
        e.finish_heap.clear()
        e.waiting.extendleft(reversed(cut))
        e.reprefilled += len(cut)

    def _set_wake(self, e: _Engine, at: float, steps: int) -> None:
        e.wake_token += 1
        e.wake_at = at
        self.world.at(at, self._wake, e, e.wake_token, steps)

    def _poke(self, e: _Engine, t: float) -> None:
        """Something changed for `e` (new prompts, a sample back, a pause): act at the next boundary."""
        if e.paused:
            return
        if e.wake_at is None:
            e.phase_start, e.phase_steps, e.phase_prefill = t, 0, 0.0
            self._set_wake(e, t, 0)
            return
        elapsed = t - e.phase_start
        j = 0 if elapsed <= TIME_EPS else max(1, math.ceil((elapsed - e.phase_prefill) / e.phase_dt - TIME_EPS))
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
        order = self.engines[self.cursor :] + self.engines[: self.cursor]
        ready = [e for e in order if self._can_pull(e)]
        touched: dict[int, _Engine] = {}
        while self.prompts.depth() and ready:
            still = []
            for e in ready:
                if not self.prompts.depth():
                    break
                self._pull(e)
                self.cursor = (e.id + 1) % len(self.engines)
                touched[e.id] = e
                if self._can_pull(e):
                    still.append(e)
            ready = still
        for e in touched.values():
            self._poke(e, t)  # the new samples join at the engine's next step boundary

    def _pull(self, e: _Engine) -> None:
        request = self.prompts.get()
        e.pulled += 1
        for j, length in enumerate(self.lengths.pop(request.prompt_id)):
            tool_at = length // 2 if self.w.tool_latency_s > 0 and length >= 2 else length
            self._uid += 1
            e.waiting.append(_Sample(self._uid, request, j, length, tool_at, e))

    def _leave(self, e: _Engine, sample: _Sample, t: float) -> None:
        """A sample stops at a step boundary: finished, or off to its tool call."""
        done = e.steps_done - sample.joined_step
        extend_spans(sample.spans, e, sample.joined_step, e.steps_done, sample.generated)
        sample.generated += done
        if sample.generated < sample.length:
            self.world.at(t + self.w.tool_latency_s, self._tool_return, sample)
            return
        self._deliver(e, sample, sample.length, "length" if sample.length >= self.w.max_tokens else "stop", t)

    def _deliver(self, e: _Engine, sample: _Sample, length: int, reason: str, t: float) -> None:
        request = sample.request
        completion = Completion.of_request(
            request,
            sample.index,
            e.id,
            response_token_ids=range(length),
            finish_reason=reason,
            version_spans=tuple(sample.spans),
            started_at=sample.started_at,
            first_token_at=sample.started_at,
            finished_at=t,
        )
        e.samples += reason != "abort"
        self.ledger.deliver(completion)
        self.results.put(completion)

    def _tool_return(self, sample: _Sample) -> None:
        e = sample.engine
        if sample.aborted:  # doomed while out on its tool call
            self._deliver(e, sample, sample.generated, "abort", self.world.now)
            return
        if e.paused or e.pause_mode is not None:
            e.parked.append(sample)  # a paused (or draining) engine takes no new requests
            return
        e.waiting.appendleft(sample)  # a continuing sample goes before new prompts
        if len(e.running) < self.cost.max_running:
            self._poke(e, self.world.now)


def held_context_tokens(first: int, steps: int, block: int) -> int:
    """The KV tokens a sample holds over `steps` steps whose context grows from `first` tokens by one a step,
    summed: each step's context in whole blocks of `block` tokens, as the engine holds it."""
    return block * (_blocks_up_to(first + steps - 1, block) - _blocks_up_to(first - 1, block))


def _blocks_up_to(tokens: int, block: int) -> int:
    """Blocks held by contexts of 1, 2, ..., `tokens` tokens, summed: ceil(x / block) over x."""
    if tokens <= 0:
        return 0
    full, rest = divmod(tokens, block)
    return block * full * (full + 1) // 2 + rest * (full + 1)


def add_segment(segments: list[list], start: float, end: float, kind: str) -> None:
    if end <= start:
        return
    if segments and segments[-1][2] == kind and abs(segments[-1][1] - start) <= TIME_EPS:
        segments[-1][1] = end
    else:
        segments.append([start, end, kind])


def extend_spans(spans: list[VersionSpan], e: _Engine, first_step: int, end_step: int, offset: int) -> None:
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
