"""The vocabulary shared by parsers, tools, environments and the rollout loop.

A model turn is parsed into `ToolCall`s; whatever answers a call (a `Tool`, shared by an engine's samples,
or an `Environment`, fresh for each sample) returns a `StepResult`. `result` is the only text the model
sees; `reward` and `done` matter only for environments; `error`/`timed_out` feed the statistics (the
rollout never raises on them). `ToolDefinition` is the OpenAI-style function schema that chat templates
render.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# Environments answer in microseconds unless they do I/O; this bounds a buggy one (and tells a network-backed
# environment how long its step may take).
ENV_STEP_TIMEOUT_S = 60.0


def default_execute_url() -> str:
    """Our code service's /execute (python tool, sandbox environment); code_api_setup.sh exports CODE_API_URL,
    the service's base URL, for the job it starts."""
    base = os.environ.get("CODE_API_URL", "http://localhost:1234").rstrip("/")
    return base.removesuffix("/test_program") + "/execute"


Role = Literal["tool", "user"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function name it wrote and its arguments."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    result: str
    reward: float = 0.0
    done: bool = False
    error: str | None = None
    timed_out: bool = False
    runtime_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


@dataclass(frozen=True)
class ToolDefinition:
    """An OpenAI-style function schema: name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("required", ()))

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def to_json(self) -> str:
        return json.dumps(self.as_openai(), sort_keys=True)


def string_tool(name: str, description: str, argument: str, argument_help: str) -> ToolDefinition:
    """A tool with one required string argument (the only shape the legacy parser can call)."""
    return ToolDefinition(
        name,
        description,
        {
            "type": "object",
            "properties": {argument: {"type": "string", "description": argument_help}},
            "required": [argument],
        },
    )


class Tool(Protocol):
    """What answers one function the model calls, for every sample of an engine (registered with
    `extensions.register_tool`). Built once per engine from its --tools entry as `cls(call_name, config)`,
    config being its --tool_configs JSON: no I/O there, and an unknown key is a `ValueError` naming it,
    because the launch checks build every tool once. The Toolbox bounds each call by `timeout_s` (plus a
    margin that lets the tool report its own timeout) and turns an exception into an error observation."""

    call_name: str  # the function name the model calls (--tool_call_names)
    timeout_s: float
    definition: ToolDefinition  # the schema the chat template renders, named `call_name`

    def __init__(self, call_name: str, config: dict[str, Any]) -> None: ...

    async def call(self, args: dict[str, Any]) -> StepResult: ...

    async def close(self) -> None: ...  # the engine is done with it: its HTTP session, its MCP connection


class Environment(Protocol):
    """What answers calls within one rollout (registered with `extensions.register_environment`). A fresh
    instance, `cls(**config)` with its --tool_configs JSON, serves each sample, so no state leaks between
    rollouts. `reset` receives the row's per-environment kwargs; a missing required kwarg raises
    `ValueError` naming it."""

    response_role: Role  # "tool" for function-call environments, "user" for text environments

    async def reset(self, **kwargs: Any) -> None: ...

    async def step(self, call: ToolCall) -> StepResult: ...

    def metrics(self) -> dict[str, float]: ...

    @classmethod
    def tool_definitions(cls) -> tuple[ToolDefinition, ...]: ...


@dataclass(frozen=True)
class ToolSpec:
    """One --tools entry, resolved: registry kind, the name the model calls, its JSON config."""

    kind: str
    call_name: str
    config: dict[str, Any] = field(default_factory=dict)
