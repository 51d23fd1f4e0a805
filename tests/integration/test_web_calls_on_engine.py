"""The hosted web tools on the real multi-turn path: a vLLM engine, with the model forced to write one call of
each (serper_search, jina_browse, s2_search, crawl4ai_browse) against the stand-ins of their services
(tests/helpers/web_services.py), gets each service's answer as its observation, and the keys are sent by the
driver-resolved credentials, never read by the engine process."""

from __future__ import annotations

import json
import re

import pytest
from helpers.forced_engine import forced_turns_engine, the_one_sample
from helpers.web_services import CRAWL4AI_KEY, KEYS, S2_REPLY, crawl_reply, jina_page, web_stub_server

from open_instruct.agents.settings import ToolSpec
from open_instruct.agents.web_tools import with_credentials


@pytest.fixture(scope="module")
def server():
    with web_stub_server() as running:
        yield running


SEARCH_REPLY = {"organic": [{"title": "Paris", "link": "https://ex.com/paris", "snippet": "Capital of France."}]}
SEARCH_TEXT = "**Paris**\nCapital of France.\nSource: https://ex.com/paris"
BROWSE_TEXT = "# Paris\n\nParis is a city."


@pytest.fixture(scope="module")
def pool(model_path, server):
    """One engine whose `search`/`browse` tools are serper_search/jina_browse against the stand-in. The keys
    are resolved here, in the driver, then removed: the engine process never sees the variables."""
    _, url = server
    with pytest.MonkeyPatch.context() as env:
        for name, value in KEYS.items():
            env.setenv(name, value)
        tools = (
            with_credentials(ToolSpec("serper_search", "search", {"base_url": url, "timeout": 10})),
            with_credentials(ToolSpec("jina_browse", "browse", {"base_url": url, "timeout": 10})),
            with_credentials(ToolSpec("s2_search", "snippets", {"base_url": url + "/graph/v1", "timeout": 10})),
            ToolSpec(
                "crawl4ai_browse", "crawl", {"api_url": url + "/crawl4ai/", "api_key": CRAWL4AI_KEY, "blocklist": []}
            ),
        )
    with forced_turns_engine(model_path, tools, max_model_len=1024) as pool:
        yield pool


def test_each_hosted_tools_observation_lands_in_the_completion(pool, server, model_path):
    from transformers import AutoTokenizer

    from open_instruct.messages import AgentRequest, PromptRequest, SamplingSettings

    stub, _ = server
    stub.reset()
    stub.script("/search", (200, SEARCH_REPLY))
    stub.script("/https:", (200, jina_page("Paris", "Paris is a city.")))
    stub.script("/graph/v1/snippet/search", (200, S2_REPLY))
    stub.script(
        "/crawl4ai/crawl", (200, crawl_reply(markdown={"fit_markdown": "pruned text"}, metadata={"title": "Ex"}))
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Search, then browse."}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    request = PromptRequest(
        prompt_id="web:0", prompt_token_ids=tuple(ids), ground_truths=("Paris",), verifier_names=("gsm8k",),
        sampling=SamplingSettings(max_tokens=640, temperature=1.0), num_samples=1, seed=3, admitted_version=0,
        agent=AgentRequest(),
    )  # fmt: skip
    turns = ("<search>paris</search>", "<browse>https://ex.com/paris</browse>", "<snippets>attention</snippets>")
    pool.call_all("set_forced_turns", (*map(re.escape, turns), re.escape("<crawl>https://example.com/</crawl>")))
    pool.submit([request])
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
    assert browse["path"] == "/https://ex.com/paris" and browse["headers"]["Authorization"] == "Bearer jina-key"
