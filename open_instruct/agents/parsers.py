"""Tool-call parsers: our own readers for the formats vLLM's native tool parsers read.

open-instruct hands each finished turn to vLLM's parser classes, which ties the rollout loop to a
vLLM import and makes the formats hard to test. The formats themselves are small, so each parser
here is a few string scans (or `json`/`ast`) that a unit test can pin down exactly. A parser
also owns the observation text appended after a call is answered, because only it knows which chat
template the model was trained on; that text is tokenised as-is, never re-rendered through the
template.

The text is written by a policy under RL, an adversary: no text may make a parser raise (that would
drop the sample, untrained) or stall the actor's event loop (a lazy regex such as
`<tool_call>(.*?)</tool_call>` is quadratic over many unclosed openers: 16,000 held the loop for 20 s).
So blocks are found with `str.find` in one pass, and anything malformed is "no call".
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Protocol

from open_instruct.agents.base import Role, ToolCall, ToolDefinition

PARSER_TYPES: tuple[str, ...] = ("legacy", "vllm_hermes", "vllm_llama3_json", "vllm_olmo3", "vllm_qwen3_xml")
# open-instruct's wordle script and docs still pass the old spelling; accept it rather than break them.
PARSER_ALIASES = {"vllm_qwen3xml": "vllm_qwen3_xml"}
UNSUPPORTED_PARSERS = {
    "dr_tulu": "it re-parses whole turns through the dr_agent package and needs the dr_agent MCP backend, "
    "which this trainer does not ship",
}

_SCHEMA_CONVERTED = frozenset({"integer", "number", "boolean", "object", "array"})
# A lone surrogate (JSON "\ud800", Python '\ud800') has no UTF-8 form: a tokeniser or a tool writing it fails.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SPACE = re.compile(r"\s*")  # what str.strip() strips: re's \s and str.isspace() are the same set
# The rollout asks vLLM for text with special tokens kept, so a turn can end in its end-of-turn token;
# formats read line by line or as bare JSON must not see it as part of the last call. This is
# `(?:\s*<\|[A-Za-z0-9_]+\|>)+\s*\Z` read backwards, anchored at the end: the forward regex retries
# from every space and special token of the text (quadratic).
_TRAILING_SPECIAL_REVERSED = re.compile(r"\s*(?:>\|[A-Za-z0-9_]+\|<\s*)+")
_INVALID = object()  # what _decode_json returns for text that is not (usable) JSON


class ToolParser(Protocol):
    parser_type: str
    stop_strings: tuple[str, ...]  # must end a generation turn: added to the sampling stop list

    def parse(self, text: str) -> list[ToolCall]: ...

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str: ...


def _clean_text(text: str) -> str:
    # NUL bytes break tokenisers and sandboxes downstream, and a model can emit them (or "\u0000").
    text = text.replace("\x00", "")
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _clean(value: Any) -> Any:
    """`_clean_text` through a decoded value; raises RecursionError on nesting too deep to walk."""
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(_clean(item) for item in value)
    if isinstance(value, dict):
        return {_clean(key): _clean(item) for key, item in value.items()}
    return value


def _decode_json(text: str) -> Any:
    """The cleaned value of a JSON text, or _INVALID: bad syntax, an integer past Python's 4,300-digit
    int-string limit (ValueError) and nesting past the recursion limit are all just not JSON here."""
    try:
        return _clean(json.loads(text))
    except (ValueError, RecursionError):
        return _INVALID


def _skip_spaces(text: str, position: int) -> int:
    return _SPACE.match(text, position).end()  # type: ignore[union-attr]  # `\s*` always matches


def _strip_trailing_specials(text: str) -> str:
    """`text` without the special tokens it ends in, and the spaces around them."""
    match = _TRAILING_SPECIAL_REVERSED.match(text[::-1])
    return text[: len(text) - match.end()] if match else text


# ------------------------------------------------------------------------------------------- scanning
# Blocks are found with str.find, never with a lazy regex like `<tool_call>(.*?)</tool_call>`: on a
# text with many openers and no closer such a regex searches the rest of the text from every opener,
# which is quadratic (backtracking). Each scan below yields what `re.finditer` of the regex in its
# docstring yields (leftmost, non-overlapping, lazy), in time linear in the text.


class _Finder:
    """`text.find(needle, start)`, remembering each needle's last answer, which is still the answer for
    a later start at or before it. A scan whose starts only grow thus reads the text once per needle."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._last: dict[str, tuple[int, int]] = {}

    def find(self, needle: str, start: int) -> int:
        previous = self._last.get(needle)
        if previous is not None and previous[0] <= start and (previous[1] == -1 or previous[1] >= start):
            return previous[1]
        found = self.text.find(needle, start)
        self._last[needle] = (start, found)
        return found


def _blocks(text: str, opener: str, closer: str, to_end: bool) -> Iterator[str]:
    r"""`opener(.*?)closer` (DOTALL), or `opener(.*?)(?:closer|\Z)` with `to_end`."""
    position = 0
    while (start := text.find(opener, position)) != -1:
        body = start + len(opener)
        end = text.find(closer, body)
        if end == -1:  # no closer after this opener, so none after any later one either
            if to_end:
                yield text[body:]
            return
        yield text[body:end]
        position = end + len(closer)


def _name_after(finder: _Finder, opener: str, start: int) -> tuple[str, int] | None:
    r"""The NAME of `opener NAME>` at `start` (`[^>\n]+>`) and where its `>` ends, or None."""
    begin = start + len(opener)
    close = finder.find(">", begin)
    newline = finder.find("\n", begin)
    if close <= begin or -1 < newline < close:
        return None
    return finder.text[begin:close], close + 1


def _functions(text: str) -> Iterator[tuple[str, str]]:
    r"""`<function=([^>\n]+)>(.*?)</function>` (DOTALL): (name, body) pairs."""
    finder, position = _Finder(text), 0
    while (start := text.find("<function=", position)) != -1:
        named = _name_after(finder, "<function=", start)
        if named is None:
            position = start + 1
            continue
        end = finder.find("</function>", named[1])
        if end == -1:
            return
        yield named[0], text[named[1] : end]
        position = end + len("</function>")


def _parameters(text: str) -> Iterator[tuple[str, str]]:
    r"""`<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)` (DOTALL): (name, value) pairs."""
    finder, position = _Finder(text), 0
    while (start := text.find("<parameter=", position)) != -1:
        named = _name_after(finder, "<parameter=", start)
        if named is None:
            position = start + 1
            continue
        closed = finder.find("</parameter>", named[1])
        following = finder.find("<parameter=", named[1])
        end = len(text) if closed == -1 else closed
        if -1 < following < end:
            end = following
        yield named[0], text[named[1] : end]
        position = end + len("</parameter>") if end == closed else end


# -------------------------------------------------------------------------------------------- parsers


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
    """A call from a decoded, cleaned `{"name": ..., "<argument key>": {...}}`, or None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[key] for key in argument_keys if key in obj), None)
    if args is None:
        args = {}
    if isinstance(args, str):  # some models double-encode the arguments as a JSON string
        args = _decode_json(args)
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], args)


@functools.lru_cache(maxsize=64)
def _tag_opener(names: tuple[str, ...]) -> re.Pattern[str]:
    """Where any `<NAME>` opens; group 1 is the first of `names`, in order, that opens there."""
    return re.compile("<(" + "|".join(re.escape(name) for name in names) + ")>")


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

    @staticmethod
    def _payload_argument(definition: ToolDefinition) -> str | None:
        if definition.required:
            return definition.required[0]
        return next(iter(definition.parameters.get("properties", {})), None)

    def parse(self, text: str) -> list[ToolCall]:
        """`<(?P<name>NAME|...)>(?P<payload>.*?)</(?P=name)>` (DOTALL), as `re.finditer` reads it."""
        text = _clean_text(text)
        names, calls, position = tuple(self._argument), [], 0
        while names and (opened := _tag_opener(names).search(text, position)) is not None:
            start = position = opened.start()
            # Names later in the alternation may open here too (`<a>` and `<a>b>`): the first with a closer wins.
            for name in names[names.index(opened[1]) :]:
                body = start + len(name) + 2
                if not text.startswith(f"<{name}>", start):
                    continue
                end = text.find(f"</{name}>", body)
                if end == -1:  # nor after any later <name>: stop looking for it (each opener would read to the end)
                    names = tuple(other for other in names if other != name)
                    continue
                argument = self._argument[name]
                calls.append(ToolCall(name, {argument: text[body:end]} if argument else {}))
                position = end + len(name) + 2
                break
            position += 1
        return calls

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        # The assistant turn continues after the output, so there are no role tokens to write.
        return "<output>\n" + _clean_text(text) + "\n</output>\n"


class HermesParser:
    """Hermes 2 Pro: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (ChatML)."""

    parser_type = "vllm_hermes"
    stop_strings: tuple[str, ...] = ()

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        del definitions  # arguments arrive as typed JSON

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for block in _blocks(_clean_text(text), "<tool_call>", "</tool_call>", to_end=False):
            call = _json_call(_decode_json(block), ("arguments",))  # a block that is not JSON is skipped
            if call is not None:
                calls.append(call)
        return calls

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        text = _clean_text(text)
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
        body = _strip_trailing_specials(_clean_text(text)).strip()
        body = body.removeprefix(self._python_tag).lstrip()
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        position = 0
        # A turn is a call only if it *is* JSON; prose that merely contains braces is an answer.
        while position < len(body) and body[position] == "{":
            try:
                obj, position = decoder.raw_decode(body, position)
                obj = _clean(obj)
            except (ValueError, RecursionError):  # see _decode_json
                break  # no way to resynchronise inside broken JSON: keep the calls before it
            call = _json_call(obj, ("parameters", "arguments"))
            if call is not None:
                calls.append(call)
            position = _skip_spaces(body, position)
            if not body.startswith(";", position):
                break
            position = _skip_spaces(body, position + 1)
        return calls

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        header = "ipython" if role == "tool" else "user"
        return (
            ("" if turn_closed else "<|eot_id|>")
            + f"<|start_header_id|>{header}<|end_header_id|>\n\n"
            + _clean_text(text)
            + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )


class Olmo3Parser:
    """Olmo 3 pythonic: `name(arg=value)` one per line, optionally inside `<function_calls>`."""

    parser_type = "vllm_olmo3"
    stop_strings: tuple[str, ...] = ()
    # Models trained on JSON schemas sometimes write JSON literals inside Python calls.
    _json_names: ClassVar[dict[str, Any]] = {"true": True, "false": False, "null": None}

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        del definitions  # the rollout, not the parser, decides which names are callable

    def parse(self, text: str) -> list[ToolCall]:
        text = _strip_trailing_specials(_clean_text(text))
        blocks = list(_blocks(text, "<function_calls>", "</function_calls>", to_end=True)) or [text]
        lines = [line.strip() for block in blocks for line in block.splitlines()]
        # A policy stuck in a loop writes one line thousands of times: each is parsed once (ToolCall is frozen).
        read: dict[str, ToolCall | None] = {}
        for line in lines:
            if line not in read:
                read[line] = self._call(line) if self._may_call(line) else None
        return [call for line in lines if (call := read[line]) is not None]

    @staticmethod
    def _may_call(line: str) -> bool:
        """False for a line that cannot parse as `name(...)`, so prose skips `ast.parse` (~10 us a line):
        a call starts with its name (a letter, `_`, or a non-ASCII character Python may read as a letter)
        or `(`, and ends with `)` unless a comment follows."""
        first = line[:1]
        starts = first == "(" or first == "_" or (first.isascii() and first.isalpha()) or first > "\x7f"
        return starts and (line.endswith(")") or "#" in line)

    def _call(self, line: str) -> ToolCall | None:
        try:
            node = ast.parse(line, mode="eval").body
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
                return None
            args = {keyword.arg: self._literal(keyword.value) for keyword in node.keywords}
            return ToolCall(node.func.id, _clean(args))
        # MemoryError: "parser stack overflowed" (e.g. 100,000 unary minus signs), not a real shortage.
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return None

    def _literal(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name) and node.id in self._json_names:
            return self._json_names[node.id]
        return ast.literal_eval(node)

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        text = _clean_text(text)
        if role == "user":
            return _chatml_prefix(turn_closed) + _chatml_user(text)
        return _chatml_prefix(turn_closed) + "<|im_start|>environment\n" + text + "<|im_end|>\n<|im_start|>assistant\n"


class Qwen3XmlParser:
    """Qwen3 XML: `<tool_call><function=N><parameter=P>value</parameter></function></tool_call>`."""

    parser_type = "vllm_qwen3_xml"
    stop_strings: tuple[str, ...] = ()

    def __init__(self, definitions: Sequence[ToolDefinition]) -> None:
        # Every value is written as text; only the schema says which ones are really numbers or JSON.
        self._definitions = {d.name: d for d in definitions}

    def parse(self, text: str) -> list[ToolCall]:
        # An unclosed final <tool_call> still counts if its function is complete (the model may end the
        # turn instead of writing </tool_call>); a missing </parameter> ends at the next parameter.
        calls = []
        for block in _blocks(_clean_text(text), "<tool_call>", "</tool_call>", to_end=True):
            for raw_name, body in _functions(block):
                name = raw_name.strip()
                if not name:
                    continue
                # A repeated parameter keeps its first place and its last value; each is converted once.
                raw = {argument.strip(): value for argument, value in _parameters(body)}
                calls.append(ToolCall(name, {key: self._value(name, key, value) for key, value in raw.items()}))
        return calls

    def _value(self, tool: str, argument: str, raw: str) -> Any:
        value = raw.removeprefix("\n").removesuffix("\n")
        if _schema_types(self._definitions.get(tool), argument) & _SCHEMA_CONVERTED:
            decoded = _decode_json(value)
            if decoded is not _INVALID:
                return decoded
            # otherwise leave it to coerce_args / the tool to report the bad value
        return value

    def format_observation(self, text: str, role: Role, turn_closed: bool) -> str:
        # Qwen3's own template answers tools in a user turn, and the model thinks before replying.
        return (
            _chatml_prefix(turn_closed)
            + "<|im_start|>user\n<tool_response>\n"
            + _clean_text(text)
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
        # str() of an int past 4,300 digits raises ValueError; of a deeply nested list, RecursionError.
        except (ValueError, TypeError, OverflowError, RecursionError):
            raise ValueError(
                f"argument {name!r} of tool {definition.name!r}: expected {expected}, got {_shown(value)}"
            ) from None
    return coerced


def _shown(value: Any, limit: int = 200) -> str:
    """`repr(value)` for a message the model reads: at most `limit` characters, and never raising."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit] + "..."
