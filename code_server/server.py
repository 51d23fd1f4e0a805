"""Local code-execution HTTP service for the `code` / `code_stdio` verifiers (stdlib only).

Why: open-instruct scores code completions by POSTing them to a separate FastAPI service. This package
is a drop-in local replacement that tests and CPU runs start themselves, in-process or as a CLI:

    python -m code_server --host 127.0.0.1 --port 0
    # first stdout line: CODE_API_URL=http://127.0.0.1:PORT

    server, url = start_code_server()          # background thread; server.close() stops it
    with code_server() as (server, url): ...   # same, stopped on exit

HTTP API (compatible with open-instruct's `code_utils/api.py`):

* `GET /health` -> `{"status": "healthy", "sandbox": {...active layers...}, "bash": bool, "workspace_path": str}`.
* `POST /test_program` `{"program", "tests": [assert, ...], "max_execution_time"}` -> `{"results": [0|1],
  "runtimes": [s, or -1.0 when not passed], "statuses": [...]}`. Each assert runs in its own process
  after the program (executed as module `solution`, so an `if __name__ == "__main__":` block does not run).
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
  time, measured from just before the program starts, so interpreter start-up is not charged to it.
  A passing test must finish within it; the process is killed `kill_margin_s` later.
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

The sandbox each test runs in is described in `code_server.sandbox`; concurrency in `code_server.executor`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from code_server.config import SandboxConfig
from code_server.executor import CodeExecutor, SandboxError
from code_server.protocol import (
    BadRequestError,
    ExecuteRequest,
    outputs_match,
    parse_execute_request,
    parse_test_request,
)

__all__ = [
    "CodeExecutionServer",
    "SandboxConfig",
    "code_server",
    "main",
    "outputs_match",
    "start_code_server",
]

logger = logging.getLogger(__name__)

_ASSERT_PATH = "/test_program"
_STDIO_PATH = "/test_program_stdio"
_EXECUTE_PATH = "/execute"


class CodeExecutionServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many concurrent clients connect at once; the default backlog is 5

    def __init__(self, address: tuple[str, int], executor: CodeExecutor):
        self.executor = executor
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


class _Handler(BaseHTTPRequestHandler):
    server: CodeExecutionServer
    protocol_version = "HTTP/1.1"  # keep-alive for pooled clients

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        if urlsplit(self.path).path.rstrip("/") == "/health":
            executor = self.server.executor
            bash = {"bash": executor.bash_ready, "workspace_path": executor.workspace_path}
            self._send_json(200, {"status": "healthy", "sandbox": executor.layers, **bash})
        else:
            self._send_json(404, {"error": f"unknown path {self.path!r}"})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path not in (_ASSERT_PATH, _STDIO_PATH, _EXECUTE_PATH):
            # The unread body would otherwise be parsed as the next request on this connection.
            self.close_connection = True
            paths = f"{_ASSERT_PATH}, {_STDIO_PATH} or {_EXECUTE_PATH}"
            self._send_json(404, {"error": f"unknown path {self.path!r}; use {paths}"})
            return
        executor = self.server.executor
        try:
            body = self._read_json(executor.config.max_request_bytes)
            if path == _EXECUTE_PATH:
                request = parse_execute_request(body, executor.config)
            else:
                request = parse_test_request(body, stdio=path == _STDIO_PATH, config=executor.config)
        except BadRequestError as e:
            self._send_json(400, {"error": str(e)})
            return
        try:
            if isinstance(request, ExecuteRequest):
                result = executor.execute(request)
            else:
                result = executor.run_request(request)
        except BadRequestError as e:  # asks for what this service cannot do (bash without the kernel layers)
            self._send_json(400, {"error": str(e)})
            return
        except SandboxError as e:
            logger.error("code sandbox failure: %s", e)
            self._send_json(500, {"error": f"sandbox failure: {e}"})
            return
        except Exception as e:
            logger.exception("code execution failed")
            self._send_json(500, {"error": f"internal error: {type(e).__name__}: {e}"})
            return
        self._send_json(200, result)

    def _read_json(self, max_bytes: int) -> Any:
        # Every early rejection leaves the body unread, so the connection cannot be reused.
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            raise BadRequestError("Content-Length header is required")
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            raise BadRequestError(f"invalid Content-Length {length_header!r}") from None
        if length < 0 or length > max_bytes:
            self.close_connection = True
            raise BadRequestError(f"request body of {length} bytes exceeds the {max_bytes}-byte limit")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequestError(f"request body is not valid JSON: {e}") from None


def start_code_server(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None
) -> tuple[CodeExecutionServer, str]:
    """Start the service in a daemon thread; returns (server, base URL). Stop it with `server.close()`."""
    executor = CodeExecutor(config)
    try:
        server = CodeExecutionServer((host, port), executor)
    except BaseException:
        executor.close()
        raise
    thread = threading.Thread(target=server.serve_forever, name="code-execution-server", daemon=True)
    server._serving_thread = thread  # type: ignore[attr-defined]
    thread.start()
    return server, server.url


@contextlib.contextmanager
def code_server(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None
) -> Iterator[tuple[CodeExecutionServer, str]]:
    server, url = start_code_server(host, port, config)
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
    parser.add_argument("--work_root", default=None)
    parser.add_argument("--no_kernel_isolation", action="store_true", help="skip namespaces and uid drop")
    parser.add_argument("--no_python_guard", action="store_true")
    parser.add_argument("--log_level", default="INFO")
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
    )
    executor = CodeExecutor(config)
    server = CodeExecutionServer((args.host, args.port), executor)
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
