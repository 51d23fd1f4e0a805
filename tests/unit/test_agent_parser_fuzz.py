"""A policy under RL is an adversary: whatever text it writes, every parser returns (never raises, which
would drop the sample untrained) and returns fast (never stalls the generation actor's event loop). The
calls that come out go through `coerce_args`, and its message through `format_observation`, as a tool's
answer would."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable

import pytest

from open_instruct.agents import rollout as rollout_module
from open_instruct.agents.base import StepResult, ToolCall, ToolDefinition, string_tool
from open_instruct.agents.parsers import PARSER_TYPES, coerce_args, make_parser
from open_instruct.agents.rollout import run_rollout
from open_instruct.agents.settings import AgentSettings
from open_instruct.agents.tools import Toolbox
from open_instruct.config.tools import ToolsConfig
from open_instruct.messages import AgentRequest, Completion, VersionSpan

TYPED = ToolDefinition(
    "typed",
    "Every JSON-schema type.",
    {
        "type": "object",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "array"},
            "z": {"type": "object"},
            "s": {"type": "string"},
            "b": {"type": "boolean"},
            "n": {"type": "number"},
        },
        "required": ["x"],
    },
)
DEFINITIONS = (string_tool("python", "Run Python.", "code", "the program"), TYPED)
BY_NAME = {d.name: d for d in DEFINITIONS}
TURN_CHARS = 64_000  # a 16k-token turn, at ~4 characters a token
# Why 1 s: the quadratic scans these parsers used took over 10 s on the unclosed-opener inputs; the linear
# ones take at most ~17 ms (qwen3, 16,000 parameters), most under 5 ms, on a 2-core machine busy with the
# test suite. The bound sits 10x under the one and 60x over the other, so a loaded machine (50 ms was once
# missed by 6 ms) cannot flip it while a quadratic scan still fails it.
BOUND_S = 1.0

# One call whose argument `x` is written as VALUE, in each format.
CALL: dict[str, Callable[[str], str]] = {
    "legacy": lambda value: f"<typed>{value}</typed>",
    "vllm_hermes": lambda value: f'<tool_call>{{"name": "typed", "arguments": {{"x": {value}}}}}</tool_call>',
    "vllm_llama3_json": lambda value: f'<|python_tag|>{{"name": "typed", "parameters": {{"x": {value}}}}}<|eom_id|>',
    "vllm_olmo3": lambda value: f"<function_calls>\ntyped(x={value})\n</function_calls>",
    "vllm_qwen3_xml": lambda value: (
        f"<tool_call>\n<function=typed>\n<parameter=x>\n{value}\n</parameter>\n"
        f"<parameter=y>\n{value}\n</parameter>\n</function>\n</tool_call>"
    ),
}
# The JSON formats also take arguments double-encoded, as a JSON string the parser decodes again.
ENCODED_CALL: dict[str, Callable[[str], str]] = {
    "vllm_hermes": lambda value: f'<tool_call>{{"name": "typed", "arguments": {value}}}</tool_call>',
    "vllm_llama3_json": lambda value: f'{{"name": "typed", "parameters": {value}}}',
}
# Pieces of each format, repeated: many openers never closed are what made the lazy regexes quadratic.
# (olmo3 parses each line that may be a call with ast.parse, ~5 us: a turn of thousands of distinct calls
# is linear, but takes tens of milliseconds, so it is not among these inputs.)
OPENERS = {
    "legacy": ("<python>", "<typed>", "<python><typed>"),
    "vllm_hermes": ("<tool_call>",),
    "vllm_llama3_json": ("{", '{"name": "typed", "parameters": ', "<|python_tag|>", "<|eot_id|>", "<|"),
    "vllm_olmo3": ("<function_calls>", "typed(", "typed(x=1)", "-"),
    "vllm_qwen3_xml": ("<tool_call>", "<function=typed>", "<parameter=x>", "<function=", "<parameter="),
}
# qwen3 reads functions only inside a <tool_call>, and parameters only inside a complete function.
QWEN3_WITHIN = {
    "<function=typed>": ("<tool_call>", ""),
    "<function=": ("<tool_call>", ""),
    "<parameter=x>": ("<tool_call><function=typed>", "</function>"),
    "<parameter=": ("<tool_call><function=typed>", "</function>"),
}
VALUES = {
    "huge int": "9" * 10_000,
    "huge negative int": "-" + "9" * 10_000,
    "huge float": "1e999999",
    "huge hex int": "0x" + "f" * 20_000,
    "deep list": "[" * 10_000 + "]" * 10_000,
    "deep object": '{"a":' * 5_000 + "1" + "}" * 5_000,
    "decodable depth": "[" * 300 + "]" * 300,
    "unclosed list": "[" * 10_000,
    "unary minus": "-" * 100_000 + "1",
    "not": "not " * 20_000 + "1",
    "escaped surrogate": '"\\ud800"',
    "escaped NUL": '"a\\u0000b"',
    "huge int as a string": '"' + "9" * 10_000 + '"',
    "long string": '"' + "a" * TURN_CHARS + '"',
}
FRAGMENTS = tuple(sorted({tag for tags in OPENERS.values() for tag in tags})) + (
    "</tool_call>",
    "</function>",
    "</parameter>",
    "</function_calls>",
    "</python>",
    "</typed>",
    "<|eom_id|>",
    '"name"',
    '"arguments"',
    ":",
    ",",
    ";",
    "}",
    "]",
    "[",
    ")",
    "(",
    "=",
    "'",
    '"',
    "\\",
    "\n",
    " ",
    "#",
    "python",
    "x",
    "1",
    "9" * 50,
    "\x00",
    "\ud800",
    "\udfff",
    "é",
    "\u3000",
    ">",
    "<",
    "/",
)


def hostile_turns(parser_type: str) -> dict[str, str]:
    """Named hostile turns for one parser: its own syntax abused, plus text any parser may see."""
    rng = random.Random(parser_type)
    turns = {f"x = {name}": CALL[parser_type](value) for name, value in VALUES.items()}
    turns |= {f"x = {name} (bare)": value for name, value in VALUES.items()}
    if parser_type in ENCODED_CALL:
        encoded = {name: json.dumps(f'{{"x": {value}}}') for name, value in VALUES.items()}
        turns |= {f"x = {name} (double-encoded)": ENCODED_CALL[parser_type](v) for name, v in encoded.items()}
    for opener in OPENERS[parser_type]:
        count = 20_000 if parser_type == "legacy" else 16_000
        before, after = QWEN3_WITHIN.get(opener, ("", "")) if parser_type == "vllm_qwen3_xml" else ("", "")
        turns[f"{count} x {opener!r}"] = before + opener * count + after
        turns[f"{count} x {opener!r} + newlines"] = before + (opener + "\n") * count + after
    one_call = CALL[parser_type]("1") + "\n"
    turns["a 16k-token turn of calls"] = one_call * (TURN_CHARS // len(one_call))
    turns["random printable"] = "".join(rng.choice("abc xyz(){}[]<>/=\"':;,\n\t0123456789") for _ in range(TURN_CHARS))
    turns["random fragments"] = "".join(rng.choice(FRAGMENTS) for _ in range(TURN_CHARS // 5))
    turns["random code points"] = "".join(chr(rng.randrange(0x110000)) for _ in range(TURN_CHARS // 4))
    turns["NUL"] = "\x00" * TURN_CHARS
    turns["NUL in a call"] = CALL[parser_type]('"a\x00b"')
    turns["lone surrogates"] = "\ud800\udfff" * (TURN_CHARS // 2)
    turns["lone surrogate in a call"] = CALL[parser_type]('"\ud800"')
    turns["spaces, then text"] = " " * TURN_CHARS + "x"
    turns["special tokens, then text"] = "<|eot_id|>" * (TURN_CHARS // 10) + "x"
    turns["special tokens and spaces"] = "<|eot_id|> " * (TURN_CHARS // 11)
    return turns


def best_of_3(parse: Callable[[str], list[ToolCall]], text: str) -> tuple[list[ToolCall], float]:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        calls = parse(text)
        best = min(best, time.perf_counter() - started)
    return calls, best


@pytest.mark.parametrize("parser_type", PARSER_TYPES)
def test_hostile_turns_parse_fast_without_raising(parser_type):
    parser = make_parser(parser_type, DEFINITIONS)
    slow = {}
    for name, text in hostile_turns(parser_type).items():
        calls, elapsed_s = best_of_3(parser.parse, text)
        if elapsed_s > BOUND_S:
            slow[name] = round(elapsed_s, 3)
        for call in calls:
            assert isinstance(call, ToolCall) and isinstance(call.name, str) and isinstance(call.args, dict), name
            answer_as_a_tool_would(parser, call)
    assert not slow, f"{parser_type} took over {BOUND_S}s on: {slow}"


def answer_as_a_tool_would(parser, call: ToolCall) -> None:
    """coerce_args raises only its ValueError; the observation is text a tokeniser can encode."""
    try:
        coerce_args(BY_NAME.get(call.name, TYPED), call.args)
        message = "ok"
    except ValueError as error:
        message = f"Bad arguments: {error}"
    for role in ("tool", "user"):
        for closed in (True, False):
            observation = parser.format_observation(message + call.name + "\x00\ud800", role, closed)
            assert "\x00" not in observation
            observation.encode("utf-8")  # raises on a lone surrogate


@pytest.mark.parametrize("parser_type", PARSER_TYPES)
def test_the_values_a_tool_sees_are_clean(parser_type):
    parser = make_parser(parser_type, DEFINITIONS)
    for text in (CALL[parser_type]('"a\x00b\ud800"'), CALL[parser_type]('"a\\u0000b\\ud800"')):
        for call in parser.parse(text):
            assert "\x00" not in repr(call.args)
            repr(call.args).encode("utf-8")


class ReprTool:
    """An in-process tool that answers with its arguments' repr, which a huge int does not have (ValueError)."""

    def __init__(self, definition: ToolDefinition):
        self.definition, self.call_name, self.timeout_s = definition, definition.name, 5.0

    async def call(self, args):
        return StepResult(repr(args)[:100])

    async def close(self):
        pass


@pytest.mark.parametrize("parser_type", PARSER_TYPES)
def test_a_hostile_turn_is_kept_whole_for_training(parser_type):
    box = Toolbox(AgentSettings(tools=ToolsConfig(tool_parser_type=parser_type), max_model_len=1_000_000))
    for definition in DEFINITIONS:
        box.tools[definition.name] = ReprTool(definition)
        box._limits[definition.name] = asyncio.Semaphore(1)
    turns = {name: hostile_turns(parser_type)[name] for name in ("x = huge int", "x = huge hex int", "x = deep list")}
    turns["lone surrogate in a call"] = CALL[parser_type]('"\\ud800"')
    for name, text in turns.items():
        out, trace = asyncio.run(run_rollout((1, 2), AgentRequest(), box, Scripted(text), utf8, 900_000))
        assert out.error is None and out.finish_reason == "stop", name
        assert out.response_ids[: len(utf8(text))] == utf8(text), name
        assert trace.turns == 1 + len(trace.calls), name


def utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))  # a tokeniser: it cannot read a lone surrogate either


class Scripted:
    """An engine that writes `text` as its first turn and "done" after."""

    def __init__(self, text: str):
        self.text = text

    async def __call__(self, context, max_tokens, stops, index):
        text = self.text if index == 0 else "done"
        ids = tuple(utf8(text))
        return Completion(
            prompt_id="p",
            sample_index=0,
            prompt_token_ids=tuple(context),
            response_token_ids=ids,
            behaviour_logprobs=(-0.5,) * len(ids),
            finish_reason="stop",
            admitted_version=0,
            engine_id=0,
            version_spans=(VersionSpan(index, 0, len(ids)),),
            response_text=text,
        )


@pytest.mark.parametrize("parser_type", PARSER_TYPES)
def test_a_turn_longer_than_16k_tokens_is_parsed_off_the_event_loop(parser_type):
    """Linear is not free on a long-context model's 100k-character turn: the rollout parses it in a thread, so a
    ticker task on the same loop gets turns meanwhile (parsed inline, it could get none); a short turn is
    parsed inline, and both give the same calls."""
    parser = make_parser(parser_type, DEFINITIONS)
    long_text = "\n".join(CALL[parser_type](f'"{i}"') for i in range(4000))
    short_text = CALL[parser_type]('"1"')
    assert len(long_text) > rollout_module._PARSE_INLINE_CHARS >= len(short_text)
    ticks = [0]

    async def ticks_while_parsing(text):
        async def ticker():
            while True:
                ticks[0] += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks[0]
        calls = await rollout_module._parse(parser, text)
        during = ticks[0] - before
        task.cancel()
        return calls, during

    calls, during = asyncio.run(ticks_while_parsing(long_text))
    assert calls == parser.parse(long_text) and calls and during > 0
    calls, during = asyncio.run(ticks_while_parsing(short_text))
    assert calls == parser.parse(short_text) and during == 0
