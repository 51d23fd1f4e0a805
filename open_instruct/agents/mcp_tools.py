"""`generic_mcp`: the tools of any MCP (Model Context Protocol) server, called mid-rollout.

Why: open-instruct's `generic_mcp` lets a run use any MCP server's tools (its weather demo, a search
backend) with one `--tools` entry. We keep its configuration keys (`server_url`, `transport` http/sse/stdio,
`command`/`args`/`env`, `timeout`, `max_retries`, `retry_backoff`, `tool_name`, `tool_info`) and its
naming: without `tool_name` the entry asks the server's `list_tools` once at start and becomes one tool
per server tool, each called by the server's name with the server's description and input schema; with
`tool_name` it is that one tool under its --tool_call_names name.

Where the expansion happens: `tool_specs` (settings.py) resolves an expanding entry into one `ToolSpec`
per server tool (`expand_specs`, cached per process), so everything after it (prompt schemas, the rows'
`tools` column, the Toolbox, the parsers) sees one spec per callable function and needed no change.
Parsing the flags does no I/O (`tool_specs(..., resolve=False)`); the server is asked when the run starts,
and an unreachable server is one line (`MCPServerError`, a `UserError`).

Differences from open-instruct, on purpose:
* one MCP session per tool and generation actor, kept open and shared by concurrent calls (open-instruct
  opens a session per call: a handshake each time, for stdio a new server process per call). A session
  that fails is dropped, and the next call connects again, so a restarted server is picked up;
* `timeout` bounds the whole call, connection attempts included (open-instruct: each attempt). Only
  connecting is retried (`max_retries` attempts, `retry_backoff` doubling); a request once sent is never
  sent again, so a tool never runs twice;
* failures become observation text the model can read (open-instruct returns an empty observation):
  "Timeout after N seconds", the server being unreachable, the connection lost during a call, an MCP
  protocol error, bad arguments. A result the server flags `isError` is shown and counted as a failure
  (open-instruct counts it a success). Non-text content is named in brackets rather than failing the call;
* with `tool_name` but no `tool_info`, the schema is read from the server (open-instruct shows an empty one).

We use the official `mcp` SDK, 2.x (the version vLLM requires): its `Client` negotiates the protocol
version and falls back to the initialize handshake for older servers such as open-instruct's weather demo.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from open_instruct.agents.base import StepResult, ToolDefinition, ToolSpec
from open_instruct.agents.parsers import coerce_args
from open_instruct.errors import UserError
from open_instruct.extensions import register_tool

KIND = "generic_mcp"
TRANSPORTS = ("http", "sse", "stdio")
_CONNECTION_CLOSED = -32000  # JSON-RPC code the SDK raises when the transport under a session died
_LIST_PAGES_CAP = 100  # a paginating server that never ends its listing cannot hang the start
_CLOSE_WAIT_S = 5.0


class MCPServerError(UserError, ValueError):
    """A generic_mcp server that could not be listed at start, or a bad generic_mcp config (one line)."""


@dataclass(frozen=True)
class MCPToolConfig:
    """open-instruct's GenericMCPToolConfig keys and defaults."""

    server_url: str = ""
    transport: str = "http"
    command: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    max_retries: int = 3
    retry_backoff: float = 0.5
    tool_name: str | None = None
    tool_info: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """The server, as messages name it."""
        if self.transport == "stdio":
            return "stdio server `" + " ".join([self.command, *self.args]) + "`"
        return f"{self.transport} server {self.server_url}"


def mcp_config(config: dict[str, Any]) -> MCPToolConfig:
    """Validate one `--tool_configs` entry (no I/O); every problem is one line naming the key."""
    known = {f.name for f in dataclasses.fields(MCPToolConfig)}
    unknown = sorted(set(config) - known - {"pool_size"})
    if unknown:
        raise MCPServerError(
            f"--tool_configs for {KIND!r}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )
    s = MCPToolConfig(**{k: v for k, v in config.items() if k in known})
    prefix = f"--tool_configs for {KIND!r}:"
    if s.transport not in TRANSPORTS:
        raise MCPServerError(f"{prefix} transport {s.transport!r} is not one of {', '.join(TRANSPORTS)}")
    if s.transport in ("http", "sse") and not (isinstance(s.server_url, str) and s.server_url):
        raise MCPServerError(f'{prefix} transport {s.transport} needs a "server_url" (e.g. http://host:8765/mcp)')
    if s.transport == "stdio" and not (isinstance(s.command, str) and s.command):
        raise MCPServerError(f'{prefix} transport stdio needs a "command" that starts the server')
    if not isinstance(s.args, list) or not all(isinstance(a, str) for a in s.args):
        raise MCPServerError(f'{prefix} "args" must be a list of strings, got {s.args!r}')
    if not isinstance(s.env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in s.env.items()):
        raise MCPServerError(f'{prefix} "env" must map names to strings, got {s.env!r}')
    for key, least in (("timeout", "positive"), ("retry_backoff", "non-negative")):
        value = getattr(s, key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or value < 0 or (key == "timeout" and not value):
            raise MCPServerError(f"{prefix} {key!r} must be a {least} number of seconds, got {value!r}")
    if isinstance(s.max_retries, bool) or not isinstance(s.max_retries, int) or s.max_retries < 1:
        raise MCPServerError(f"{prefix} 'max_retries' (connection attempts) must be an integer >= 1")
    if s.tool_name is not None and not (isinstance(s.tool_name, str) and s.tool_name):
        raise MCPServerError(f"{prefix} 'tool_name' must be a tool's name, got {s.tool_name!r}")
    if not isinstance(s.tool_info, dict):
        raise MCPServerError(f"{prefix} 'tool_info' must be an object with description and input_schema")
    return s


def _open_client(s: MCPToolConfig):
    """A new, not yet entered `mcp.Client` for the configured server (the SDK is imported on first use)."""
    from mcp import Client, StdioServerParameters

    if s.transport == "stdio":
        server: Any = StdioServerParameters(command=s.command, args=list(s.args), env=dict(s.env) or None)
    elif s.transport == "sse":
        from mcp.client.sse import sse_client

        server = sse_client(s.server_url)
    else:
        server = s.server_url  # a URL string: streamable HTTP
    # No response cache: every call must reach the server.
    return Client(server, cache=None)


def _root_cause(error: BaseException) -> str:
    """The innermost error of an exception group (the SDK's task groups wrap transport failures)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, asyncio.CancelledError):
        return "the connection was cancelled"
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _tool_info(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": tool.input_schema or {"type": "object", "properties": {}},
    }


async def list_server_tools(s: MCPToolConfig) -> dict[str, dict[str, Any]]:
    """name -> {name, description, input_schema}, every page of the server's listing."""
    tools: dict[str, dict[str, Any]] = {}
    async with _open_client(s) as client:
        cursor = None
        for _ in range(_LIST_PAGES_CAP):
            page = await client.list_tools(cursor=cursor)
            tools.update((tool.name, _tool_info(tool)) for tool in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    return tools


def _run_in_thread(make_coro, timeout_s: float):
    """Run a coroutine to completion on a fresh event loop in a daemon thread: callers may already be inside a
    running loop, and a server that never answers must not hang the start (the thread is abandoned)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(asyncio.wait_for(make_coro(), timeout_s))
        except BaseException as error:
            box["error"] = error

    thread = threading.Thread(target=target, name="mcp-discovery", daemon=True)
    thread.start()
    thread.join(timeout_s + _CLOSE_WAIT_S)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


_DISCOVERED: dict[str, dict[str, dict[str, Any]]] = {}
_DISCOVERED_LOCK = threading.Lock()


def discover(s: MCPToolConfig) -> dict[str, dict[str, Any]]:
    """The server's tools, asked once per process and server (the driver resolves the specs more than once)."""
    key = json.dumps(
        [s.transport, s.server_url, s.command, list(s.args), sorted(s.env.items()), s.timeout], sort_keys=True
    )
    with _DISCOVERED_LOCK:
        if key in _DISCOVERED:
            return _DISCOVERED[key]
    try:
        tools = _run_in_thread(partial(list_server_tools, s), float(s.timeout))
    except TimeoutError:
        raise MCPServerError(
            f"--tools {KIND}: the {s.where} did not list its tools within {s.timeout:g} s (--tool_configs timeout)"
        ) from None
    except Exception as error:
        raise MCPServerError(
            f"--tools {KIND}: cannot list the tools of the {s.where}: {_root_cause(error)}; start the server "
            "first or fix server_url/transport in --tool_configs"
        ) from None
    with _DISCOVERED_LOCK:
        _DISCOVERED[key] = tools
    return tools


def expand_specs(specs: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    """Each generic_mcp entry without `tool_name` becomes one spec per server tool, named as the server names it
    (--tool_call_names does not apply to it, as in open-instruct); one with `tool_name` but no `tool_info` gets
    the server's schema. Other specs pass through unchanged."""
    out: list[ToolSpec] = []
    for spec in specs:
        if spec.kind != KIND:
            out.append(spec)
            continue
        s = mcp_config(spec.config)
        if s.tool_name is not None and s.tool_info:
            out.append(spec)
            continue
        tools = discover(s)
        if s.tool_name is not None:
            if s.tool_name not in tools:
                raise MCPServerError(
                    f"--tool_configs for {KIND!r}: the {s.where} has no tool {s.tool_name!r} "
                    f"(it has: {', '.join(sorted(tools)) or 'none'})"
                )
            out.append(dataclasses.replace(spec, config={**spec.config, "tool_info": tools[s.tool_name]}))
            continue
        if not tools:
            raise MCPServerError(f"--tools {KIND}: the {s.where} lists no tools")
        for name, info in tools.items():
            out.append(ToolSpec(KIND, name, {**spec.config, "tool_name": name, "tool_info": info}))
    names = [spec.call_name for spec in out]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise MCPServerError(
            f"--tools {KIND}: the function name(s) {', '.join(twice)} would be called by two tools (an MCP server's "
            "tool takes the server's name); rename the other --tools entry with --tool_call_names"
        )
    return tuple(out)


def result_text(result: Any) -> str:
    """The observation for a CallToolResult: its text blocks, one per line; other content is named, not shown."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "text")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(getattr(block, "resource", None), "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind} content not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


class _Lost(Exception):
    """The connection under a call died before the call was answered."""


class _Connection:
    """One MCP session, held open by its own task: the SDK's transports cancel the task that entered them when
    the server goes away, so no rollout task may be that task. Calls from any task share the session."""

    def __init__(self, settings: MCPToolConfig) -> None:
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume)
        self._stop = asyncio.Event()
        self.retired = False
        self.in_flight = 0
        self.task = asyncio.create_task(self._hold(settings), name="mcp-session")

    async def _hold(self, settings: MCPToolConfig) -> None:
        try:
            async with _open_client(settings) as client:
                if not self.ready.done():
                    self.ready.set_result(client)
                await self._stop.wait()
        except BaseException as error:  # includes the transport's cancellation; this task just ends
            if not self.ready.done():
                self.ready.set_exception(ConnectionError(_root_cause(error)))
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before it connected"))

    @property
    def usable(self) -> bool:
        return not self.retired and not self.task.done()

    def retire(self) -> None:
        """No new calls; close once the calls in flight are answered (closing would fail them too)."""
        self.retired = True
        if self.in_flight == 0:
            self._close()

    def _close(self) -> None:
        self._stop.set()
        if not self.ready.done():
            self.task.cancel()

    async def close(self) -> None:
        self.retired = True
        self._close()
        done, _ = await asyncio.wait({self.task}, timeout=_CLOSE_WAIT_S)
        if not done:
            self.task.cancel()

    async def call(self, name: str, args: dict[str, Any], remaining_s: float):
        """The server's CallToolResult; raises TimeoutError, _Lost, or the SDK's MCPError."""
        client = self.ready.result()
        self.in_flight += 1
        request = asyncio.ensure_future(client.call_tool(name, args))
        try:
            done, _ = await asyncio.wait(
                {request, self.task}, timeout=max(0.0, remaining_s), return_when=asyncio.FIRST_COMPLETED
            )
            if request in done:
                return request.result()
            if self.task in done:
                raise _Lost("the session ended")
            raise TimeoutError
        finally:
            if not request.done():
                # Abandoned, not awaited: a transport that does not react to cancellation must not hang the
                # sample (also when the sample itself is cancelled while it waits).
                request.cancel()
                request.add_done_callback(_consume)
            self.in_flight -= 1
            if self.retired and self.in_flight == 0:
                self._close()


def _consume(future: asyncio.Future) -> None:
    # Errors of abandoned requests and unawaited connection attempts are expected; retrieving them keeps
    # asyncio from logging "exception was never retrieved".
    if not future.cancelled():
        future.exception()


@register_tool(KIND)
class MCPTool:
    """One tool of an MCP server (an `agents.base.Tool`)."""

    def __init__(self, call_name: str, config: dict[str, Any]):
        self.settings = mcp_config(config)
        self.call_name = call_name
        # An unexpanded spec (built directly, not through tool_specs) calls the server's tool of its own name.
        self.tool_name = self.settings.tool_name or call_name
        info = self.settings.tool_info
        self.definition = ToolDefinition(
            call_name,
            str(info.get("description", "")),
            info.get("input_schema") or {"type": "object", "properties": {}},
        )
        self.timeout_s = float(self.settings.timeout)
        self._connection: _Connection | None = None

    def endpoints(self) -> list[str]:
        """The URLs this tool reaches (preflight checks them); a stdio server has none."""
        return [self.settings.server_url] if self.settings.transport != "stdio" else []

    async def _connect(self, deadline: float) -> _Connection:
        """A connected session, connecting (again) if there is none; raises ConnectionError or TimeoutError."""
        loop = asyncio.get_running_loop()
        for attempt in range(self.settings.max_retries):
            connection = self._connection
            if connection is None or not connection.usable:
                connection = self._connection = _Connection(self.settings)
            done, _ = await asyncio.wait({connection.ready}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                if self._connection is connection and not connection.ready.done():
                    connection.retire()  # a connect that hangs is dropped; the next call starts a new one
                    self._connection = None
                raise TimeoutError
            if connection.ready.exception() is None:
                return connection
            if self._connection is connection:
                self._connection = None
            if attempt + 1 == self.settings.max_retries:
                raise ConnectionError(str(connection.ready.exception()))
            pause = self.settings.retry_backoff * 2**attempt
            if loop.time() + pause >= deadline:
                raise TimeoutError
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")  # max_retries >= 1

    async def call(self, args: dict[str, Any]) -> StepResult:
        try:
            args = coerce_args(self.definition, args)
        except ValueError as error:
            return StepResult(f"Bad arguments: {error}", error=str(error))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        timed_out = f"Timeout after {self.timeout_s:g} seconds"
        try:
            connection = await self._connect(deadline)
        except TimeoutError:
            return StepResult(timed_out, error=timed_out, timed_out=True)
        except ConnectionError as error:
            message = f"MCP {self.settings.where} is unreachable: {error}"
            return StepResult(message, error=message)
        try:
            result = await connection.call(self.tool_name, args, deadline - loop.time())
        except TimeoutError:
            return StepResult(timed_out, error=timed_out, timed_out=True)
        except Exception as error:
            from mcp import MCPError

            # The SDK reports a dead transport as code -32000 "Connection closed"; a server may use -32000 too.
            if isinstance(error, MCPError) and (error.code, error.message) != (_CONNECTION_CLOSED, "Connection closed"):
                message = f"MCP error {error.code}: {error.message}"  # the server answered; the session is fine
            else:
                connection.retire()
                if self._connection is connection:
                    self._connection = None
                message = f"MCP connection to the {self.settings.where} was lost during the call: {_root_cause(error)}"
            return StepResult(message, error=message)
        text = result_text(result)
        if result.is_error:
            return StepResult(text, error=text or "the tool reported an error")
        return StepResult(text)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None
