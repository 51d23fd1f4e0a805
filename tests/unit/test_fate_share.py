"""fate_share: a driver's processes end with it. A stand-in driver starts a tree (a shell with two children)
and a watcher on it, then is SIGKILLed: the watcher ends the whole tree; a driver that releases the watcher
first leaves its tree alone. Plain processes, no Ray (tests/integration/test_driver_sigkill.py kills a driver of a
real local Ray cluster).
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
from open_instruct import fate_share
tree = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300 & wait"])
watcher = fate_share.watch([tree.pid])
if sys.argv[1] == "release":
    watcher.release()
print(tree.pid, watcher.process.pid, watcher.process.returncode, flush=True)
time.sleep(300)
"""


def start_driver(mode: str) -> tuple[subprocess.Popen, psutil.Process, int, str]:
    """The driver, its tree's root, and its watcher's pid and exit status ("None" while it runs)."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, text=True)
    tree_pid, watcher_pid, watcher_status = driver.stdout.readline().split()
    return driver, psutil.Process(int(tree_pid)), int(watcher_pid), watcher_status


def until(condition, deadline_s: float = 60.0) -> bool:
    """Polls `condition` until it holds or the deadline passes: what it waits for is an exit, which has no
    event to wait on from here."""
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def running(processes) -> list[int]:
    return [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_killed_driver_takes_its_tree_with_it():
    driver, tree, watcher_pid, _ = start_driver("watch")
    watcher = psutil.Process(watcher_pid)
    assert until(lambda: len(tree.children()) == 2)
    members = [tree, *tree.children()]
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert until(lambda: not running(members)), running(members)
    assert until(lambda: not running([watcher]))  # and the watcher leaves


def test_a_released_watcher_leaves_the_tree_alone():
    driver, tree, _, watcher_status = start_driver("release")
    assert watcher_status == "0"  # `release` waited for it to leave
    assert until(lambda: len(tree.children()) == 2)
    members = [tree, *tree.children()]
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    try:
        assert running([tree]) == [tree.pid]
    finally:
        for p in members:
            p.kill()
