"""`code` and `code_stdio` verifiers: run the response's program against the row's tests over HTTP.

The tests run in a code-execution service (open-instruct's API; the top-level `code_server` package is
the local implementation), never in this process. Semantics follow open-instruct:

* Program: the content of the **last** ```` ``` ```` fenced block, with an optional `python` right after
  the opening fence dropped (a `py` tag is kept and fails as a NameError); without a fence, the whole
  response. Nothing is stripped first, so a fence inside a think block counts too.
* Request: `{"program", "tests": ground_truth as given, "max_execution_time"}` POSTed to
  `<base>/test_program` (`code`) or `<base>/test_program_stdio` (`code_stdio`). `code_api_url` may be
  the base URL or either endpoint URL; the other endpoint is derived from it.
* Score: pass rate = mean(results) (0 with no results), set to 0 when below
  `code_pass_rate_reward_threshold`. With `code_apply_perf_penalty`, each pass is weighted by
  (T - runtime) / T before averaging (T = `code_max_execution_time`); the threshold applies to the
  unweighted pass rate.

Deliberate difference: open-instruct scores any HTTP failure as 0. Here an unreachable service, an HTTP
error status (after retries on 500/502/503/504 and on connection errors) or a malformed reply raises
`CodeServiceError`, so the reward pool counts it as an error instead of a silent zero reward. A bad
request (HTTP 400, e.g. undecodable tests) raises too, naming the server's reason.

When CODE_API_KEY is set (code_api_setup.sh exports one when the service binds beyond loopback), every
request carries `Authorization: Bearer $CODE_API_KEY`; the python tool and generic_sandbox send it too.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from open_instruct.errors import UserError
from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult

_FENCED = re.compile(r"```(?:python)?(.*?)```", re.DOTALL)
_ASSERT_PATH = "/test_program"
_STDIO_PATH = "/test_program_stdio"


class CodeServiceError(RuntimeError):
    """The code-execution service could not be reached or did not return a usable answer."""


class CodeServiceUnreachable(UserError):
    """At start-up: the data has code rows, and nothing answers at --code_api_url."""


CODE_VERIFIERS = ("code", "code_stdio")
API_KEY_VAR = "CODE_API_KEY"


def code_api_headers() -> dict[str, str]:
    """The code service's auth header, or none. Read per request: in Ray actors the variable arrives with
    the job's runtime environment, after this module is imported."""
    key = os.environ.get(API_KEY_VAR)
    return {"Authorization": f"Bearer {key}"} if key else {}


def check_code_service(code_api_url: str, timeout_s: float = 5.0) -> None:
    """One request before the run starts (any HTTP answer will do): a service that is not there would
    otherwise score every code sample 0, retried, for the whole run."""
    url = endpoint_url(code_api_url, stdio=False)
    try:
        response = requests.get(url, headers=code_api_headers(), timeout=timeout_s)
    except requests.RequestException as error:
        raise CodeServiceUnreachable(
            f"--code_api_url {code_api_url}: the code-execution service does not answer ({type(error).__name__}); "
            "start it (source configs/beaker_configs/code_api_setup.sh) or point --code_api_url at it"
        ) from None
    if response.status_code == 401:
        raise CodeServiceUnreachable(
            f"--code_api_url {code_api_url}: the code-execution service wants an API key; set {API_KEY_VAR} to the "
            "key it was started with"
        )


def extract_program(text: str) -> str:
    blocks = _FENCED.findall(text)
    return blocks[-1] if blocks else text


def endpoint_url(code_api_url: str, stdio: bool) -> str:
    base = code_api_url.rstrip("/")
    for suffix in (_STDIO_PATH, _ASSERT_PATH):  # the longer suffix first: it contains the shorter
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base + (_STDIO_PATH if stdio else _ASSERT_PATH)


def http_timeout_s(max_execution_time: float) -> float:
    return max(30.0, min(300.0, 10.0 * max_execution_time))


_session_lock = threading.Lock()
_session: requests.Session | None = None
_session_pid: int | None = None


def _get_session() -> requests.Session:
    # One pooled session per process; a forked reward worker must not share the parent's sockets.
    global _session, _session_pid
    with _session_lock:
        if _session is None or _session_pid != os.getpid():
            retry = Retry(
                total=3,
                connect=3,
                read=0,  # a read timeout means a busy service; resending the work would add load
                status=3,
                backoff_factor=0.3,
                status_forcelist=(500, 502, 503, 504),
                allowed_methods=frozenset({"POST"}),
                raise_on_status=False,
            )
            session = requests.Session()
            adapter = HTTPAdapter(pool_connections=100, pool_maxsize=100, max_retries=retry)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            _session, _session_pid = session, os.getpid()
        return _session


def run_tests(url: str, program: str, tests: Any, max_execution_time: float) -> dict[str, Any]:
    """POST one program and its tests; returns the service's JSON or raises CodeServiceError."""
    payload = {"program": program, "tests": tests, "max_execution_time": max_execution_time}
    try:
        response = _get_session().post(
            url, json=payload, headers=code_api_headers(), timeout=http_timeout_s(max_execution_time)
        )
    except requests.RequestException as e:
        raise CodeServiceError(f"code execution service at {url} failed: {type(e).__name__}: {e}") from e
    if response.status_code != 200:
        raise CodeServiceError(
            f"code execution service at {url} returned HTTP {response.status_code}: {response.text[:500]}"
        )
    try:
        reply = response.json()
    except ValueError as e:
        raise CodeServiceError(f"code execution service at {url} returned non-JSON: {response.text[:200]!r}") from e
    results = reply.get("results") if isinstance(reply, dict) else None
    runtimes = reply.get("runtimes", []) if isinstance(reply, dict) else None
    if not isinstance(results, list) or not isinstance(runtimes, list):
        raise CodeServiceError(f"code execution service at {url} returned no results list: {str(reply)[:200]}")
    return reply


def score_results(results: list[Any], runtimes: list[Any], settings: RewardSettings) -> tuple[float, float]:
    """(score, pass_rate) for one test run."""
    if not results:
        return 0.0, 0.0
    passed = [1.0 if r else 0.0 for r in results]
    pass_rate = sum(passed) / len(passed)
    if pass_rate < settings.reward.code_pass_rate_reward_threshold:
        return 0.0, pass_rate
    if not settings.reward.code_apply_perf_penalty:
        return pass_rate, pass_rate
    limit = settings.reward.code_max_execution_time
    weighted = []
    for i, ok in enumerate(passed):
        runtime = runtimes[i] if i < len(runtimes) and isinstance(runtimes[i], (int, float)) else limit
        weighted.append(ok * min(1.0, max(0.0, (limit - runtime) / limit)))
    return sum(weighted) / len(weighted), pass_rate


def _verify(inp: VerifierInput, settings: RewardSettings, stdio: bool) -> VerifierResult:
    program = extract_program(inp.prediction)
    url = endpoint_url(settings.reward.code_api_url, stdio)
    if isinstance(inp.ground_truth, list) and not inp.ground_truth:
        return VerifierResult(score=0.0, extracted=program, details={"results": [], "runtimes": [], "url": url})
    reply = run_tests(url, program, inp.ground_truth, settings.reward.code_max_execution_time)
    score, pass_rate = score_results(reply["results"], reply["runtimes"], settings)
    details = {
        "results": reply["results"],
        "runtimes": reply["runtimes"],
        "statuses": reply.get("statuses", []),
        "pass_rate": pass_rate,
        "url": url,
    }
    return VerifierResult(score=score, extracted=program, details=details)


@register_verifier("code")
def code_verifier(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    return _verify(inp, settings, stdio=False)


@register_verifier("code_stdio")
def code_stdio_verifier(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    return _verify(inp, settings, stdio=True)
