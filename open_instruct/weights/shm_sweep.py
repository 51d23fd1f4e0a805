"""Shared-memory files that no process uses any more: vLLM's message queues of killed engines.

vLLM's engine processes talk through `multiprocessing.shared_memory` segments (`/dev/shm/psm_*`, see
vllm/distributed/device_communicators/shm_broadcast.py). An engine that exits cleanly unlinks them; one
that is killed (replaced after a failure, or ended with the cluster) leaves them, and a long run with
restarts fills /dev/shm. Like our own staged weight files (`weights.shm.remove_orphans`) they are
swept: after an engine is replaced (`EnginePool`) and at shutdown (`cluster`).

A file is removed only when all of these hold: its name starts with `psm_`; it belongs to this user and
no one else may open it (mode 0600, as Python creates them); no process visible in /proc maps it or holds
it open, and every process of this user that started after this one (as a run's engines all do) could be
read (a container's init often cannot be, even by root); and it was last modified at least `margin_s` ago,
so a segment being created (opened, not yet mapped) is never taken. Processes in other PID namespaces are
not visible: a container sharing this /dev/shm without sharing its PID namespace is not covered. Only the
node the caller runs on is swept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "psm_"  # Python's name for an anonymous `SharedMemory` segment (multiprocessing.shared_memory)
MARGIN_S = 60.0


def orphaned(files: dict[str, float], held: set[str] | None, now: float, margin_s: float = MARGIN_S) -> list[str]:
    """The decision, pure: of `files` (path -> last modification time), those no process holds and older than
    `margin_s`. `held` None means the process table could not be read completely: nothing is removed."""
    if held is None:
        return []
    return sorted(path for path, mtime in files.items() if path not in held and now - mtime >= margin_s)


def held_paths(directory: str, proc_root: str = "/proc") -> set[str] | None:
    """Paths under `directory` that a live process maps (/proc/PID/maps) or holds open (/proc/PID/fd).
    None when a process of this user that started after this one could not be read (another user's process
    cannot open our 0600 files; an older one is not one of the engines this process started)."""
    prefix = os.path.join(directory, "")
    own_start = _start_ticks(os.path.join(proc_root, "self"))
    held: set[str] = set()
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        try:
            held |= _paths_of(entry.path, prefix)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        except PermissionError:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if os.stat(entry.path).st_uid == os.getuid() and _start_ticks(entry.path) >= own_start:
                    return None
    return held


def _start_ticks(process: str) -> int:
    """When the process started (clock ticks after boot: field 22 of /proc/PID/stat)."""
    with open(os.path.join(process, "stat"), encoding="utf-8", errors="replace") as f:
        after_name = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    return int(after_name[19])


def _paths_of(process: str, prefix: str) -> set[str]:
    paths = set()
    with open(os.path.join(process, "maps"), encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            path = fields[5].rstrip("\n") if len(fields) == 6 else ""
            if path.startswith(prefix):  # "PATH (deleted)": an unlinked file, not the one at PATH now
                paths.add(path)
    for fd in os.scandir(os.path.join(process, "fd")):
        with contextlib.suppress(OSError):
            target = os.readlink(fd.path)
            if target.startswith(prefix):
                paths.add(target)
    return paths


def candidates(directory: str, prefix: str = PREFIX) -> dict[str, float]:
    """This user's private files named `prefix*` in `directory`: path -> last modification time."""
    found = {}
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in names:
        if not name.startswith(prefix):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            private = stat.S_IMODE(info.st_mode) & 0o077 == 0
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and private:
                found[path] = info.st_mtime
    return found


def sweep(
    directory: str = "/dev/shm", proc_root: str = "/proc", margin_s: float = MARGIN_S, now: float | None = None
) -> list[str]:
    """Remove the orphaned `psm_*` files of `directory` (see the module); returns the paths removed. Never
    raises: a sweep that cannot read or remove something leaves it."""
    directory = os.path.realpath(directory)  # /proc shows resolved paths
    try:
        files = candidates(directory)
        if not files:
            return []
        doomed = orphaned(files, held_paths(directory, proc_root), time.time() if now is None else now, margin_s)
    except OSError as error:
        logger.info("shared-memory sweep of %s skipped: %s", directory, error)
        return []
    removed = []
    for path in doomed:
        with contextlib.suppress(FileNotFoundError, PermissionError):
            Path(path).unlink()
            removed.append(path)
    if removed:
        logger.warning("removed %d shared-memory file(s) left by killed processes: %s", len(removed), removed)
    return removed
