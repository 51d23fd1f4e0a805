"""fate_share: a driver's processes end with it. A stand-in driver starts a tree (a shell with two children)
and a watcher on it, then is SIGKILLed: the watcher ends the whole tree; a driver that closes the watcher (as
`cluster.shutdown_ray` does after `ray.shutdown()`) has it end what is left at once, and waits for that. Plain
processes, no Ray (tests/integration/test_driver_sigkill.py does both to a driver of a real local Ray cluster).
Run: `.venv/bin/pytest tests/unit/test_fate_share.py` (seconds).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

DRIVER = """
import subprocess, sys, time
import psutil
from open_instruct import fate_share
tree = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300 & wait"])
watcher = fate_share.watch([tree.pid])
while len(psutil.Process(tree.pid).children()) < 2:  # the whole tree up before the watcher is closed
    time.sleep(0.05)
children = [p.pid for p in psutil.Process(tree.pid).children()]
if sys.argv[1] == "close":
    watcher.close()
print(tree.pid, watcher.process.pid, watcher.process.returncode, *children, flush=True)
time.sleep(300)
"""


def start_driver(mode: str) -> tuple[subprocess.Popen, list[int], int, str]:
    """The driver, its tree's pids (root first), and its watcher's pid and exit status ("None" while it runs)."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, text=True)
    tree_pid, watcher_pid, watcher_status, *children = driver.stdout.readline().split()
    return driver, [int(pid) for pid in (tree_pid, *children)], int(watcher_pid), watcher_status


def until(condition, deadline_s: float = 60.0) -> bool:
    """Polls `condition` until it holds or the deadline passes: what it waits for is an exit, which has no
    event to wait on from here."""
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def running(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_a_killed_driver_takes_its_tree_with_it():
    driver, members, watcher_pid, _ = start_driver("watch")
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert until(lambda: not running(members)), running(members)
    assert until(lambda: not running([watcher_pid]))  # and the watcher leaves


def test_a_closed_watcher_ends_what_is_left_before_close_returns():
    driver, tree, _, watcher_status = start_driver("close")
    try:
        assert watcher_status == "0"  # `close` waited for it to leave
        assert not running(tree)  # ... and it had ended the tree by then
    finally:
        driver.kill()
        driver.wait()
