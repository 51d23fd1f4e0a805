"""The tool and environment flags (names, defaults, validation), the rows' `tools`/`env_config` columns, and
the code service's `/execute` endpoint behind the `python` tool."""

from __future__ import annotations

import json

import pytest
import requests

from open_instruct.agents.settings import AgentSettings
from open_instruct.config.core import ConfigError, parse_config
from open_instruct.data.cache import agent_from_json, agent_to_json
from open_instruct.data.rows import BadRow, RowSettings, parse_agent_columns
from open_instruct.messages import AgentRequest, EnvSpec

# open-instruct's defaults (EnvsConfig and the two loader fields), flag by flag.
DEFAULTS = {
    "tools": [],
    "tool_call_names": [],
    "tool_configs": [],
    "tool_parser_type": "legacy",
    "max_steps": 5,
    "per_turn_max_tokens": None,
    "pool_size": None,
    "pass_tools_to_chat_template": True,
    "only_reward_good_outputs": False,
    "mask_tool_use": True,
    "reward_aggregator": "last",
}


def test_every_flag_parses_with_open_instructs_default():
    tools = parse_config([]).tools
    assert {name: getattr(tools, name) for name in DEFAULTS} == DEFAULTS


def test_non_default_values_land_in_the_config_and_the_engine_settings():
    cfg = parse_config(
        [
            "--tools",
            "python",
            "guess_number",
            "--tool_call_names",
            "code",
            "guess_number",
            "--tool_configs",
            '{"timeout": 7, "pool_size": 2}',
            '{"max_val": 50}',
            "--tool_parser_type",
            "vllm_qwen3xml",
            "--max_steps",
            "9",
            "--per_turn_max_tokens",
            "64",
            "--pool_size",
            "8",
            "--pass_tools_to_chat_template",
            "False",
            "--only_reward_good_outputs",
            "True",
            "--no_mask_tool_use",
            "--reward_aggregator",
            "sum",
        ]
    )
    tools = cfg.tools
    assert (tools.max_steps, tools.per_turn_max_tokens, tools.pool_size, tools.reward_aggregator) == (9, 64, 8, "sum")
    assert not tools.pass_tools_to_chat_template and tools.only_reward_good_outputs and not tools.mask_tool_use
    agent = AgentSettings.from_config(cfg)
    assert agent.parser_type == "vllm_qwen3_xml"  # the stale name open-instruct's own scripts pass
    assert [(s.kind, s.call_name, s.config) for s in agent.tool_specs] == [
        ("python", "code", {"timeout": 7, "pool_size": 2}),
        ("guess_number", "guess_number", {"max_val": 50}),
    ]
    assert agent.pool_size == 8 and agent.tools == cfg.tools


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_steps", "0"], "--max_steps 0 must be >= 1"),
        (["--per_turn_max_tokens", "0"], "--per_turn_max_tokens 0 must be >= 1"),
        (["--pool_size", "-1"], "--pool_size -1 must be >= 1"),
        (["--tool_parser_type", "hermes"], "--tool_parser_type 'hermes' is not one of legacy, vllm_hermes"),
        (["--tool_parser_type", "dr_tulu"], "--tool_parser_type dr_tulu is not supported yet"),
        (["--tools", "python", "--tool_call_names", "a", "b"], "--tool_call_names has 2 entries for 1 --tools"),
        (["--tools", "python", "--tool_configs", "{bad"], "--tool_configs entry 1 ('{bad') is not a JSON object"),
        (["--tools", "python", "--tool_configs", "[1]"], "is not a JSON object"),
        (["--tools", "calculator"], "--tools 'calculator' is not a known tool or environment"),
        (["--tools", "serper_search"], "--tools serper_search needs the SERPER_API_KEY environment variable"),
        (["--tools", "generic_mcp"], 'transport http needs a "server_url"'),
        (["--tools", "dr_agent_mcp"], "--tools dr_agent_mcp is not supported yet"),
        (["--tools", "python", "python"], "--tool_call_names: python used twice"),
        (["--tools", "python", "--tool_configs", '{"endpoint": "x"}'], "--tool_configs for 'python': unknown key"),
        (["--tools", "http"], "--tool_configs for 'http' needs a \"url\""),
        (["--tools", "counter", "--tool_configs", '{"goal": 3}'], "--tool_configs for 'counter': unknown key 'goal'"),
    ],
)
def test_bad_tool_flags_fail_before_anything_starts_naming_the_flag(argv, message, monkeypatch):
    from open_instruct.grpo_fast import checked_config

    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(ConfigError) as error:
        checked_config(argv)
    assert message in str(error.value)


def test_reward_aggregator_choices_are_enforced_by_the_parser():
    with pytest.raises(SystemExit):
        parse_config(["--reward_aggregator", "mean"])


ROWS = RowSettings(
    sft_messages_key="messages",
    ground_truths_key="ground_truth",
    max_prompt_token_length=64,
    dataset_skip_bad_rows=False,
    add_bos=False,
    system_prompt_override=None,
    remap=(),
    known_verifiers=("passthrough",),
    tool_names=("code", "search"),
    known_environments=("counter", "guess_number", "wordle"),
)


@pytest.mark.parametrize(
    "env_config",
    [
        {"env_name": "counter", "target": "4", "max_steps": 8},  # one dict; its max_steps is the row's limit
        [{"env_name": "counter", "target": "4"}],  # a list of dicts
        {"max_steps": 8, "env_configs": [{"env_name": "counter", "target": "4", "is_text_env": False}]},
    ],
)
def test_the_three_env_config_shapes_normalise_to_one_request(env_config):
    agent = parse_agent_columns(["code"], env_config, ROWS)
    assert agent.tools == ("code",) and agent.envs == (EnvSpec("counter", (("target", "4"),)),)
    assert agent.max_steps in (8, None)
    assert agent_from_json(agent_to_json(agent)) == agent  # what the dataset cache stores


@pytest.mark.parametrize(
    ("tools", "env_config", "message"),
    [
        ("code", None, "'tools' must be a list of tool call names"),
        (["browse"], None, "tool 'browse' in 'tools' is not configured (--tools: code, search)"),
        (None, {"env_name": "chess"}, "unknown environment 'chess' (known: counter, guess_number, wordle)"),
        (None, [{"target": 3}], 'has no "env_name"'),
        (None, {"foo": 1}, "'env_config' must name an env_name"),
        (None, {"env_configs": {"env_name": "counter"}}, "env_configs must be a list"),
        (None, {"env_name": "counter", "max_steps": 0}, "max_steps must be an integer >= 1"),
    ],
)
def test_bad_agent_columns_are_bad_rows_with_a_reason(tools, env_config, message):
    with pytest.raises(BadRow) as error:
        parse_agent_columns(tools, env_config, ROWS)
    assert message in error.value.message


def test_rows_without_agent_columns_stay_single_turn():
    assert parse_agent_columns(None, None, ROWS) is None
    assert agent_to_json(None) == "" and agent_from_json("") is None
    assert parse_agent_columns([], None, ROWS) == AgentRequest()


def test_environments_listed_in_tools_join_every_row_besides_those_its_env_config_names():
    from dataclasses import replace

    settings = replace(ROWS, tools_environments=("generic_sandbox", "counter"))
    plain = parse_agent_columns(None, None, settings)
    assert plain.envs == (EnvSpec("generic_sandbox", ()), EnvSpec("counter", ()))
    own = parse_agent_columns(None, {"env_name": "counter", "target": "4"}, settings)
    assert own.envs == (EnvSpec("counter", (("target", "4"),)), EnvSpec("generic_sandbox", ()))


def test_the_python_tools_endpoint_runs_code_and_reports_errors():
    from code_server import code_server

    with code_server() as (_, url):
        ok = requests.post(url + "/execute", json={"code": "print(6*7)", "timeout": 2}).json()
        assert (ok["output"], ok["error"], ok["success"]) == ("42\n", "", True)
        failed = requests.post(url + "/execute", json={"code": "print('a')\n1/0", "timeout": 2}).json()
        assert failed["output"] == "a\n" and not failed["success"]
        assert failed["error"].startswith('Traceback (most recent call last):\n  File "<solution>", line 2')
        slow = requests.post(url + "/execute", json={"code": "while True: pass", "timeout": 0.5}).json()
        assert slow["status"] == "timeout" and slow["error"] == "Timeout after 0.5 seconds"
        bad = requests.post(url + "/execute", data=json.dumps({"code": 1}))
        assert bad.status_code == 400 and bad.json()["error"] == "'code' must be a string"


def test_multi_turn_rows_load_render_their_tool_schemas_and_survive_the_cache(tmp_path, model_path):
    from transformers import AutoTokenizer

    from open_instruct.config.data import DataConfig
    from open_instruct.config.model import ModelConfig
    from open_instruct.config.tools import ToolsConfig
    from open_instruct.data.dataset import load_prompt_dataset

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # A template that renders the tool names it is given, so the test sees what reached it.
    tokenizer.chat_template = (
        "{% if tools %}[{{ tools | map(attribute='function.name') | join(',') }}]{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    rows = [
        {"messages": [{"role": "user", "content": "a"}], "ground_truth": "1", "dataset": "gsm8k", "tools": ["code"]},
        {
            "messages": [{"role": "user", "content": "b"}],
            "ground_truth": "",
            "dataset": "passthrough",
            "env_config": {"env_name": "counter", "target": "3", "max_steps": 7},
        },
        {"messages": [{"role": "user", "content": "c"}], "ground_truth": "2", "dataset": "gsm8k"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = DataConfig(dataset_mixer_list=[str(path), "1.0"], dataset_local_cache_dir=str(tmp_path / "cache"))
    tools = ToolsConfig(
        tools=["python", "http"], tool_call_names=["code", "search"], tool_configs=["{}", '{"url": "x"}']
    )
    loads = [load_prompt_dataset(data, ModelConfig(), tokenizer, "train", tools_cfg=tools) for _ in range(2)]
    assert [r.cache for r in loads[0].report.sources] == ["miss"] and loads[1].report.sources[0].cache == "hit"
    for dataset in loads:
        by_text = {
            tokenizer.decode(p.prompt_token_ids): p.agent for p in sorted(dataset.prompts, key=lambda p: p.index)
        }
        assert by_text == {
            "[code]a": AgentRequest(tools=("code",)),
            "[code,search,increment,decrement,submit]b": AgentRequest(
                envs=(EnvSpec("counter", (("target", "3"),)),), max_steps=7
            ),
            "[code,search]c": None,
        }
    quiet = ToolsConfig(tools=["python"], tool_call_names=["code"], pass_tools_to_chat_template=False)
    plain = load_prompt_dataset(data, ModelConfig(), tokenizer, "train", tools_cfg=quiet)
    assert plain.report.sources[0].cache == "miss"  # the flag is part of the cache key
    assert sorted(tokenizer.decode(p.prompt_token_ids) for p in plain.prompts) == ["a", "b", "c"]
