"""Multi-turn rollouts: which tools and environments the model may call, how calls are written, and their limits.

Which names exist (tools, environments, call parsers) is the agents package's to say: the entry point checks
the names before anything starts (`agents.settings.registry_problems`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from open_instruct.config.fields import arg


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
    max_steps: int = arg(5, "Tool/environment calls per sample (a row's env_config max_steps wins).", bounds=">= 1")
    per_turn_max_tokens: int | None = arg(
        None, "Token cap per generation turn (None: what is left of the budget).", bounds=">= 1"
    )
    pool_size: int | None = arg(
        None,
        "Concurrent calls per tool and engine (default: prompts x samples, i.e. never the bottleneck).",
        bounds=">= 1",
    )
    pass_tools_to_chat_template: bool = arg(True, "Render the tool schemas into the prompt via the chat template.")
    only_reward_good_outputs: bool = arg(
        False, "A sample gets its verifier reward only if it made a tool call that returned output without error."
    )
    mask_tool_use: bool = arg(True, "Keep tool and environment output tokens out of the loss.")
    reward_aggregator: Literal["last", "sum"] = arg(
        "last", "Per-step environment rewards -> sample reward: the last step's (plus the verifier's) or their sum."
    )

    def problems(self) -> list[str]:
        checks = []
        for flag, values in (("--tool_call_names", self.tool_call_names), ("--tool_configs", self.tool_configs)):
            checks.append(
                (
                    not values or len(values) == len(self.tools),
                    f"{flag} has {len(values)} entries for {len(self.tools)} --tools; give one per tool",
                )
            )
        for position, raw in enumerate(self.tool_configs):
            try:
                is_object, error = isinstance(json.loads(raw), dict), "not an object"
            except ValueError as invalid:
                is_object, error = False, str(invalid)
            checks.append((is_object, f"--tool_configs entry {position + 1} ({raw!r}) is not a JSON object ({error})"))
        names = self.tool_call_names or self.tools
        duplicates = sorted({name for name in names if names.count(name) > 1})
        checks.append(
            (not duplicates, f"--tool_call_names: {', '.join(duplicates)} used twice; give each tool its own name")
        )
        return [message for ok, message in checks if not ok]
