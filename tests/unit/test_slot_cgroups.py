"""A cgroup per slot of the code service (`code_server/slot_cgroups.py`): a job's processes share one memory
limit, one process count and one CPU, instead of each getting the rlimits anew (issue 48, "limits per job").

Real cgroups on this machine: the tests skip, naming why, where the service cannot make them (not root, or
no writable hierarchy); then /health must say so and what stands in instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from code_server import SandboxConfig, code_server
from code_server.slot_cgroups import SlotLimits, create


@pytest.fixture(scope="module")
def service() -> Iterator[tuple[object, str]]:
    with code_server(config=SandboxConfig(max_concurrency=2, memory_limit_mb=512)) as handle:
        yield handle


def cgroups_or_skip(server: object) -> dict:
    described = server.executor.cgroups
    if not described["per_slot"]:
        assert "rlimits per process" in described["instead"] and described["why"]
        pytest.skip(f"no cgroups here: {described['why']}")
    return described


def test_health_says_which_cgroups_bind_and_every_job_joins_its_slots(service) -> None:
    server, url = service
    described = cgroups_or_skip(server)
    health = requests.get(url + "/health", timeout=10).json()["sandbox"]
    assert health["cgroups"] == described and health["cgroup"] is True
    assert described["controllers"] == ["memory", "pids", "cpu"] and described["memory_mb"] == 512
    program = "def own_cgroups():\n    return open('/proc/self/cgroup').read()\n"
    # The program (asked through own_cgroups) is in its slot's cgroup; the judge, which runs this test, is in one
    # of its own beside it: a program that fills the slot's budget cannot keep its judge from starting.
    tests = [
        "judge = open('/proc/self/cgroup').read()\nassert 'oi-code-' in own_cgroups() and 'oi-code-' in judge\n"
        "assert own_cgroups() != judge"
    ]
    assert requests.post(url + "/test_program", json={"program": program, "tests": tests}, timeout=60).json()[
        "results"
    ] == [1]


def test_a_bash_jobs_processes_share_one_memory_limit(service) -> None:
    """Four processes of 200 MiB each fit their rlimits (512 MiB each) but not the slot's 512 MiB together."""
    server, url = service
    cgroups_or_skip(server)
    if not server.executor.bash_ready:
        pytest.skip("bash needs the kernel layers")
    # Each child holds its 200 MiB until every child has either said so or died: no timing involved.
    command = """python - <<'EOF'
import subprocess, sys
child = "import sys; b = bytearray(200 << 20); print('held', flush=True); sys.stdin.read()"
pipe = subprocess.PIPE
kids = [subprocess.Popen([sys.executable, "-c", child], stdin=pipe, stdout=pipe) for _ in range(4)]
for kid in kids:
    kid.stdout.readline()
for kid in kids:
    kid.stdin.close()
print(" ".join(f"exit={kid.wait()}" for kid in kids))
EOF"""
    reply = requests.post(url + "/execute", json={"code": command, "language": "bash", "timeout": 30}, timeout=90)
    exits = reply.json()["output"].split()
    # Some fit, and the slot's OOM killer ended the rest: the limit held them together, not one by one.
    assert len(exits) == 4 and "exit=0" in exits and "exit=-9" in exits, reply.json()


def test_the_cgroups_are_removed_when_the_service_closes() -> None:
    if os.geteuid() != 0:
        pytest.skip("cgroups need root")
    made, why = create(2, SlotLimits(256 << 20, 8), tag=f"{os.getpid()}-test")
    if made is None:
        pytest.skip(f"no cgroups here: {why}")
    directories = [d for slot in (0, 1) for d in made.slot_dirs[slot]]
    assert all(os.path.isdir(d) for d in directories)
    limit_files = [os.path.join(d, n) for d in directories for n in ("memory.limit_in_bytes", "memory.max")]
    assert any(Path(f).read_text().strip() == str(256 << 20) for f in limit_files if os.path.exists(f))
    made.close()
    assert not any(os.path.exists(d) for d in made.created)
