"""Benchmark workloads: heavy-tailed response lengths and simulated tool calls, applied inside the engines.

A benchmark must compare modes on the *same* samples, so a sample's length is a function of its
id (`ShapedWorkload.length`), not of the random model. `ShapedGenerationActor` is the engine
actor with the workload applied through `GenerationActor.generate_sample`, the core's one hook
for benchmarks: each sample gets its exact length (ignore_eos) and, with `tool_latency_s`, leaves
the engine halfway for an exponentially distributed wait, as an agent waiting on an API does.
Nothing about workloads travels on the core's messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random

from open_instruct.generation import GenerationActor
from open_instruct.messages import Completion, PromptRequest, VersionSpan


def capped_lognormal(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    """One heavy-tailed response length: lognormal around `median`, rounded, clamped to [1, cap]."""
    return max(1, min(cap, round(median * rng.lognormvariate(0.0, sigma))))


def lognormal_lengths(count: int, median: int, sigma: float, cap: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [capped_lognormal(rng, median, sigma, cap) for _ in range(count)]


@dataclasses.dataclass(frozen=True)
class ShapedWorkload:
    name: str
    median_tokens: int
    sigma: float
    max_tokens: int
    tool_latency_s: float = 0.0  # mean of the exponential wait at each sample's halfway point; 0 = none

    def length(self, sample_id: str) -> int:
        """The exact response length of sample `sample_id` ("<prompt id>/<sample index>")."""
        digest = hashlib.blake2b(f"{self.name}/{sample_id}".encode(), digest_size=4).digest()
        return capped_lognormal(
            random.Random(int.from_bytes(digest, "big")), self.median_tokens, self.sigma, self.max_tokens
        )


class ShapedGenerationActor(GenerationActor):
    """GenerationActor with a `ShapedWorkload` applied to every sample (pass it to `cluster.Stack`)."""

    def __init__(self, engine_id, settings, reward_settings=None, reward_workers=1, workload=None):
        super().__init__(engine_id, settings, reward_settings, reward_workers)
        self.workload: ShapedWorkload | None = workload

    def set_workload(self, workload: ShapedWorkload | None) -> None:
        self.workload = workload

    async def generate_sample(self, request: PromptRequest, sample_index: int) -> Completion:
        if self.workload is None:
            return await super().generate_sample(request, sample_index)
        total = self.workload.length(f"{request.prompt_id}/{sample_index}")
        exact = dataclasses.replace(request.sampling, max_tokens=total, ignore_eos=True, stop_strings=())
        request = dataclasses.replace(request, sampling=exact)
        if self.workload.tool_latency_s <= 0 or total < 2:
            return await self._generate_sample(request, sample_index)
        return await self._with_tool_call(request, sample_index, total)

    async def _with_tool_call(self, request: PromptRequest, sample_index: int, total: int) -> Completion:
        """First half of the response, a wait (the simulated tool), then the rest as a continuation."""
        half = total // 2
        first_part = dataclasses.replace(request.sampling, max_tokens=half)
        first = await self._generate_sample(dataclasses.replace(request, sampling=first_part), sample_index)
        if first.finish_reason != "length" or first.error:
            return first
        rng = random.Random(request.seed * 7919 + sample_index)
        await asyncio.sleep(rng.expovariate(1.0 / self.workload.tool_latency_s))
        rest = dataclasses.replace(
            request,
            prompt_token_ids=request.prompt_token_ids + first.response_token_ids,
            sampling=dataclasses.replace(request.sampling, max_tokens=total - half),
        )
        second = await self._generate_sample(rest, sample_index, part="/after-tool")
        offset = len(first.response_token_ids)
        spans = first.version_spans + tuple(
            VersionSpan(s.version, s.start + offset, s.end + offset) for s in second.version_spans
        )
        return dataclasses.replace(
            second,
            prompt_token_ids=request.prompt_token_ids,
            response_token_ids=first.response_token_ids + second.response_token_ids,
            behaviour_logprobs=first.behaviour_logprobs + second.behaviour_logprobs,
            version_spans=spans,
            response_text=first.response_text + second.response_text,
            started_at=first.started_at,
            first_token_at=first.first_token_at,
        )


class ForcedTurnsActor(GenerationActor):
    """GenerationActor whose first turns of every multi-turn sample are forced to match given regexes.

    A random tiny model never writes a tool call by itself; structured outputs (a regex such as
    `<code>print\\(1\\)</code>`) make turn k write a match of `forced_turns[k]`, through the real
    sampler, parser, tools and observation path. Later turns sample freely."""

    def __init__(self, engine_id, settings, reward_settings=None, reward_workers=1, forced_turns=()):
        super().__init__(engine_id, settings, reward_settings, reward_workers)
        self.forced_turns: tuple[str, ...] = tuple(forced_turns)

    def set_forced_turns(self, forced_turns: tuple[str, ...]) -> None:
        self.forced_turns = tuple(forced_turns)

    def sampling_params(self, request: PromptRequest, sample_index: int, turn: int):
        from vllm.sampling_params import StructuredOutputsParams

        params = super().sampling_params(request, sample_index, turn)
        if turn < len(self.forced_turns):
            params.structured_outputs = StructuredOutputsParams(regex=self.forced_turns[turn])
        return params
