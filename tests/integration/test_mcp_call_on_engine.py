"""generic_mcp on the real multi-turn path: a vLLM engine, with the model forced to write the call, calls the
test MCP server (tests/helpers/mcp_server.py) and its answer lands in the observation."""

from __future__ import annotations

import re

import pytest
from helpers.forced_engine import forced_turns_engine, the_one_sample
from helpers.mcp_server import GENEROUS_S, McpServerProcess, generic_mcp_entry

from open_instruct.agents.settings import tool_specs
from open_instruct.messages import AgentRequest


@pytest.fixture(scope="module")
def server():
    with McpServerProcess() as running:
        yield running


@pytest.fixture(scope="module")
def engine_pool(model_path, server):
    tools = tool_specs(generic_mcp_entry(server.url, timeout=GENEROUS_S))
    with forced_turns_engine(model_path, tools) as pool:
        yield pool


def test_a_forced_mcp_call_on_a_real_engine_puts_the_servers_answer_in_the_observation(engine_pool, model_path):
    from transformers import AutoTokenizer

    from open_instruct.messages import PromptRequest, SamplingSettings

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Use the tools."}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    request = PromptRequest(
        prompt_id="mcp:0", prompt_token_ids=tuple(ids), ground_truths=("42",), verifier_names=("gsm8k",),
        sampling=SamplingSettings(max_tokens=160, temperature=1.0), num_samples=1, seed=3, admitted_version=0,
        agent=AgentRequest(tools=("echo",)),
    )  # fmt: skip
    engine_pool.call_all("set_forced_turns", (re.escape("<echo>hello from the model</echo>"),))
    engine_pool.submit([request])
    c = the_one_sample(engine_pool, timeout_s=300)
    assert c.error is None and [(call.name, call.ok) for call in c.agent.calls][:1] == [("echo", True)]
    observations = [tokenizer.decode(c.response_token_ids[s:e]) for s, e in c.agent.observation_spans]
    assert observations[0] == "<output>\necho: hello from the model\n</output>\n"
