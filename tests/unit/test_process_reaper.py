"""The reaper that runs before a replacement engine starts (`generation.process_reaper.end_processes`), on real
processes: what exits by itself is reported as such, what does not is SIGKILLed, a pid the OS gave to another
process is left alone, and a zombie counts as gone."""

from __future__ import annotations

import subprocess
import sys

import psutil

from open_instruct.generation.process_reaper import end_processes, engine_processes

WAITS_FOR_STDIN = "import sys; sys.stdin.read()"
NEVER_EXITS = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)"


def start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def process_id(proc: subprocess.Popen) -> tuple[int, float]:
    return proc.pid, psutil.Process(proc.pid).create_time()


def test_a_process_that_exits_by_itself_is_not_killed_and_one_that_does_not_is():
    leaving, staying = start(WAITS_FOR_STDIN), start(NEVER_EXITS)
    leaving_id, staying_id = process_id(leaving), process_id(staying)
    leaving.stdin.close()  # it ends now: the reaper returns as soon as it is gone, well within the grace
    assert end_processes((leaving_id,), grace_s=120.0) == {"exited": [leaving.pid], "killed": [], "alive": []}
    reaped = end_processes((staying_id,), grace_s=0.2, kill_wait_s=30.0)
    assert reaped == {"exited": [], "killed": [staying.pid], "alive": []}
    assert staying.wait(timeout=10) == -9 and leaving.wait(timeout=10) == 0


def test_a_reused_pid_is_someone_elses_and_is_left_alone():
    other = start(NEVER_EXITS)
    try:
        pid, started = process_id(other)
        reaped = end_processes(((pid, started - 100.0),), grace_s=0.0)
        assert reaped == {"exited": [pid], "killed": [], "alive": []}
        assert other.poll() is None  # still running
    finally:
        other.kill()
        other.wait(timeout=10)


def test_a_zombie_counts_as_gone():
    child = start(WAITS_FOR_STDIN)
    ids = (process_id(child),)
    child.stdin.close()
    # Not reaped by us (no wait()): it stays a zombie once it exits, which end_processes must not wait out.
    reaped = end_processes(ids, grace_s=10.0)
    assert reaped["exited"] == [child.pid] and reaped["alive"] == [] and reaped["killed"] == []
    assert child.wait(timeout=10) == 0


def test_an_engine_records_itself_and_every_process_it_started():
    child = start(WAITS_FOR_STDIN)
    try:
        recorded = dict(engine_processes())
        assert recorded[child.pid] == psutil.Process(child.pid).create_time()
        assert psutil.Process().pid in recorded
    finally:
        child.stdin.close()
        child.wait(timeout=10)
