"""GenerationActor: one vLLM AsyncLLM engine inside a Ray actor, streaming per-sample Completions.

The actor is a plain class (Ray is applied in `cluster.py`). In streaming mode (`run`) it
pulls prompts one at a time from the shared prompt channel whenever it has room (so engines
steal work from each other), keeps its running set near a concurrency target derived from
its KV-cache capacity, and pushes every sample to the result channel the moment it
finishes. Each prompt becomes `num_samples` independent requests with seeds `seed + j`.
Rewards are computed in the actor, off the event loop (reward pool), so scoring overlaps
generation. `generate` is the fixed-batch mode used by synchronous baselines.

Failure rules: a prompt the engine rejects (too long, bad ids) becomes an error Completion;
only a dead engine stops the loop, and then the error propagates to the driver at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator

from open_instruct.generation.agent_turns import agent_sample
from open_instruct.generation.engine_setup import (
    EngineSettings,
    engine_args,
    engine_process_cores,
    engine_process_on,
    scheduler_probe,
)
from open_instruct.generation.outputs import sampling_params
from open_instruct.generation.process_reaper import engine_processes
from open_instruct.generation.queues import ChannelTimeout
from open_instruct.generation.sample_requests import SampleRequests
from open_instruct.generation.scoring import scored
from open_instruct.generation.weight_receive import WeightReceiver
from open_instruct.messages import (
    Completion,
    EngineLoopEnded,
    EngineStarted,
    EngineStats,
    EngineStep,
    EngineStopped,
    PromptRequest,
    PromptStarted,
)

logger = logging.getLogger(__name__)

_PULL_TIMEOUT_S = 0.2


def _node_id() -> str:
    """The Ray node this actor runs on ("" outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


class _Occupancy:
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


class GenerationActor(WeightReceiver, SampleRequests):
    def __init__(self, engine_id: int, settings: EngineSettings, reward_settings=None, reward_workers: int = 1):
        self.engine_id = engine_id
        self.settings = settings
        self.reward_settings = reward_settings
        self.reward_workers = reward_workers
        self.engine = None
        self.scorer = None
        self.tokenizer = None
        self.target_concurrency = 1
        self.weight_version = 0
        self._probe: dict = {}
        self._running = 0
        self._paused = False
        self._pauses = 0
        self._stopping = False
        # An abort stop cuts the samples it finds; the pull loop may still launch a request it had pulled
        # (taken off the prompt queue, so it must be delivered): those are cut as they start.
        self._cutting_new = False
        self._tasks: set[asyncio.Task] = set()
        self._room = asyncio.Event()
        self._occupancy = _Occupancy()
        self._tokens = self._completed = self._pulled = 0
        self._prompt_tokens = self._weight_updates = self._outputs = 0
        # A reprefill sync (--inflight_update_kv reprefill) aborts the running requests: a stream that ends
        # "abort" while the epoch moved was cut by one, and its sample continues after the resume.
        self._reprefill_epoch = 0
        self._reprefilled_samples = self._reprefill_tokens = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._weights_settled = asyncio.Event()  # clear while receive_weights runs (and restores, on failure)
        self._weights_settled.set()
        self._progress: dict[str, int] = {}  # request id -> tokens generated so far
        # (prompt id, sample index) of samples still generating -> their task, and the weight version
        # of their first token: what `abort_stale` needs to stop samples the staleness bound dooms.
        self._generating: dict[tuple[str, int], asyncio.Task] = {}
        self._first_version: dict[tuple[str, int], int] = {}
        self.toolbox = None
        self._results = None  # the result channel while streaming (progress reports go there too)
        self._parked = 0  # samples waiting on a tool or environment (they hold no KV cache meanwhile)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> EngineStarted:
        """Build the engine (15-30 s on CPU). Separate from __init__ so failures surface as errors."""
        from vllm.v1.engine.async_llm import AsyncLLM

        from open_instruct.extensions import load_extensions
        from open_instruct.weights.transport import transport

        load_extensions(self.settings.extension_modules)  # the verifiers, tools and environments it looks up

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.update(transport(self.settings.weight_transfer_backend).ENGINE_ENV)
        started = time.monotonic()
        with engine_process_on(self.settings.cpu_cores):
            self.engine = AsyncLLM.from_engine_args(
                engine_args(self.settings), stat_loggers=[scheduler_probe(self._probe)]
            )
        self.target_concurrency = self._derive_target()
        await self.engine.update_weight_version(str(self.weight_version))
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.settings.model_path)
        from open_instruct.agents.tools import Toolbox

        self.toolbox = Toolbox(self.settings.agent)
        if self.reward_settings is not None:
            from open_instruct.rewards.scoring import RewardScorer

            self.scorer = RewardScorer(self.reward_settings, max_workers=self.reward_workers)
        self._occupancy = _Occupancy()
        return EngineStarted(
            self.engine_id,
            time.monotonic() - started,
            os.getpid(),
            self.target_concurrency,
            self._kv_tokens(),
            kv_block_tokens=self._kv_block_tokens(),
            engine_process_cores=engine_process_cores(),
            node_id=_node_id(),
            processes=engine_processes(),
        )

    def _kv_tokens(self) -> int:
        blocks = self._probe.get("num_blocks") or self.engine.vllm_config.cache_config.num_gpu_blocks or 0
        return blocks * self._kv_block_tokens()

    def _kv_block_tokens(self) -> int:
        return self._probe.get("block_size") or self.engine.vllm_config.cache_config.block_size

    def _derive_target(self) -> int:
        """Samples that fit in the KV cache at their full length, capped by the scheduler's limit."""
        by_kv = self._kv_tokens() // self.settings.max_model_len
        limit = self.engine.vllm_config.scheduler_config.max_num_seqs
        if self.settings.max_concurrency:
            limit = min(limit, self.settings.max_concurrency)
        return max(1, min(by_kv or 1, limit))

    async def stop(self, mode: str = "finish", timeout_s: float = 600.0) -> EngineStopped:
        """Stop pulling prompts; 'finish' lets running samples end, 'abort' cuts them (they are still
        delivered, with finish_reason 'abort'). Returns what happened to the in-flight samples."""
        self._stopping = True
        self._cutting_new = mode == "abort"
        self._room.set()
        in_flight = len(self._tasks)
        if mode == "abort":
            for task in list(self._tasks):
                task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)
        return EngineStopped(self.engine_id, mode, in_flight, len(self._tasks), self._completed, self.weight_version)

    async def shutdown(self) -> None:
        if self._tasks:
            await self.stop("abort", timeout_s=30)
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None
        if self.toolbox is not None:
            await self.toolbox.close()
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    # ------------------------------------------------------------------ streaming mode

    async def run(self, prompts, results) -> EngineLoopEnded:
        """Pull prompts while there is room; push each finished sample. Returns when stopped."""
        self._stopping = self._cutting_new = False
        self._results = results
        while not self._stopping:
            self._room.clear()
            active = self._running - self._parked  # a sample parked on a tool holds no engine slot
            if self._paused or (active and active + 1 > self.target_concurrency):
                await self._room.wait()
                continue
            try:
                request: PromptRequest = await prompts.get_async(timeout=_PULL_TIMEOUT_S)
            except ChannelTimeout:
                continue
            self._pulled += 1
            await results.put_async(PromptStarted(request.prompt_id, self.engine_id))
            for j in request.samples_to_generate():
                self._launch(request, j)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        self._results = None
        return EngineLoopEnded(self.engine_id, self._pulled, self._completed)

    def _launch(self, request: PromptRequest, sample_index: int) -> None:
        self._set_running(self._running + 1)
        task = asyncio.create_task(self._sample_to_channel(request, sample_index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sample_to_channel(self, request: PromptRequest, sample_index: int) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        key = (request.prompt_id, sample_index)
        if not request.is_eval:  # the staleness bound is about training; an eval round always finishes
            self._generating[key] = asyncio.current_task()
        try:
            try:
                if self._cutting_new:  # launched after an abort stop went through the running samples
                    raise asyncio.CancelledError
                completion = await self._one_sample(request, sample_index)
            except asyncio.CancelledError:  # cancelled outside a vLLM call (before it, or between two)
                completion = self.empty_sample(request, sample_index, "abort", "aborted before generating")
            except EngineDeadError:
                raise
            except Exception as error:  # e.g. sampling parameters vLLM refuses: delivered, never hung on
                logger.warning("prompt %s sample %d failed: %s", request.prompt_id, sample_index, error)
                completion = self.empty_sample(request, sample_index, "error", f"{type(error).__name__}: {error}")
            await self._results.put_async(completion)
        finally:
            self._generating.pop(key, None)
            self._first_version.pop(key, None)
            self._set_running(self._running - 1)

    def empty_sample(self, request: PromptRequest, sample_index: int, reason: str, error: str) -> Completion:
        """A sample that ended without a vLLM result: still delivered, so its group completes."""
        return Completion(
            prompt_id=request.prompt_id,
            sample_index=sample_index,
            prompt_token_ids=request.prompt_token_ids,
            response_token_ids=(),
            behaviour_logprobs=(),
            finish_reason=reason,
            version_spans=(),  # type: ignore[arg-type]
            admitted_version=request.admitted_version,
            engine_id=self.engine_id,
            error=error,
            is_eval=request.is_eval,
            queued_at=request.queued_at,
            temperature=request.sampling.temperature,
        )

    async def abort_stale(self, min_version: int, prompt_ids: list[str]) -> int:
        """Abort samples the staleness bound dooms: those whose first token is older than `min_version`, and
        every sample of `prompt_ids`. Each is still delivered (finish_reason "abort", its tokens so far)."""
        doomed = set(prompt_ids)
        cancelled = 0
        for key, task in list(self._generating.items()):
            first = self._first_version.get(key)
            if key[0] in doomed or (first is not None and first < min_version):
                task.cancel()
                cancelled += 1
        return cancelled

    def _set_running(self, running: int) -> None:
        self._occupancy.account(self._running, self.target_concurrency, self._paused, self._parked)
        if running < self._running:
            self._room.set()  # wake the pull loop, whichever mode freed the slot
        self._running = running

    # ------------------------------------------------------------------ batch mode

    async def generate(self, requests: list[PromptRequest]) -> list[Completion]:
        """All samples of all requests, in the order they finished (synchronous baselines)."""
        return [completion async for completion in self.stream(requests)]

    async def stream(self, requests: list[PromptRequest]) -> AsyncIterator[Completion]:
        async def counted(request: PromptRequest, j: int) -> Completion:
            self._set_running(self._running + 1)
            try:
                return await self._one_sample(request, j)
            finally:
                self._set_running(self._running - 1)

        tasks = [asyncio.create_task(counted(r, j)) for r in requests for j in r.samples_to_generate()]
        for finished in asyncio.as_completed(tasks):
            yield await finished

    # ------------------------------------------------------------------ one sample

    async def _one_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        completion = await self.generate_sample(request, sample_index)
        # Generation is over: from here on (scoring, delivery) an abort would only lose finished work.
        self._generating.pop((request.prompt_id, sample_index), None)
        self._first_version.pop((request.prompt_id, sample_index), None)
        if completion.finish_reason in ("error", "abort"):
            return completion  # delivered as is: nothing to verify
        self._completed += 1
        if self.scorer is None:
            return completion
        return await scored(self.scorer, self.reward_settings, self.settings.agent, self.tokenizer, completion, request)

    async def generate_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        """One sample, not scored yet. The one hook for benchmarks: a subclass may reshape the request
        (exact lengths) and call `engine_request` or `multi_turn_sample`."""
        if self.toolbox.tools or (request.agent is not None and request.agent.envs):
            return await self.multi_turn_sample(request, sample_index)
        return await self.engine_request(request, sample_index)

    async def multi_turn_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        return await agent_sample(self, request, sample_index)

    @contextlib.asynccontextmanager
    async def parking(self):
        """A sample waits on a tool: it frees its engine slot, so the pull loop may start another."""
        self._occupancy.account(self._running, self.target_concurrency, self._paused, self._parked)
        self._parked += 1
        self._room.set()
        try:
            yield
        finally:
            self._occupancy.account(self._running, self.target_concurrency, self._paused, self._parked)
            self._parked -= 1

    def sampling_params(self, request: PromptRequest, sample_index: int, turn: int):
        """vLLM SamplingParams of one request (turn: the index of a multi-turn sample's turn). A hook: tests and
        benchmarks force a turn's text (tool calls from a random model) through structured outputs."""
        return sampling_params(request, sample_index)

    # ------------------------------------------------------------------ metrics

    def running_tokens(self) -> dict[str, int]:
        """Tokens generated so far by each running request (tests watch a request's progress)."""
        return dict(self._progress)

    def _set_paused(self, paused: bool) -> None:
        self._occupancy.account(self._running, self.target_concurrency, self._paused, self._parked)
        self._pauses += paused and not self._paused
        if paused != self._paused:  # both edges: a step computed before a pause may arrive after it began
            self._probe["pause_transitions"] = self._probe.get("pause_transitions", 0) + 1
        self._paused = paused

    def start_step_trace(self) -> None:
        """Record every engine step from now on, until `take_step_trace` (the benchmarks' cost data)."""
        self._probe["step_trace"] = []

    def take_step_trace(self) -> list[EngineStep]:
        """The engine steps recorded since `start_step_trace`; recording stops."""
        return self._probe.pop("step_trace", None) or []

    def stats(self) -> EngineStats:
        self._occupancy.account(self._running, self.target_concurrency, self._paused, self._parked)
        scheduler = self._probe.get("stats")
        occupancy = self._occupancy
        return EngineStats(
            engine_id=self.engine_id,
            target_concurrency=self.target_concurrency,
            running_samples=self._running,
            waiting_requests=getattr(scheduler, "num_waiting_reqs", 0),
            kv_cache_usage=float(getattr(scheduler, "kv_cache_usage", 0.0)),
            generated_tokens=self._tokens,
            completed_samples=self._completed,
            prompts_pulled=self._pulled,
            uptime_s=time.monotonic() - occupancy.started,
            idle_s=occupancy.idle_s,
            underfilled_s=occupancy.underfilled_s,
            paused_s=occupancy.paused_s,
            sample_s=occupancy.sample_s,
            parked_sample_s=occupancy.parked_sample_s,
            pauses=self._pauses,
            weight_version=self.weight_version,
            weight_updates=self._weight_updates,
            preempted_requests=self._probe.get("preempted", 0),
            prefill_tokens=self._probe.get("prefill_tokens", 0),
            submitted_prompt_tokens=self._prompt_tokens,
            prefix_cache_hit_tokens=self._probe.get("cache_hit_tokens", 0),
            token_outputs=self._outputs,
            parked_samples=self._parked,
            reprefilled_samples=self._reprefilled_samples,
            reprefill_tokens=self._reprefill_tokens,
        )

    def reset_stats(self) -> None:
        self._occupancy = _Occupancy()
        self._tokens = self._completed = self._pulled = 0
        self._prompt_tokens = self._weight_updates = 0
        self._reprefilled_samples = self._reprefill_tokens = 0
        for key in ("preempted", "prefill_tokens", "cache_hit_tokens"):
            self._probe.pop(key, None)
