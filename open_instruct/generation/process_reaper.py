"""An engine's processes, recorded when it starts and confirmed gone before its replacement starts.

vLLM runs its engine core (and on GPUs its workers) in processes the engine's actor starts. When the actor is
killed they usually follow it, but not always at once: on a GPU an EngineCore that outlived its actor still
holds most of the GPU's memory, and vLLM in the replacement would refuse to start on what is left. psutil
only, no Ray: `cluster.reap_engine_processes` runs `end_processes` on the engine's node.
"""

from __future__ import annotations

import time

ProcessId = tuple[int, float]  # a pid and its start time: a pid the OS gave to another process is not ours

# How long the old processes may take to exit by themselves before they are killed. Short: the engine is already
# dead or killed, and an orphaned EngineCore serves nobody (it often waits for its parent's next message).
REAP_GRACE_S = 2.0


def engine_processes() -> tuple[ProcessId, ...]:
    """This process and every process it started (vLLM's EngineCore, its workers), as they are now."""
    import psutil

    me = psutil.Process()
    found = []
    for process in [me, *me.children(recursive=True)]:
        try:
            found.append((process.pid, process.create_time()))
        except psutil.NoSuchProcess:  # a helper that exited while we looked
            continue
    return tuple(found)


def end_processes(processes: tuple[ProcessId, ...], grace_s: float = REAP_GRACE_S, kill_wait_s: float = 10.0) -> dict:
    """Wait up to `grace_s` for `processes` to exit, SIGKILL those still running, and wait up to `kill_wait_s`
    for them. Returns the pids that had exited, those killed, and those still running after all that (a
    process stuck in the kernel). A zombie counts as gone: it holds no memory."""
    import psutil

    running = _wait_gone([p for p in map(_ours, processes) if p is not None], grace_s)
    gone = {pid for pid, _ in processes} - {p.pid for p in running}
    killed = []
    for process in running:
        try:
            process.kill()
            killed.append(process.pid)
        except psutil.NoSuchProcess:
            gone.add(process.pid)
    left = _wait_gone(running, kill_wait_s)
    return {"exited": sorted(gone), "killed": sorted(killed), "alive": sorted(p.pid for p in left)}


def _ours(process_id: ProcessId):
    """The running process `process_id` names, or None when it is gone or its pid now names another one."""
    import psutil

    pid, started = process_id
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started) > 1e-3 or process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except psutil.NoSuchProcess:
        return None


def _wait_gone(processes: list, timeout_s: float) -> list:
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        running = []
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
            except psutil.NoSuchProcess:
                continue
        if not running or time.monotonic() >= deadline:
            return running
        processes = running
        time.sleep(0.05)
