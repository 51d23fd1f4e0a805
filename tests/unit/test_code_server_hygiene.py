"""The code service under attack from its clients: malformed bodies, stalled connections, missing keys.

Each malformed body must get a 400 (413 for an oversized Content-Length) whose JSON `error` is one line,
never a dropped connection, and the server must answer a correct request right after. A client that
stalls mid-headers or mid-body is cut after `request_timeout_s` (1 s here) and its thread freed, while
others are served. With an API key every request needs `Authorization: Bearer <key>`; beyond loopback
the service refuses to start without one (tested on the decision, so no test binds a public address).
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from code_server import BadRequestError, SandboxConfig, code_server, decode_tests, start_code_server
from code_server.server import bind_refusal
from open_instruct.agents.tools import PythonTool
from open_instruct.rewards.code_tests import CodeServiceError, CodeServiceUnreachable, check_code_service, run_tests

REPO = Path(__file__).resolve().parents[2]
CONFIG = SandboxConfig(max_concurrency=2, request_timeout_s=1.0, max_tests_bytes=1 << 20, max_request_bytes=4 << 20)
GOOD = {"program": "def add(a, b):\n    return a + b\n", "tests": ["assert add(1, 2) == 3"]}
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with code_server(config=CONFIG) as (_, base):
        yield base


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    with code_server(config=CONFIG, api_key=KEY) as (_, base):
        yield base


def assert_still_serves(base: str, headers: dict[str, str] | None = None) -> None:
    reply = requests.post(base + "/test_program", json=GOOD, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["results"] == [1]


def raw_exchange(base: str, data: bytes, half_close: bool = False) -> tuple[int, dict]:
    """Send bytes as they are; the status and JSON body of the reply."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def post_raw(path: str, body: bytes, length: int | None = None) -> bytes:
    length = len(body) if length is None else length
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode() + body


def packed(value, protocol: int = 4) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(value, protocol=protocol))).decode()


def zlib_bomb(size: int) -> bytes:
    """zlib of `size` zero bytes, built a megabyte at a time (the test never holds the expansion)."""
    deflater = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"".join(deflater.compress(chunk) for _ in range(size >> 20)) + deflater.flush()


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def shared_tree(levels: int) -> list:
    value: list = ["x"]
    for _ in range(levels):
        value = [value, value]  # pickled once per level through the memo; 2**levels leaves once expanded
    return value


def deep_pickle(depth: int) -> str:
    """A pickle of lists nested `depth` deep, written by hand: pickle.dumps itself recurses and would stop."""
    opcodes = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."  # EMPTY_LIST each, then APPEND each
    return base64.b64encode(zlib.compress(opcodes)).decode()


def cyclic() -> list:
    value: list = []
    value.append(value)
    return value


def one_line_error(reply: dict) -> str:
    assert set(reply) == {"error"} and "\n" not in reply["error"], reply
    return reply["error"]


# --------------------------------------------------------------------------------------------------
# Malformed bodies: 400 naming the problem, then a correct request is served.

LONG = "y" * 10_000
HUGE_INT = b"9" * 5000  # past Python's int-string limit (4300 digits)
MALFORMED = {
    "invalid-json": (b"{not json", "/test_program", "not valid JSON"),
    "not-utf8": (b'{"program": "\xff"}', "/test_program", "not valid JSON"),
    "deep-json": (b"[" * 100_000 + b"]" * 100_000, "/test_program", "nested too deeply"),
    "deeper-than-limit": (json.dumps({"program": "x", "tests": nested(100)}), "/test_program", "nested more than 64"),
    "huge-int": (b'{"program": "x", "tests": [], "max_execution_time": ' + HUGE_INT + b"}", "/test_program", "limit"),
    "huge-int-in-tests": (json.dumps({"program": "x", "tests": f"[{HUGE_INT.decode()}]"}), "/test_program", "limit"),
    "deep-tests-string": (json.dumps({"program": "x", "tests": "[" * 100_000}), "/test_program", "nested too deeply"),
    "program-not-string": (json.dumps({"program": 5, "tests": []}), "/test_program", "'program'"),
    "tests-object": (json.dumps({"program": "x", "tests": {"a": 1}}), "/test_program", "list"),
    "limit-string": (json.dumps({**GOOD, "max_execution_time": "1"}), "/test_program", "max_execution_time"),
    "limit-huge-float": (json.dumps({**GOOD, "max_execution_time": 1e308}), "/test_program", "max_execution_time"),
    "code-list": (json.dumps({"code": ["print(1)"]}), "/execute", "'code'"),
    "timeout-bool": (json.dumps({"code": "x", "timeout": True}), "/execute", "'timeout'"),
    "language-list": (json.dumps({"code": "x", "language": ["python"]}), "/execute", "'language'"),
    "stdio-inputs-mismatch": (
        json.dumps({"program": "x", "tests": {"inputs": ["1"], "outputs": []}}),
        "/test_program_stdio",
        "equal length",
    ),
    "bad-base64": (json.dumps({"program": "x", "tests": "!!not base64!!"}), "/test_program", "neither JSON"),
    "not-zlib": (json.dumps({"program": "x", "tests": base64.b64encode(b"hello").decode()}), "/test_program", "zlib"),
    "truncated-zlib": (
        json.dumps({"program": "x", "tests": base64.b64encode(zlib.compress(pickle.dumps(["a"]))[:-6]).decode()}),
        "/test_program",
        "truncated",
    ),
    "not-pickle": (
        json.dumps({"program": "x", "tests": base64.b64encode(zlib.compress(b"not a pickle")).decode()}),
        "/test_program",
        "plain pickle",
    ),
    "zlib-bomb": (
        json.dumps({"program": "x", "tests": base64.b64encode(zlib_bomb(16 << 20)).decode()}),
        "/test_program",
        "decompresses to more than",
    ),
    "pickle-shared-string": (json.dumps({"program": "x", "tests": packed([LONG] * 4000)}), "/test_program", "expands"),
    "pickle-shared-tree": (json.dumps({"program": "x", "tests": packed(shared_tree(60))}), "/test_program", "expands"),
    "pickle-deep": (json.dumps({"program": "x", "tests": deep_pickle(100_000)}), "/test_program", "nested more"),
    "pickle-cycle": (json.dumps({"program": "x", "tests": packed(cyclic())}), "/test_program", "nested more"),
    "pickle-huge-int": (
        json.dumps({"program": "x", "tests": base64.b64encode(zlib.compress(b"L" + b"9" * 5000 + b"L\n.")).decode()}),
        "/test_program",
        "plain pickle",
    ),
    "pickle-json-string-not-json": (json.dumps({"program": "x", "tests": packed("{oops")}), "/test_program", "JSON"),
}


@pytest.mark.parametrize(("body", "path", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_body_gets_400_and_the_server_serves_on(url: str, body, path: str, message: str) -> None:
    body = body.encode() if isinstance(body, str) else body
    with requests.Session() as session:  # the same kept-alive connection, where the server keeps it
        response = session.post(url + path, data=body, headers={"Content-Type": "application/json"}, timeout=60)
        assert response.status_code == 400, response.text
        assert message in one_line_error(response.json())
        assert_still_serves(url)
        reply = session.post(url + "/test_program", json=GOOD, timeout=60)
        assert reply.status_code == 200 and reply.json()["results"] == [1]


def test_an_oversized_content_length_is_413_without_reading_the_body(url: str) -> None:
    status, reply = raw_exchange(url, post_raw("/test_program", b"", length=1 << 40))
    assert status == 413 and "exceeds the 4194304-byte limit" in one_line_error(reply)
    assert_still_serves(url)


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"POST /test_program HTTP/1.1\r\nHost: x\r\n\r\n", 400, "Content-Length header is required"),
        (b"POST /test_program HTTP/1.1\r\nHost: x\r\nContent-Length: ab\r\n\r\n", 400, "invalid Content-Length"),
        (b"POST /test_program HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400, "invalid Content-Length"),
        (b"POST /test_program HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 400, "Content-Length"),
        (b"GARBAGE\r\n\r\n", 400, "Bad request syntax"),
        (b"BREW /test_program HTTP/1.1\r\nHost: x\r\n\r\n", 501, "Unsupported method"),
        (b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 505, "Invalid HTTP version"),
    ],
    ids=["no-length", "length-text", "length-negative", "length-huge-int", "request-line", "method", "version"],
)
def test_malformed_framing_gets_a_json_error(url: str, request_bytes: bytes, status: int, message: str) -> None:
    got, reply = raw_exchange(url, request_bytes)
    assert got == status and message in one_line_error(reply)
    assert_still_serves(url)


def test_a_body_shorter_than_its_content_length_is_400(url: str) -> None:
    status, reply = raw_exchange(url, post_raw("/test_program", b'{"program"', length=100), half_close=True)
    assert status == 400 and "ended after 10 of 100 bytes" in one_line_error(reply)
    assert_still_serves(url)


def test_a_zlib_bomb_never_allocates_past_the_cap() -> None:
    tests = base64.b64encode(zlib_bomb(64 << 20)).decode()
    config = SandboxConfig(max_tests_bytes=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(BadRequestError, match="decompresses to more than 1048576 bytes"):
            decode_tests(tests, config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) + len(tests) + (4 << 20), f"peak {peak} bytes for a 64 MiB bomb"


def test_pickled_tests_within_the_limits_still_decode() -> None:
    config = SandboxConfig(max_tests_bytes=1 << 20)
    tests = [{"input": "1\n", "output": "1"}] * 100  # shared references, but small once expanded
    assert decode_tests(packed(tests), config) == tests
    assert decode_tests(packed(json.dumps(nested(60))), config) == nested(60)


# --------------------------------------------------------------------------------------------------
# Stalled clients: cut after request_timeout_s, their threads freed, others served meanwhile.


def handler_threads() -> set[threading.Thread]:
    """The HTTP handler threads of every service in this process (earlier modules' kept-alive connections
    among them, which end only at their own timeout): a test watches those that came after it started."""
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def freed(threads: set[threading.Thread]) -> bool:
    return not any(t.is_alive() for t in threads)


def wait_for(condition, bound_s: float = 60.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def read_to_eof(sock: socket.socket) -> bytes:
    """What arrives until the server closes the connection (a reset counts as closed)."""
    sock.settimeout(60)  # generous: the server's own timeout is 1 s
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with bytes still unread on its side
        pass
    return data


@pytest.mark.parametrize(
    ("sent", "expect_reply"),
    [
        (b"POST /test_program HTTP/1.1\r\nHost: x\r\n", False),  # stops mid-headers: cut without a reply
        (post_raw("/test_program", b'{"prog', length=1000), True),  # stops mid-body: 408, then cut
    ],
    ids=["mid-headers", "mid-body"],
)
def test_a_stalled_client_is_cut_and_others_are_served(url: str, sent: bytes, expect_reply: bool) -> None:
    before = handler_threads()
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as stalled:
        stalled.sendall(sent)
        assert wait_for(lambda: handler_threads() - before)
        stalled_threads = handler_threads() - before
        assert_still_serves(url)  # while the stalled one holds its thread
        data = read_to_eof(stalled)  # EOF: the server closed the connection
    if expect_reply:
        assert data.startswith(b"HTTP/1.1 408") and b"not received within 1 s" in data
    else:
        assert data == b""
    assert wait_for(lambda: freed(stalled_threads)), "the stalled client's thread was not freed"
    assert_still_serves(url)


@pytest.mark.parametrize("head", [b"POST /test_program HTTP/1.1\r\nX-Pad: ", None], ids=["headers", "body"])
def test_a_client_trickling_its_request_is_cut_at_the_deadline(url: str, head: bytes | None) -> None:
    # A byte every 0.2 s resets a per-read timeout forever; the deadline on the headers, or the body's, cuts it.
    parts = urlsplit(url)
    stop = threading.Event()
    before = handler_threads()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head if head is not None else post_raw("/test_program", b"", length=10_000))
        assert wait_for(lambda: handler_threads() - before)
        trickling_threads = handler_threads() - before

        def trickle() -> None:
            while not stop.wait(0.2):
                try:
                    sock.sendall(b" ")
                except OSError:
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            data = read_to_eof(sock)
        finally:
            stop.set()
            sender.join(10)
    # Its unread bytes may turn the server's close into a reset that overtakes the 408.
    assert data == b"" or data.startswith(b"HTTP/1.1 408"), data[:200]
    assert wait_for(lambda: freed(trickling_threads)), "the trickling client's thread was not freed"
    assert_still_serves(url)


# --------------------------------------------------------------------------------------------------
# The API key.


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"X-Api-Key": KEY}],
    ids=["none", "wrong", "no-bearer", "other-header"],
)
def test_without_the_right_key_every_request_is_401(keyed_url: str, headers: dict) -> None:
    health = requests.get(keyed_url + "/health", headers=headers, timeout=30)
    assert health.status_code == 401 and health.headers["WWW-Authenticate"] == "Bearer"
    assert one_line_error(health.json()) == "missing or wrong API key"
    run = requests.post(keyed_url + "/test_program", json=GOOD, headers=headers, timeout=30)
    assert run.status_code == 401
    assert requests.post(keyed_url + "/nope", json={}, headers=headers, timeout=30).status_code == 401
    assert_still_serves(keyed_url, {"Authorization": f"Bearer {KEY}"})


def test_with_the_right_key_the_service_answers(keyed_url: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    assert requests.get(keyed_url + "/health", headers=auth, timeout=30).json()["status"] == "healthy"
    assert_still_serves(keyed_url, auth)


def test_the_clients_send_the_key_from_code_api_key(keyed_url: str, monkeypatch) -> None:
    monkeypatch.delenv("CODE_API_KEY", raising=False)
    with pytest.raises(CodeServiceError, match="HTTP 401"):
        run_tests(keyed_url + "/test_program", GOOD["program"], GOOD["tests"], 2.0)
    with pytest.raises(CodeServiceUnreachable, match="set CODE_API_KEY"):
        check_code_service(keyed_url)
    monkeypatch.setenv("CODE_API_KEY", KEY)
    assert run_tests(keyed_url + "/test_program", GOOD["program"], GOOD["tests"], 2.0)["results"] == [1]
    check_code_service(keyed_url)

    async def python_tool():
        tool = PythonTool("python", {"api_endpoint": keyed_url + "/execute", "timeout": 5.0})
        try:
            return await tool.call({"code": "print(6 * 7)"})
        finally:
            await tool.close()

    assert asyncio.run(python_tool()).result.strip() == "42"


def fake_resolver(*addresses: str):
    def resolve(host, port, family=0, type=0):
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    return resolve


@pytest.mark.parametrize(
    ("host", "resolve", "refused"),
    [
        ("127.0.0.1", None, False),
        ("127.0.0.2", None, False),
        ("::1", None, False),
        ("0.0.0.0", None, True),
        ("", None, True),
        ("10.0.0.1", None, True),
        ("192.168.1.5", None, True),
        ("::", None, True),
        ("loopback.test", fake_resolver("127.0.0.1", "::1"), False),
        ("mixed.test", fake_resolver("127.0.0.1", "10.0.0.2"), True),
        ("unknown.test", fake_resolver(), True),
    ],
)
def test_binding_beyond_loopback_needs_a_key(host: str, resolve, refused: bool) -> None:
    kwargs = {"resolve": resolve} if resolve else {}
    problem = bind_refusal(host, None, **kwargs)
    assert (problem is not None) == refused
    if refused:
        assert "without an API key: set CODE_API_KEY (or --api_key)" in problem and "\n" not in problem
    assert bind_refusal(host, "a-key", **kwargs) is None


def test_the_cli_and_the_library_refuse_a_public_bind_without_a_key() -> None:
    # Refused before any socket is bound, so no test listens beyond loopback.
    with pytest.raises(ValueError, match=r"refusing to serve on '10\.0\.0\.1'"):
        start_code_server("10.0.0.1", 0, CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "CODE_API_KEY"}
    result = subprocess.run(
        [sys.executable, "-m", "code_server", "--host", "10.0.0.1", "--port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "code_server: refusing to serve on '10.0.0.1' without an API key: set CODE_API_KEY (or --api_key), "
        "or bind a loopback address"
    ]
