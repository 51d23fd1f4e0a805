"""generic_sandbox on the real multi-turn path: a vLLM engine, with the model forced to write two bash calls,
runs them in our code service (code_server, started here), and the workspace persists between the turns."""

from __future__ import annotations

import re

import pytest
from helpers.forced_engine import forced_turns_engine, the_one_sample
from helpers.sandbox_service import bash_code_service

from open_instruct.agents.settings import ToolSpec
from open_instruct.messages import AgentRequest, EnvSpec


@pytest.fixture(scope="module")
def service():
    with bash_code_service() as url:
        yield url


@pytest.fixture(scope="module")
def engine_pool(model_path, service):
    sandbox = ToolSpec("generic_sandbox", "generic_sandbox", {"api_endpoint": service + "/execute", "timeout": 20})
    with forced_turns_engine(model_path, (sandbox,), max_model_len=1024) as pool:
        yield pool


def test_forced_sandbox_calls_on_a_real_engine_keep_the_workspace_between_turns(engine_pool, model_path):
    from transformers import AutoTokenizer

    from open_instruct.messages import PromptRequest, SamplingSettings

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Compute 6*7 in the sandbox."}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    request = PromptRequest(
        prompt_id="sandbox:0", prompt_token_ids=tuple(ids), ground_truths=("42",), verifier_names=("gsm8k",),
        sampling=SamplingSettings(max_tokens=600, temperature=1.0), num_samples=1, seed=3, admitted_version=0,
        agent=AgentRequest(envs=(EnvSpec("generic_sandbox", ()),)),
    )  # fmt: skip
    forced = ("<execute_bash>echo $((6*7)) > answer.txt</execute_bash>", "<execute_bash>cat answer.txt</execute_bash>")
    engine_pool.call_all("set_forced_turns", tuple(re.escape(turn) for turn in forced))
    engine_pool.submit([request])
    c = the_one_sample(engine_pool, timeout_s=300)
    assert c.error is None and [(call.name, call.ok) for call in c.agent.calls][:2] == [("execute_bash", True)] * 2
    observations = [tokenizer.decode(c.response_token_ids[s:e]) for s, e in c.agent.observation_spans]
    assert observations[0].startswith("<output>\nExit code: 0\n")
    assert "[STDOUT]\n42\n" in observations[1]
    assert c.agent.env_metrics["generic_sandbox/step_count"] >= 2
