"""Tool-call parsers: our own readers for the formats vLLM's native tool parsers read.

open-instruct hands each finished turn to vLLM's parser classes, which ties the rollout loop to a
vLLM import and makes the formats hard to test. The formats themselves are small, so each parser
here is a few regular expressions (or `json`/`ast`) that a unit test can pin down exactly. A parser
also owns the observation text appended after a call is answered, because only it knows which chat
template the model was trained on; that text is tokenised as-is, never re-rendered through the
template.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from open_instruct.agents.base import Role, ToolCall, ToolDefinition

PARSER_TYPES: tuple[str, ...] = ("legacy", "vllm_hermes", "vllm_llama3_json", "vllm_olmo3", "vllm_qwen3_xml")
# open-instruct's wordle script and docs still pass the old spelling; accept it rather than break them.
PARSER_ALIASES = {"vllm_qwen3xml": "vllm_qwen3_xml"}
UNSUPPORTED_PARSERS = {
    "dr_tulu": "it re-parses whole turns through the dr_agent package and needs the dr_agent MCP backend, "
    "which this trainer does not ship",
}

# The rollout asks vLLM for text with special tokens kept, so a turn can end in its end-of-turn token;
# formats read line by line or as bare JSON must not see it as part of the last call.
_TRAILING_SPECIAL = re.compile(r"(?:\s*<\|[A-Za-z0-9_]+\|>)+\s*\Z")
_SCHEMA_CONVERTED = frozenset({"integer", "number", "boolean", "object", "array"})


class ToolParser(Protocol):
    parser_type: str
    stop_strings: tuple[str, ...]  # must end a generation turn: added to the sampling stop list

    def parse(self, text: str) -> list[ToolCall]: ...

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str: ...


def _strip_nul(value: Any) -> Any:
    # NUL bytes break tokenisers and sandboxes downstream, and a model can emit them (or "\u0000").
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_strip_nul(item) for item in value]
    if isinstance(value, dict):
        return {_strip_nul(key): _strip_nul(item) for key, item in value.items()}
    return value


def _schema_types(definition: ToolDefinition | None, argument: str) -> set[str]:
    if definition is None:
        return set()
    declared = definition.parameters.get("properties", {}).get(argument, {}).get("type")
    if isinstance(declared, str):
        return {declared}
    return {t for t in declared if isinstance(t, str)} if isinstance(declared, list) else set()


def _chatml_prefix(turn_closed: bool) -> str:
    # A turn cut by the token limit has no <|im_end|>; close it so the next block is well formed.
    return "\n" if turn_closed else "<|im_end|>\n"


def _chatml_user(text: str) -> str:
    return "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"


def _json_call(obj: Any, argument_keys: tuple[str, ...]) -> ToolCall | None:
    """A call from a decoded `{"name": ..., "<argument key>": {...}}`, or None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[key] for key in argument_keys if key in obj), None)
    if args is None:
        args = {}
    if isinstance(args, str):  # some models double-encode the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(_strip_nul(obj["name"]), _strip_nul(args))


class LegacyParser:
    """`<NAME>payload</NAME>`: the payload fills the tool's single (first required) parameter."""

    parser_type = "legacy"

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        seen: set[str] = set()
        for definition in definitions:
            if definition.name in seen:
                raise ValueError(
                    f"duplicate tool name {definition.name!r} with --tool_parser_type legacy: "
                    f"each <{definition.name}> tag must name exactly one tool"
                )
            seen.add(definition.name)
        self._argument = {d.name: self._payload_argument(d) for d in definitions}
        self.stop_strings: tuple[str, ...] = tuple(f"</{d.name}>" for d in definitions)
        # One alternation (instead of a search per tool) yields the calls in text order.
        names = "|".join(re.escape(d.name) for d in definitions)
        self._pattern = re.compile(rf"<(?P<name>{names})>(?P<payload>.*?)</(?P=name)>", re.DOTALL) if names else None

    @staticmethod
    def _payload_argument(definition: ToolDefinition) -> str | None:
        if definition.required:
            return definition.required[0]
        return next(iter(definition.parameters.get("properties", {})), None)

    def parse(self, text: str) -> list[ToolCall]:
        if self._pattern is None:
            return []
        calls = []
        for match in self._pattern.finditer(text.replace("\x00", "")):
            argument = self._argument[match["name"]]
            calls.append(ToolCall(match["name"], {argument: match["payload"]} if argument else {}))
        return calls

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        # The assistant turn continues after the output, so there are no role tokens to write.
        return "<output>\n" + text + "\n</output>\n"


class HermesParser:
    """Hermes 2 Pro: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (ChatML)."""

    parser_type = "vllm_hermes"
    stop_strings: tuple[str, ...] = ()
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        del definitions  # arguments arrive as typed JSON

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for match in self._block.finditer(text.replace("\x00", "")):
            try:
                obj = json.loads(match[1])
            except json.JSONDecodeError:
                continue
            call = _json_call(obj, ("arguments",))
            if call is not None:
                calls.append(call)
        return calls

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        if role == "user":
            return _chatml_prefix(turn_closed) + _chatml_user(text)
        return (
            _chatml_prefix(turn_closed)
            + "<|im_start|>tool\n<tool_response>\n"
            + text
            + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )


class Llama3JsonParser:
    """Llama 3 JSON: the whole turn is `{"name": ..., "parameters": {...}}`, several joined by `;`."""

    parser_type = "vllm_llama3_json"
    stop_strings: tuple[str, ...] = ()
    _python_tag = "<|python_tag|>"

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        del definitions  # arguments arrive as typed JSON

    def parse(self, text: str) -> list[ToolCall]:
        body = _TRAILING_SPECIAL.sub("", text.replace("\x00", "")).strip()
        body = body.removeprefix(self._python_tag).lstrip()
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        position = 0
        # A turn is a call only if it *is* JSON; prose that merely contains braces is an answer.
        while position < len(body) and body[position] == "{":
            try:
                obj, position = decoder.raw_decode(body, position)
            except json.JSONDecodeError:
                break  # no way to resynchronise inside broken JSON: keep the calls before it
            call = _json_call(obj, ("parameters", "arguments"))
            if call is not None:
                calls.append(call)
            rest = body[position:].lstrip()
            if not rest.startswith(";"):
                break
            position = len(body) - len(rest[1:].lstrip())
        return calls

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        header = "ipython" if role == "tool" else "user"
        return (
            ("" if turn_closed else "<|eot_id|>")
            + f"<|start_header_id|>{header}<|end_header_id|>\n\n"
            + text
            + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )


class Olmo3Parser:
    """Olmo 3 pythonic: `name(arg=value)` one per line, optionally inside `<function_calls>`."""

    parser_type = "vllm_olmo3"
    stop_strings: tuple[str, ...] = ()
    _block = re.compile(r"<function_calls>(.*?)(?:</function_calls>|\Z)", re.DOTALL)
    # Models trained on JSON schemas sometimes write JSON literals inside Python calls.
    _json_names: ClassVar[dict[str, Any]] = {"true": True, "false": False, "null": None}

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        del definitions  # the rollout, not the parser, decides which names are callable

    def parse(self, text: str) -> list[ToolCall]:
        text = _TRAILING_SPECIAL.sub("", text.replace("\x00", ""))
        blocks = [match[1] for match in self._block.finditer(text)] or [text]
        lines = (line.strip() for block in blocks for line in block.splitlines())
        return [call for line in lines if line and (call := self._call(line)) is not None]

    def _call(self, line: str) -> ToolCall | None:
        try:
            node = ast.parse(line, mode="eval").body
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
                return None
            args = {keyword.arg: self._literal(keyword.value) for keyword in node.keywords}
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return None
        return ToolCall(node.func.id, _strip_nul(args))

    def _literal(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name) and node.id in self._json_names:
            return self._json_names[node.id]
        return ast.literal_eval(node)

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        if role == "user":
            return _chatml_prefix(turn_closed) + _chatml_user(text)
        return _chatml_prefix(turn_closed) + "<|im_start|>environment\n" + text + "<|im_end|>\n<|im_start|>assistant\n"


class Qwen3XmlParser:
    """Qwen3 XML: `<tool_call><function=N><parameter=P>value</parameter></function></tool_call>`."""

    parser_type = "vllm_qwen3_xml"
    stop_strings: tuple[str, ...] = ()
    # An unclosed final <tool_call> still counts if its function is complete (the model may end the
    # turn instead of writing </tool_call>); a missing </parameter> ends at the next parameter.
    _block = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
    _function = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
    _parameter = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        # Every value is written as text; only the schema says which ones are really numbers or JSON.
        self._definitions = {d.name: d for d in definitions}

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for block in self._block.finditer(text.replace("\x00", "")):
            for function in self._function.finditer(block[1]):
                name = function[1].strip()
                if not name:
                    continue
                args = {}
                for parameter in self._parameter.finditer(function[2]):
                    argument = parameter[1].strip()
                    args[argument] = self._value(name, argument, parameter[2])
                calls.append(ToolCall(name, args))
        return calls

    def _value(self, tool: str, argument: str, raw: str) -> Any:
        value = raw.removeprefix("\n").removesuffix("\n")
        if _schema_types(self._definitions.get(tool), argument) & _SCHEMA_CONVERTED:
            try:
                return _strip_nul(json.loads(value))
            except json.JSONDecodeError:
                pass  # leave it to coerce_args / the tool to report the bad value
        return value

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        # Qwen3's own template answers tools in a user turn, and the model thinks before replying.
        return (
            _chatml_prefix(turn_closed)
            + "<|im_start|>user\n<tool_response>\n"
            + text
            + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
        )


_PARSERS: dict[str, Callable[[Sequence[ToolDefinition]], ToolParser]] = {
    cls.parser_type: cls for cls in (LegacyParser, HermesParser, Llama3JsonParser, Olmo3Parser, Qwen3XmlParser)
}


def make_parser(parser_type: str, definitions: Sequence[ToolDefinition]) -> ToolParser:
    """The parser for `--tool_parser_type`; raises ValueError for unknown or unsupported types."""
    resolved = PARSER_ALIASES.get(parser_type, parser_type)
    if resolved in UNSUPPORTED_PARSERS:
        raise ValueError(f"--tool_parser_type {resolved} is not supported yet: {UNSUPPORTED_PARSERS[resolved]}")
    if resolved not in _PARSERS:
        raise ValueError(f"unknown --tool_parser_type {parser_type!r} (known: {', '.join(PARSER_TYPES)})")
    return _PARSERS[resolved](definitions)


def _cast(expected: str, value: Any) -> Any:
    # bool is an int subclass, but True is not a valid integer or number argument.
    if expected == "integer":
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            return int(value)
        return int(value.strip()) if isinstance(value, str) else int(value)
    if expected == "number":
        if isinstance(value, bool):
            raise ValueError
        return value if isinstance(value, int | float) else float(value)
    if expected == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError
    return str(value)


def coerce_args(definition: ToolDefinition, args: dict[str, Any]) -> dict[str, Any]:
    """Cast each argument to its declared JSON-schema type; raise ValueError naming a bad one.

    Models write numbers as strings and booleans in many spellings; casting here gives every tool
    typed arguments, and a clear error the model can read instead of a tool crashing on the type.
    """
    properties = definition.parameters.get("properties", {})
    coerced = {}
    for name, value in args.items():
        expected = properties.get(name, {}).get("type")
        if expected not in ("integer", "number", "boolean", "string"):
            coerced[name] = value
            continue
        try:
            coerced[name] = _cast(expected, value)
        except (ValueError, TypeError, OverflowError):
            raise ValueError(
                f"argument {name!r} of tool {definition.name!r}: expected {expected}, got {value!r}"
            ) from None
    return coerced
