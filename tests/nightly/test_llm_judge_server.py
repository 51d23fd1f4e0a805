"""The general-* LLM-judge verifiers against a real OpenAI-compatible server: vLLM's, serving the tiny model,
started here. The random model cannot grade, so the request asks vLLM for structured output (a regex for
the judge's JSON reply); the score parsed from it flows through the reward pool."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
import requests
from helpers.judge import score_with
from helpers.processes import free_port

from open_instruct.config.rewards import RewardConfig
from open_instruct.rewards import RewardSettings, VerifierInput

JUDGE_REGEX = r'\{"REASONING": "[a-z ]{1,20}", "SCORE": [0-9]\}'


@pytest.fixture(scope="module")
def judge_server(model_path, tmp_path_factory):
    template = tmp_path_factory.mktemp("judge") / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    port = free_port()
    log = open(tmp_path_factory.mktemp("judge_log") / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_path,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--max-model-len",
            "2048",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(256 << 20),
            "--chat-template",
            str(template),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(1)
    try:
        assert server.poll() is None, f"the vLLM server exited; see {log.name}"
        yield url + "/v1", model_path
    finally:
        os.killpg(server.pid, 9)
        server.wait()
        log.close()


def test_the_judge_returns_scores_from_a_local_vllm_server(judge_server):
    url, model = judge_server
    flags = RewardConfig(
        llm_judge_model=f"hosted_vllm/{model}",  # a provider prefix, as litellm names are written, is dropped
        llm_judge_max_tokens=64,
        llm_judge_temperature=1.0,
        llm_judge_timeout=60,
    )
    extra_body = json.dumps({"structured_outputs": {"regex": JUDGE_REGEX}})
    settings = RewardSettings(reward=flags, judge_base_url=url, judge_extra_body=extra_body)
    for verifier in ("general-quality", "general-factuality"):
        outcome, _ = score_with(settings, verifier)
        assert not outcome.errors, outcome.errors
        assert 0.0 <= outcome.per_verifier[verifier] <= 1.0
        assert outcome.reward == pytest.approx(10.0 * outcome.per_verifier[verifier])


WRITER_REGEX = (
    r'\{"positive_rubrics": \[\{"title": "[a-z]{1,12}", "description": "[a-z ]{1,30}"\}\], "negative_rubrics": \[\]\}'
)


def test_evolving_rubrics_are_written_by_a_local_vllm_server_and_graded_by_it(judge_server):
    """One rubric-writing step against the real server, then the rubric verifier grades a response with the
    rubrics it wrote (each criterion a separate judge call)."""
    from open_instruct.rewards.evolving_rubrics import EvolvingRubrics, RubricGroup
    from open_instruct.rewards.llm_judge import ask_judge
    from open_instruct.rewards.rubric import rubric

    url, model = judge_server
    base = RewardSettings(RewardConfig(llm_judge_model=model, llm_judge_max_tokens=200), judge_base_url=url)
    writer = dataclasses.replace(base, judge_extra_body=json.dumps({"structured_outputs": {"regex": WRITER_REGEX}}))
    rubrics = EvolvingRubrics(max_active=3, generate=lambda prompt: ask_judge(prompt, writer))
    truth = json.dumps({"query": "What is 2 + 2?", "rubrics": [{"description": "Gives 4.", "weight": 1.0}]})
    group = RubricGroup("rows:0", (truth,), 0, ("It is 4.", "It is 5."))
    metrics = rubrics.step([group], step=0)
    assert metrics["evolving_rubrics/skipped"] == 0.0 and metrics["evolving_rubrics/num_new_rubrics"] == 1.0
    (new_truth,) = rubrics.overrides["rows:0"]
    written = json.loads(new_truth)
    assert written["rubrics"][0]["description"] == "Gives 4." and written["rubrics_types"] == ["persistent", "evolving"]
    judge = dataclasses.replace(
        base, judge_extra_body=json.dumps({"structured_outputs": {"regex": r'\{"score": [0-2]\}'}})
    )
    result = rubric(VerifierInput(prediction="It is 4.", ground_truth=new_truth), judge)
    assert result.details == {"rubrics": 2, "failed": 0} and 0.0 <= result.score <= 1.0
