"""Stateless tools the model calls mid-rollout, and the `Toolbox` one generation actor shares among its samples.

Every call is a coroutine on the actor's event loop, so a sample waiting on a slow tool parks only
itself: the engine keeps decoding every other sample meanwhile. A call never raises into the rollout:
errors and timeouts become observation text (`StepResult.error` / `timed_out`) and are counted.

Timeouts are not retried (the call already used its budget, and re-running code would double its
effects); connection errors, 429 and 5xx are retried with back-off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from open_instruct.agents.base import StepResult, Tool, ToolDefinition, ToolSpec, default_execute_url, string_tool
from open_instruct.agents.http_client import HttpClient, parse_tool_config
from open_instruct.agents.settings import UNSUPPORTED_TOOLS, AgentSettings, tool_specs
from open_instruct.config.tools import ToolsConfig
from open_instruct.extensions import register_tool, registered_environments, registered_tools
from open_instruct.rewards.code_tests import code_api_headers

_GUARD_MARGIN_S = 2.0  # the outer timeout leaves the tool's own timeout room to report itself (at most 2x)


@dataclass(frozen=True)
class PythonToolConfig:
    api_endpoint: str = field(default_factory=default_execute_url)
    timeout: float = 3.0
    max_retries: int = 3


@dataclass(frozen=True)
class HttpToolConfig:
    url: str = ""
    timeout: float = 10.0
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    result_key: str | None = None  # read this key of a JSON reply; None: the whole reply text
    description: str = "Call a web service with JSON arguments."
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    )
    max_retries: int = 3


@register_tool("python")
class PythonTool:
    """Runs a snippet in our sandboxed code-execution service (`POST /execute`, code_server)."""

    def __init__(self, call_name: str, config: dict[str, Any]):
        self.settings = parse_tool_config(PythonToolConfig, "python", config)
        self.call_name = call_name
        self.timeout_s = float(self.settings.timeout)
        self.definition = string_tool(call_name, "Run Python code; what it prints comes back.", "code", "the code")
        self._http = HttpClient()

    async def call(self, args: dict[str, Any]) -> StepResult:
        code = str(args.get("code", ""))
        if not code.strip():
            return StepResult("", error="empty code")
        payload = {"code": code, "timeout": self.settings.timeout}
        status, reason, text = await self._http.request(
            "POST",
            self.settings.api_endpoint,
            payload,
            self.settings.timeout + 5,
            code_api_headers(),
            self.settings.max_retries,
        )
        if status != 200:
            return StepResult(f"HTTP error: {status} {reason}", error=f"HTTP {status}: {text[:200]}")
        reply = json.loads(text)
        output, error = reply.get("output", ""), reply.get("error", "")
        observation = output + (("\n" if output and not output.endswith("\n") else "") + error if error else "")
        timed_out = reply.get("status") == "timeout"
        return StepResult(observation, error=error or None, timed_out=timed_out)

    async def close(self) -> None:
        await self._http.close()


@register_tool("http")
class HttpTool:
    """Any JSON web service: the call's arguments are the request body, the reply (or one key of it) the result."""

    def __init__(self, call_name: str, config: dict[str, Any]):
        self.settings = parse_tool_config(HttpToolConfig, "http", config)
        if not self.settings.url:
            raise ValueError("--tool_configs for 'http' needs a \"url\"")
        self.call_name = call_name
        self.timeout_s = float(self.settings.timeout)
        self.definition = ToolDefinition(call_name, self.settings.description, self.settings.parameters)
        self._http = HttpClient()

    async def call(self, args: dict[str, Any]) -> StepResult:
        status, reason, text = await self._http.request(
            self.settings.method,
            self.settings.url,
            args,
            self.settings.timeout,
            self.settings.headers,
            self.settings.max_retries,
        )
        if not 200 <= status < 300:
            return StepResult(f"HTTP error: {status} {reason}", error=f"HTTP {status}: {text[:200]}")
        if self.settings.result_key is None:
            return StepResult(text)
        try:
            value = json.loads(text)[self.settings.result_key]
        except (ValueError, KeyError, TypeError) as error:
            return StepResult(
                f"Bad reply: no {self.settings.result_key!r} in it", error=f"{type(error).__name__}: {error}"
            )
        return StepResult(value if isinstance(value, str) else json.dumps(value))

    async def close(self) -> None:
        await self._http.close()


def make_tool(spec: ToolSpec) -> Tool:
    return registered_tools()[spec.kind](spec.call_name, spec.config)


def registry_problems(tools_cfg: ToolsConfig) -> list[str]:
    """Tool, environment and parser names that do not exist here, then each tool built once (no I/O) so that a bad
    --tool_configs key fails before any actor starts: one line each, naming the flag and the fix. The entry point
    runs this; the flag group checks the rest when it is parsed."""
    from open_instruct.agents.parsers import PARSER_ALIASES, PARSER_TYPES, UNSUPPORTED_PARSERS

    problems = []
    tools, environments = registered_tools(), registered_environments()
    parser = PARSER_ALIASES.get(tools_cfg.tool_parser_type, tools_cfg.tool_parser_type)
    if parser in UNSUPPORTED_PARSERS:
        problems.append(f"--tool_parser_type {parser} is not supported yet: {UNSUPPORTED_PARSERS[parser]}")
    elif parser not in PARSER_TYPES:
        problems.append(f"--tool_parser_type {tools_cfg.tool_parser_type!r} is not one of {', '.join(PARSER_TYPES)}")
    for kind in tools_cfg.tools:
        if kind in UNSUPPORTED_TOOLS:
            problems.append(f"--tools {kind} is not supported yet: {UNSUPPORTED_TOOLS[kind]}")
        elif kind not in tools and kind not in environments:
            known = ", ".join([*tools, *environments])
            problems.append(
                f"--tools {kind!r} is not a known tool or environment (known: {known}; --extension_modules adds yours)"
            )
    return problems or config_problems(tools_cfg)


def config_problems(tools_cfg: ToolsConfig) -> list[str]:
    """Build each tool and environment once (no I/O), so a bad --tool_configs key fails before any actor starts."""
    from open_instruct.agents.environments import make_environment

    problems = []
    for spec in tool_specs(tools_cfg, resolve=False):  # no I/O at parse time: MCP servers are asked at start
        try:
            if spec.kind in registered_tools():
                make_tool(spec)
            else:
                make_environment(spec.kind, {k: v for k, v in spec.config.items() if k != "pool_size"})
        except (TypeError, ValueError) as error:
            problems.append(str(error))
    return problems


async def call_guarded(name: str, call, timeout_s: float) -> StepResult:
    """Run one tool or environment step; a timeout or an exception becomes an error observation."""
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        message = f"Step '{name}' timed out after {timeout_s:g}s"
        result = StepResult(message, error=message, timed_out=True)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        message = f"Step '{name}' failed: {type(error).__name__}: {error}"
        result = StepResult(message, error=message)
    return dataclasses.replace(result, runtime_s=time.monotonic() - started)


class Toolbox:
    """The configured tools of one generation actor, each behind a `--pool_size` concurrency limit."""

    def __init__(self, settings: AgentSettings):
        self.settings = settings
        tools = registered_tools()
        self.tools: dict[str, Tool] = {
            spec.call_name: make_tool(spec) for spec in settings.tool_specs if spec.kind in tools
        }
        self.env_configs = {  # `pool_size` is ours (a concurrency limit), not an environment setting
            spec.kind: {k: v for k, v in spec.config.items() if k != "pool_size"}
            for spec in settings.tool_specs
            if spec.kind not in tools
        }
        pool = {spec.call_name: int(spec.config.get("pool_size", settings.pool_size)) for spec in settings.tool_specs}
        self._limits = {name: asyncio.Semaphore(size) for name, size in pool.items()}

    def definitions(self, allowed: tuple[str, ...] = ()) -> tuple[ToolDefinition, ...]:
        """Schemas of the configured tools, filtered by a row's `tools` column (empty: all)."""
        return tuple(tool.definition for name, tool in self.tools.items() if not allowed or name in allowed)

    async def call(self, name: str, args: dict[str, Any]) -> StepResult:
        tool = self.tools[name]
        async with self._limits[name]:
            guard_s = tool.timeout_s + min(_GUARD_MARGIN_S, tool.timeout_s)
            return await call_guarded(name, tool.call(args), guard_s)

    async def close(self) -> None:
        for tool in self.tools.values():
            await tool.close()
