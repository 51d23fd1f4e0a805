"""Agent turns: a multi-turn sample (tool calls, environment steps) as one engine request per turn, joined
into one Completion. The turn loop itself is pure (`agents.rollout`); this module gives it the engine through
`TurnEngine`, the part of the engine actor's public interface a multi-turn sample uses: each turn is an
`engine_request` with the turn's context, and a sample waiting on a tool parks (frees its engine slot)."""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, Protocol

from open_instruct.messages import AgentRequest, Completion, PromptRequest


class TurnEngine(Protocol):
    """What a multi-turn sample needs of the engine actor (`GenerationActor` is one)."""

    engine_id: int
    toolbox: Any  # agents.tools.Toolbox
    tokenizer: Any

    async def engine_request(self, request: PromptRequest, sample_index: int, part: str = "", turn: int = 0): ...

    def parking(self) -> AbstractAsyncContextManager: ...

    def empty_sample(self, request: PromptRequest, sample_index: int, reason: str, error: str) -> Completion: ...


async def agent_sample(actor: TurnEngine, request: PromptRequest, sample_index: int) -> Completion:
    """A multi-turn sample (tools, environments): one engine request per turn, one Completion."""
    from open_instruct.agents.rollout import EnvConfigError, run_rollout

    def turn(context: tuple[int, ...], max_tokens: int, stops: tuple[str, ...], index: int):
        # The parser reads the closing tag of a call, so stop strings stay in every turn's output.
        sampling = replace(
            request.sampling,
            max_tokens=max_tokens,
            stop_strings=request.sampling.stop_strings + stops,
            include_stop_str_in_output=True,
        )
        turn_request = replace(request, prompt_token_ids=context, sampling=sampling)
        return actor.engine_request(turn_request, sample_index, part=f"/t{index}", turn=index)

    def encode(text: str) -> list[int]:
        return actor.tokenizer.encode(text, add_special_tokens=False)

    try:
        out, trace = await run_rollout(
            request.prompt_token_ids,
            request.agent or AgentRequest(),
            actor.toolbox,
            turn,
            encode,
            request.sampling.max_tokens,
            actor.parking,
        )
    except EnvConfigError as error:  # any other error is the sample's own, reported as it is
        return actor.empty_sample(request, sample_index, "error", f"env_config of {request.prompt_id}: {error}")
    first = out.first_turn
    return Completion.of_request(
        request,
        sample_index,
        actor.engine_id,
        response_token_ids=tuple(out.response_ids),
        behaviour_logprobs=tuple(out.logprobs),
        finish_reason=out.finish_reason,
        version_spans=tuple(out.version_spans),
        response_text=actor.tokenizer.decode(out.response_ids, skip_special_tokens=True),
        error=out.error,
        started_at=first.started_at if first else time.time(),
        first_token_at=first.first_token_at if first else 0.0,
        agent=trace,
    )
