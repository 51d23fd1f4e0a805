"""A driver of a real local Ray cluster SIGKILLed, as an out-of-memory killer would: every process of its
cluster (Ray's daemons, the raylet's agents, an actor) is gone within seconds, not the minute the agents took
before `fate_share`; a driver that shuts Ray down leaves none either once `shutdown_ray` returns (the agents
outlived a plain `ray.shutdown()` by minutes). Unit tests of the watcher itself: tests/unit/test_fate_share.py.
Run: `.venv/bin/pytest tests/integration/test_driver_sigkill.py` (about 30 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

DRIVER = """
import os, time
import ray
from open_instruct import cluster

cluster.init_ray()

@ray.remote(num_cpus=0)
class Actor:
    def pid(self):
        return os.getpid()

actor = Actor.remote()
print(ray.get(actor.pid.remote()), flush=True)
if input() == "shut down":
    cluster.shutdown_ray()
    print("done", flush=True)
time.sleep(600)
"""

# Longer than the watcher needs (its grace and one look, about 5 s), shorter than the agents lived without it.
GONE_WITHIN_S = 30


def start_driver() -> tuple[subprocess.Popen, list]:
    """The driver, once its actor runs, and every process of its cluster."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    actor_pid = int(driver.stdout.readline())
    members = psutil.Process(driver.pid).children(recursive=True)
    names = " ".join(p.name() for p in members)
    assert actor_pid in {p.pid for p in members} and "raylet" in names and "gcs_server" in names
    assert any("Agent" in " ".join(p.cmdline()) for p in members)  # the agents that outlived the driver
    return driver, members


def still_running(members) -> list[str]:
    left = []
    for p in members:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:80])
        except psutil.NoSuchProcess:  # it ended between the two questions
            continue
    return left


def test_a_driver_that_shuts_ray_down_leaves_no_process_of_its_cluster():
    driver, members = start_driver()
    try:
        driver.stdin.write("shut down\n")
        driver.stdin.flush()
        assert driver.stdout.readline() == "done\n"
        assert not still_running(members)  # `shutdown_ray` returned after the watcher had ended the rest
    finally:
        driver.kill()
        driver.wait()


def test_a_sigkilled_driver_leaves_no_process_of_its_ray_cluster():
    driver, members = start_driver()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    ends = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < ends and still_running(members):
        time.sleep(0.2)  # an exit has no event to wait on from here
    left = still_running(members)
    assert not left, f"still running {GONE_WITHIN_S} s after the driver's SIGKILL: {left}"
