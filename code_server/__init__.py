"""Local sandboxed code-execution HTTP service for the `code` / `code_stdio` verifiers (stdlib only).

`python -m code_server --host 127.0.0.1 --port 0` serves it; `code_server/code_api_setup.sh` starts it in
the background for a training job and exports CODE_API_URL. Modules: `server` (HTTP API, CLI),
`protocol` (request decoding, stdio output comparison), `executor` (concurrency, supervision of each
test process), `sandbox` (the in-sandbox runner and its isolation layers), `config` (limits).
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
