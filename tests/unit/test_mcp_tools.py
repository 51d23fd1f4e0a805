"""generic_mcp against a real MCP server (tests/helpers/mcp_server.py, the same `mcp` SDK) in a subprocess.

One --tools entry expanding into the server's tools, calls through the Toolbox, a tool error, a slow call
timing out, the server dying mid-call and mid-rollout (an error observation, then a new server on the same
port is reached again), SSE and stdio transports, config errors. The real multi-turn path on a vLLM engine,
with the model forced to write the call, is in tests/integration/test_agent_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers.mcp_server import GENEROUS_S, McpServerProcess, generic_mcp_entry, stdio_config
from helpers.processes import free_port

from open_instruct.agents.base import ToolCall
from open_instruct.agents.mcp_tools import MCPServerError, MCPTool, expand_specs, mcp_config
from open_instruct.agents.rollout import run_rollout
from open_instruct.agents.settings import AgentSettings, ToolSpec, tool_specs
from open_instruct.agents.tools import Toolbox
from open_instruct.config.core import ConfigError, parse_config
from open_instruct.config.tools import ToolsConfig
from open_instruct.grpo_fast import checked_config
from open_instruct.messages import AgentRequest, Completion, VersionSpan


@pytest.fixture(scope="module")
def server():
    with McpServerProcess() as running:
        yield running


def call(tool, **args):
    """One call and the tool's close, on one event loop (a tool's session belongs to the loop that opened it)."""

    async def once():
        try:
            return await tool.call(args)
        finally:
            await tool.close()

    return asyncio.run(once())


def test_one_entry_becomes_one_tool_per_server_tool_with_the_servers_names_and_schemas(server):
    specs = tool_specs(generic_mcp_entry(server.url, timeout=GENEROUS_S))
    assert [s.call_name for s in specs] == ["echo", "add", "slow", "fail", "picture"]
    assert {s.kind for s in specs} == {"generic_mcp"}
    box = Toolbox(AgentSettings(tool_specs=specs))
    add = {d.name: d for d in box.definitions()}["add"]
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer" and add.required == ("a", "b")
    # A row's `tools` column filters the expanded tools like any others.
    assert [d.name for d in box.definitions(("echo", "fail"))] == ["echo", "fail"]
    # Parsing the flags asks no server: unresolved, the entry is one spec.
    assert [s.call_name for s in tool_specs(generic_mcp_entry(server.url), resolve=False)] == ["generic_mcp"]


def test_tool_name_makes_one_tool_under_its_call_name_with_the_servers_schema(server):
    t = ToolsConfig(
        tools=["generic_mcp"],
        tool_call_names=["say"],
        tool_configs=[json.dumps({"server_url": server.url, "tool_name": "echo", "timeout": GENEROUS_S})],
    )
    [spec] = tool_specs(t)
    tool = MCPTool(spec.call_name, spec.config)
    assert tool.definition.name == "say" and tool.definition.required == ("text",)
    assert call(tool, text="hi").result == "echo: hi"


def test_calls_coerce_arguments_and_turn_tool_errors_and_other_content_into_text(server):
    async def scenario():
        box = Toolbox(AgentSettings(tool_specs=tool_specs(generic_mcp_entry(server.url, timeout=GENEROUS_S))))
        try:
            return [
                await box.call("add", {"a": "2", "b": 3}),  # a number written as a string, as models do
                await box.call("fail", {"text": "no"}),
                await box.call("picture", {}),
                await box.call("add", {"a": "two", "b": 1}),
            ]
        finally:
            await box.close()

    added, failed, picture, bad = asyncio.run(scenario())
    assert (added.result, added.ok) == ("5", True)
    assert not failed.ok and not failed.timed_out and "fail" in failed.result and failed.error == failed.result
    assert (picture.result, picture.ok) == ("[image content not shown]", True)
    assert not bad.ok and bad.result.startswith("Bad arguments: argument 'a' of tool 'add': expected integer")


def test_a_tool_the_server_does_not_have_is_an_error_observation_and_the_session_stays(server):
    config = {"server_url": server.url, "tool_name": "weather", "tool_info": {"description": "gone"}}
    tool = MCPTool("weather", {**config, "timeout": GENEROUS_S})

    async def scenario():
        try:
            return await tool.call({}), tool._connection
        finally:
            await tool.close()

    result, session = asyncio.run(scenario())
    assert not result.ok and not result.timed_out and "weather" in result.result and session is not None


def test_a_slow_call_times_out_and_the_session_serves_the_next_call(server):
    [spec] = tool_specs(generic_mcp_entry(server.url, tool_name="slow", timeout=5))

    async def scenario():
        tool = MCPTool(spec.call_name, spec.config)
        try:
            warm = await tool.call({"seconds": 0})
            session = tool._connection
            started = time.monotonic()
            late = await tool.call({"seconds": 600})
            late_s = time.monotonic() - started
            after = await tool.call({"seconds": 0})
            return warm, late, late_s, after, tool._connection is session
        finally:
            await tool.close()

    warm, late, late_s, after, same_session = asyncio.run(scenario())
    assert warm.ok and after.ok and after.result == "slept 0"
    assert late.timed_out and late.result == "Timeout after 5 seconds" and late_s < 600
    assert same_session  # a timeout is the tool's slowness, not a broken connection


def test_a_server_killed_during_a_call_gives_an_error_observation_at_once(tmp_path):
    marker = tmp_path / "started"
    with McpServerProcess() as server:
        [spec] = tool_specs(generic_mcp_entry(server.url, tool_name="slow", timeout=GENEROUS_S))

        async def scenario():
            tool = MCPTool(spec.call_name, spec.config)
            try:
                pending = asyncio.create_task(tool.call({"seconds": 600, "marker": str(marker)}))
                deadline = time.monotonic() + GENEROUS_S
                while not marker.exists():  # the call reached the server
                    assert time.monotonic() < deadline and not pending.done()
                    await asyncio.sleep(0.02)
                server.kill()
                return await pending
            finally:
                await tool.close()

        result = asyncio.run(scenario())
    assert not result.ok and not result.timed_out
    assert "was lost during the call" in result.result and server.url in result.result


def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]


class KillingEngine:
    """A scripted engine: every turn calls echo; before answering turn 1 it kills the server, before turn 2 it
    starts a new one on the same port."""

    def __init__(self, server: McpServerProcess):
        self.server = server

    async def __call__(self, context, max_tokens, stops, index):
        if index == 1:
            self.server.kill()
        if index == 2:
            self.server.start()
        text = f"<echo>turn {index}</echo>" if index < 3 else "done"
        ids = tuple(tokenize(text))
        return Completion(
            prompt_id="p",
            sample_index=0,
            prompt_token_ids=tuple(context),
            response_token_ids=ids,
            behaviour_logprobs=(-0.5,) * len(ids),
            finish_reason="stop",
            version_spans=(VersionSpan(0, 0, len(ids)),),
            admitted_version=0,
            engine_id=0,
            response_text=text,
        )


def test_the_server_dying_mid_rollout_is_an_error_observation_and_a_new_server_is_reached_again():
    server = McpServerProcess().start()
    try:
        specs = tool_specs(generic_mcp_entry(server.url, timeout=GENEROUS_S, max_retries=1))
        box = Toolbox(AgentSettings(tool_specs=specs, max_model_len=4000))

        async def scenario():
            try:
                return await run_rollout((1, 2, 3), AgentRequest(), box, KillingEngine(server), tokenize, 3000)
            finally:
                await box.close()

        out, trace = asyncio.run(scenario())
    finally:
        server.kill()
    assert [c.ok for c in trace.calls] == [True, False, True] and trace.turns == 4
    observations = ["".join(map(chr, out.response_ids[s:e])) for s, e in trace.observation_spans]
    assert "echo: turn 0" in observations[0]
    assert server.url in observations[1] and "echo: " not in observations[1]
    assert "echo: turn 2" in observations[2]


def test_sse_and_stdio_transports_list_and_call():
    with McpServerProcess(transport="sse") as sse:
        specs = tool_specs(generic_mcp_entry(sse.url, transport="sse", timeout=GENEROUS_S))
        echo = next(MCPTool(s.call_name, s.config) for s in specs if s.call_name == "echo")
        assert call(echo, text="over sse").result == "echo: over sse"
    t = ToolsConfig(tools=["generic_mcp"], tool_configs=[json.dumps({**stdio_config(), "timeout": GENEROUS_S})])
    specs = tool_specs(t)
    assert "add" in [s.call_name for s in specs]

    async def over_stdio():
        add = MCPTool("add", next(s.config for s in specs if s.call_name == "add"))
        try:
            return await add.call({"a": 40, "b": 2})
        finally:
            await add.close()  # ends the server process

    assert asyncio.run(over_stdio()).result == "42"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"url": "http://x/mcp"}, "--tool_configs for 'generic_mcp': unknown key 'url' (known: args, command"),
        ({"server_url": "http://x/mcp", "transport": "websocket"}, "transport 'websocket' is not one of http, sse"),
        ({}, 'transport http needs a "server_url"'),
        ({"transport": "stdio"}, 'transport stdio needs a "command"'),
        ({"server_url": "http://x/mcp", "timeout": 0}, "'timeout' must be a positive number of seconds"),
        ({"server_url": "http://x/mcp", "max_retries": 0}, "'max_retries' (connection attempts) must be"),
        ({"server_url": "http://x/mcp", "args": "-v"}, '"args" must be a list of strings'),
    ],
)
def test_bad_configs_are_one_line_errors_naming_the_key(config, message):
    with pytest.raises(MCPServerError) as error:
        mcp_config(config)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_bad_config_keys_fail_at_parse_time_but_parsing_asks_no_server():
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    cfg = parse_config(["--tools", "generic_mcp", "--tool_configs", json.dumps({"server_url": url})])
    assert cfg.tools.tools == ["generic_mcp"]
    with pytest.raises(ConfigError, match="unknown key 'url'"):
        checked_config(["--tools", "generic_mcp", "--tool_configs", json.dumps({"url": url})])


def test_an_unreachable_server_at_start_is_one_line_naming_it():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(MCPServerError) as error:
        tool_specs(generic_mcp_entry(url, timeout=GENEROUS_S))
    text = str(error.value)
    assert text.startswith(f"--tools generic_mcp: cannot list the tools of the http server {url}: ")
    assert "ConnectError" in text and "\n" not in text


def test_a_tool_name_the_server_lacks_and_a_name_clash_are_start_errors(server):
    with pytest.raises(MCPServerError, match="has no tool 'weather' \\(it has: add, echo, fail, picture, slow\\)"):
        tool_specs(generic_mcp_entry(server.url, tool_name="weather", timeout=GENEROUS_S))
    t = ToolsConfig(
        tools=["python", "generic_mcp"],
        tool_call_names=["echo", "generic_mcp"],
        tool_configs=["{}", json.dumps({"server_url": server.url, "timeout": GENEROUS_S})],
    )
    with pytest.raises(MCPServerError, match="the function name\\(s\\) echo would be called by two tools"):
        tool_specs(t)


def test_a_dead_server_at_call_time_is_an_unreachable_observation_after_the_connection_attempts():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    info = {"description": "echo", "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}
    config = {"server_url": url, "tool_name": "echo", "tool_info": info, "max_retries": 2, "retry_backoff": 0.01}
    [spec] = expand_specs((ToolSpec("generic_mcp", "echo", {**config, "timeout": GENEROUS_S}),))  # no I/O: info given
    result = call(MCPTool(spec.call_name, spec.config), text="x")
    assert not result.ok and not result.timed_out
    assert result.result.startswith(f"MCP http server {url} is unreachable: ")


def test_dr_agent_mcp_stays_refused_with_its_reason():
    with pytest.raises(ConfigError) as error:
        checked_config(["--tools", "dr_agent_mcp"])
    assert "dr_agent_mcp is not supported yet" in str(error.value) and "use generic_mcp" in str(error.value)


def test_the_legacy_parser_fills_an_mcp_tools_single_string_argument():
    # The legacy parser fills an MCP tool's first required parameter, so single-string tools work as in
    # open-instruct; the call it builds is what the Toolbox receives.
    from open_instruct.agents.parsers import make_parser

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    info = {"description": "", "input_schema": schema}
    tool = MCPTool("echo", {"server_url": "http://x/mcp", "tool_name": "echo", "tool_info": info})
    assert make_parser("legacy", [tool.definition]).parse("<echo>hi</echo>") == [ToolCall("echo", {"text": "hi"})]
