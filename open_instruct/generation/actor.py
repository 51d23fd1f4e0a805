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
import logging
import os
import time
from collections.abc import AsyncIterator

from open_instruct.generation.agent_turns import agent_sample
from open_instruct.generation.channels import ChannelTimeout
from open_instruct.generation.engine_setup import (
    EngineSettings,
    engine_args,
    engine_process_cores,
    engine_process_on,
    scheduler_probe,
)
from open_instruct.generation.engine_state import EngineCounters, EngineState, Occupancy
from open_instruct.generation.outputs import sampling_params
from open_instruct.generation.process_reaper import engine_processes
from open_instruct.generation.sample_requests import SampleRequests
from open_instruct.generation.scoring import scored
from open_instruct.generation.weight_receive import WeightReceiver
from open_instruct.messages import (
    Completion,
    EngineLoopEnded,
    EnginePaused,
    EngineStarted,
    EngineStats,
    EngineStep,
    EngineStopped,
    PromptRequest,
    PromptStarted,
    WeightsReceived,
)

logger = logging.getLogger(__name__)

_PULL_TIMEOUT_S = 0.2


def _node_id() -> str:
    """The Ray node this actor runs on ("" outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


class GenerationActor:
    """The Ray-facing engine actor. Its state is declared in `EngineState`; generating one sample is
    `SampleRequests`' job and the weight sync's engine side is `WeightReceiver`'s, both over that state. Subclasses
    (benchmarks, tests) override the hooks `generate_sample` and `sampling_params`, or name their own
    `requests_class`."""

    requests_class = SampleRequests

    def __init__(self, engine_id: int, settings: EngineSettings, reward_settings=None, reward_workers: int = 1):
        self.engine_id = engine_id
        self.settings = settings
        self.reward_settings = reward_settings
        self.reward_workers = reward_workers
        self.state = EngineState(engine_id, settings)
        self.requests = self.requests_class(self.state, self.sampling_params)
        self.weights = WeightReceiver(self.state)
        self.scorer = None
        self.toolbox = None
        self._adapter_dir = None  # --use_peft: the folder the engine reads its adapter from
        self._stopping = False
        # An abort stop cuts the samples it finds; the pull loop may still launch a request it had pulled
        # (taken off the prompt queue, so it must be delivered): those are cut as they start.
        self._cutting_new = False
        self._tasks: set[asyncio.Task] = set()  # the streaming loop's samples, each delivered by its own task

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> EngineStarted:
        """Build the engine (15-30 s on CPU). Separate from __init__ so failures surface as errors."""
        from vllm.v1.engine.async_llm import AsyncLLM

        from open_instruct.extensions import load_extensions
        from open_instruct.weights.transport import transport

        load_extensions(self.settings.extension_modules)  # the verifiers, tools and environments it looks up

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.update(transport(self.settings.weight_transfer_backend).ENGINE_ENV)
        state = self.state
        started = time.monotonic()
        with engine_process_on(self.settings.cpu_cores):
            state.engine = AsyncLLM.from_engine_args(
                engine_args(self.settings), stat_loggers=[scheduler_probe(state.probe)]
            )
        state.target_concurrency = self._derive_target()
        await state.engine.update_weight_version(str(state.weight_version))
        if self.settings.model.use_peft:
            state.adapter = await self._serve_adapter()
        from transformers import AutoTokenizer

        state.tokenizer = AutoTokenizer.from_pretrained(self.settings.model_path)
        from open_instruct.agents.tools import Toolbox

        self.toolbox = Toolbox(self.settings.agent)
        if self.reward_settings is not None:
            from open_instruct.rewards.scoring import RewardScorer

            self.scorer = RewardScorer(self.reward_settings, max_workers=self.reward_workers)
        state.occupancy = Occupancy()
        return EngineStarted(
            self.engine_id,
            time.monotonic() - started,
            os.getpid(),
            state.target_concurrency,
            self._kv_tokens(),
            kv_block_tokens=self._kv_block_tokens(),
            engine_process_cores=engine_process_cores(),
            node_id=_node_id(),
            processes=engine_processes(),
        )

    @property
    def tokenizer(self):
        return self.state.tokenizer

    def _kv_tokens(self) -> int:
        blocks = self.state.probe.num_blocks or self.state.engine.vllm_config.cache_config.num_gpu_blocks or 0
        return blocks * self._kv_block_tokens()

    def _kv_block_tokens(self) -> int:
        return self.state.probe.block_size or self.state.engine.vllm_config.cache_config.block_size

    async def _serve_adapter(self):
        """--use_peft: the engine serves base + one adapter from a folder of its own, zero until the first sync
        (the learner's fresh adapter is zero too); returns the LoRARequest every request names. A weight sync
        writes the new adapter there and vLLM loads it again under the same id (`weights.adapter_engine`)."""
        from vllm.lora.request import LoRARequest

        from open_instruct import adapters
        from open_instruct.weights.adapter_names import ADAPTER_ID, ADAPTER_NAME

        # Removed at shutdown; a SIGKILLed engine's folder (a 7B's adapter is tens of MB) is removed by the next
        # engine to start on this node.
        root = self.settings.model.lora_adapter_dir
        await asyncio.to_thread(adapters.sweep_folders, root)
        self._adapter_dir = adapters.AdapterFolder(root, self.engine_id)
        directory = self._adapter_dir.path
        await asyncio.to_thread(adapters.write_zero_adapter, self.settings.model_path, self.settings.model, directory)
        await self.state.engine.collective_rpc("serve_adapter", args=(directory,))
        return LoRARequest(ADAPTER_NAME, ADAPTER_ID, lora_path=directory)

    def _derive_target(self) -> int:
        """Samples that fit in the KV cache at their full length, capped by the scheduler's limit."""
        by_kv = self._kv_tokens() // self.settings.max_model_len
        limit = self.state.engine.vllm_config.scheduler_config.max_num_seqs
        if self.settings.max_concurrency:
            limit = min(limit, self.settings.max_concurrency)
        return max(1, min(by_kv or 1, limit))

    async def stop(self, mode: str = "finish", timeout_s: float = 600.0) -> EngineStopped:
        """Stop pulling prompts; 'finish' lets running samples end, 'abort' cuts them (they are still
        delivered, with finish_reason 'abort'). Returns what happened to the in-flight samples."""
        self._stopping = True
        self._cutting_new = mode == "abort"
        self.state.room.set()
        in_flight = len(self._tasks)
        if mode == "abort":
            for task in list(self._tasks):
                task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)
        completed = self.state.counters.completed_samples
        return EngineStopped(self.engine_id, mode, in_flight, len(self._tasks), completed, self.state.weight_version)

    async def shutdown(self) -> None:
        if self._tasks:
            await self.stop("abort", timeout_s=30)
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None
        if self.toolbox is not None:
            await self.toolbox.close()
        if self.state.engine is not None:
            self.state.engine.shutdown()
            self.state.engine = None
        if self._adapter_dir is not None:
            self._adapter_dir.close()
            self._adapter_dir = None

    # ------------------------------------------------------------------ the weight sync (WeightReceiver's)

    async def pause(self, mode: str = "keep") -> EnginePaused:
        return await self.weights.pause(mode)

    async def init_weight_transfer(self, init_info: dict) -> dict:
        return await self.weights.init_weight_transfer(init_info)

    async def receive_weights(self, update_info: dict, version: int, timeout_s: float = 600.0) -> WeightsReceived:
        return await self.weights.receive_weights(update_info, version, timeout_s)

    async def resume(self) -> float:
        return await self.weights.resume()

    # ------------------------------------------------------------------ streaming mode

    async def run(self, prompts, results) -> EngineLoopEnded:
        """Pull prompts while there is room; push each finished sample. Returns when stopped."""
        state = self.state
        self._stopping = self._cutting_new = False
        state.results = results
        while not self._stopping:
            state.room.clear()
            active = state.running - state.parked  # a sample parked on a tool holds no engine slot
            if state.paused or (active and active + 1 > state.target_concurrency):
                await state.room.wait()
                continue
            try:
                request: PromptRequest = await prompts.get_async(timeout=_PULL_TIMEOUT_S)
            except ChannelTimeout:
                continue
            state.counters.prompts_pulled += 1
            await results.put_async(PromptStarted(request.prompt_id, self.engine_id))
            for j in request.samples_to_generate():
                self._launch(request, j)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        state.results = None
        return EngineLoopEnded(self.engine_id, state.counters.prompts_pulled, state.counters.completed_samples)

    def _launch(self, request: PromptRequest, sample_index: int) -> None:
        self.state.set_running(self.state.running + 1)
        task = asyncio.create_task(self._sample_to_channel(request, sample_index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sample_to_channel(self, request: PromptRequest, sample_index: int) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        state = self.state
        if not request.is_eval:  # the staleness bound is about training; an eval round always finishes
            state.generating[(request.prompt_id, sample_index)] = asyncio.current_task()
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
            await state.results.put_async(completion)
        finally:
            state.sample_done_generating(request.prompt_id, sample_index)
            state.set_running(state.running - 1)

    def empty_sample(self, request: PromptRequest, sample_index: int, reason: str, error: str) -> Completion:
        """A sample that ended without a vLLM result: still delivered, so its group completes."""
        return Completion.of_request(request, sample_index, self.engine_id, finish_reason=reason, error=error)

    async def abort_stale(self, min_version: int, prompt_ids: list[str]) -> int:
        """Abort samples the staleness bound dooms: those whose first token is older than `min_version`, and
        every sample of `prompt_ids`. Each is still delivered (finish_reason "abort", its tokens so far)."""
        doomed = set(prompt_ids)
        cancelled = 0
        for key, task in list(self.state.generating.items()):
            first = self.state.first_version.get(key)
            if key[0] in doomed or (first is not None and first < min_version):
                task.cancel()
                cancelled += 1
        return cancelled

    # ------------------------------------------------------------------ batch mode

    async def generate(self, requests: list[PromptRequest]) -> list[Completion]:
        """All samples of all requests, in the order they finished (synchronous baselines)."""
        return [completion async for completion in self.stream(requests)]

    async def stream(self, requests: list[PromptRequest]) -> AsyncIterator[Completion]:
        state = self.state

        async def counted(request: PromptRequest, j: int) -> Completion:
            state.set_running(state.running + 1)
            try:
                return await self._one_sample(request, j)
            finally:
                state.set_running(state.running - 1)

        tasks = [asyncio.create_task(counted(r, j)) for r in requests for j in r.samples_to_generate()]
        for finished in asyncio.as_completed(tasks):
            yield await finished

    # ------------------------------------------------------------------ one sample

    async def _one_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        completion = await self.generate_sample(request, sample_index)
        self.state.sample_done_generating(request.prompt_id, sample_index)
        if completion.finish_reason in ("error", "abort"):
            return completion  # delivered as is: nothing to verify
        self.state.counters.completed_samples += 1
        if self.scorer is None:
            return completion
        return await scored(self.scorer, self.reward_settings, self.settings.agent, self.tokenizer, completion, request)

    async def generate_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        """One sample, not scored yet. The one hook for benchmarks: a subclass may reshape the request
        (exact lengths) and call `engine_request` or `multi_turn_sample`."""
        if self.toolbox.tools or (request.agent is not None and request.agent.envs):
            return await self.multi_turn_sample(request, sample_index)
        return await self.engine_request(request, sample_index)

    async def engine_request(self, request: PromptRequest, sample_index: int, part: str = "", turn: int = 0):
        """One vLLM request of a sample (a whole single-turn sample, or one turn of a multi-turn one)."""
        return await self.requests.engine_request(request, sample_index, part, turn)

    async def multi_turn_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        return await agent_sample(self, request, sample_index)

    def parking(self):
        """A sample waits on a tool: it frees its engine slot, so the pull loop may start another."""
        return self.state.parking()

    def sampling_params(self, request: PromptRequest, sample_index: int, turn: int):
        """vLLM SamplingParams of one request (turn: the index of a multi-turn sample's turn). A hook: tests and
        benchmarks force a turn's text (tool calls from a random model) through structured outputs."""
        return sampling_params(request, sample_index)

    # ------------------------------------------------------------------ metrics

    def running_tokens(self) -> dict[str, int]:
        """Tokens generated so far by each running request (tests watch a request's progress)."""
        return dict(self.state.progress)

    def start_step_trace(self) -> None:
        """Record every engine step from now on, until `take_step_trace` (the benchmarks' cost data)."""
        self.state.probe.step_trace = []

    def take_step_trace(self) -> list[EngineStep]:
        """The engine steps recorded since `start_step_trace`; recording stops."""
        trace, self.state.probe.step_trace = self.state.probe.step_trace, None
        return trace or []

    def stats(self) -> EngineStats:
        state = self.state
        state.account()
        scheduler, occupancy, counters = state.probe.stats, state.occupancy, state.counters
        return EngineStats(
            engine_id=self.engine_id,
            target_concurrency=state.target_concurrency,
            running_samples=state.running,
            waiting_requests=getattr(scheduler, "num_waiting_reqs", 0),
            kv_cache_usage=float(getattr(scheduler, "kv_cache_usage", 0.0)),
            generated_tokens=counters.generated_tokens,
            completed_samples=counters.completed_samples,
            prompts_pulled=counters.prompts_pulled,
            uptime_s=time.monotonic() - occupancy.started,
            idle_s=occupancy.idle_s,
            underfilled_s=occupancy.underfilled_s,
            paused_s=occupancy.paused_s,
            sample_s=occupancy.sample_s,
            parked_sample_s=occupancy.parked_sample_s,
            pauses=counters.pauses,
            weight_version=state.weight_version,
            weight_updates=counters.weight_updates,
            preempted_requests=state.probe.preempted,
            prefill_tokens=state.probe.prefill_tokens,
            submitted_prompt_tokens=counters.submitted_prompt_tokens,
            prefix_cache_hit_tokens=state.probe.cache_hit_tokens,
            token_outputs=counters.token_outputs,
            parked_samples=state.parked,
            reprefilled_samples=counters.reprefilled_samples,
            reprefill_tokens=counters.reprefill_tokens,
            recomputed_tokens=counters.recomputed_tokens,
        )

    def reset_stats(self) -> None:
        self.state.occupancy = Occupancy()
        self.state.counters = EngineCounters()
        self.state.probe.reset_counters()
