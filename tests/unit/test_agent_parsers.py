"""Tests for the tool-call parsers, their observation templates, the factory and `coerce_args`."""

import json
import random
import re

import pytest

from open_instruct.agents.base import ToolCall, ToolDefinition, string_tool
from open_instruct.agents.parsers import (
    PARSER_ALIASES,
    PARSER_TYPES,
    UNSUPPORTED_PARSERS,
    Olmo3Parser,
    _blocks,
    _functions,
    _parameters,
    _strip_trailing_specials,
    coerce_args,
    make_parser,
)

CODE = string_tool("code", "Run Python.", "code", "the program")
SEARCH = string_tool("search", "Search the web.", "query", "the query")
GUESS = ToolDefinition(
    "guess",
    "Guess the number.",
    {
        "type": "object",
        "properties": {
            "number": {"type": "integer"},
            "confident": {"type": "boolean"},
            "notes": {"type": "string"},
            "weights": {"type": "array"},
            "scale": {"type": "number"},
        },
        "required": ["number"],
    },
)


def legacy(*definitions: ToolDefinition):
    return make_parser("legacy", definitions or (CODE, SEARCH))


# --- legacy --------------------------------------------------------------------------------------


def test_legacy_calls_in_text_order_with_repeats():
    text = "First <search>rl papers</search> then <code>print(1)</code> and <search>ppo</search>."
    assert legacy().parse(text) == [
        ToolCall("search", {"query": "rl papers"}),
        ToolCall("code", {"code": "print(1)"}),
        ToolCall("search", {"query": "ppo"}),
    ]


def test_legacy_multiline_payload_is_kept_verbatim():
    text = "<code>\nfor i in range(3):\n    print(i)\n</code>"
    assert legacy().parse(text) == [ToolCall("code", {"code": "\nfor i in range(3):\n    print(i)\n"})]


def test_legacy_payload_with_angle_brackets():
    text = '<code>if a < b and c > d:\n    print("<b>x</b>")</code>'
    assert legacy().parse(text) == [ToolCall("code", {"code": 'if a < b and c > d:\n    print("<b>x</b>")'})]


def test_legacy_partial_tags_are_not_calls():
    parser = legacy()
    assert parser.parse("<code>print(1)") == []
    assert parser.parse("print(1)</code>") == []
    assert parser.parse("<code print(1)</code>") == []
    # An unterminated tag does not swallow a later complete call.
    assert parser.parse("<code>oops <search>q</search>") == [ToolCall("search", {"query": "q"})]


def test_legacy_empty_payload_is_a_call():
    assert legacy().parse("<search></search>") == [ToolCall("search", {"query": ""})]


def test_legacy_regex_characters_in_names():
    odd = string_tool("c++.run", "Run C++.", "source", "the program")
    star = string_tool("a*b", "Star.", "x", "x")
    parser = legacy(odd, star)
    assert parser.parse("<c++.run>int main(){}</c++.run> <a*b>1</a*b> <cc+.run>no</cc+.run> <aab>no</aab>") == [
        ToolCall("c++.run", {"source": "int main(){}"}),
        ToolCall("a*b", {"x": "1"}),
    ]
    assert parser.stop_strings == ("</c++.run>", "</a*b>")


def test_legacy_strips_nul_bytes():
    assert legacy().parse("<code>print(\x001)</code>") == [ToolCall("code", {"code": "print(1)"})]


def test_legacy_payload_fills_first_required_then_first_property():
    required_second = ToolDefinition(
        "fetch",
        "Fetch.",
        {
            "type": "object",
            "properties": {"timeout": {"type": "integer"}, "url": {"type": "string"}},
            "required": ["url"],
        },
    )
    no_required = ToolDefinition("note", "Note.", {"type": "object", "properties": {"text": {"type": "string"}}})
    no_parameters = ToolDefinition("submit", "Submit.", {"type": "object", "properties": {}})
    parser = legacy(required_second, no_required, no_parameters)
    assert parser.parse("<fetch>https://a.b</fetch><note>hi</note><submit>now</submit>") == [
        ToolCall("fetch", {"url": "https://a.b"}),
        ToolCall("note", {"text": "hi"}),
        ToolCall("submit", {}),
    ]


def test_legacy_stop_strings_and_observation():
    parser = legacy()
    assert parser.parser_type == "legacy"
    assert parser.stop_strings == ("</code>", "</search>")
    expected = "<output>\n42\n</output>\n"
    assert parser.format_observation("42", "tool", True) == expected
    assert parser.format_observation("42", "user", False) == expected


def test_legacy_without_definitions_finds_nothing():
    parser = make_parser("legacy", [])
    assert parser.stop_strings == ()
    assert parser.parse("<code>x</code>") == []


def test_legacy_rejects_duplicate_names():
    with pytest.raises(ValueError, match=r"duplicate tool name 'code'"):
        make_parser("legacy", [CODE, SEARCH, string_tool("code", "Other.", "src", "src")])


def test_duplicate_names_are_fine_outside_legacy():
    make_parser("vllm_hermes", [CODE, CODE])


# --- vllm_hermes ---------------------------------------------------------------------------------


def test_hermes_single_call():
    text = (
        "<think>Need code.</think>\n<tool_call>\n"
        '{"name": "code", "arguments": {"code": "print(2**10)"}}\n</tool_call><|im_end|>'
    )
    assert make_parser("vllm_hermes", [CODE]).parse(text) == [ToolCall("code", {"code": "print(2**10)"})]


def test_hermes_two_calls_and_string_arguments():
    text = (
        '<tool_call>{"name": "search", "arguments": {"query": "ppo"}}</tool_call>\n'
        '<tool_call>{"name": "guess", "arguments": "{\\"number\\": 7}"}</tool_call>'
    )
    assert make_parser("vllm_hermes", [SEARCH, GUESS]).parse(text) == [
        ToolCall("search", {"query": "ppo"}),
        ToolCall("guess", {"number": 7}),
    ]


def test_hermes_skips_bad_blocks():
    text = (
        '<tool_call>{"name": "code", "arguments": {"code": "x"</tool_call>\n'  # bad JSON
        '<tool_call>{"arguments": {"code": "x"}}</tool_call>\n'  # no name
        '<tool_call>{"name": "code", "arguments": "not json"}</tool_call>\n'  # arguments not an object
        '<tool_call>{"name": "code", "arguments": [1]}</tool_call>\n'
        '<tool_call>{"name": "code"}</tool_call>\n'  # no arguments: an empty call
        '<tool_call>{"name": "code", "arguments": {"code": "ok"}}'  # never closed
    )
    assert make_parser("vllm_hermes", [CODE]).parse(text) == [ToolCall("code", {})]


def test_hermes_strips_nul_bytes():
    text = '<tool_call>{"name": "code", "arguments": {"code": "a\\u0000b", "raw": "c\x00d"}}</tool_call>'
    assert make_parser("vllm_hermes", [CODE]).parse(text) == [ToolCall("code", {"code": "ab", "raw": "cd"})]


def test_hermes_observations():
    parser = make_parser("vllm_hermes", [CODE])
    assert parser.stop_strings == ()
    assert parser.format_observation("1024", "tool", True) == (
        "\n<|im_start|>tool\n<tool_response>\n1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert parser.format_observation("1024", "tool", False) == (
        "<|im_end|>\n<|im_start|>tool\n<tool_response>\n1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert parser.format_observation("G Y X X G", "user", True) == (
        "\n<|im_start|>user\nG Y X X G<|im_end|>\n<|im_start|>assistant\n"
    )
    assert parser.format_observation("G Y X X G", "user", False) == (
        "<|im_end|>\n<|im_start|>user\nG Y X X G<|im_end|>\n<|im_start|>assistant\n"
    )


# --- vllm_llama3_json ----------------------------------------------------------------------------


def test_llama3_single_call_with_python_tag_and_eot():
    text = '<|python_tag|>{"name": "search", "parameters": {"query": "weather in Paris"}}<|eom_id|>'
    assert make_parser("vllm_llama3_json", [SEARCH]).parse(text) == [ToolCall("search", {"query": "weather in Paris"})]


def test_llama3_two_calls_separated_by_semicolon():
    text = (
        ' {"name": "search", "parameters": {"query": "a;b"}}; {"name": "guess", "arguments": {"number": 3}}<|eot_id|>'
    )
    assert make_parser("vllm_llama3_json", [SEARCH, GUESS]).parse(text) == [
        ToolCall("search", {"query": "a;b"}),
        ToolCall("guess", {"number": 3}),
    ]


def test_llama3_non_json_and_bad_json():
    parser = make_parser("vllm_llama3_json", [SEARCH])
    assert parser.parse('The answer is {"name": "search"}.') == []
    assert parser.parse("The answer is 42.<|eot_id|>") == []
    assert parser.parse('{"name": "search", "parameters": {"query": }') == []
    # A broken object ends the list; the calls before it stand.
    assert parser.parse('{"name": "search", "parameters": {"query": "x"}}; {"name": oops}') == [
        ToolCall("search", {"query": "x"})
    ]
    # An object without a name is skipped, the next one still read.
    assert parser.parse('{"parameters": {}}; {"name": "search", "parameters": {"query": "y"}}') == [
        ToolCall("search", {"query": "y"})
    ]


def test_llama3_observations():
    parser = make_parser("vllm_llama3_json", [SEARCH])
    assert parser.stop_strings == ()
    assert parser.format_observation("Sunny", "tool", True) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\nSunny<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert parser.format_observation("Sunny", "tool", False) == (
        "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"
        "Sunny<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert parser.format_observation("Try again", "user", True) == (
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Try again<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert parser.format_observation("Try again", "user", False) == (
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Try again<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


# --- vllm_olmo3 ----------------------------------------------------------------------------------


def test_olmo3_single_call_in_function_calls_block():
    text = 'I will search.\n<function_calls>\nsearch(query="olmo 3")\n</function_calls><|im_end|>'
    assert make_parser("vllm_olmo3", [SEARCH]).parse(text) == [ToolCall("search", {"query": "olmo 3"})]


def test_olmo3_two_calls_one_per_line_with_literals():
    text = "<function_calls>\nguess(number=7, confident=true, weights=[0.5, 1])\nsubmit()\n</function_calls>"
    assert make_parser("vllm_olmo3", [GUESS]).parse(text) == [
        ToolCall("guess", {"number": 7, "confident": True, "weights": [0.5, 1]}),
        ToolCall("submit", {}),
    ]


def test_olmo3_without_wrapper_reads_every_line_and_skips_invalid_ones():
    text = (
        "Let me think.\n"
        "search(query='a')\n"
        "search('positional')\n"  # positional arguments are not the format
        "search(query=some_variable)\n"  # not a literal
        "search(**opts)\n"
        "obj.method(x=1)\n"
        "search(query='unclosed\n"
        "code(code='print(1)')<|im_end|>"
    )
    assert make_parser("vllm_olmo3", [SEARCH, CODE]).parse(text) == [
        ToolCall("search", {"query": "a"}),
        ToolCall("code", {"code": "print(1)"}),
    ]


def test_olmo3_ignores_text_outside_function_calls_block():
    text = 'Maybe search(query="draft")?\n<function_calls>\nsearch(query="final")\n</function_calls>'
    assert make_parser("vllm_olmo3", [SEARCH]).parse(text) == [ToolCall("search", {"query": "final"})]


def test_olmo3_observations():
    parser = make_parser("vllm_olmo3", [SEARCH])
    assert parser.stop_strings == ()
    assert parser.format_observation("3 results", "tool", True) == (
        "\n<|im_start|>environment\n3 results<|im_end|>\n<|im_start|>assistant\n"
    )
    assert parser.format_observation("3 results", "tool", False) == (
        "<|im_end|>\n<|im_start|>environment\n3 results<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        parser.format_observation("Again", "user", True)
        == "\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert parser.format_observation("Again", "user", False) == (
        "<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    )


# --- vllm_qwen3_xml ------------------------------------------------------------------------------


def test_qwen3_xml_single_call_keeps_inner_newlines():
    text = (
        "<think>\nrun it\n</think>\n\n<tool_call>\n<function=code>\n<parameter=code>\n"
        "for i in range(2):\n    print(i)\n\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert make_parser("vllm_qwen3_xml", [CODE]).parse(text) == [
        ToolCall("code", {"code": "for i in range(2):\n    print(i)\n"})
    ]


def test_qwen3_xml_two_calls_with_schema_types():
    text = (
        "<tool_call>\n<function=guess>\n<parameter=number>\n42\n</parameter>\n"
        "<parameter=confident>\ntrue\n</parameter>\n<parameter=notes>\n17\n</parameter>\n"
        "<parameter=weights>\n[1, 2]\n</parameter>\n<parameter=scale>\nlots\n</parameter>\n"
        "<parameter=extra>\n5\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=search>\n<parameter=query>\nqwen\n</parameter>\n</function>\n</tool_call>"
    )
    assert make_parser("vllm_qwen3_xml", [GUESS, SEARCH]).parse(text) == [
        # strings stay strings, undeclared stays text, a value that is not JSON is kept as written
        ToolCall(
            "guess", {"number": 42, "confident": True, "notes": "17", "weights": [1, 2], "scale": "lots", "extra": "5"}
        ),
        ToolCall("search", {"query": "qwen"}),
    ]


def test_qwen3_xml_skips_malformed_calls():
    text = (
        "<tool_call>\n<function=search>\n<parameter=query>\ncut off"  # no </function>
        "</tool_call>\n<tool_call>\n<function=>\n</function>\n</tool_call>\n"  # empty name
        "<function=search>\n<parameter=query>\nbare\n</parameter>\n</function>\n"  # outside <tool_call>
        "<tool_call>\n<function=search>\n<parameter=query>\nok\n</function>\n</tool_call>"  # no </parameter>
    )
    assert make_parser("vllm_qwen3_xml", [SEARCH]).parse(text) == [ToolCall("search", {"query": "ok"})]


def test_qwen3_xml_unclosed_tool_call_with_complete_function():
    text = "<tool_call>\n<function=search>\n<parameter=query>\nq\x00\n</parameter>\n</function>\n<|im_end|>"
    assert make_parser("vllm_qwen3_xml", [SEARCH]).parse(text) == [ToolCall("search", {"query": "q"})]


@pytest.mark.parametrize("role", ["tool", "user"])
def test_qwen3_xml_observations_are_user_turns(role):
    parser = make_parser("vllm_qwen3_xml", [SEARCH])
    assert parser.stop_strings == ()
    body = "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert parser.format_observation("ok", role, True) == "\n" + body
    assert parser.format_observation("ok", role, False) == "<|im_end|>\n" + body


# --- factory -------------------------------------------------------------------------------------


def test_every_parser_type_builds_and_reports_its_type():
    assert PARSER_TYPES == ("legacy", "vllm_hermes", "vllm_llama3_json", "vllm_olmo3", "vllm_qwen3_xml")
    for parser_type in PARSER_TYPES:
        assert make_parser(parser_type, [CODE]).parser_type == parser_type


def test_alias_resolves_to_qwen3_xml():
    assert PARSER_ALIASES == {"vllm_qwen3xml": "vllm_qwen3_xml"}
    assert make_parser("vllm_qwen3xml", [CODE]).parser_type == "vllm_qwen3_xml"


def test_unknown_parser_type():
    with pytest.raises(ValueError) as error:
        make_parser("hermes", [CODE])
    assert str(error.value) == (
        "unknown --tool_parser_type 'hermes' (known: legacy, vllm_hermes, vllm_llama3_json, vllm_olmo3, vllm_qwen3_xml)"
    )


def test_unsupported_parser_type():
    with pytest.raises(ValueError) as error:
        make_parser("dr_tulu", [CODE])
    assert str(error.value) == f"--tool_parser_type dr_tulu is not supported yet: {UNSUPPORTED_PARSERS['dr_tulu']}"
    assert "dr_agent MCP backend" in UNSUPPORTED_PARSERS["dr_tulu"]


# --- coerce_args ---------------------------------------------------------------------------------


def test_coerce_args_casts_declared_types_and_passes_unknown_through():
    args = {"number": " 12 ", "confident": "TRUE", "notes": 5, "scale": "0.5", "weights": "[1]", "other": "x"}
    assert coerce_args(GUESS, args) == {
        "number": 12,
        "confident": True,
        "notes": "5",
        "scale": 0.5,
        "weights": "[1]",
        "other": "x",
    }
    assert coerce_args(GUESS, {"number": 3.0, "confident": False, "scale": 2}) == {
        "number": 3,
        "confident": False,
        "scale": 2,
    }
    assert coerce_args(GUESS, {"confident": "false"}) == {"confident": False}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"number": "abc"}, "argument 'number' of tool 'guess': expected integer, got 'abc'"),
        ({"number": 2.5}, "argument 'number' of tool 'guess': expected integer, got 2.5"),
        ({"number": True}, "argument 'number' of tool 'guess': expected integer, got True"),
        ({"number": None}, "argument 'number' of tool 'guess': expected integer, got None"),
        ({"confident": "yes"}, "argument 'confident' of tool 'guess': expected boolean, got 'yes'"),
        ({"confident": 1}, "argument 'confident' of tool 'guess': expected boolean, got 1"),
        ({"scale": "big"}, "argument 'scale' of tool 'guess': expected number, got 'big'"),
        ({"scale": False}, "argument 'scale' of tool 'guess': expected number, got False"),
    ],
)
def test_coerce_args_rejects_bad_values(args, message):
    with pytest.raises(ValueError) as error:
        coerce_args(GUESS, args)
    assert str(error.value) == message


def test_coerce_args_shows_values_it_cannot_print_or_that_are_long():
    huge = int("9" * 4000) ** 2  # past the 4,300 digits str() and repr() accept
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    for value, shown in ((huge, "<int too large to show>"), (deep, "<list too large to show>")):
        with pytest.raises(ValueError) as error:
            coerce_args(GUESS, {"notes": value})
        assert str(error.value) == f"argument 'notes' of tool 'guess': expected string, got {shown}"
    with pytest.raises(ValueError) as error:
        coerce_args(GUESS, {"number": "9" * 10_000})
    assert str(error.value) == "argument 'number' of tool 'guess': expected integer, got '" + "9" * 199 + "..."


# --- hostile text: kept as "no call" where malformed JSON is, never raised --------------------------


HUGE_OR_DEEP = {
    "huge int": "9" * 5000,
    "deep list": "[" * 5000 + "]" * 5000,
    "deep object": '{"a":' * 3000 + "}" * 3000,
}


@pytest.mark.parametrize("value", HUGE_OR_DEEP.values(), ids=HUGE_OR_DEEP.keys())
def test_json_a_parser_cannot_read_is_malformed_json(value):
    args = f'{{"number": {value}}}'
    hermes = make_parser("vllm_hermes", [GUESS])
    # a block that is not JSON is skipped, and so are arguments (double-encoded) that are not
    assert hermes.parse(f'<tool_call>{{"name": "guess", "arguments": {args}}}</tool_call>') == []
    assert hermes.parse(f'<tool_call>{{"name": "guess", "arguments": {json.dumps(args)}}}</tool_call>') == []
    # broken JSON ends a llama3 list; the calls before it stand
    ok = '{"name": "guess", "parameters": {"number": 1}}'
    llama = make_parser("vllm_llama3_json", [GUESS])
    assert llama.parse(f'{ok}; {{"name": "guess", "parameters": {args}}}; {ok}') == [ToolCall("guess", {"number": 1})]
    # qwen3 keeps a typed value it cannot decode as text, for coerce_args to report
    qwen = make_parser("vllm_qwen3_xml", [GUESS])
    text = f"<tool_call>\n<function=guess>\n<parameter=number>\n{value}\n</parameter>\n</function>\n</tool_call>"
    assert qwen.parse(text) == [ToolCall("guess", {"number": value})]
    with pytest.raises(ValueError, match="argument 'number' of tool 'guess': expected integer, got "):
        coerce_args(GUESS, {"number": value})


def test_olmo3_python_it_cannot_read_is_no_call():
    parser = make_parser("vllm_olmo3", [GUESS])
    for value in ("-" * 100_000 + "1", "not " * 50_000 + "1", "9" * 5000, "[" * 300 + "]" * 300, "1+" * 30_000 + "1"):
        assert parser.parse(f"guess(number={value})\nguess(number=1)") == [ToolCall("guess", {"number": 1})]
    [call] = parser.parse("guess(number=0x" + "f" * 5000 + ")")  # a valid literal past 4,300 decimal digits
    assert coerce_args(GUESS, call.args) == call.args
    with pytest.raises(ValueError, match="expected string, got <int too large to show>"):
        coerce_args(GUESS, {"notes": call.args["number"]})


@pytest.mark.parametrize("parser_type", PARSER_TYPES)
def test_lone_surrogates_and_nul_become_text_a_tokeniser_reads(parser_type):
    parser = make_parser(parser_type, [CODE])
    observation = parser.format_observation("a\x00b\ud800c", "tool", True)
    assert "ab\ufffdc" in observation and "\x00" not in observation
    observation.encode("utf-8")


def test_lone_surrogates_in_calls_become_replacement_characters():
    assert legacy().parse("<code>a\ud800\x00</code>") == [ToolCall("code", {"code": "a\ufffd"})]
    text = '<tool_call>{"name": "code", "arguments": {"code": "a\\ud800", "\\udfff": ["\\ud800"]}}</tool_call>'
    assert make_parser("vllm_hermes", [CODE]).parse(text) == [
        ToolCall("code", {"code": "a\ufffd", "\ufffd": ["\ufffd"]})
    ]
    assert make_parser("vllm_olmo3", [CODE]).parse("code(code=('\\ud800',))") == [
        ToolCall("code", {"code": ("\ufffd",)})
    ]


# --- scanning: the str.find scans read what the regexes they replaced read ---------------------------
# The parsers' old lazy regexes, kept here only as the oracle: exact, but quadratic over many unclosed
# openers, so they are compared on many short texts made of the formats' own pieces.

OLD_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OLD_QWEN3_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
OLD_OLMO3_BLOCK = re.compile(r"<function_calls>(.*?)(?:</function_calls>|\Z)", re.DOTALL)
OLD_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
OLD_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
OLD_TRAILING_SPECIAL = re.compile(r"(?:\s*<\|[A-Za-z0-9_]+\|>)+\s*\Z")
PIECES = (
    "<tool_call>",
    "</tool_call>",
    "<tool_call",
    "/tool_call>",
    "<function_calls>",
    "</function_calls>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|",
    "|>",
    "<|a b|>",
    "<",
    ">",
    "/",
    "=",
    "|",
    "\n",
    " ",
    "\t",
    "\u3000",
    "a",
    "b_1",
    "x y",
)


def texts(pieces: tuple[str, ...], count: int = 4000, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(pieces) for _ in range(rng.randint(0, 20)))


def test_block_scans_match_the_lazy_regexes():
    for text in texts(PIECES):
        assert list(_blocks(text, "<tool_call>", "</tool_call>", False)) == OLD_HERMES_BLOCK.findall(text), text
        assert list(_blocks(text, "<tool_call>", "</tool_call>", True)) == OLD_QWEN3_BLOCK.findall(text), text
        olmo3 = list(_blocks(text, "<function_calls>", "</function_calls>", True))
        assert olmo3 == OLD_OLMO3_BLOCK.findall(text), text
        assert list(_functions(text)) == OLD_FUNCTION.findall(text), text
        assert list(_parameters(text)) == OLD_PARAMETER.findall(text), text
        assert _strip_trailing_specials(text) == OLD_TRAILING_SPECIAL.sub("", text), text


def test_legacy_scan_matches_the_lazy_regex():
    # `a>b` opens where `a` does: the alternation's order decides, and a tag without a closer yields.
    names = ("a", "a>b", "ab", "b+", "")
    parser = legacy(*(string_tool(name, "t", "x", "x") for name in names))
    old = re.compile(rf"<(?P<name>{'|'.join(re.escape(n) for n in names)})>(?P<payload>.*?)</(?P=name)>", re.DOTALL)
    pieces = ("<a>", "</a>", "<a>b>", "</a>b>", "<ab>", "</ab>", "<b+>", "</b+>", "<>", "</>", "<", ">", "/", "a", "b")
    for text in texts(pieces):
        expected = [ToolCall(m["name"], {"x": m["payload"]}) for m in old.finditer(text)]
        assert parser.parse(text) == expected, text


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # ast.parse on '\\.'
def test_olmo3_skips_only_lines_that_cannot_be_calls():
    parser = make_parser("vllm_olmo3", [CODE])
    for line in ("(f)(x=1)", "f(x=1)  # note", "_f()", "\uff46(x=1)", "f (x=1)"):
        assert Olmo3Parser._may_call(line) and parser.parse(line), line
    pieces = ("f", "(", ")", "x=1", "#", " ", "_", "\u00e9", "\uff3f", "1", "'", '"', ",", "=", "[", "]", "\\", ".")
    for line in texts(pieces, seed=1):
        line = line.strip()
        assert Olmo3Parser._may_call(line) or parser._call(line) is None, line
