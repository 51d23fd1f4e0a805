"""The multi-turn loop of one sample: generate a turn, run the calls it makes, append their output, repeat.

The engine is reached through `generate_turn` (a generation actor passes its own vLLM call), so the
loop is tested on CPU with a scripted generator and runs unchanged inside the actor. The response is
kept as token ids throughout: model tokens are never re-tokenized and the history is never re-rendered,
so what the learner trains on is exactly what the engine sampled, plus observation tokens that carry
no behaviour logprob (NaN) and no weight version. Each turn is a new engine request submitted when the
previous tool answered, so a weight update during a tool wait applies to the next turn.

Differences from open-instruct's loop, on purpose:
* only the environments a row's `env_config` names are started for it, each as a fresh instance;
* several results of one turn are appended as one observation block (one role header, not one each);
* after its last allowed call (--max_steps) the model gets one more turn to answer; calls in that turn
  are not run. open-instruct ends the sample on the observation instead, unanswered;
* a rollout cut after an observation (by the token budget) ends "length", not with the last model
  turn's "stop": the model never answered, so it counts as truncated.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from open_instruct.agents.base import ENV_STEP_TIMEOUT_S, Role, StepResult, ToolCall
from open_instruct.agents.tools import Toolbox, call_guarded
from open_instruct.messages import AgentRequest, AgentTrace, Completion, ToolCallRecord, VersionSpan

if TYPE_CHECKING:
    from open_instruct.agents.parsers import ToolParser

# (context token ids, max new tokens, extra stop strings, turn index) -> one engine request's result.
GenerateTurn = Callable[[tuple[int, ...], int, tuple[str, ...], int], Awaitable[Completion]]


@dataclass
class Rollout:
    """What the loop built; the actor turns it into one Completion."""

    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_spans: list[VersionSpan] = field(default_factory=list)
    observation_spans: list[tuple[int, int]] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    error: str | None = None
    turns: int = 0
    done: bool = False
    tool_wait_s: float = 0.0
    first_turn: Completion | None = None

    def trace(self, env_metrics: dict[str, float]) -> AgentTrace:
        return AgentTrace(
            turns=self.turns,
            calls=tuple(self.calls),
            observation_spans=tuple(self.observation_spans),
            step_rewards=tuple(self.step_rewards),
            env_metrics=env_metrics,
            tool_wait_s=self.tool_wait_s,
            done=self.done,
        )


class _Dispatch:
    """Who answers which function name in this rollout: configured tools and this row's environments."""

    def __init__(self, toolbox: Toolbox, request: AgentRequest):
        from open_instruct.agents.environments import make_environment

        allowed = set(request.tools) if request.tools else set(toolbox.tools)
        self.tools = {name for name in toolbox.tools if name in allowed}
        self.envs = {
            spec.name: make_environment(spec.name, toolbox.env_configs.get(spec.name, {})) for spec in request.envs
        }
        self.functions = {d.name: name for name, env in self.envs.items() for d in env.tool_definitions()}
        self.text_envs = [name for name, env in self.envs.items() if env.response_role == "user"]
        if len(self.text_envs) > 1:
            raise ValueError(
                f"env_config names {len(self.text_envs)} text environments ({self.text_envs}); one at most"
            )

    def definitions(self, toolbox: Toolbox):
        envs = tuple(d for env in self.envs.values() for d in env.tool_definitions())
        return toolbox.definitions(tuple(self.tools)) + envs

    def accepts(self, call: ToolCall) -> bool:
        return call.name in self.tools or call.name in self.functions


async def run_rollout(
    prompt_ids: tuple[int, ...],
    request: AgentRequest,
    toolbox: Toolbox,
    generate_turn: GenerateTurn,
    tokenize: Callable[[str], list[int]],
    response_length: int,
    parked: Callable[[], contextlib.AbstractAsyncContextManager] = contextlib.nullcontext,
) -> tuple[Rollout, AgentTrace]:
    """One sample's whole trajectory within `response_length` tokens (model and observation tokens together:
    the request's max_tokens). `parked` wraps every tool wait (the actor counts parked samples)."""
    settings = toolbox.settings
    budget = _Budget(response_length, settings.max_model_len - len(prompt_ids), settings.tools.per_turn_max_tokens)
    dispatch, parser = await _start(toolbox, request)
    max_steps = request.max_steps or settings.tools.max_steps
    out, steps = Rollout(), 0
    while True:
        max_tokens = budget.next_turn(len(out.response_ids))
        if max_tokens <= 0:
            out.finish_reason = "length"
            break
        turn = await generate_turn(prompt_ids + tuple(out.response_ids), max_tokens, parser.stop_strings, out.turns)
        _append_turn(out, turn)
        if turn.finish_reason in ("abort", "error"):
            out.finish_reason, out.error = turn.finish_reason, turn.error
            break
        out.finish_reason = turn.finish_reason
        calls = [call for call in await _parse(parser, turn.response_text) if dispatch.accepts(call)]
        calls += [ToolCall(name, {"text": turn.response_text}) for name in dispatch.text_envs]
        calls = calls[: max(0, max_steps - steps)]
        if not calls:
            break
        steps += len(calls)
        waited_from = time.monotonic()
        async with parked():
            results = await _answer_all(calls, dispatch, toolbox)
        out.tool_wait_s += time.monotonic() - waited_from
        _record(out, calls, results)
        role: Role = "user" if any(c.name in dispatch.text_envs for c in calls) else "tool"
        text = "\n".join(result.result for result in results)
        closed = turn.finish_reason == "stop" and not any(turn.response_text.endswith(s) for s in parser.stop_strings)
        if not _append_observation(out, tokenize(parser.format_observation(text, role, closed)), budget):
            break
        if out.done:
            out.finish_reason = "stop"
            break
    env_metrics = {
        f"{name}/{key}": float(value) for name, env in dispatch.envs.items() for key, value in env.metrics().items()
    }
    return out, out.trace(env_metrics)


# Every parser is linear, and a 16k-token turn parses in well under 50 ms; a longer turn (a long-context model)
# is parsed in a thread, so that even it cannot hold up the engine's other samples and its weight syncs.
_PARSE_INLINE_CHARS = 65_536


async def _parse(parser: ToolParser, text: str) -> list[ToolCall]:
    if len(text) <= _PARSE_INLINE_CHARS:
        return parser.parse(text)
    return await asyncio.to_thread(parser.parse, text)


class EnvConfigError(ValueError):
    """A row's env_config that its environments refuse (a missing reset key, two text environments, ...):
    the only error of a rollout that is the row's fault, not the model's."""


async def _start(toolbox: Toolbox, request: AgentRequest) -> tuple[_Dispatch, ToolParser]:
    """This row's tools and fresh environments, reset, and the parser over their definitions."""
    from open_instruct.agents.parsers import make_parser

    try:
        dispatch = _Dispatch(toolbox, request)
        for spec in request.envs:
            await dispatch.envs[spec.name].reset(**dict(spec.reset_kwargs))
        return dispatch, make_parser(toolbox.settings.parser_type, dispatch.definitions(toolbox))
    except ValueError as error:
        raise EnvConfigError(str(error)) from error


@dataclass(frozen=True)
class _Budget:
    """Token limits of one rollout: the response (model + observation tokens), the context, each turn."""

    response_length: int
    context_room: int  # max_model_len - prompt length
    per_turn: int | None

    def left(self, used: int) -> int:
        return min(self.response_length, self.context_room) - used

    def next_turn(self, used: int) -> int:
        return min(self.left(used), self.per_turn or math.inf)  # type: ignore[return-value]


def _append_turn(out: Rollout, turn: Completion) -> None:
    offset = len(out.response_ids)
    out.first_turn = out.first_turn or turn
    out.turns += 1
    out.response_ids += turn.response_token_ids
    out.logprobs += turn.behaviour_logprobs
    out.version_spans += [VersionSpan(s.version, s.start + offset, s.end + offset) for s in turn.version_spans]


async def _answer_all(calls: list[ToolCall], dispatch: _Dispatch, toolbox: Toolbox) -> list[StepResult]:
    """Stateless tool calls of one turn run concurrently; environment steps run in order, and one that
    ends the episode skips the calls after it."""
    if all(call.name in dispatch.tools for call in calls):
        return list(await asyncio.gather(*(_answer(call, dispatch, toolbox) for call in calls)))
    results = []
    for call in calls:
        results.append(await _answer(call, dispatch, toolbox))
        if results[-1].done:
            break
    return results


async def _answer(call: ToolCall, dispatch: _Dispatch, toolbox: Toolbox) -> StepResult:
    if call.name in dispatch.tools:
        return await toolbox.call(call.name, call.args)
    env = dispatch.envs[dispatch.functions.get(call.name, call.name)]
    return await call_guarded(call.name, env.step(call), ENV_STEP_TIMEOUT_S)


def _record(out: Rollout, calls: list[ToolCall], results: list[StepResult]) -> None:
    for call, result in zip(calls, results):
        out.calls.append(
            ToolCallRecord(call.name, result.ok, result.timed_out, result.runtime_s, len(result.result), result.error)
        )
        out.step_rewards.append(result.reward)
        if result.done:
            out.done = True


def _append_observation(out: Rollout, ids: list[int], budget: _Budget) -> bool:
    """Append observation tokens (cut to the budget); False when the cut ends the rollout."""
    kept = ids[: max(0, budget.left(len(out.response_ids)))]
    start = len(out.response_ids)
    out.response_ids += kept
    out.logprobs += [math.nan] * len(kept)
    if kept:
        out.observation_spans.append((start, start + len(kept)))
    if len(kept) < len(ids) or budget.left(len(out.response_ids)) <= 0:
        out.finish_reason = "length"
        return False
    return True


def agent_reward(
    scored: float,
    format_part: float,
    trace: AgentTrace,
    aggregator: str,
    only_reward_good_outputs: bool,
    penalised: bool,
) -> float:
    """The sample's reward from the verifier's (`scored`, format reward included) and the environments' steps.

    The verifier's reward joins the last step's reward; `last` keeps that, `sum` adds every step. With
    --only_reward_good_outputs a sample without a successful, non-empty call keeps only its format
    reward. A non-stop penalty (`penalised`) replaces everything, as it does for single-turn samples."""
    if penalised:
        return scored
    if only_reward_good_outputs and not any(c.ok and c.output_chars for c in trace.calls):
        scored = format_part
    steps: list[Any] = list(trace.step_rewards)
    if not steps:
        return scored
    return (steps[-1] if aggregator == "last" else sum(steps)) + scored
