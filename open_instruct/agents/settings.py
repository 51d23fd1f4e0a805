"""The tool and environment flags (open-instruct's names, types and defaults) and what crosses into the engines.

`ToolsConfig` is one argument group of the CLI; `tool_problems` is its share of the parse-time validation
(every message names the flag and the fix). `AgentSettings` is the frozen, picklable form a generation
actor receives: resolved call names, parsed JSON configs, limits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from open_instruct.agents.base import ToolSpec
from open_instruct.config.fields import arg

# Registry names of open-instruct that need infrastructure we do not ship; each is refused at parse time
# with its reason instead of failing mid-run.
UNSUPPORTED_TOOLS = {
    "dr_agent_mcp": "its calls are dr_agent's <call_tool> text, parsed and answered by the dr_agent package's own "
    "tool classes (with --tool_parser_type dr_tulu), not plain MCP calls; for an MCP server's tools, dr_agent's "
    "backend included, use generic_mcp",
}
SHIPPED_TOOLS = ("python", "http", "serper_search", "s2_search", "jina_browse", "crawl4ai_browse", "generic_mcp")
SHIPPED_ENVIRONMENTS = ("counter", "guess_number", "wordle", "generic_sandbox")


@dataclass(frozen=True)
class ToolsConfig:
    _argument_group_name = "tools and environments (multi-turn rollouts)"

    tools: list[str] = arg(
        [],
        "Tools and environments the model may call: python (our code-execution service), http (any JSON "
        "endpoint), serper_search, s2_search, jina_browse, crawl4ai_browse (web search and browsing; keys from "
        "SERPER_API_KEY, S2_API_KEY, JINA_API_KEY, CRAWL4AI_API_URL/_API_KEY/_BLOCKLIST_PATH), generic_mcp (an "
        "MCP server's tools, one per server tool unless tool_name is set), counter, guess_number, wordle, "
        "generic_sandbox (execute_bash and str_replace_editor in our code service). Environments named by a "
        "row's env_config need not be listed.",
    )
    tool_call_names: list[str] = arg([], "Function name the model writes for each --tools entry (default: the tool's).")
    tool_configs: list[str] = arg(
        [], 'One JSON object per --tools entry: the tool\'s settings, e.g. \'{"api_endpoint": URL, "timeout": 3}\'.'
    )
    tool_parser_type: str = arg(
        "legacy",
        "How calls are written and observations appended: legacy (<name>payload</name>), vllm_hermes, "
        "vllm_llama3_json, vllm_olmo3, vllm_qwen3_xml.",
    )
    max_steps: int = arg(5, "Tool/environment calls per sample (a row's env_config max_steps wins).")
    per_turn_max_tokens: int | None = arg(None, "Token cap per generation turn (None: what is left of the budget).")
    pool_size: int | None = arg(
        None, "Concurrent calls per tool and engine (default: prompts x samples, i.e. never the bottleneck)."
    )
    pass_tools_to_chat_template: bool = arg(True, "Render the tool schemas into the prompt via the chat template.")
    only_reward_good_outputs: bool = arg(
        False, "A sample gets its verifier reward only if it made a tool call that returned output without error."
    )
    mask_tool_use: bool = arg(True, "Keep tool and environment output tokens out of the loss.")
    reward_aggregator: Literal["last", "sum"] = arg(
        "last", "Per-step environment rewards -> sample reward: the last step's (plus the verifier's) or their sum."
    )


def tool_specs(t: ToolsConfig, resolve: bool = True) -> tuple[ToolSpec, ...]:
    """--tools / --tool_call_names / --tool_configs zipped; assumes `tool_problems` found nothing.

    With `resolve`, an entry that stands for several tools (generic_mcp without a tool_name) becomes one spec
    per tool, which asks its server once per process (mcp_tools.expand_specs); without it there is no I/O."""
    names = t.tool_call_names or t.tools
    configs = t.tool_configs or ["{}"] * len(t.tools)
    specs = tuple(ToolSpec(kind, name, json.loads(raw)) for kind, name, raw in zip(t.tools, names, configs))
    if resolve and any(spec.kind == "generic_mcp" for spec in specs):
        from open_instruct.agents.mcp_tools import expand_specs

        specs = expand_specs(specs)
    return specs


def tool_problems(t: ToolsConfig) -> list[str]:
    """Everything wrong with the tool flags, each in one line naming the flag and the fix."""
    from open_instruct.agents.parsers import PARSER_ALIASES, PARSER_TYPES, UNSUPPORTED_PARSERS

    problems = []
    if t.max_steps < 1:
        problems.append(f"--max_steps {t.max_steps} must be >= 1")
    if t.per_turn_max_tokens is not None and t.per_turn_max_tokens < 1:
        problems.append(f"--per_turn_max_tokens {t.per_turn_max_tokens} must be >= 1 (or unset)")
    if t.pool_size is not None and t.pool_size < 1:
        problems.append(f"--pool_size {t.pool_size} must be >= 1 (or unset)")
    parser = PARSER_ALIASES.get(t.tool_parser_type, t.tool_parser_type)
    if parser in UNSUPPORTED_PARSERS:
        problems.append(f"--tool_parser_type {parser} is not supported yet: {UNSUPPORTED_PARSERS[parser]}")
    elif parser not in PARSER_TYPES:
        problems.append(f"--tool_parser_type {t.tool_parser_type!r} is not one of {', '.join(PARSER_TYPES)}")
    for flag, values in (("--tool_call_names", t.tool_call_names), ("--tool_configs", t.tool_configs)):
        if values and len(values) != len(t.tools):
            problems.append(f"{flag} has {len(values)} entries for {len(t.tools)} --tools; give one per tool")
    for kind in t.tools:
        if kind in UNSUPPORTED_TOOLS:
            problems.append(f"--tools {kind} is not supported yet: {UNSUPPORTED_TOOLS[kind]}")
        elif kind not in SHIPPED_TOOLS + SHIPPED_ENVIRONMENTS:
            known = ", ".join(SHIPPED_TOOLS + SHIPPED_ENVIRONMENTS)
            problems.append(f"--tools {kind!r} is not a known tool or environment (known: {known})")
    for position, raw in enumerate(t.tool_configs):
        try:
            if not isinstance(json.loads(raw), dict):
                raise ValueError("not an object")
        except ValueError as error:
            problems.append(f"--tool_configs entry {position + 1} ({raw!r}) is not a JSON object ({error})")
    names = t.tool_call_names or t.tools
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        problems.append(f"--tool_call_names: {', '.join(duplicates)} used twice; give each tool its own name")
    return problems


@dataclass(frozen=True)
class AgentSettings:
    """What a generation actor needs for multi-turn rollouts; crosses into the actor process."""

    tools: tuple[ToolSpec, ...] = ()
    parser_type: str = "legacy"
    max_steps: int = 5
    per_turn_max_tokens: int | None = None
    pool_size: int = 64
    max_model_len: int = 512
    reward_aggregator: str = "last"
    only_reward_good_outputs: bool = False

    @classmethod
    def from_config(cls, cfg) -> AgentSettings:
        from open_instruct.agents.parsers import PARSER_ALIASES
        from open_instruct.agents.web_tools import with_credentials

        tools = cfg.tools
        return cls(
            # keys are read once, on the driver: engines on other nodes need not have them exported
            tools=tuple(with_credentials(spec) for spec in tool_specs(tools)),
            parser_type=PARSER_ALIASES.get(tools.tool_parser_type, tools.tool_parser_type),
            max_steps=tools.max_steps,
            per_turn_max_tokens=tools.per_turn_max_tokens,
            pool_size=tools.pool_size or cfg.rollout_batch_size,
            max_model_len=cfg.data.max_prompt_token_length
            + max(cfg.generation.response_length, cfg.eval_response_length),
            reward_aggregator=tools.reward_aggregator,
            only_reward_good_outputs=tools.only_reward_good_outputs,
        )
