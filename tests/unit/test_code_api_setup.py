"""code_server/code_api_setup.sh starts a healthy code-execution service and exports its URL.

What: source the script in a strict bash (`set -euo pipefail`), as the Beaker command does, read back
CODE_API_URL / CODE_API_PID, check `GET /health` and one real `code` verification through the exported URL
(via open_instruct.rewards.code_tests, so the URL convention is the one the verifier expects), then stop
the server. A server that cannot start must make the script return 1, so `&& python grpo_fast.py` never
runs without its verifier. The same holds for configs/beaker_configs/code_api_setup.sh, the path launch
commands source, which only forwards to the script (sourced, or executed with bash).

Run: `.venv/bin/pytest tests/unit/test_code_api_setup.py` (a few seconds; CPU only). Cleanup kills only the
processes of the sessions this test started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers.processes import session_pids

from open_instruct.rewards.code_tests import code_api_headers, endpoint_url, run_tests

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "code_server" / "code_api_setup.sh"
SHIM = REPO / "configs" / "beaker_configs" / "code_api_setup.sh"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def stop_session(sid: int) -> list[int]:
    """SIGTERM then SIGKILL every live process of session `sid` (ours); returns survivors."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return session_pids(sid)


def source_script(
    tmp_path: Path, after: str, extra_env: dict[str, str] | None = None, script: Path = SCRIPT
) -> subprocess.CompletedProcess:
    return run_bash(tmp_path, f"set -euo pipefail; source {script} && {after}", extra_env)


def run_bash(tmp_path: Path, command: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path), **(extra_env or {})}
    names = ("CODE_API_HOST", "CODE_API_URL", "NUM_NODES", "BEAKER_REPLICA_COUNT", "CODE_API_LOG", "CODE_API_KEY")
    for name in (*names, "CODE_SANDBOX_ALLOW_WEAK"):
        if name not in (extra_env or {}):
            env.pop(name, None)
    proc = subprocess.Popen(
        ["bash", "-c", command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the server inherits this session: how cleanup finds it
    )
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.sid = proc.pid  # type: ignore[attr-defined]
    return result


@pytest.mark.parametrize("script", [SCRIPT, SHIM], ids=["code_server", "beaker_configs_shim"])
def test_sourced_script_exports_a_healthy_code_api_url(tmp_path, monkeypatch, script):
    for name in ("NO_PROXY", "no_proxy"):  # requests honours proxy variables; a local service needs none
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    result = source_script(
        tmp_path,
        'echo "CODE_API_URL=$CODE_API_URL"; echo "CODE_API_PID=$CODE_API_PID"; echo "CODE_API_LOG=$CODE_API_LOG"',
        script=script,
    )
    check_running_service(result, tmp_path)


@pytest.mark.parametrize("script", [SCRIPT, SHIM], ids=["code_server", "beaker_configs_shim"])
def test_executed_script_prints_the_assignments_and_leaves_the_server_running(tmp_path, monkeypatch, script):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    # From another directory: the script finds the repository from its own path, not the working directory.
    result = run_bash(tmp_path, f"cd {tmp_path} && bash {script}")
    check_running_service(result, tmp_path)


def test_a_key_in_code_api_key_is_required_by_the_service_and_sent_by_its_clients(tmp_path, monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    monkeypatch.setenv("CODE_API_KEY", "setup-test-key")  # the verifier in this process sends it
    result = source_script(
        tmp_path,
        'echo "CODE_API_URL=$CODE_API_URL"; echo "CODE_API_PID=$CODE_API_PID"; echo "CODE_API_LOG=$CODE_API_LOG"; '
        'echo "CODE_API_KEY=$CODE_API_KEY"; ps -o args= -p "$CODE_API_PID"',
        {"CODE_API_KEY": "setup-test-key"},
    )
    try:
        assert result.returncode == 0, result.stderr
        assert "CODE_API_KEY=setup-test-key" in result.stdout.splitlines()
        assert result.stdout.count("setup-test-key") == 1, "the key shows in the server's command line"
        url = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)["CODE_API_URL"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            NO_PROXY.open(url + "/health", timeout=10)
        assert refused.value.code == 401
    except BaseException:
        stop_session(result.sid)
        raise
    check_running_service(result, tmp_path)  # /health and a verification with the key, then stops the server


def check_running_service(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    """`result` printed CODE_API_URL/PID/LOG of a server that still answers; stops that server."""
    try:
        assert result.returncode == 0, result.stderr
        values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        url, pid = values["CODE_API_URL"], int(values["CODE_API_PID"])
        # Loopback by default: nothing outside this node reaches it.
        assert url.startswith("http://127.0.0.1:")
        # open-instruct's convention: the base URL; clients append /test_program or /test_program_stdio.
        assert not url.endswith("/test_program")
        assert Path(values["CODE_API_LOG"]).parent == tmp_path

        # The sourcing shell has exited; the server must still be running and answering.
        assert pid in session_pids(result.sid)
        with NO_PROXY.open(urllib.request.Request(url + "/health", headers=code_api_headers()), timeout=10) as reply:
            assert reply.status == 200
            assert json.load(reply)["status"] == "healthy"

        # The verifier's own URL handling reaches the right endpoint and gets a real verdict.
        reply = run_tests(
            endpoint_url(url, stdio=False),
            "def add(a, b):\n    return a + b\n",
            ["assert add(1, 2) == 3"],
            5.0,
        )
        assert reply["results"] == [1]
    finally:
        survivors = stop_session(result.sid)
    assert not survivors, f"processes left running: {survivors}"


@pytest.mark.parametrize("script", [SCRIPT, SHIM], ids=["code_server", "beaker_configs_shim"])
def test_a_server_that_cannot_start_fails_the_chain_and_is_cleaned_up(tmp_path, script):
    # An unknown server flag makes the server exit at once (argparse); the script must notice, not hang.
    result = source_script(tmp_path, "echo TRAINING_STARTED", {"CODE_API_SERVER_ARGS": "--no_such_flag"}, script=script)
    survivors = stop_session(result.sid)
    assert result.returncode == 1
    assert "TRAINING_STARTED" not in result.stdout
    assert "did not come up" in result.stderr
    assert "--no_such_flag" in result.stderr  # the server's own error, from the log's tail
    assert not survivors


def test_a_server_without_kernel_layers_starts_only_when_the_weak_mode_is_allowed(tmp_path, monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    # --no_kernel_isolation stands in for a machine where the service is not root.
    weak = {"CODE_API_SERVER_ARGS": "--no_kernel_isolation"}
    refused = source_script(tmp_path, "echo TRAINING_STARTED", weak)
    assert not stop_session(refused.sid)
    assert refused.returncode == 1 and "TRAINING_STARTED" not in refused.stdout
    assert "kernel layers missing (netns, mountns" in refused.stderr  # the server's one line, from the log's tail
    assert "CODE_SANDBOX_ALLOW_WEAK=1" in refused.stderr

    show = 'echo "CODE_API_URL=$CODE_API_URL"; echo "CODE_API_LOG=$CODE_API_LOG"'
    allowed = source_script(tmp_path, show, {**weak, "CODE_SANDBOX_ALLOW_WEAK": "1"})
    try:
        assert allowed.returncode == 0, allowed.stderr
        exported = dict(line.split("=", 1) for line in allowed.stdout.splitlines() if "=" in line)
        with NO_PROXY.open(exported["CODE_API_URL"] + "/health", timeout=10) as reply:
            assert json.load(reply)["sandbox"]["mode"] == "weak"
        assert "WARNING code sandbox: WEAK mode" in Path(exported["CODE_API_LOG"]).read_text()
    finally:
        assert not stop_session(allowed.sid)
