"""The engine actor's state, declared once. The actor (`actor.py`: lifecycle, pull loop, delivery) and its two
collaborators, `SampleRequests` (one sample as vLLM requests) and `WeightReceiver` (the engine's side of a
weight sync), each get this object and nothing else of one another: what they share is here, with the one
writer of each field named beside it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from open_instruct.generation.engine_setup import EngineSettings, SchedulerProbe


class Occupancy:
    """Integrates time spent idle / under-filled / paused, and sample-seconds running / parked on tools,
    updated at every state change. A sample parked on a tool occupies no engine slot."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.idle_s = self.underfilled_s = self.paused_s = 0.0
        self.sample_s = self.parked_sample_s = 0.0

    def account(self, running: int, target: int, paused: bool, parked: int = 0) -> None:
        now = time.monotonic()
        elapsed, self.last = now - self.last, now
        self.sample_s += running * elapsed
        self.parked_sample_s += parked * elapsed
        active = running - parked
        if paused:
            self.paused_s += elapsed
        elif active == 0:
            self.idle_s += elapsed
        elif active < target:
            self.underfilled_s += elapsed


@dataclass
class EngineCounters:
    """Totals since the start or the last `reset_stats`, reported in `EngineStats`."""

    generated_tokens: int = 0  # SampleRequests
    completed_samples: int = 0  # the actor
    prompts_pulled: int = 0  # the actor
    submitted_prompt_tokens: int = 0  # SampleRequests
    weight_updates: int = 0  # WeightReceiver
    token_outputs: int = 0  # SampleRequests
    reprefilled_samples: int = 0  # SampleRequests
    reprefill_tokens: int = 0  # SampleRequests
    recomputed_tokens: int = 0  # SampleRequests
    pauses: int = 0  # set_paused


@dataclass
class EngineState:
    """Everything the engine actor's parts share. Slot accounting (running, parked, paused) changes only through
    the methods below, which integrate the occupancy before each change."""

    engine_id: int
    settings: EngineSettings
    engine: Any = None  # vLLM's AsyncLLM, built by the actor's `start`
    tokenizer: Any = None  # the actor's `start`
    adapter: Any = None  # --use_peft: the LoRARequest every request names (the actor's `start`)
    weight_version: int = 0  # WeightReceiver, after a complete receive
    target_concurrency: int = 1  # the actor's `start`, from the KV capacity
    # vLLM's stat logger reports here (`engine_setup.scheduler_probe`; its writers named on the class).
    probe: SchedulerProbe = field(default_factory=SchedulerProbe)
    counters: EngineCounters = field(default_factory=EngineCounters)
    occupancy: Occupancy = field(default_factory=Occupancy)
    running: int = 0  # samples started and not yet delivered
    parked: int = 0  # of those, samples waiting on a tool or environment (they hold no KV cache meanwhile)
    paused: bool = False  # a weight sync holds the engine
    room: asyncio.Event = field(default_factory=asyncio.Event)  # set when a slot frees or the engine resumes
    # Clear from a sync's pause to its resume: requests submitted meanwhile would be salted with the old version.
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    # Clear while WeightReceiver.receive_weights runs (and restores, on failure): a resume waits for it.
    weights_settled: asyncio.Event = field(default_factory=asyncio.Event)
    # WeightReceiver bumps it before a reprefill sync aborts the running requests: a stream that ends "abort"
    # while it moved was cut by that sync, and SampleRequests continues its sample after the resume.
    reprefill_epoch: int = 0
    progress: dict[str, int] = field(default_factory=dict)  # vLLM request id -> tokens generated so far
    # (prompt id, sample index) of training samples still generating -> their task (the actor's), and the weight
    # version of their first token (SampleRequests): what `abort_stale` needs to stop samples the bound dooms.
    generating: dict[tuple[str, int], asyncio.Task] = field(default_factory=dict)
    first_version: dict[tuple[str, int], int] = field(default_factory=dict)
    results: Any = None  # the result channel while the actor streams (progress reports go there too)

    def __post_init__(self) -> None:
        self.resumed.set()
        self.weights_settled.set()

    def account(self) -> None:
        self.occupancy.account(self.running, self.target_concurrency, self.paused, self.parked)

    def set_running(self, running: int) -> None:
        self.account()
        if running < self.running:
            self.room.set()  # wake the pull loop, whichever mode freed the slot
        self.running = running

    def set_paused(self, paused: bool) -> None:
        self.account()
        self.counters.pauses += paused and not self.paused
        if paused != self.paused:  # both edges: a step computed before a pause may arrive after it began
            self.probe.pause_transitions += 1
        self.paused = paused

    @contextlib.asynccontextmanager
    async def parking(self):
        """A sample waits on a tool: it frees its engine slot, so the pull loop may start another."""
        self.account()
        self.parked += 1
        self.room.set()
        try:
            yield
        finally:
            self.account()
            self.parked -= 1

    def sample_done_generating(self, prompt_id: str, sample_index: int) -> None:
        """Scoring and delivery follow: from here on an abort would only lose finished work."""
        self.generating.pop((prompt_id, sample_index), None)
        self.first_version.pop((prompt_id, sample_index), None)
