"""open-instruct's four web tools: `serper_search` (Google results through Serper), `s2_search` (Semantic
Scholar snippet search), `jina_browse` (Jina Reader) and `crawl4ai_browse` (a Crawl4AI deployment).

They exist so that open-instruct's search-agent recipes (the DR Tulu scripts pass `--tools serper_search
jina_browse s2_search`) run here unchanged: each tool sends the request open-instruct's client sends, with
the key from the same environment variable, and gives the model the same observation text, so a policy
trained on one trainer sees the same tool answers on the other. The services are third-party; tests and
self-hosted deployments point a tool elsewhere with its `base_url` (crawl4ai: `api_url`) config key.

The browse tools fetch a page the model chose, so the URL is checked first (`url_refusal`): only http(s) to
a host whose every address is public; `file://`, loopback, private, link-local (cloud metadata), multicast
and reserved addresses become a one-line error observation and nothing is sent. The configured service
endpoint (`base_url` / `api_url`) is ours, not the model's, and is not checked.

A missing variable fails at parse time (`config_problems` builds every tool once; constructors do no
network I/O). `with_credentials` lets the driver copy the variables into the tool configs, so generation
actors on other nodes need neither the variables nor the blocklist file; keys never show in a repr.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from open_instruct.agents.base import StepResult, ToolSpec, string_tool
from open_instruct.agents.http_client import HttpClient, parse_tool_config
from open_instruct.extensions import register_tool, registered_tools

NO_RESULTS = "Query returned no results."
_EMPTY_QUERY = "Empty query. Please provide a search query."
_EMPTY_URL = "Empty URL. Please provide a URL to fetch."


Resolver = Callable[[str], list[str]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_HOST_CHARS = re.compile(r"[a-z0-9._:-]+")


def resolve_host(host: str) -> list[str]:
    """Every address the system resolver gives `host`."""
    return [info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]


def _embedded(address: IPAddress) -> list[IPAddress]:
    # IPv6 forms that carry an IPv4 address reach that address (mapped, 6to4, Teredo's client); it comes
    # first because it names the refusal better than the IPv6 range around it.
    if isinstance(address, ipaddress.IPv4Address):
        return [address]
    teredo = address.teredo
    inner = [address.ipv4_mapped, address.sixtofour, teredo[1] if teredo else None]
    return [*(a for a in inner if a is not None), address]


def address_refusal(address: IPAddress) -> str | None:
    """The kind of address that makes `address` not public ("loopback", "private", ...), or None."""
    for a in _embedded(address):
        for kind, hit in (
            ("loopback", a.is_loopback),
            ("link-local", a.is_link_local),
            ("multicast", a.is_multicast),
            ("unspecified", a.is_unspecified),
            ("reserved", a.is_reserved),
            ("private", a.is_private),
            ("non-public", not a.is_global),
        ):
            if hit:
                return kind
    return None


def _literal_address(host: str) -> tuple[IPAddress, str] | None:
    """The address a host written as one stands for, and how to name it in a refusal."""
    try:
        return ipaddress.ip_address(host), host
    except ValueError:
        pass
    try:  # the shorthand IPv4 forms browsers accept too: 127.1, 0x7f000001, 2130706433
        address = ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None
    return address, f"{host} ({address})"


def url_refusal(url: str, resolve: Resolver = resolve_host) -> str | None:
    """Why a page the model chose must not be fetched (one line), or None. Only http(s) to a host whose
    every address is public: the service fetches what it is sent, so a `file://` URL, the cloud metadata
    address or a service on the trainer's network would come back to the policy as page text. Host forms
    that URL parsers read differently (user info, backslashes, whitespace, percent escapes) are refused."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as error:
        return f"Refused URL: it does not parse ({error})"
    if parts.scheme not in ("http", "https"):
        return f"Refused URL: scheme {parts.scheme or '(none)'!r} is not http or https"
    if "@" in parts.netloc or "\\" in parts.netloc:
        return "Refused URL: user info or a backslash in the host part"
    try:
        host = (parts.hostname or "").encode("idna").decode("ascii")  # browsers fold Unicode hosts the same way
    except UnicodeError:
        return f"Refused URL: host {parts.hostname!r} is not a valid name"
    if not _HOST_CHARS.fullmatch(host):
        return f"Refused URL: host {host!r} is empty or has characters a host name cannot have"
    literal = _literal_address(host)
    if literal is not None:
        kind = address_refusal(literal[0])
        return f"Refused URL: {literal[1]} is a {kind} address" if kind else None
    try:
        addresses = [ipaddress.ip_address(a) for a in resolve(host)]
    except (OSError, ValueError, UnicodeError):
        addresses = []
    if not addresses:
        return f"Refused URL: host {host} does not resolve"
    for address in addresses:
        kind = address_refusal(address)
        if kind:
            return f"Refused URL: {host} resolves to {address}, a {kind} address"
    return None


class _Secret(str):
    """An API key that stays out of reprs (configs cross into actors and end up in error messages)."""

    def __repr__(self) -> str:
        return "'<hidden>'"


@dataclass(frozen=True)
class HostedServiceConfig:
    """The keys of a tool that calls a third-party API at a known address; each tool's subclass gives its
    service's `timeout` and `base_url` defaults. crawl4ai_browse has its own: its service is a deployment of
    yours, at `api_url` (CRAWL4AI_API_URL) with no default."""

    timeout: float
    base_url: str  # tests and self-hosted deployments point the tool elsewhere
    api_key: str | None = field(default=None, repr=False)  # None: the tool's variable (`from_env`)
    max_retries: int = 3


@dataclass(frozen=True)
class SerperConfig(HostedServiceConfig):
    timeout: float = 10
    base_url: str = "https://google.serper.dev"
    num_results: int = 5


@dataclass(frozen=True)
class S2Config(HostedServiceConfig):
    timeout: float = 60
    base_url: str = "https://api.semanticscholar.org/graph/v1"
    num_results: int = 10


@dataclass(frozen=True)
class JinaConfig(HostedServiceConfig):
    timeout: float = 30
    base_url: str = "https://r.jina.ai"


@dataclass(frozen=True)
class Crawl4AIConfig:
    timeout: float = 180
    ignore_links: bool = True
    bypass_cache: bool = False
    include_html: bool = False
    max_content_length: int | None = 5000  # None or 0: no limit
    api_url: str | None = None  # None: CRAWL4AI_API_URL
    api_key: str | None = field(default=None, repr=False)  # None: CRAWL4AI_API_KEY
    blocklist: list[str] | None = None  # domains; None: the lines of the file CRAWL4AI_BLOCKLIST_PATH names
    max_retries: int = 3


class _WebTool:
    """One HTTP request per call; every failure becomes the observation text open-instruct gives."""

    kind: ClassVar[str]
    config_class: ClassVar[type]
    from_env: ClassVar[dict[str, str]]  # config key -> the environment variable it defaults to
    description: ClassVar[str]
    argument: ClassVar[str]
    argument_help: ClassVar[str]
    empty_message: ClassVar[str]

    def __init__(self, call_name: str, config: dict[str, Any]):

        settings = parse_tool_config(self.config_class, self.kind, config)
        for key, variable in self.from_env.items():
            if getattr(settings, key) is None:
                value = os.environ.get(variable)
                if not value:
                    raise ValueError(f"--tools {self.kind} needs the {variable} environment variable")
                settings = dataclasses.replace(settings, **{key: value})
        self.settings = settings
        self.call_name = call_name
        self.timeout_s = float(settings.timeout)
        self.definition = string_tool(call_name, self.description, self.argument, self.argument_help)
        self._http = HttpClient()

    @classmethod
    def resolve(cls, config: dict[str, Any]) -> dict[str, Any]:
        """`config` with what the tool would read from this process's environment filled in."""
        resolved = dict(config)
        for key, variable in cls.from_env.items():
            if resolved.get(key) is None and os.environ.get(variable):
                resolved[key] = _Secret(os.environ[variable]) if key == "api_key" else os.environ[variable]
        return resolved

    def request(self, argument: str) -> tuple[str, str, Any, dict[str, str]]:
        """(method, url, JSON body or None, headers)."""
        raise NotImplementedError

    def observe(self, data: Any) -> tuple[str, str | None]:
        """(observation, error) from the decoded reply of a successful request."""
        raise NotImplementedError

    async def call(self, args: dict[str, Any]) -> StepResult:
        import aiohttp

        value = args.get(self.argument)
        argument = "" if value is None else str(value)
        if not argument.strip():
            # open-instruct shows the model nothing here; the message only reaches the statistics.
            return StepResult("", error=self.empty_message)
        method, url, body, headers = self.request(argument)
        try:
            status, reason, text = await self._http.request(
                method, url, body, self.settings.timeout, headers, self.settings.max_retries
            )
        except TimeoutError:
            message = f"Timeout after {self.settings.timeout:g} seconds"
            return StepResult(message, error=message, timed_out=True)
        except aiohttp.ClientError as error:
            message = f"Connection error: {error}"
            return StepResult(message, error=message)
        if status >= 400:
            message = f"HTTP error: {status} {reason}"
            return StepResult(message, error=message)
        try:
            data = json.loads(text)
        except ValueError:
            message = f"Bad reply: HTTP {status} with a body that is not JSON"
            return StepResult(message, error=message)
        if not isinstance(data, dict):
            message = f"Bad reply: HTTP {status} with a JSON {type(data).__name__}, not an object"
            return StepResult(message, error=message)
        observation, error = self.observe(data)
        return StepResult(observation, error=error)

    async def close(self) -> None:
        await self._http.close()


class SerperSearchTool(_WebTool):
    kind = "serper_search"
    config_class = SerperConfig
    from_env: ClassVar[dict[str, str]] = {"api_key": "SERPER_API_KEY"}
    description = "Google search via the Serper API"
    argument, argument_help = "query", "The search query for Google"
    empty_message = _EMPTY_QUERY

    def request(self, argument):
        headers = {"X-API-KEY": self.settings.api_key, "Content-Type": "application/json"}
        return (
            "POST",
            self.settings.base_url.rstrip("/") + "/search",
            {"q": argument, "num": self.settings.num_results},
            headers,
        )

    def observe(self, data):
        blocks = [
            f"**{hit.get('title', '')}**\n{hit['snippet']}\nSource: {hit.get('link', '')}"
            for hit in (data.get("organic") or [])[: self.settings.num_results]
            if isinstance(hit, dict) and hit.get("snippet")
        ]
        box = data.get("answerBox")
        if isinstance(box, dict) and "answer" in box:
            blocks.insert(0, f"**Direct Answer:** {box['answer']}")
        elif isinstance(box, dict) and "snippet" in box:
            blocks.insert(0, f"**Featured Snippet:** {box['snippet']}")
        if not blocks:
            return NO_RESULTS, NO_RESULTS
        return "\n\n".join(blocks).strip(), None


class S2SearchTool(_WebTool):
    kind = "s2_search"
    config_class = S2Config
    from_env: ClassVar[dict[str, str]] = {"api_key": "S2_API_KEY"}
    description = "Searches Semantic Scholar for academic papers and citations"
    argument, argument_help = "query", "The search query for Semantic Scholar"
    empty_message = _EMPTY_QUERY

    def request(self, argument):
        query = urllib.parse.urlencode({"limit": self.settings.num_results, "query": argument})
        return (
            "GET",
            f"{self.settings.base_url.rstrip('/')}/snippet/search?{query}",
            None,
            {"x-api-key": self.settings.api_key},
        )

    def observe(self, data):
        texts = [
            text
            for item in data.get("data") or []
            if isinstance(item, dict) and (text := (item.get("snippet") or {}).get("text"))
        ]
        if not texts:
            return NO_RESULTS, NO_RESULTS
        return "\n".join(texts).strip(), None


class _BrowseTool(_WebTool):
    """A tool whose argument is a page for the service to fetch: refused URLs never leave this process."""

    def __init__(self, call_name: str, config: dict[str, Any], resolve: Resolver | None = None):
        super().__init__(call_name, config)
        self._resolve = resolve or resolve_host  # tests pass a resolver so that no name needs DNS

    async def call(self, args: dict[str, Any]) -> StepResult:
        value = args.get(self.argument)
        url = "" if value is None else str(value)
        if url.strip():
            # getaddrinfo blocks; every other sample on this event loop keeps decoding meanwhile
            refusal = await asyncio.to_thread(url_refusal, url, self._resolve)
            if refusal:
                return StepResult(refusal, error=refusal)
        return await super().call(args)


class JinaBrowseTool(_BrowseTool):
    kind = "jina_browse"
    config_class = JinaConfig
    from_env: ClassVar[dict[str, str]] = {"api_key": "JINA_API_KEY"}
    description = "Fetches and converts webpage content to clean markdown using Jina Reader API"
    argument, argument_help = "url", "The URL of the webpage to fetch"
    empty_message = _EMPTY_URL

    def request(self, argument):
        # The page's URL is the reader's path; only its scheme and path separators stay unescaped.
        target = urllib.parse.quote(argument.strip(), safe=":/")
        headers = {
            "Accept": "application/json",
            "Authorization": f"Bearer {self.settings.api_key}",
            "X-Return-Format": "markdown",
        }
        return "GET", f"{self.settings.base_url.rstrip('/')}/{target}", None, headers

    def observe(self, data):
        if data.get("code") != 200:
            message = f"Jina API error: {data.get('message', 'Unknown error')}"
            return message, message
        page = data.get("data") or {}
        content, title = page.get("content") or "", page.get("title") or ""
        return (f"# {title}\n\n{content}" if title and content else content), None


class Crawl4AIBrowseTool(_BrowseTool):
    kind = "crawl4ai_browse"
    config_class = Crawl4AIConfig
    from_env: ClassVar[dict[str, str]] = {"api_url": "CRAWL4AI_API_URL", "api_key": "CRAWL4AI_API_KEY"}
    description = "Fetches and converts webpage content to clean markdown using Crawl4AI"
    argument, argument_help = "url", "The URL of the webpage to fetch"
    empty_message = _EMPTY_URL

    def __init__(self, call_name: str, config: dict[str, Any], resolve: Resolver | None = None):
        super().__init__(call_name, config, resolve)
        self._blocklist_path = None
        if self.settings.blocklist is None:
            path = os.environ.get("CRAWL4AI_BLOCKLIST_PATH")
            if not path:
                raise ValueError(f"--tools {self.kind} needs the CRAWL4AI_BLOCKLIST_PATH environment variable")
            if not os.path.isfile(path):
                raise ValueError(f"--tools {self.kind}: the blocklist file {path} (CRAWL4AI_BLOCKLIST_PATH) is missing")
            self._blocklist_path = path  # read on first use: constructors run at parse time and do no I/O

    @classmethod
    def resolve(cls, config):
        resolved = super().resolve(config)
        path = os.environ.get("CRAWL4AI_BLOCKLIST_PATH")
        if resolved.get("blocklist") is None and path and os.path.isfile(path):
            resolved["blocklist"] = _read_blocklist(path)
        return resolved

    def blocklist(self) -> list[str]:
        if self.settings.blocklist is None:
            self.settings = dataclasses.replace(self.settings, blocklist=_read_blocklist(self._blocklist_path))
        return list(self.settings.blocklist)

    def request(self, argument):
        # Crawl4AI's Docker API takes serialised BrowserConfig / CrawlerRunConfig objects; the blocklist is
        # its `exclude_domains`, so the service drops links to those domains (the page itself is fetched).
        crawler = {
            "cache_mode": "bypass" if self.settings.bypass_cache else "enabled",
            "word_count_threshold": 10,
            "exclude_social_media_links": True,
            "excluded_tags": ["form", "header", "footer", "nav"],
            "page_timeout": int(
                (self.settings.timeout - 1) * 1000
            ),  # ms, one second under ours so the service answers first
            "exclude_domains": self.blocklist(),
        }
        if self.settings.ignore_links:
            crawler["exclude_external_links"] = True
        body = {
            "urls": [argument.strip()],
            "browser_config": {"type": "BrowserConfig", "params": {"headless": True}},
            "crawler_config": {"type": "CrawlerRunConfig", "params": crawler},
        }
        headers = {"Content-Type": "application/json", "x-api-key": self.settings.api_key}
        return "POST", self.settings.api_url.rstrip("/") + "/crawl", body, headers

    def observe(self, data):
        results = data.get("results") or []
        if not results:
            message = f"Crawl4AI error: {data.get('error', 'No results returned')}"
            return message, message
        page = results[0]
        if not page.get("success", False):
            message = f"Crawl4AI error: {page.get('error_message', page.get('error', 'Unknown error'))}"
            return message, message
        markdown = page.get("markdown") or ""
        if isinstance(markdown, dict):  # pruned markdown first, the raw conversion otherwise
            content = markdown.get("fit_markdown") or markdown.get("raw_markdown") or ""
        else:
            content = markdown
        if not content and self.settings.include_html:
            content = page.get("html") or page.get("cleaned_html") or ""
        metadata = page.get("metadata")
        title = metadata.get("title", "") if isinstance(metadata, dict) else ""
        if title and content:
            content = f"# {title}\n\n{content}"
        limit = self.settings.max_content_length
        if limit and len(content) > limit:
            content = content[:limit] + "\n\n[Content truncated]"
        return content, None


def _read_blocklist(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


# Registered under the `kind` their messages name, so the two cannot differ.
for _tool in (SerperSearchTool, S2SearchTool, JinaBrowseTool, Crawl4AIBrowseTool):
    register_tool(_tool.kind)(_tool)


def with_credentials(spec: ToolSpec) -> ToolSpec:
    """The driver's half of a web tool's set-up: its environment variables (and crawl4ai's blocklist) copied
    into the config, so the engines that build the tool need not see them. Other specs pass unchanged."""
    tool = registered_tools().get(spec.kind)
    if not (isinstance(tool, type) and issubclass(tool, _WebTool)):
        return spec
    return dataclasses.replace(spec, config=tool.resolve(spec.config))
