"""The multi-turn loop's logic, on CPU in milliseconds: a scripted engine, in-process tools, real environments.

The engine is a function that returns a scripted turn; tokens are characters (`ord`), so spans and
budgets are easy to check by hand. The real-engine tests are in tests/integration/test_agent_engine.py.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from open_instruct.agents.base import StepResult, string_tool
from open_instruct.agents.rollout import agent_reward, run_rollout
from open_instruct.agents.settings import AgentSettings, ToolSpec
from open_instruct.agents.tools import Toolbox, call_guarded
from open_instruct.batching import _trained_tokens
from open_instruct.config.fields import groups_from_flags
from open_instruct.config.tools import ToolsConfig
from open_instruct.loss import importance_weights
from open_instruct.messages import AgentRequest, AgentTrace, Completion, EnvSpec, ToolCallRecord, VersionSpan

PROMPT = tuple(range(10))


def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(chr(i) for i in ids)


class ScriptedEngine:
    """Answers turn k with `turns[k]` (cut to the budget); records what each turn was asked."""

    def __init__(self, turns: list[str], version: int = 0):
        self.turns, self.version, self.asked = turns, version, []

    async def __call__(self, context, max_tokens, stops, index):
        self.asked.append((len(context), max_tokens, stops))
        text = self.turns[index] if index < len(self.turns) else "the end"
        ids = tuple(tokenize(text)[:max_tokens])
        return Completion(
            prompt_id="p",
            sample_index=0,
            prompt_token_ids=tuple(context),
            response_token_ids=ids,
            behaviour_logprobs=(-0.5,) * len(ids),
            finish_reason="stop" if len(ids) == len(text) else "length",
            version_spans=(VersionSpan(self.version + index, 0, len(ids)),),
            admitted_version=0,
            engine_id=0,
            response_text=decode(ids),
        )


class EchoTool:
    """An in-process tool: answers `echo:<payload>` after `delay_s` (and after every call sharing its
    `rendezvous` has arrived there), or fails when told to."""

    def __init__(self, name: str, delay_s=0.0, fail=False, timeout_s=5.0, rendezvous: asyncio.Barrier | None = None):
        self.call_name, self.delay_s, self.fail, self.timeout_s = name, delay_s, fail, timeout_s
        self.rendezvous = rendezvous
        self.definition = string_tool(name, "echo", "code", "text")

    async def call(self, args):
        if self.rendezvous is not None:
            await self.rendezvous.wait()
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("service down")
        return StepResult(f"echo:{args['code']}")

    async def close(self):
        pass


def toolbox(*tools: EchoTool, **values) -> Toolbox:
    """A Toolbox of `tools` under tool flags by their names (`max_steps=2`) and AgentSettings' own fields."""
    built, rest = groups_from_flags(values, {"tools": ToolsConfig})
    box = Toolbox(AgentSettings(**built, **{"max_model_len": 400, **rest}))
    for tool in tools:
        box.tools[tool.call_name] = tool
        box._limits[tool.call_name] = asyncio.Semaphore(4)
    return box


def rollout(engine, box, request: AgentRequest | None = None, response_length: int = 200):
    return asyncio.run(run_rollout(PROMPT, request or AgentRequest(), box, engine, tokenize, response_length))


def test_two_calls_outputs_in_place_masked_and_without_logprobs():
    engine = ScriptedEngine(["a<code>x</code>", "b<code>y</code>", "done"])
    out, trace = rollout(engine, toolbox(EchoTool("code")))
    text = decode(out.response_ids)
    obs1, obs2 = "<output>\necho:x\n</output>\n", "<output>\necho:y\n</output>\n"
    assert text == "a<code>x</code>" + obs1 + "b<code>y</code>" + obs2 + "done"
    assert [decode(out.response_ids[s:e]) for s, e in trace.observation_spans] == [obs1, obs2]
    observed = {i for s, e in trace.observation_spans for i in range(s, e)}
    assert all(math.isnan(lp) == (i in observed) for i, lp in enumerate(out.logprobs))
    # Version spans cover the model's tokens only, each turn at its own version.
    spans = [(v.version, decode(out.response_ids[v.start : v.end])) for v in out.version_spans]
    assert spans == [(0, "a<code>x</code>"), (1, "b<code>y</code>"), (2, "done")]
    assert trace.turns == 3 and [c.name for c in trace.calls] == ["code", "code"] and out.finish_reason == "stop"
    # Each turn sees the whole context so far and the parser's stop string.
    assert engine.asked[1][0] == len(PROMPT) + len("a<code>x</code>" + obs1) and engine.asked[0][2] == ("</code>",)


def test_loss_mask_excludes_observations_only_with_mask_tool_use():
    out, trace = rollout(ScriptedEngine(["<code>x</code>", "ok"]), toolbox(EchoTool("code")))
    completion = Completion(
        prompt_id="p",
        sample_index=0,
        prompt_token_ids=PROMPT,
        response_token_ids=tuple(out.response_ids),
        behaviour_logprobs=tuple(out.logprobs),
        finish_reason="stop",
        version_spans=(),
        admitted_version=0,
        engine_id=0,
        agent=trace,
    )
    mask = _trained_tokens(completion, trains=True, mask_tool_use=True)
    assert [i for i, m in enumerate(mask) if not m] == [i for s, e in trace.observation_spans for i in range(s, e)]
    assert _trained_tokens(completion, trains=True, mask_tool_use=False) is None
    assert set(_trained_tokens(completion, trains=False, mask_tool_use=True)) == {0}


def test_untrained_observation_tokens_get_ratio_one_in_the_importance_weights():
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    behaviour = torch.tensor([[-1.5, float("nan"), -3.0]])
    result = importance_weights(old, behaviour, torch.ones(1, 3, dtype=torch.bool), cap=2.0)
    assert torch.isfinite(result.weights_BT).all()
    assert result.weights_BT[0, 1] == 1.0 and result.weights_BT[0, 0] == pytest.approx(math.exp(0.5))


def test_after_its_last_allowed_call_the_model_answers_once_more_without_running_calls():
    engine = ScriptedEngine(["<code>1</code>"] * 5)
    out, trace = rollout(engine, toolbox(EchoTool("code"), max_steps=2))
    assert len(trace.calls) == 2 and trace.turns == 3 and out.finish_reason == "stop"
    assert decode(out.response_ids).endswith("</output>\n<code>1</code>")
    # A row's own max_steps wins over the flag.
    out, trace = rollout(ScriptedEngine(["<code>1</code>"] * 5), toolbox(EchoTool("code")), AgentRequest(max_steps=1))
    assert len(trace.calls) == 1


def test_budgets_per_turn_and_overall():
    engine = ScriptedEngine(["<code>x</code>", "y" * 100])
    out, _ = rollout(engine, toolbox(EchoTool("code"), per_turn_max_tokens=40), response_length=60)
    assert [asked[1] for asked in engine.asked] == [40, 60 - len("<code>x</code><output>\necho:x\n</output>\n")]
    assert len(out.response_ids) == 60 and out.finish_reason == "length"
    # An observation that does not fit is cut and ends the rollout.
    out, trace = rollout(ScriptedEngine(["<code>x</code>"]), toolbox(EchoTool("code")), response_length=20)
    assert len(out.response_ids) == 20 and out.finish_reason == "length" and trace.observation_spans == ((14, 20),)


def test_tool_errors_and_timeouts_become_text_and_the_sample_continues():
    box = toolbox(EchoTool("slow", delay_s=0.5, timeout_s=0.05), EchoTool("down", fail=True))
    engine = ScriptedEngine(["<slow>a</slow>", "<down>b</down>", "fine"])
    out, trace = rollout(engine, box)
    text = decode(out.response_ids)
    assert "Step 'slow' timed out" in text and "Step 'down' failed: ConnectionError: service down" in text
    assert [(c.timed_out, c.error is not None) for c in trace.calls] == [(True, True), (False, True)]
    assert text.endswith("fine") and trace.turns == 3


def test_tool_calls_of_one_turn_run_concurrently():
    """Each call waits at a rendezvous for the other: run one after the other, the first would time out."""
    both = asyncio.Barrier(2)  # bound to the event loop at its first wait, inside `rollout`
    box = toolbox(EchoTool("a", 0.3, rendezvous=both, timeout_s=60), EchoTool("b", 0.3, rendezvous=both))
    out, trace = rollout(ScriptedEngine(["<a>1</a><b>2</b>", "x"]), box)
    assert [(c.name, c.timed_out) for c in trace.calls] == [("a", False), ("b", False)]
    assert "echo:1\necho:2" in decode(out.response_ids)
    assert trace.tool_wait_s >= 0.3  # both slept 0.3 s, at once


def test_an_environment_step_that_ends_the_episode_skips_the_calls_after_it():
    call = "<guess>{}</guess>"
    engine = ScriptedEngine([call.format(37) + call.format(50)])
    _, trace = rollout(engine, toolbox(), AgentRequest(envs=(EnvSpec("guess_number", (("number", "37"),)),)))
    assert len(trace.calls) == 1 and trace.done and trace.step_rewards == (1.0,)


def test_calls_outside_the_rows_tools_are_not_run():
    _, trace = rollout(
        ScriptedEngine(["<a>1</a><b>2</b>", "x"]), toolbox(EchoTool("a"), EchoTool("b")), AgentRequest(tools=("b",))
    )
    assert [c.name for c in trace.calls] == ["b"]


def test_guess_number_environment_with_the_hermes_parser():
    call = '<tool_call>{{"name": "guess", "arguments": {{"number": {}}}}}</tool_call><|im_end|>'
    engine = ScriptedEngine([call.format(50), call.format(37), "never"])
    request = AgentRequest(envs=(EnvSpec("guess_number", (("number", "37"),)),))
    out, trace = rollout(
        engine, toolbox(tool_parser_type="vllm_hermes", max_model_len=600), request, response_length=400
    )
    assert trace.step_rewards == pytest.approx((1 - 13 / 99, 1.0)) and trace.done and out.finish_reason == "stop"
    assert trace.turns == 2 and trace.env_metrics["guess_number/solved"] == 1.0
    assert "<|im_start|>tool\n<tool_response>\n" in decode(out.response_ids)


def test_a_text_environment_sees_every_turn():
    guess = "<guess>{}</guess>"
    engine = ScriptedEngine([guess.format("crane"), guess.format("plant")])
    out, trace = rollout(engine, toolbox(), AgentRequest(envs=(EnvSpec("wordle", (("word", "plant"),)),)))
    assert trace.done and trace.turns == 2 and trace.step_rewards[-1] > 1
    assert "<output>" in decode(out.response_ids)  # legacy parser's wrapping, for the user role too


def test_a_row_missing_its_reset_kwarg_raises_a_clear_error():
    with pytest.raises(ValueError, match="counter: reset needs 'target'"):
        rollout(ScriptedEngine(["x"]), toolbox(), AgentRequest(envs=(EnvSpec("counter"),)))


def test_parked_context_wraps_each_tool_wait():
    events = []

    class Parking:
        async def __aenter__(self):
            events.append("park")

        async def __aexit__(self, *exc):
            events.append("unpark")

    engine = ScriptedEngine(["<code>x</code>", "<code>y</code>", "z"])
    asyncio.run(run_rollout(PROMPT, AgentRequest(), toolbox(EchoTool("code")), engine, tokenize, 200, Parking))
    assert events == ["park", "unpark", "park", "unpark"]


def test_call_guarded_measures_runtime_and_catches_exceptions():
    async def boom():
        raise ValueError("bad")

    result = asyncio.run(call_guarded("t", boom(), 1.0))
    assert result.error == "Step 't' failed: ValueError: bad" and result.runtime_s >= 0


def trace_with(rewards, calls=()):
    return AgentTrace(
        turns=1,
        calls=tuple(calls),
        observation_spans=(),
        step_rewards=tuple(rewards),
        env_metrics={},
        tool_wait_s=0.0,
        done=True,
    )


def test_agent_reward_aggregates_environment_steps_with_the_verifier():
    trace = trace_with([-0.1, -0.1, 1.0])
    assert agent_reward(10.0, 0.0, trace, "last", False, False) == pytest.approx(11.0)
    assert agent_reward(10.0, 0.0, trace, "sum", False, False) == pytest.approx(10.8)
    assert agent_reward(3.0, 0.0, trace_with([]), "last", False, False) == 3.0
    assert agent_reward(-1.0, 0.0, trace, "sum", False, True) == -1.0  # the non-stop penalty replaces all


def test_only_reward_good_outputs_needs_a_successful_non_empty_call():
    good = ToolCallRecord("code", ok=True, timed_out=False, runtime_s=0.1, output_chars=3)
    empty = ToolCallRecord("code", ok=True, timed_out=False, runtime_s=0.1, output_chars=0)
    failed = ToolCallRecord("code", ok=False, timed_out=True, runtime_s=3, output_chars=9, error="timeout")
    assert agent_reward(10.0, 1.0, trace_with([], [good]), "last", True, False) == 10.0
    for calls in ([], [empty], [failed]):
        assert agent_reward(10.0, 1.0, trace_with([], calls), "last", True, False) == 1.0


def test_toolbox_refuses_unknown_config_keys_and_needs_a_url_for_http():
    with pytest.raises(ValueError, match="unknown key 'endpoint'"):
        Toolbox(AgentSettings(tool_specs=(ToolSpec("python", "code", {"endpoint": "x"}),)))
    with pytest.raises(ValueError, match='needs a "url"'):
        Toolbox(AgentSettings(tool_specs=(ToolSpec("http", "search", {}),)))
