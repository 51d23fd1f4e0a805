"""The local Ray cluster a driver starts ends with the driver, however the driver ends.

`ray.init` starts its daemons (GCS, raylet, dashboard, monitors) fate-shared with the driver, but the raylet's
agents (`DashboardAgent`, `RuntimeEnvAgent`) are not: after a driver killed without warning (SIGKILL, as an
out-of-memory killer does) they lived on for 40 to 70 seconds, and whatever an actor had started (a vLLM
engine core, a sandbox) had no one left to end it; after `ray.shutdown()` the agents lived on for minutes. On a
shared node that is memory held for nobody, and a resubmitted job meets it.

`watch(roots)` starts a watcher, a small process in a session of its own, that follows the processes under
`roots` (Ray's daemons, recorded by `cluster.init_ray`) and their descendants as they come, and holds the read
end of a pipe whose write end only the driver holds. The kernel closes that end when the driver ends, in any
way; on that EOF the watcher ends every process it follows still running (SIGTERM, then SIGKILL after a grace).
A driver that shuts Ray down itself closes the pipe after `ray.shutdown()` (`Watcher.close`), so that the
watcher ends what the shutdown left. psutil only, no Ray.

    python -m open_instruct.fate_share ROOT_PID ...   # the watcher (started by `watch`)
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass

# How often the watcher looks for new descendants: a process started between two looks and orphaned by the
# driver's death is found by the last look, which follows the survivors' children.
LOOK_EVERY_S = 2.0
# How long the followed processes have to exit after SIGTERM before SIGKILL.
GRACE_S = 3.0


@dataclass
class Watcher:
    process: subprocess.Popen
    pipe: int  # the write end, held by the driver only

    def close(self) -> None:
        """After the driver's `ray.shutdown()`: the watcher ends what the shutdown left (the raylet's agents) and
        leaves; this waits for it."""
        try:
            os.close(self.pipe)
        except OSError:  # closed already
            return
        self.process.wait(timeout=30)


def watch(roots: list[int]) -> Watcher:
    read, write = os.pipe()  # both ends close-on-exec: no process the driver starts later holds `write`
    process = subprocess.Popen(
        [sys.executable, "-m", "open_instruct.fate_share", *map(str, roots)],
        stdin=read,
        start_new_session=True,  # a Ctrl-C to the driver's process group must not end the watcher first
    )
    os.close(read)
    return Watcher(process, write)


ProcessKey = tuple[int, float]  # pid and start time: a pid the kernel gave to another process is not followed


def descendants(followed: dict[ProcessKey, object]) -> dict[ProcessKey, object]:
    """`followed` (psutil processes still running) with their children, recursively, as they are now: one pass
    over the process table per look."""
    import psutil

    children = collections.defaultdict(list)
    for process in psutil.process_iter(["ppid"]):
        children[process.info["ppid"]].append(process)
    found, todo = {}, list(followed.values())
    while todo:
        process = todo.pop()
        try:
            key = (process.pid, process.create_time())
            if key in found or not process.is_running():
                continue
        except psutil.NoSuchProcess:
            continue
        found[key] = process
        todo.extend(children.get(process.pid, ()))
    return found


def _running(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # it ended between the two questions
        return False


def end(followed: dict[ProcessKey, object], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every followed process, SIGKILL those left after `grace_s`; the pids that were still running."""
    import psutil

    alive = [p for p in followed.values() if _running(p)]
    for p in alive:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    _, left = psutil.wait_procs(alive, timeout=grace_s)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(left, timeout=grace_s)
    return [p.pid for p in alive]


def follow(roots: list[int], look_every_s: float = LOOK_EVERY_S) -> int:
    """The watcher's loop: follow the trees under `roots` until every process of them is gone, or stdin closes:
    then end those still running. Exit 0 in each case (nobody reads the status)."""
    import psutil

    followed = {}
    for pid in roots:
        try:
            p = psutil.Process(pid)
            followed[(pid, p.create_time())] = p
        except psutil.NoSuchProcess:
            continue
    while True:
        followed = descendants(followed)
        if not followed:  # the cluster ended whole (`ray.shutdown()` without `close`, and nothing left)
            return 0
        ready, _, _ = select.select([sys.stdin.buffer], [], [], look_every_s)
        if ready:  # EOF: the driver closed the pipe after its shutdown, or ended
            ended = end(descendants(followed))
            if ended:
                print(f"fate_share: ended {len(ended)} processes of the driver's Ray cluster", file=sys.stderr)
            return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(follow([int(pid) for pid in sys.argv[1:]]))
