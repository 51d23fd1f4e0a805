"""Local sandboxed code-execution HTTP service for the `code` / `code_stdio` verifiers (stdlib only).

`python -m code_server --host 127.0.0.1 --port 0` serves it; `code_server/code_api_setup.sh` starts it in
the background for a training job and exports CODE_API_URL.

__main__.py        `python -m code_server --host 127.0.0.1 --port 0` (first line: CODE_API_URL=...)
server.py          HTTP API (/health, /test_program, /test_program_stdio, /execute), start_code_server
protocol.py        request decoding (JSON / base64-zlib-pickle tests, globals refused), stdio comparison
executor.py        `CodeExecutor`: probes the sandbox layers, slot pool, a supervised sandbox per test
sandbox.py         the in-sandbox runner: namespaces, read-only mounts, uid drop, rlimits, audit-hook guard
remote_calls.py    assert tests judged outside the program: what the judge trusts, plain data over pipes, handles
syscall_filter.py  the seccomp filter (namespaces, mounts, bpf, keyctl, ptrace, AF_UNIX), compiled once
slot_cgroups.py    a cgroup per slot (v2, else v1): memory, process count and CPU bound per job
config.py          `SandboxConfig` (limits and switches)
"""

from code_server.config import SandboxConfig
from code_server.executor import CodeExecutor, RunOutcome, SandboxError
from code_server.protocol import BadRequestError, TestRequest, decode_tests, outputs_match, parse_test_request
from code_server.server import CodeExecutionServer, code_server, main, start_code_server

__all__ = [
    "BadRequestError",
    "CodeExecutionServer",
    "CodeExecutor",
    "RunOutcome",
    "SandboxConfig",
    "SandboxError",
    "TestRequest",
    "code_server",
    "decode_tests",
    "main",
    "outputs_match",
    "parse_test_request",
    "start_code_server",
]
