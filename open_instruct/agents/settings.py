"""What of the tool flags (`config.tools.ToolsConfig`) crosses into the engines, and the names they may use.

`AgentSettings` is the frozen, picklable form a generation actor receives: the tool flags as parsed, plus
the tool specs resolved from them (call names, parsed JSON configs, API keys). `tools.registry_problems`
checks the names at launch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from open_instruct.agents.base import ToolSpec
from open_instruct.config.tools import ToolsConfig

# Registry names of open-instruct that need infrastructure we do not ship; each is refused at parse time
# with its reason instead of failing mid-run.
UNSUPPORTED_TOOLS = {
    "dr_agent_mcp": "its calls are dr_agent's <call_tool> text, parsed and answered by the dr_agent package's own "
    "tool classes (with --tool_parser_type dr_tulu), not plain MCP calls; for an MCP server's tools, dr_agent's "
    "backend included, use generic_mcp",
}


def tool_specs(tools_cfg: ToolsConfig, resolve: bool = True) -> tuple[ToolSpec, ...]:
    """--tools / --tool_call_names / --tool_configs zipped; assumes the flag checks found nothing.

    With `resolve`, an entry that stands for several tools (generic_mcp without a tool_name) becomes one spec
    per tool, which asks its server once per process (mcp_tools.expand_specs); without it there is no I/O."""
    names = tools_cfg.tool_call_names or tools_cfg.tools
    configs = tools_cfg.tool_configs or ["{}"] * len(tools_cfg.tools)
    specs = tuple(ToolSpec(kind, name, json.loads(raw)) for kind, name, raw in zip(tools_cfg.tools, names, configs))
    if resolve and any(spec.kind == "generic_mcp" for spec in specs):
        from open_instruct.agents.mcp_tools import expand_specs

        specs = expand_specs(specs)
    return specs


@dataclass(frozen=True)
class AgentSettings:
    """What a generation actor needs for multi-turn rollouts; crosses into the actor process: the tool flags
    as parsed (`settings.tools.max_steps`, ...) and what the driver resolves from them once."""

    tools: ToolsConfig = field(default_factory=ToolsConfig)
    # --tools zipped with their call names and configs, API keys filled in on the driver (engines on other
    # nodes need not have them exported), generic_mcp servers expanded to one spec per tool
    tool_specs: tuple[ToolSpec, ...] = ()
    pool_size: int = 64  # --pool_size, or one step's samples when not given
    max_model_len: int = 512  # prompt + the longest response (training or eval): the context of a whole rollout

    @classmethod
    def from_config(cls, cfg) -> AgentSettings:
        from open_instruct.agents.web_tools import with_credentials

        tools = cfg.tools
        return cls(
            tools=tools,
            tool_specs=tuple(with_credentials(spec) for spec in tool_specs(tools)),
            pool_size=tools.pool_size or cfg.rollout_batch_size,
            max_model_len=cfg.max_model_len,
        )

    @property
    def parser_type(self) -> str:
        """--tool_parser_type, with the stale names open-instruct's scripts still pass mapped to current ones."""
        from open_instruct.agents.parsers import PARSER_ALIASES

        return PARSER_ALIASES.get(self.tools.tool_parser_type, self.tools.tool_parser_type)
