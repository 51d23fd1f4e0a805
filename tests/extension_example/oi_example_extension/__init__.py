"""A user's own task for open_instruct, outside the package: one verifier, one tool and one environment.

Loaded by `--extension_modules oi_example_extension` (this folder on PYTHONPATH), or, when this folder is on
sys.path, through the entry point that `oi_example_extension-0.1.0.dist-info/entry_points.txt` declares (as
an installed package would). tests/integration/test_extension_training.py trains with all three.
"""

from __future__ import annotations

import re
from typing import Any

from open_instruct.agents.base import StepResult, ToolCall, ToolDefinition, string_tool
from open_instruct.extensions import register_environment, register_tool, register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult


@register_verifier("last_digit")
def last_digit(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    """1.0 when the last digit the response writes is the last digit of the ground truth."""
    written = re.findall(r"\d", inp.prediction)
    wanted = re.findall(r"\d", str(inp.ground_truth))
    score = 1.0 if written and wanted and written[-1] == wanted[-1] else 0.0
    return VerifierResult(score, extracted=written[-1] if written else None)


@register_tool("reverse_text")
class ReverseText:
    """A stateless tool: the text reversed (a `prefix` from its --tool_configs entry in front)."""

    def __init__(self, call_name: str, config: dict[str, Any]):
        unknown = set(config) - {"prefix"}
        if unknown:
            raise ValueError(f"--tool_configs for 'reverse_text': unknown key {sorted(unknown)[0]!r} (known: prefix)")
        self.call_name, self.prefix, self.timeout_s = call_name, str(config.get("prefix", "")), 5.0
        self.definition = string_tool(call_name, "Reverse a text.", "text", "the text to reverse")

    async def call(self, args: dict[str, Any]) -> StepResult:
        return StepResult(self.prefix + str(args.get("text", ""))[::-1])

    async def close(self) -> None:
        pass


@register_environment("countdown")
class Countdown:
    """A stateful environment: `tick` counts down from the row's `start`; reaching 0 earns 1.0 and ends it."""

    response_role = "tool"

    def __init__(self) -> None:
        self.left = 0
        self.ticks = 0

    async def reset(self, start: int = 3, **_: Any) -> None:
        self.left = int(start)

    async def step(self, call: ToolCall) -> StepResult:
        if call.name != "tick":
            return StepResult(f"unknown function {call.name!r}; call tick", error="unknown function")
        self.ticks += 1
        self.left -= 1
        return StepResult(str(self.left), reward=1.0 if self.left == 0 else 0.0, done=self.left <= 0)

    def metrics(self) -> dict[str, float]:
        return {"ticks": float(self.ticks)}

    @classmethod
    def tool_definitions(cls) -> tuple[ToolDefinition, ...]:
        return (ToolDefinition("tick", "Count down by one.", {"type": "object", "properties": {}}),)
