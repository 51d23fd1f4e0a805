"""The general-* LLM-judge verifiers against a real OpenAI-compatible server: vLLM's, serving the tiny model,
started here. The random model cannot grade, so the request asks vLLM for structured output (a regex for
the judge's JSON reply); the score parsed from it flows through the reward pool. A judge that times out
gives reward 0 and a counted error."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from open_instruct.rewards import VerifierInput, VerifierSettings
from open_instruct.rewards.llm_judge import judge_prompt, parse_score
from open_instruct.rewards.scoring import RewardScorer, RewardSettings

JUDGE_REGEX = r'\{"REASONING": "[a-z ]{1,20}", "SCORE": [0-9]\}'


def test_scores_are_parsed_from_the_judges_json_and_scaled():
    assert parse_score('{"REASONING": "ok", "SCORE": 7}') == pytest.approx(0.7)
    assert parse_score("SCORE: 12") == 1.0 and parse_score('"score": -3') == 0.0
    with pytest.raises(ValueError, match="no SCORE"):
        parse_score("I think it is fine")
    prompt = judge_prompt("quality", "q" * 10_000, "r" * 10_000, "ref", max_context_tokens=1024)
    assert len(prompt) < 2000 and prompt.endswith('"SCORE": <integer 0-10>}')


def score_with(settings: VerifierSettings, verifier: str = "general-quality"):
    with RewardScorer(RewardSettings(verifier=settings, verifier_timeout_s=60), max_workers=1) as scorer:
        outcome = asyncio.run(
            scorer.score("s/0", "Paris.", ["Paris"], [verifier], "stop", 2, query="Capital of France?")
        )
        return outcome, scorer.error_counts


class _Slow(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(3)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_judge_that_times_out_scores_zero_and_is_counted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        outcome, errors = score_with(VerifierSettings(llm_judge_base_url=url, llm_judge_timeout=0.5))
    finally:
        server.shutdown()
    assert outcome.reward == 0.0 and errors["general-quality"] == 1
    assert "timed out" in outcome.errors[0].lower()


def test_no_endpoint_is_a_counted_error_naming_the_variable():
    outcome, errors = score_with(VerifierSettings(llm_judge_base_url=""))
    assert outcome.reward == 0.0 and "LLM_JUDGE_BASE_URL" in outcome.errors[0] and errors["general-quality"] == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server(model_path, tmp_path_factory):
    template = tmp_path_factory.mktemp("judge") / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("judge_log") / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--port", str(port),
         "--host", "127.0.0.1", "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager",
         "--kv-cache-memory-bytes", str(256 << 20), "--chat-template", str(template)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
        start_new_session=True,
    )  # fmt: skip
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


@pytest.mark.slow
def test_the_judge_returns_scores_from_a_local_vllm_server(judge_server):
    url, model = judge_server
    settings = VerifierSettings(
        llm_judge_base_url=url,
        llm_judge_model=f"hosted_vllm/{model}",  # a provider prefix, as litellm names are written, is dropped
        llm_judge_max_tokens=64,
        llm_judge_temperature=1.0,
        llm_judge_timeout=60,
        llm_judge_extra_body=json.dumps({"structured_outputs": {"regex": JUDGE_REGEX}}),
    )
    for verifier in ("general-quality", "general-factuality"):
        outcome, _ = score_with(settings, verifier)
        assert not outcome.errors, outcome.errors
        assert 0.0 <= outcome.per_verifier[verifier] <= 1.0
        assert outcome.reward == pytest.approx(10.0 * outcome.per_verifier[verifier])


WRITER_REGEX = (
    r'\{"positive_rubrics": \[\{"title": "[a-z]{1,12}", "description": "[a-z ]{1,30}"\}\], "negative_rubrics": \[\]\}'
)


@pytest.mark.slow
def test_evolving_rubrics_are_written_by_a_local_vllm_server_and_graded_by_it(judge_server):
    """One rubric-writing step against the real server, then the rubric verifier grades a response with the
    rubrics it wrote (each criterion a separate judge call)."""
    from open_instruct.rewards.evolving_rubrics import EvolvingRubrics, RubricGroup
    from open_instruct.rewards.llm_judge import ask_judge
    from open_instruct.rewards.rubric import rubric

    url, model = judge_server
    base = VerifierSettings(llm_judge_base_url=url, llm_judge_model=model, llm_judge_max_tokens=200)
    writer = dataclasses.replace(base, llm_judge_extra_body=json.dumps({"structured_outputs": {"regex": WRITER_REGEX}}))
    rubrics = EvolvingRubrics(max_active=3, generate=lambda prompt: ask_judge(prompt, writer))
    truth = json.dumps({"query": "What is 2 + 2?", "rubrics": [{"description": "Gives 4.", "weight": 1.0}]})
    group = RubricGroup("rows:0", (truth,), 0, ("It is 4.", "It is 5."))
    metrics = rubrics.step([group], step=0)
    assert metrics["evolving_rubrics/skipped"] == 0.0 and metrics["evolving_rubrics/num_new_rubrics"] == 1.0
    (new_truth,) = rubrics.overrides["rows:0"]
    written = json.loads(new_truth)
    assert written["rubrics"][0]["description"] == "Gives 4." and written["rubrics_types"] == ["persistent", "evolving"]
    judge = dataclasses.replace(
        base, llm_judge_extra_body=json.dumps({"structured_outputs": {"regex": r'\{"score": [0-2]\}'}})
    )
    result = rubric(VerifierInput(prediction="It is 4.", ground_truth=new_truth), judge)
    assert result.details == {"rubrics": 2, "failed": 0} and 0.0 <= result.score <= 1.0
