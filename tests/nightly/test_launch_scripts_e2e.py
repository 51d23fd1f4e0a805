"""Four of open-instruct's launch scripts train end to end on the real stack (vLLM, Ray, DeepSpeed) for two
steps, after the CPU substitutions of tests/helpers/launch_commands.py: a math run with a thinker template,
an environment run, a tool run against local stand-ins of the hosted services, and a two-learner ZeRO-3 run
with sequence parallelism. Every other flag is the script's own (--save_traces included, which is how the
tests see what the model was shown).

The random tiny model never writes a tool call by itself, so the tool and environment runs force the first
turn through structured outputs (`ForcedTurnsActor`); the parser, the tools, the observations and the
training that follow are the production path. Nor does it solve a math row: the ZeRO-3 script's
--active_sampling trains only groups with reward spread, so there one sample of each prompt is forced to the
row's answer and the other to a wrong one (the verifier still judges both).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.launch_commands import STEPS, substitute

from open_instruct.config.core import parse_config
from open_instruct.traces import read_traces

SEARCH_HIT = "Paris is the capital and largest city of France."


class _Serper(BaseHTTPRequestHandler):
    """Answers every POST the way google.serper.dev answers /search, every GET with a page of text."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        body = {"organic": [{"title": "Paris", "link": "https://example.org/paris", "snippet": SEARCH_HIT}]}
        self._send(json.dumps(body), "application/json")

    def do_GET(self):
        self._send(f"Title: Paris\n\n{SEARCH_HIT}", "text/plain")

    def _send(self, text: str, kind: str):
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoints():
    from code_server import code_server

    web = ThreadingHTTPServer(("127.0.0.1", 0), _Serper)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with code_server() as (_, code_url):
        yield {"http": f"http://127.0.0.1:{web.server_address[1]}", "code": code_url.removesuffix("/")}
    web.shutdown()


@pytest.fixture
def environment(monkeypatch):
    for name in ("SERPER_API_KEY", "JINA_API_KEY", "S2_API_KEY"):
        monkeypatch.setenv(name, "test-key")
    monkeypatch.setenv("WANDB_MODE", "offline")


def train(script, tmp_path, endpoints, learners=1, forced=()):
    """Run the substituted command for STEPS steps; the summary, the per-step metrics and the traces."""
    from helpers.forced_turns import ForcedTurnsActor

    from open_instruct.grpo_fast import run

    cfg = parse_config(substitute(script, tmp_path, endpoints, learners=learners))
    summary = run(cfg, engine_class=ForcedTurnsActor, engine_args=(tuple(forced),))
    metrics = [json.loads(line) for line in (tmp_path / "output_dir" / "metrics.jsonl").read_text().splitlines()]
    traces = list(read_traces(str(tmp_path / "rollouts_save_path"), cfg.run_name))
    return summary, metrics, traces


def assert_trained(summary, metrics, traces):
    assert summary["status"] == "completed"
    steps = [m["training_step"] for m in metrics if "training_step" in m and "loss/policy_avg" in m]
    assert len(steps) == len(set(steps)) == STEPS
    assert len(traces) >= STEPS * 8  # every trained sample is traced


def test_a_math_script_with_a_thinker_template_trains(tmp_path, endpoints, environment):
    # r1_simple_chat_postpend_think, the R1 format reward, --single_gpu_mode, --with_tracking (offline W&B)
    summary, metrics, traces = train("scripts/train/debug/single_gpu_on_beaker.sh", tmp_path, endpoints)
    assert_trained(summary, metrics, traces)
    assert all(t["verifier_names"] for t in traces)


def test_an_environment_script_trains_on_the_counter_game(tmp_path, endpoints, environment):
    # vllm_hermes calls to the counter environment the rows name; the first turn always increments
    call = r'<tool_call>\n\{"name": "increment", "arguments": \{\}\}\n</tool_call>'
    summary, metrics, traces = train("scripts/train/debug/envs/counter_1gpu.sh", tmp_path, endpoints, forced=(call,))
    assert_trained(summary, metrics, traces)
    calls = [call for t in traces for call in t["tool_calls"]]
    assert calls and all(c["name"] == "increment" and c["ok"] for c in calls[: len(traces)])


def test_a_tool_script_calls_the_search_stand_in_and_trains_on_what_it_returned(tmp_path, endpoints, environment):
    # python + serper_search + jina_browse named code/search/browse, as the script configures them
    call = r'<tool_call>\n\{"name": "search", "arguments": \{"query": "capital of France"\}\}\n</tool_call>'
    script = "scripts/train/debug/tools/qwen3_vllm_hermes_parser_debug.sh"
    summary, metrics, traces = train(script, tmp_path, endpoints, forced=(call,))
    assert_trained(summary, metrics, traces)
    searched = [t for t in traces if any(c["name"] == "search" and c["ok"] for c in t["tool_calls"])]
    assert searched and all(SEARCH_HIT in t["response_text"] for t in searched)


def test_a_two_learner_zero3_script_with_sequence_parallelism_trains(tmp_path, endpoints, environment):
    from helpers.forced_turns import GROUND_TRUTH

    answers = (r"\\boxed\{" + GROUND_TRUTH + r"\}", r"\\boxed\{0\}")  # right for sample 0, wrong for sample 1
    script = "scripts/train/debug/grpo_fast_3_gpu.sh"
    summary, metrics, traces = train(script, tmp_path, endpoints, learners=2, forced=(answers,))
    assert_trained(summary, metrics, traces)
    assert all(m["batch/filtered_zero_std_prompts_total"] == 0 for m in metrics if "training_step" in m)
