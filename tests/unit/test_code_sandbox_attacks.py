"""Attacks that got past the code sandbox when the service ran without root (issue 48, "no silent weak mode").

Each attack is a program submitted to a real `python -m code_server` process, in full mode (root: every
kernel layer) and in the weak mode (kernel layers off, allowed explicitly through CODE_SANDBOX_ALLOW_WEAK=1,
as code_api_setup.sh passes it). The server's environment holds a secret (its CODE_API_KEY), which a
program must never print. A service without the kernel layers and without that permission must not start.

Run: `.venv/bin/pytest tests/unit/test_code_sandbox_attacks.py` (about 20 s; CPU only).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from code_server import SandboxConfig, SandboxError, start_code_server

REPO = Path(__file__).resolve().parents[2]
SECRET = "oi-secret-" + secrets.token_hex(12)
HEADERS = {"Authorization": f"Bearer {SECRET}"}


def start_cli(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("CODE_SANDBOX_ALLOW_WEAK", "CODE_API_KEY")} | env
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "code_server", "--port", "0", "--max_concurrency", "2", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


@pytest.fixture(scope="module", params=["full", "weak"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, mode) of a CLI service whose environment carries SECRET as its API key."""
    mode = request.param
    if mode == "full" and os.geteuid() != 0:
        pytest.skip("the full sandbox needs root")
    weak = {"CODE_SANDBOX_ALLOW_WEAK": "1"} if mode == "weak" else {}
    log = tmp_path_factory.mktemp(f"code-{mode}") / "server.log"
    args = ["--no_kernel_isolation"] if mode == "weak" else []
    proc = start_cli(args, {"CODE_API_KEY": SECRET, **weak}, log)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, log.read_text()
        line = proc.stdout.readline().strip()
        assert line.startswith("CODE_API_URL="), log.read_text()
        health = requests.get(line.split("=", 1)[1] + "/health", headers=HEADERS, timeout=10).json()
        assert health["sandbox"]["mode"] == mode, health
        if mode == "weak":  # announced on every start, not at INFO
            assert "WARNING code sandbox: WEAK mode" in log.read_text()
            assert health["sandbox"]["missing"] == [
                "netns",
                "mountns",
                "readonly_fs",
                "pidns",
                "uid_drop",
                "no_new_privs",
            ]
        yield line.split("=", 1)[1], mode
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def execute(base: str, program: str) -> dict:
    reply = requests.post(base + "/execute", json={"code": program, "timeout": 10}, headers=HEADERS, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_program(base: str, program: str, tests: list[str]) -> list[int]:
    body = {"program": program, "tests": tests, "max_execution_time": 5}
    reply = requests.post(base + "/test_program", json=body, headers=HEADERS, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["results"]


test_program.__test__ = False  # a helper named like the endpoint, not a test


# Every way to start a process that we know of: each runs `touch` on a marker in the work dir (writable in
# both modes) and one on the host (visible to this test in the weak mode, where the file system is shared).
SPAWN_ATTACK = r"""
import gc, importlib, importlib.machinery, importlib.util, json, os, sys, time

COMMAND = "touch spawned-{name} " + HOST_MARKER + "-{name}"
results = {}

def spawn_with(fork_exec, name):
    r, w = os.pipe()
    argv = [b"/bin/sh", b"-c", COMMAND.format(name=name).encode()]
    fork_exec(argv, [b"/bin/sh"], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1,
              None, None, None, -1, None, True)

def direct(name):
    import _posixsubprocess
    spawn_with(_posixsubprocess.fork_exec, name)

def subprocess_internal(name):
    import subprocess
    spawn_with(subprocess._fork_exec, name)

def fresh_module(name):
    sys.modules.pop("_posixsubprocess", None)
    import _posixsubprocess
    spawn_with(_posixsubprocess.fork_exec, name)

def from_spec(name):
    spec = importlib.machinery.PathFinder.find_spec("_posixsubprocess") or importlib.util.find_spec("_posixsubprocess")
    spawn_with(importlib.util.module_from_spec(spec).fork_exec, name)

def reloaded(name):
    import _posixsubprocess
    spawn_with(importlib.reload(_posixsubprocess).fork_exec, name)

def from_gc(name):
    found = [o for o in gc.get_objects() if type(o).__name__ == "builtin_function_or_method"
             and o.__name__ == "fork_exec"]
    spawn_with(found[0], name)

def subinterpreter(name):
    import _xxsubinterpreters
    code = f"import os; os.system({COMMAND.format(name=name)!r})"
    _xxsubinterpreters.run_string(_xxsubinterpreters.create(), code)

def run_subprocess(name):
    import subprocess
    subprocess.run(["/bin/sh", "-c", COMMAND.format(name=name)])

def posix_spawn(name):
    os.posix_spawn("/bin/sh", ["/bin/sh", "-c", COMMAND.format(name=name)], {})

def system(name):
    os.system(COMMAND.format(name=name))

def fork(name):
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", COMMAND.format(name=name)])

for action in (direct, subprocess_internal, fresh_module, from_spec, reloaded, from_gc, subinterpreter,
               run_subprocess, posix_spawn, system, fork):
    try:
        action(action.__name__)
        results[action.__name__] = "ran"
    except BaseException as e:
        results[action.__name__] = type(e).__name__
time.sleep(0.3)
print(json.dumps({"results": results, "spawned": sorted(n for n in os.listdir(".") if n.startswith("spawned-"))}))
"""


def test_no_way_of_spawning_a_process_gets_through(service: tuple[str, str], tmp_path: Path) -> None:
    base, _ = service
    host_marker = f"/tmp/oi-spawn-{secrets.token_hex(6)}"
    reply = execute(base, f"HOST_MARKER = {host_marker!r}\n" + SPAWN_ATTACK)
    outcome = json.loads(reply["output"])
    assert outcome["spawned"] == [], outcome
    assert "ran" not in outcome["results"].values(), outcome
    assert not [p for p in os.listdir("/tmp") if p.startswith(os.path.basename(host_marker))]


def test_a_program_that_reaches_for_fork_exec_scores_zero(service: tuple[str, str]) -> None:
    base, _ = service
    marker = f"/tmp/oi-spawn-{secrets.token_hex(6)}"
    program = (
        "import os, _posixsubprocess\nr, w = os.pipe()\n"
        f"_posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'touch {marker}'], [b'/bin/sh'], True, (w,), None, None, "
        "-1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, True)\n"
        "def add(a, b):\n    return a + b\n"
    )
    assert test_program(base, program, ["assert add(1, 2) == 3"]) == [0]
    assert not os.path.exists(marker)


ENVIRON_ATTACK = r"""
import json, os
ppid = os.getppid()
pids = {ppid} | {int(p) for p in os.listdir("/proc") if p.isdigit()}  # the supervisor is among them
paths = [f"/proc/{p}/environ" for p in sorted(pids)] + [
    f"/proc/self/../{ppid}/environ",
    f"/proc//{ppid}/environ",
    f"/proc/1/../{ppid}/environ",
    f"/dev/fd/../../{ppid}/environ",
    f"/proc/{ppid}/task/{ppid}/environ",
    f"/proc/{ppid}/root/proc/{ppid}/environ",
    f"/proc/{ppid}/cmdline",
    "link/environ",
]
os.symlink(f"/proc/{ppid}", "link")
seen = {}
for path in paths:
    try:
        with open(path, "rb") as f:
            seen[path] = f.read().decode(errors="replace")
    except OSError as e:
        seen[path] = type(e).__name__
print(json.dumps(seen))
"""


def test_the_server_environment_cannot_be_read(service: tuple[str, str]) -> None:
    base, mode = service
    reply = execute(base, ENVIRON_ATTACK)
    assert SECRET not in json.dumps(reply)
    seen = json.loads(reply["output"])
    if mode == "weak":  # no PID namespace: the parent is the service itself
        assert len(seen) > 8
    assert set(seen.values()) == {"PermissionError"}, {k: v[:80] for k, v in seen.items()}


def test_a_correct_solution_still_passes(service: tuple[str, str]) -> None:
    base, _ = service
    program = "import subprocess, asyncio\n\ndef add(a, b):\n    return a + b\n"  # importing them is harmless
    assert test_program(base, program, ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]) == [1, 1]


def test_a_service_without_kernel_layers_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    proc = start_cli(["--no_kernel_isolation"], {}, tmp_path / "server.log")
    out, _ = proc.communicate(timeout=60)
    lines = (tmp_path / "server.log").read_text().strip().splitlines()
    assert proc.returncode != 0 and "CODE_API_URL" not in out
    assert lines[-1].startswith("code_server: code sandbox: kernel layers missing (netns, mountns"), lines
    assert "--allow_weak_sandbox" in lines[-1] and "CODE_SANDBOX_ALLOW_WEAK=1" in lines[-1]

    with pytest.raises(SandboxError, match=r"kernel layers missing \(netns.*--allow_weak_sandbox"):
        start_code_server(config=SandboxConfig(kernel_isolation=False))
    with pytest.raises(SandboxError, match="the Python guard is off"):
        start_code_server(config=SandboxConfig(kernel_isolation=False, python_guard=False, allow_weak_sandbox=True))
