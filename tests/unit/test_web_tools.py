"""serper_search, s2_search, jina_browse and crawl4ai_browse against stand-ins of their services on 127.0.0.1
(tests/helpers/web_services.py).

The stand-ins answer with the real reply shapes of each API (and its error statuses, slow answers, 429s,
empty results); the assertions pin the request open-instruct's client sends and the observation text it
gives the model. The real multi-turn path on a vLLM engine is in tests/integration/test_agent_engine.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle
import socket
import time
import urllib.parse

import pytest
from helpers.web_services import CRAWL4AI_KEY, KEYS, S2_REPLY, crawl_reply, jina_page, web_stub_server

from open_instruct.agents.settings import AgentSettings, ToolSpec
from open_instruct.agents.tools import Toolbox
from open_instruct.agents.web_tools import (
    NO_RESULTS,
    HostedServiceConfig,
    JinaConfig,
    S2Config,
    SerperConfig,
    url_refusal,
    with_credentials,
)
from open_instruct.config.core import ConfigError, parse_config
from open_instruct.extensions import registered_tools
from open_instruct.grpo_fast import checked_config


@pytest.fixture(scope="module")
def server():
    with web_stub_server() as running:
        yield running


@pytest.fixture
def stub(server, tmp_path, monkeypatch):
    """The stand-in, emptied, with every variable the four tools read pointing at it."""
    service, url = server
    service.reset()
    blocklist = tmp_path / "blocklist.txt"
    blocklist.write_text("  spam.example\n\nads.example  \n")
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CRAWL4AI_API_URL", url + "/crawl4ai/")
    monkeypatch.setenv("CRAWL4AI_API_KEY", CRAWL4AI_KEY)
    monkeypatch.setenv("CRAWL4AI_BLOCKLIST_PATH", str(blocklist))
    service.url = url
    return service


def public_dns(host: str) -> list[str]:
    """Every name resolves to a public address (example.com's), so no test needs DNS."""
    return ["93.184.215.14"]


def call(kind: str, args: dict, resolve=public_dns, **config):
    async def go():
        browse = kind in ("jina_browse", "crawl4ai_browse")
        cls = registered_tools()[kind]
        tool = cls(kind, config, resolve=resolve) if browse else cls(kind, config)
        try:
            return await tool.call(args)
        finally:
            await tool.close()

    return asyncio.run(go())


# --- serper_search -------------------------------------------------------------------------------------

SERPER_REPLY = {
    "searchParameters": {"q": "capital of france", "type": "search", "num": 2, "engine": "google"},
    "answerBox": {"title": "France / Capital", "answer": "Paris"},
    "knowledgeGraph": {"title": "Paris", "type": "Capital of France"},
    "organic": [
        {
            "title": "Paris - Wikipedia",
            "link": "https://en.wikipedia.org/wiki/Paris",
            "snippet": "Paris is the capital of France.",
            "position": 1,
        },
        {"title": "No snippet here", "link": "https://example.com/empty", "position": 2},
        {"title": "Paris travel", "link": "https://example.com/travel", "snippet": "Visit Paris.", "position": 3},
        {"title": "Beyond num_results", "link": "https://example.com/4", "snippet": "cut", "position": 4},
    ],
    "peopleAlsoAsk": [{"question": "Is Paris big?", "snippet": "Yes."}],
    "relatedSearches": [{"query": "paris population"}],
}


def test_serper_sends_openinstructs_request_and_formats_hits_after_the_answer_box(stub):
    stub.script("/search", (200, SERPER_REPLY))
    result = call("serper_search", {"query": "capital of france"}, base_url=stub.url, num_results=3)
    assert result.ok
    assert result.result == (
        "**Direct Answer:** Paris\n\n"
        "**Paris - Wikipedia**\nParis is the capital of France.\nSource: https://en.wikipedia.org/wiki/Paris\n\n"
        "**Paris travel**\nVisit Paris.\nSource: https://example.com/travel"
    )
    [sent] = stub.requests
    assert (sent["method"], sent["path"]) == ("POST", "/search")
    assert sent["headers"]["X-API-KEY"] == "serper-key" and sent["headers"]["Content-Type"] == "application/json"
    assert json.loads(sent["body"]) == {"q": "capital of france", "num": 3}


def test_serper_featured_snippet_and_no_results(stub):
    stub.script("/search", (200, {"answerBox": {"snippet": "About 2.1 million."}, "organic": []}), (200, {}))
    featured = call("serper_search", {"query": "paris population"}, base_url=stub.url)
    assert featured.result == "**Featured Snippet:** About 2.1 million." and featured.ok
    empty = call("serper_search", {"query": "zzzz"}, base_url=stub.url)
    # open-instruct counts an empty search as a failed call: the text is both observation and error
    assert (empty.result, empty.error) == (NO_RESULTS, NO_RESULTS) == ("Query returned no results.",) * 2


# --- s2_search -----------------------------------------------------------------------------------------


def test_s2_gets_snippet_search_with_limit_and_query_and_joins_snippets(stub):
    stub.script("/graph/v1/snippet/search", (200, S2_REPLY), (200, {"data": [], "retrievalVersion": "pa1-v1"}))
    result = call("s2_search", {"query": "attention & transformers"}, base_url=stub.url + "/graph/v1")
    assert result.ok and result.result == "Attention is all you need.\nTransformers replace recurrence."
    sent = stub.requests[0]
    path, _, query = sent["path"].partition("?")
    assert (sent["method"], path, sent["body"]) == ("GET", "/graph/v1/snippet/search", b"")
    assert urllib.parse.parse_qs(query) == {"limit": ["10"], "query": ["attention & transformers"]}
    assert sent["headers"]["x-api-key"] == "s2-key"
    empty = call("s2_search", {"query": "nothing"}, base_url=stub.url + "/graph/v1", num_results=2)
    assert (empty.result, empty.error) == (NO_RESULTS, NO_RESULTS)
    assert "limit=2" in stub.requests[1]["path"]


# --- jina_browse ---------------------------------------------------------------------------------------


def test_jina_gets_the_reader_url_with_the_bearer_key_and_prefixes_the_title(stub):
    stub.script("/https:", (200, jina_page("Example Domain", "This domain is for use in examples.")))
    result = call("jina_browse", {"url": "  https://example.com/a b?x=1  "}, base_url=stub.url)
    assert result.ok and result.result == "# Example Domain\n\nThis domain is for use in examples."
    [sent] = stub.requests
    # the page URL, quoted with only ':' and '/' kept, is the reader's path (aiohttp un-escapes '=' and '&')
    assert (sent["method"], sent["path"]) == ("GET", "/https://example.com/a%20b%3Fx=1")
    headers = sent["headers"]
    assert headers["Authorization"] == "Bearer jina-key" and headers["X-Return-Format"] == "markdown"
    assert headers["Accept"] == "application/json"


def test_jina_without_a_title_gives_the_content_and_a_non_200_code_an_error(stub):
    stub.script("/https:", (200, jina_page("", "bare content")), (200, {"code": 451, "message": "Blocked"}))
    assert call("jina_browse", {"url": "https://example.com"}, base_url=stub.url).result == "bare content"
    blocked = call("jina_browse", {"url": "https://example.com"}, base_url=stub.url)
    assert (blocked.result, blocked.error) == ("Jina API error: Blocked",) * 2


# --- crawl4ai_browse -----------------------------------------------------------------------------------


def test_crawl4ai_posts_the_docker_api_payload_with_the_blocklist_and_prefers_fit_markdown(stub):
    markdown = {"raw_markdown": "raw", "markdown_with_citations": "c", "fit_markdown": "pruned text"}
    stub.script("/crawl4ai/crawl", (200, crawl_reply(markdown=markdown, metadata={"title": "Example"})))
    result = call("crawl4ai_browse", {"url": " https://example.com/ "}, timeout=30)
    assert result.ok and result.result == "# Example\n\npruned text"
    [sent] = stub.requests
    assert (sent["method"], sent["path"]) == ("POST", "/crawl4ai/crawl")
    assert sent["headers"]["x-api-key"] == CRAWL4AI_KEY
    assert json.loads(sent["body"]) == {
        "urls": ["https://example.com/"],
        "browser_config": {"type": "BrowserConfig", "params": {"headless": True}},
        "crawler_config": {
            "type": "CrawlerRunConfig",
            "params": {
                "cache_mode": "enabled",
                "word_count_threshold": 10,
                "exclude_social_media_links": True,
                "excluded_tags": ["form", "header", "footer", "nav"],
                "page_timeout": 29000,
                "exclude_domains": ["spam.example", "ads.example"],
                "exclude_external_links": True,
            },
        },
    }


def test_crawl4ai_options_truncation_html_fallback_and_failures(stub):
    stub.script(
        "/crawl4ai/crawl",
        (200, crawl_reply(markdown="x" * 30, metadata={"title": "T"})),
        (200, crawl_reply(markdown={"raw_markdown": "", "fit_markdown": ""}, html="<p>page</p>")),
        (200, crawl_reply(success=False, error_message="net::ERR_NAME_NOT_RESOLVED")),
        (200, {"success": False, "results": []}),
    )
    config = {"max_content_length": 20, "bypass_cache": True, "ignore_links": False}
    cut = call("crawl4ai_browse", {"url": "https://a.example"}, **config)
    assert cut.result == "# T\n\n" + "x" * 15 + "\n\n[Content truncated]"
    params = json.loads(stub.requests[0]["body"])["crawler_config"]["params"]
    assert params["cache_mode"] == "bypass" and "exclude_external_links" not in params
    html = call("crawl4ai_browse", {"url": "https://b.example"}, include_html=True)
    assert html.ok and html.result == "<p>page</p>"
    failed = call("crawl4ai_browse", {"url": "https://c.example"})
    assert (failed.result, failed.error) == ("Crawl4AI error: net::ERR_NAME_NOT_RESOLVED",) * 2
    nothing = call("crawl4ai_browse", {"url": "https://d.example"})
    assert nothing.result == "Crawl4AI error: No results returned" and not nothing.ok


# --- the page the model chooses ------------------------------------------------------------------------

DNS = {
    "example.com": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"],
    "internal.test": ["127.0.0.1"],
    "metadata.test": ["169.254.169.254"],
    "split.test": ["93.184.215.14", "10.1.2.3"],
}


def fake_dns(host: str) -> list[str]:
    if host not in DNS:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return DNS[host]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///etc/passwd", "scheme 'file' is not http or https"),
        ("http://127.0.0.1/", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
        ("http://[::1]/", "::1 is a loopback address"),
        ("http://10.0.0.1/", "10.0.0.1 is a private address"),
        ("http://internal.test/admin", "internal.test resolves to 127.0.0.1, a loopback address"),
        ("http://metadata.test/latest", "resolves to 169.254.169.254, a link-local address"),
        ("https://split.test/", "split.test resolves to 10.1.2.3, a private address"),  # any address counts
        ("http://172.16.5.4:8080/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://[fc00::1]/", "fc00::1 is a private address"),
        ("http://[fe80::1]/", "link-local"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://0.0.0.0:8000/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://240.0.0.1/", "reserved"),
        ("http://100.64.0.1/", "non-public"),  # carrier-grade NAT
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 is a loopback address"),  # IPv4-mapped
        ("http://[2002:7f00:1::]/", "loopback"),  # 6to4 of 127.0.0.1
        ("http://2130706433/", "2130706433 (127.0.0.1) is a loopback address"),  # one number, as browsers read it
        ("http://0x7f.1/", "0x7f.1 (127.0.0.1) is a loopback address"),
        ("http://１２７.０.０.１/", "loopback"),  # full-width digits fold to ASCII
        ("http://127.0.0.1\\@example.com/", "user info or a backslash"),  # a browser's host is 127.0.0.1
        ("http://user:pw@example.com/", "user info"),
        ("http://%31%32%37.0.0.1/", "characters a host name cannot have"),
        ("http:///etc/passwd", "characters a host name cannot have"),
        ("gopher://example.com/", "scheme 'gopher'"),
        ("javascript:alert(1)", "scheme 'javascript'"),
        ("raw:<h1>hi</h1>", "scheme 'raw'"),  # Crawl4AI's inline-HTML form
        ("example.com/page", "scheme '(none)'"),
        ("http://nowhere.test/", "host nowhere.test does not resolve"),
        ("http://example.com:99999/", "does not parse"),
    ],
)
def test_the_url_guard_refuses_what_is_not_public_http(url, why):
    refusal = url_refusal(url, fake_dns)
    assert refusal is not None and refusal.startswith("Refused URL: ") and "\n" not in refusal
    assert why in refusal, refusal


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a b?x=1",
        "HTTP://Example.COM:8080/path#frag",
        "http://93.184.215.14/",
        "https://[2606:4700::1111]/dns-query",
        "  https://example.com  ",
    ],
)
def test_the_url_guard_accepts_public_http(url):
    assert url_refusal(url, fake_dns) is None


@pytest.mark.parametrize("kind", ["jina_browse", "crawl4ai_browse"])
@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "http://169.254.169.254/latest/meta-data", "http://internal.test/", "http://[::1]/"]
)
def test_a_refused_url_is_the_observation_and_nothing_is_sent(stub, kind, url):
    # The tools' own service endpoint is the stand-in on 127.0.0.1: only the model's URL is checked.
    config = {"base_url": stub.url} if kind == "jina_browse" else {}
    result = call(kind, {"url": url}, resolve=fake_dns, **config)
    assert result.result.startswith("Refused URL: ") and result.error == result.result
    assert not stub.requests


# --- transport: errors, retries, timeouts --------------------------------------------------------------


def test_a_4xx_is_reported_at_once_without_retrying(stub):
    stub.script("/search", (403, {"message": "Unauthorized."}))
    result = call("serper_search", {"query": "q"}, base_url=stub.url)
    assert (result.result, result.error) == ("HTTP error: 403 Forbidden",) * 2
    assert len(stub.requests) == 1


def test_a_429_is_retried_with_backoff_then_succeeds(stub):
    stub.script("/https:", (429, {"message": "slow down"}), (200, jina_page("Back", "again")))
    started = time.monotonic()
    result = call("jina_browse", {"url": "https://example.com"}, base_url=stub.url)
    assert result.ok and result.result == "# Back\n\nagain"
    assert len(stub.requests) == 2 and time.monotonic() - started >= 0.4  # waited before the second try


def test_500s_exhaust_the_retries_and_the_last_status_is_the_observation(stub):
    stub.script("/graph/v1/snippet/search", (500, {"error": "internal"}))
    result = call("s2_search", {"query": "q"}, base_url=stub.url + "/graph/v1")
    assert (result.result, result.error) == ("HTTP error: 500 Internal Server Error",) * 2
    assert len(stub.requests) == 4  # open-instruct's three retries
    call("s2_search", {"query": "q"}, base_url=stub.url + "/graph/v1", max_retries=0)
    assert len(stub.requests) == 5


def test_a_slow_service_times_out_with_openinstructs_text(stub):
    stub.script("/search", (200, SERPER_REPLY, 2.0))
    started = time.monotonic()
    result = call("serper_search", {"query": "q"}, base_url=stub.url, timeout=0.5)
    assert result.timed_out and (result.result, result.error) == ("Timeout after 0.5 seconds",) * 2
    assert time.monotonic() - started < 1.5


def test_an_unreachable_service_and_a_reply_that_is_not_json(stub):
    down = call("serper_search", {"query": "q"}, base_url="http://127.0.0.1:9", max_retries=0)
    assert down.result.startswith("Connection error: ") and down.error == down.result
    stub.script("/search", (200, "<html>maintenance</html>"))
    garbled = call("serper_search", {"query": "q"}, base_url=stub.url)
    assert garbled.result.startswith("Bad reply: ") and not garbled.ok


@pytest.mark.parametrize(
    ("kind", "args", "message"),
    [
        ("serper_search", {"query": "  "}, "Empty query. Please provide a search query."),
        ("s2_search", {}, "Empty query. Please provide a search query."),
        ("jina_browse", {"url": ""}, "Empty URL. Please provide a URL to fetch."),
        ("crawl4ai_browse", {"url": None}, "Empty URL. Please provide a URL to fetch."),
    ],
)
def test_empty_input_gives_an_empty_observation_and_sends_nothing(stub, kind, args, message):
    result = call(kind, args)
    assert (result.result, result.error) == ("", message) and not stub.requests


def test_pool_size_limits_concurrent_calls_of_one_tool(stub):
    stub.script("/search", (200, SERPER_REPLY, 0.3))
    spec = ToolSpec("serper_search", "search", {"base_url": stub.url, "pool_size": 1})

    async def go():
        toolbox = Toolbox(AgentSettings(tool_specs=(spec,), pool_size=8))
        try:
            return await asyncio.gather(*(toolbox.call("search", {"query": str(i)}) for i in range(3)))
        finally:
            await toolbox.close()

    assert all(r.ok for r in asyncio.run(go()))
    assert len(stub.requests) == 3 and stub.max_active == 1


# --- configuration -------------------------------------------------------------------------------------


def test_schemas_are_openinstructs():
    expected = {
        "serper_search": ("Google search via the Serper API", "query", "The search query for Google"),
        "s2_search": (
            "Searches Semantic Scholar for academic papers and citations",
            "query",
            "The search query for Semantic Scholar",
        ),
        "jina_browse": (
            "Fetches and converts webpage content to clean markdown using Jina Reader API",
            "url",
            "The URL of the webpage to fetch",
        ),
        "crawl4ai_browse": (
            "Fetches and converts webpage content to clean markdown using Crawl4AI",
            "url",
            "The URL of the webpage to fetch",
        ),
    }
    for kind, (description, argument, help_text) in expected.items():
        config = {"api_key": "k"} | ({"api_url": "http://x", "blocklist": []} if kind == "crawl4ai_browse" else {})
        definition = registered_tools()[kind]("my_" + kind, config).definition
        assert definition.as_openai() == {
            "type": "function",
            "function": {
                "name": "my_" + kind,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {argument: {"type": "string", "description": help_text}},
                    "required": [argument],
                },
            },
        }


def test_the_hosted_services_share_their_keys_and_keep_their_defaults():
    """serper_search, s2_search and jina_browse take the keys of `HostedServiceConfig`, each with the defaults
    its --tool_configs always had (a pin: a user's JSON means what it meant)."""
    defaults = {
        SerperConfig: {"timeout": 10, "base_url": "https://google.serper.dev", "num_results": 5},
        S2Config: {"timeout": 60, "base_url": "https://api.semanticscholar.org/graph/v1", "num_results": 10},
        JinaConfig: {"timeout": 30, "base_url": "https://r.jina.ai"},
    }
    for config_class, own in defaults.items():
        assert issubclass(config_class, HostedServiceConfig)
        keys = {f.name: f.default for f in dataclasses.fields(config_class)}
        assert keys == {**own, "api_key": None, "max_retries": 3}, config_class.__name__
        assert "secret" not in repr(config_class(api_key="secret"))


def test_the_four_tools_parse_with_their_variables_set(stub):
    configs = ['{"num_results": 3, "timeout": 5}', '{"num_results": 4, "pool_size": 2}', '{"timeout": 9}', "{}"]
    cfg = parse_config(
        ["--tools", "serper_search", "s2_search", "jina_browse", "crawl4ai_browse", "--tool_configs", *configs]
    )
    assert [s.kind for s in AgentSettings.from_config(cfg).tool_specs] == list(cfg.tools.tools)


@pytest.mark.parametrize(
    ("kind", "variable"),
    [
        ("serper_search", "SERPER_API_KEY"),
        ("s2_search", "S2_API_KEY"),
        ("jina_browse", "JINA_API_KEY"),
        ("crawl4ai_browse", "CRAWL4AI_API_URL"),
        ("crawl4ai_browse", "CRAWL4AI_API_KEY"),
        ("crawl4ai_browse", "CRAWL4AI_BLOCKLIST_PATH"),
    ],
)
def test_a_missing_variable_fails_at_parse_time_naming_it(stub, monkeypatch, kind, variable):
    monkeypatch.delenv(variable)
    with pytest.raises(ConfigError) as error:
        checked_config(["--tools", kind])
    assert f"--tools {kind} needs the {variable} environment variable" in str(error.value)


def test_a_missing_blocklist_file_and_an_unknown_config_key_fail_at_parse_time(stub, monkeypatch, tmp_path):
    monkeypatch.setenv("CRAWL4AI_BLOCKLIST_PATH", str(tmp_path / "absent.txt"))
    with pytest.raises(ConfigError, match=r"blocklist file .*absent\.txt \(CRAWL4AI_BLOCKLIST_PATH\) is missing"):
        checked_config(["--tools", "crawl4ai_browse"])
    with pytest.raises(ConfigError, match="--tool_configs for 'serper_search': unknown key 'num'"):
        checked_config(["--tools", "serper_search", "--tool_configs", '{"num": 3}'])


def test_with_credentials_carries_the_environment_into_the_config_and_hides_the_key(stub, monkeypatch):
    specs = [with_credentials(ToolSpec(kind, kind)) for kind in ("serper_search", "crawl4ai_browse", "python")]
    serper, crawl, python = pickle.loads(pickle.dumps(specs))  # as they cross into the engine actors
    assert serper.config == {"api_key": "serper-key"} and python == ToolSpec("python", "python")
    assert crawl.config == {
        "api_url": stub.url + "/crawl4ai/",
        "api_key": CRAWL4AI_KEY,
        "blocklist": ["spam.example", "ads.example"],
    }
    assert "serper-key" not in repr(serper) and CRAWL4AI_KEY not in repr(crawl)
    for variable in (*KEYS, "CRAWL4AI_API_URL", "CRAWL4AI_API_KEY", "CRAWL4AI_BLOCKLIST_PATH"):
        monkeypatch.delenv(variable)
    tool = registered_tools()["serper_search"]("search", serper.config)  # an engine without the variables
    assert "serper-key" not in repr(tool.settings)
    stub.script("/crawl4ai/crawl", (200, crawl_reply(markdown="ok")))
    assert call("crawl4ai_browse", {"url": "https://example.com"}, **crawl.config).result == "ok"
    assert json.loads(stub.requests[0]["body"])["crawler_config"]["params"]["exclude_domains"] == [
        "spam.example",
        "ads.example",
    ]
