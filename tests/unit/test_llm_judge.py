"""The general-* LLM-judge verifiers without a real server: the score parsed from the judge's reply, the
prompt's length cap, and a judge that times out or has no endpoint giving reward 0 and a counted error.
(Against vLLM's own OpenAI-compatible server: tests/nightly/test_llm_judge_server.py.)"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.judge import score_with

from open_instruct.config.rewards import RewardConfig
from open_instruct.rewards import RewardSettings
from open_instruct.rewards.llm_judge import judge_prompt, parse_score


def test_scores_are_parsed_from_the_judges_json_and_scaled():
    assert parse_score('{"REASONING": "ok", "SCORE": 7}') == pytest.approx(0.7)
    assert parse_score("SCORE: 12") == 1.0 and parse_score('"score": -3') == 0.0
    with pytest.raises(ValueError, match="no SCORE"):
        parse_score("I think it is fine")
    prompt = judge_prompt("quality", "q" * 10_000, "r" * 10_000, "ref", max_context_tokens=1024)
    assert len(prompt) < 2000 and prompt.endswith('"SCORE": <integer 0-10>}')


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
        outcome, errors = score_with(RewardSettings(RewardConfig(llm_judge_timeout=0.5), judge_base_url=url))
    finally:
        server.shutdown()
    assert outcome.reward == 0.0 and errors["general-quality"] == 1
    assert "timed out" in outcome.errors[0].lower()


def test_no_endpoint_is_a_counted_error_naming_the_variable():
    outcome, errors = score_with(RewardSettings(judge_base_url=""))
    assert outcome.reward == 0.0 and "LLM_JUDGE_BASE_URL" in outcome.errors[0] and errors["general-quality"] == 1
