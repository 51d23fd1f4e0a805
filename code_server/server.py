"""Local code-execution HTTP service for the `code` / `code_stdio` verifiers (stdlib only).

Why: open-instruct scores code completions by POSTing them to a separate FastAPI service. This package
is a drop-in local replacement that tests and CPU runs start themselves, in-process or as a CLI:

    python -m code_server --host 127.0.0.1 --port 0
    # first stdout line: CODE_API_URL=http://127.0.0.1:PORT
    CODE_API_KEY=... python -m code_server --host 10.0.0.5 --port 0   # beyond loopback a key is required

    server, url = start_code_server()          # background thread; server.close() stops it
    with code_server() as (server, url): ...   # same, stopped on exit

HTTP API (compatible with open-instruct's `code_utils/api.py`):

* `GET /health` -> `{"status": "healthy", "sandbox": {...}, "bash": bool, "workspace_path": str}`; `sandbox` has
  each layer (true when up), `mode` ("full": every kernel layer; "weak": the Python guard and rlimits only,
  which the service runs only with `--allow_weak_sandbox` / CODE_SANDBOX_ALLOW_WEAK=1), `missing` (the kernel
  layers that are not up), `process_limit` (whether RLIMIT_NPROC binds, and for which uid) and `cgroups`
  (a cgroup per slot: its version, controllers and limits, or why there is none and what stands in).
* `POST /test_program` `{"program", "tests": [assert, ...], "max_execution_time"}` -> `{"results": [0|1],
  "runtimes": [s, or -1.0 when not passed], "statuses": [...]}`. Each assert runs in a judge process of its own
  against a fresh process of the program (executed as module `solution`, so an `if __name__ == "__main__":`
  block does not run), which answers with plain data only (`remote_calls.py`).
* `POST /test_program_stdio`, tests `[{"input", "output"}, ...]` (or `{"inputs": [...], "outputs": [...]}`):
  the program runs as `__main__` with the input on its real stdin, once per test. A test passes when it
  exits cleanly and, after `strip()`, the stdout has as many lines as the expected output and every line
  matches as stripped text or as a whitespace-separated list of Decimals (so `3.0` equals `3`).
* `tests` may be a list, a JSON string or base64(zlib(pickle(...))) (the pickled value may itself be a
  JSON string). Pickles are decoded here, in the server, with an unpickler that refuses every global:
  only plain containers, strings and numbers can be built, so no pickled code can run. A pickle that
  needs any class or function is rejected with HTTP 400, as is any other malformed body (the JSON
  `error` names the problem). Unlike open-instruct, which scores undecodable tests as 0, a bad row
  therefore surfaces as a verifier error instead of a silent zero.
* `max_execution_time` (default 1.0 s, at most `max_execution_time_cap`) bounds the program's own run
  time, measured from just before the program starts, so interpreter start-up is not charged to it: a
  stdio program's wall time (the process is killed `kill_margin_s` later), an assert test's program CPU
  time less its round trips with the judge (which waits the limit plus 2 ms per request on the wall clock).
* `POST /execute` `{"code", "timeout"}` -> `{"output", "error", "success", "status", "runtime"}`: the
  `python` tool's endpoint (open-instruct's tool-server contract). The snippet runs as `__main__` in the
  same sandbox, with empty stdin; nothing is echoed, so code must `print`.
* `POST /execute` with `"language": "bash"`, `"workspace"` (base64 tar.gz, "" for an empty one) and `"shell_state"`
  (the previous reply's, "" at first): the generic_sandbox environment's command. It runs under bash in the
  workspace, unpacked at `workspace_path` (the same path for every command), with the exported variables and
  directory the previous command left; the reply adds `exit_code`, `workspace` (packed after the command;
  null when the run was cut and its changes are lost), `shell_state`, `workspace_path` and `notes`. The
  server keeps nothing between requests: the client carries the sample's state. Only where the kernel layers
  are up (root): the Python guard cannot watch a shell, so elsewhere this is a 400.
* HTTP 500 means the service itself failed (e.g. a sandbox could not start), never a wrong program.
* Every refusal is `{"error": one line}` and the server keeps serving: 400 for any malformed body (invalid
  JSON, nesting deeper than `max_json_depth`, an integer past Python's int-string limit, wrong types, a
  pickle that is invalid or expands past `max_tests_bytes`), 413 for a Content-Length over
  `max_request_bytes` (the body is not read), 408 and a closed connection for a body that does not arrive
  within `request_timeout_s`, which is also each connection's socket timeout and the deadline of a request's
  line and headers together (a stalled or trickling client frees its thread).
* With an API key (`--api_key`, default $CODE_API_KEY) every request, /health included, needs
  `Authorization: Bearer <key>` (401 otherwise); an address other than loopback refuses to start without one.
  The clients in open_instruct send the header when CODE_API_KEY is set.

The sandbox each test runs in is described in `code_server.sandbox`; concurrency in `code_server.executor`.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import io
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from code_server.config import SandboxConfig
from code_server.executor import WEAK_ENV_VAR, CodeExecutor, SandboxError
from code_server.protocol import (
    BadRequestError,
    ExecuteRequest,
    TestRequest,
    check_shape,
    loads_json,
    outputs_match,
    parse_execute_request,
    parse_test_request,
)

__all__ = [
    "API_KEY_VAR",
    "CodeExecutionServer",
    "SandboxConfig",
    "bind_refusal",
    "code_server",
    "main",
    "outputs_match",
    "start_code_server",
]

logger = logging.getLogger(__name__)

_ASSERT_PATH = "/test_program"
_STDIO_PATH = "/test_program_stdio"
_EXECUTE_PATH = "/execute"


API_KEY_VAR = "CODE_API_KEY"
_MAX_ERROR_CHARS = 1000


class _Refusal(Exception):
    """A request answered with an error status before it runs; the message is the reply's one-line error."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _is_loopback_host(host: str, resolve: Callable[..., list] = socket.getaddrinfo) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not host:  # "" binds every interface
            return False
        try:
            addresses = [ipaddress.ip_address(info[4][0]) for info in resolve(host, None, 0, socket.SOCK_STREAM)]
        except (OSError, ValueError):
            return False
        return bool(addresses) and all(_unmapped(a).is_loopback for a in addresses)
    return _unmapped(address).is_loopback


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def bind_refusal(host: str, api_key: str | None, resolve: Callable[..., list] = socket.getaddrinfo) -> str | None:
    """Why the service must not start on `host`, or None. Beyond loopback anyone on the network could run
    code in the sandbox or tie up its slots, so an address other than loopback needs a shared secret."""
    if api_key or _is_loopback_host(host, resolve):
        return None
    return (
        f"refusing to serve on {host or 'every interface'!r} without an API key: set {API_KEY_VAR} "
        "(or --api_key), or bind a loopback address"
    )


class CodeExecutionServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many concurrent clients connect at once; the default backlog is 5

    def __init__(self, address: tuple[str, int], executor: CodeExecutor, api_key: str | None = None):
        self.executor = executor
        # Bytes, because hmac.compare_digest takes str only when it is ASCII; compared in constant time.
        self.expected_authorization = f"Bearer {api_key}".encode() if api_key else None
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving (if serving), release the socket and delete the work directories."""
        if getattr(self, "_serving_thread", None) is not None:
            self.shutdown()
        self.server_close()
        self.executor.close()


class _DeadlineReader(socket.SocketIO):
    """A socket's reads, each waiting at most until `deadline` (when set) instead of a fresh timeout."""

    deadline: float | None = None

    def readinto(self, buffer: Any) -> int | None:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request line and headers did not arrive in time")
            self._sock.settimeout(left)
        return super().readinto(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: CodeExecutionServer
    protocol_version = "HTTP/1.1"  # keep-alive for pooled clients

    def setup(self) -> None:
        # The socket timeout frees this thread from a client that stops sending (headers, body or between
        # kept-alive requests); the base class closes the connection when a read times out. A deadline on top
        # bounds a request's line and headers together, so a client trickling a byte at a time is cut too.
        self.timeout = self.server.executor.config.request_timeout_s
        super().setup()
        self._reader = _DeadlineReader(self.connection, "rb")
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.timeout
        super().handle_one_request()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self._reader.deadline = None  # the headers are in; the body has its own deadline (`_read_body`)
        self.connection.settimeout(self.timeout)
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        # One line, bounded: a message may quote part of a hostile body.
        self._send_json(status, {"error": " ".join(message.split())[:_MAX_ERROR_CHARS]}, headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's errors (malformed request line or headers, unknown method) as JSON, not HTML."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":
            # Not parsed yet: the base class would answer as HTTP/0.9, a body without a status line, which
            # no client of this API reads.
            self.request_version = "HTTP/1.0"
        self._send_error(code, message or self.responses.get(code, ("error",))[0])

    def _authorized(self) -> bool:
        expected = self.server.expected_authorization
        if expected is None:
            return True
        given = self.headers.get("Authorization", "").encode("latin-1", "replace")  # the bytes as sent
        if hmac.compare_digest(given, expected):
            return True
        self.close_connection = True  # the body, if any, stays unread
        self._send_error(401, "missing or wrong API key", {"WWW-Authenticate": "Bearer"})
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if urlsplit(self.path).path.rstrip("/") == "/health":
            executor = self.server.executor
            bash = {"bash": executor.bash_ready, "workspace_path": executor.workspace_path}
            self._send_json(200, {"status": "healthy", "sandbox": executor.layers, **bash})
        else:
            self._send_error(404, f"unknown path {self.path!r}")

    def do_POST(self) -> None:
        if not self._authorized():
            return
        path = urlsplit(self.path).path.rstrip("/")
        try:
            request = self._parse(path)
        except _Refusal as e:
            self._send_error(e.status, str(e))
            return
        status, payload = self._run(request)
        if status == 200:
            self._send_json(status, payload)
        else:
            self._send_error(status, payload["error"])

    def _parse(self, path: str) -> TestRequest | ExecuteRequest:
        if path not in (_ASSERT_PATH, _STDIO_PATH, _EXECUTE_PATH):
            raise self._unread(404, f"unknown path {self.path!r}; use {_ASSERT_PATH}, {_STDIO_PATH} or {_EXECUTE_PATH}")
        config = self.server.executor.config
        body = self._read_json(config)
        try:
            if path == _EXECUTE_PATH:
                return parse_execute_request(body, config)
            return parse_test_request(body, stdio=path == _STDIO_PATH, config=config)
        except BadRequestError as e:
            raise _Refusal(400, str(e)) from None
        except Exception as e:  # the parse reads only the body, so whatever breaks it is the body's fault
            logger.warning("malformed request body: %s: %s", type(e).__name__, e)
            raise _Refusal(400, f"malformed request body: {type(e).__name__}: {e}") from None

    def _run(self, request: TestRequest | ExecuteRequest) -> tuple[int, dict[str, Any]]:
        executor = self.server.executor
        try:
            if isinstance(request, ExecuteRequest):
                return 200, executor.execute(request)
            return 200, executor.run_request(request)
        except BadRequestError as e:  # asks for what this service cannot do (bash without the kernel layers)
            return 400, {"error": str(e)}
        except SandboxError as e:
            logger.error("code sandbox failure: %s", e)
            return 500, {"error": f"sandbox failure: {e}"}
        except Exception as e:
            logger.exception("code execution failed")
            return 500, {"error": f"internal error: {type(e).__name__}: {e}"}

    def _read_json(self, config: SandboxConfig) -> Any:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise self._unread(400, "Content-Length header is required")
        try:
            length = int(length_header)
        except ValueError:
            raise self._unread(400, f"invalid Content-Length {length_header[:100]!r}") from None
        if length < 0:
            raise self._unread(400, f"invalid Content-Length {length}")
        if length > config.max_request_bytes:
            raise self._unread(413, f"request body of {length} bytes exceeds the {config.max_request_bytes}-byte limit")
        raw = self._read_body(length, config.request_timeout_s)
        try:
            body = loads_json(raw, "request body")
            check_shape(body, config.max_json_depth, None, "request body")
        except BadRequestError as e:
            raise _Refusal(400, str(e)) from None
        return body

    def _unread(self, status: int, message: str) -> _Refusal:
        # What is left of the body would be read as the next request, so this connection ends with the reply.
        self.close_connection = True
        return _Refusal(status, message)

    def _read_body(self, length: int, timeout_s: float) -> bytes:
        # The socket timeout bounds each read; the deadline bounds them together, so a client trickling a
        # byte at a time cannot hold the thread either.
        deadline = time.monotonic() + timeout_s
        chunks, remaining = [], length
        try:
            while remaining:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(remaining, 1 << 20))
                if not chunk:
                    raise self._unread(400, f"request body ended after {length - remaining} of {length} bytes")
                chunks.append(chunk)
                remaining -= len(chunk)
        except TimeoutError:
            raise self._unread(408, f"request body not received within {timeout_s:g} s") from None
        finally:
            self.connection.settimeout(timeout_s)
        return b"".join(chunks)


def start_code_server(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None, api_key: str | None = None
) -> tuple[CodeExecutionServer, str]:
    """Start the service in a daemon thread; returns (server, base URL). Stop it with `server.close()`.
    With `api_key`, every request must carry `Authorization: Bearer <api_key>`; beyond loopback it is required."""
    problem = bind_refusal(host, api_key)
    if problem:
        raise ValueError(problem)
    executor = CodeExecutor(config)
    try:
        server = CodeExecutionServer((host, port), executor, api_key)
    except BaseException:
        executor.close()
        raise
    thread = threading.Thread(target=server.serve_forever, name="code-execution-server", daemon=True)
    server._serving_thread = thread  # type: ignore[attr-defined]
    thread.start()
    return server, server.url


@contextlib.contextmanager
def code_server(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None, api_key: str | None = None
) -> Iterator[tuple[CodeExecutionServer, str]]:
    server, url = start_code_server(host, port, config, api_key)
    try:
        yield server, url
    finally:
        server.close()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = SandboxConfig()
    parser = argparse.ArgumentParser(prog="python -m code_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--max_concurrency", type=int, default=defaults.max_concurrency)
    parser.add_argument("--memory_limit_mb", type=int, default=defaults.memory_limit_mb)
    parser.add_argument("--max_output_bytes", type=int, default=defaults.max_output_bytes)
    parser.add_argument("--max_processes", type=int, default=defaults.max_processes)
    parser.add_argument("--max_execution_time_cap", type=float, default=defaults.max_execution_time_cap)
    parser.add_argument("--sandbox_uid_base", type=int, default=defaults.sandbox_uid_base)
    parser.add_argument("--request_timeout_s", type=float, default=defaults.request_timeout_s)
    parser.add_argument("--work_root", default=None)
    parser.add_argument("--no_kernel_isolation", action="store_true", help="skip namespaces and uid drop")
    parser.add_argument("--no_python_guard", action="store_true")
    parser.add_argument(
        "--allow_weak_sandbox",
        action="store_true",
        default=os.environ.get(WEAK_ENV_VAR, "").strip().lower() in ("1", "true", "yes"),
        help="start even without the kernel sandbox layers (not root): programs are confined by the Python "
        f"guard and rlimits only, which a hostile program may get past (default: ${WEAK_ENV_VAR}=1)",
    )
    parser.add_argument("--log_level", default="INFO")
    parser.add_argument(
        "--api_key",
        default=os.environ.get(API_KEY_VAR) or None,
        help=f"require `Authorization: Bearer KEY` on every request (default: ${API_KEY_VAR}, which keeps the key "
        "out of the process list); needed to bind an address other than loopback",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Serve in the foreground until SIGTERM/SIGINT; the first stdout line is `CODE_API_URL=<base URL>`."""
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    config = SandboxConfig(
        max_concurrency=args.max_concurrency,
        memory_limit_mb=args.memory_limit_mb,
        max_output_bytes=args.max_output_bytes,
        max_processes=args.max_processes,
        max_execution_time_cap=args.max_execution_time_cap,
        sandbox_uid_base=args.sandbox_uid_base,
        work_root=args.work_root,
        kernel_isolation=not args.no_kernel_isolation,
        python_guard=not args.no_python_guard,
        allow_weak_sandbox=args.allow_weak_sandbox,
        request_timeout_s=args.request_timeout_s,
    )
    problem = bind_refusal(args.host, args.api_key)
    if problem:
        raise SystemExit(f"code_server: {problem}")
    try:
        executor = CodeExecutor(config)
    except SandboxError as e:  # e.g. no kernel layers and no --allow_weak_sandbox: the one line says which
        raise SystemExit(f"code_server: {e}") from None
    server = CodeExecutionServer((args.host, args.port), executor, args.api_key)
    # Flushed at once: code_api_setup.sh waits for this line in the log before polling /health.
    print(f"CODE_API_URL={server.url}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        # shutdown() blocks until serve_forever returns, so it cannot run on the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        executor.close()
