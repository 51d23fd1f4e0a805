"""A cgroup per concurrency slot, so that memory, process count and CPU are bounded per job, not per process.

rlimits bind one process each: 16 processes of one bash job could hold 16 x 2 GiB and as many cores. Where the
kernel lets the service make cgroups (it runs as root, and the hierarchy is writable), each slot gets one:
`memory_limit_mb` for the whole job (swap included), `max_processes` tasks, and one CPU's worth of time. A
job's runner joins its slot's cgroup first thing, before it builds the rest of its sandbox, so everything the
job starts is counted there. The executor asks for two per slot: one for the slot's jobs (an assert
test's program among them), one beside it for the slot's judges.

cgroup v2 is used where this service's cgroup can delegate the three controllers to children (on a pure v2
host its own cgroup must not hold processes, the kernel's "no internal processes" rule, which is the case under
systemd with `Delegate=yes` or in a container started for it). Otherwise the v1 hierarchies (memory, pids, cpu),
where mounted. Otherwise none: `/health` says so, and the executor divides the memory limit between a bash
job's processes instead (Python jobs cannot start processes: the guard refuses).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class SlotLimits:
    memory_bytes: int
    max_processes: int
    cpus: float = 1.0


@dataclass
class SlotCgroups:
    version: int
    slot_dirs: dict[int, list[str]]  # slot -> its cgroup directories (one in v2, one per controller in v1)
    controllers: tuple[str, ...]
    created: list[str] = field(default_factory=list)  # to remove on close, children first

    def procs_files(self, slot: int) -> list[str]:
        """What the slot's runner writes its pid into."""
        return [os.path.join(d, "cgroup.procs") for d in self.slot_dirs[slot]]

    def describe(self, limits: SlotLimits) -> dict[str, Any]:
        return {
            "per_slot": True,
            "version": self.version,
            "controllers": list(self.controllers),
            "memory_mb": limits.memory_bytes >> 20 if "memory" in self.controllers else None,
            "max_processes": limits.max_processes if "pids" in self.controllers else None,
            "cpus": limits.cpus if "cpu" in self.controllers else None,
        }

    def close(self) -> None:
        for path in reversed(self.created):
            with contextlib.suppress(OSError):  # still busy (a job being killed): left for the kernel to reap
                os.rmdir(path)


def create(slots: int, limits: SlotLimits, tag: str) -> tuple[SlotCgroups | None, str]:
    """One cgroup per slot, v2 first, then v1; or (None, why neither works here)."""
    if os.geteuid() != 0:
        return None, "the service is not root"
    reasons = []
    for version, make in ((2, _create_v2), (1, _create_v1)):
        try:
            made = make(slots, limits, tag)
        except OSError as e:
            reasons.append(f"v{version}: {e.strerror or e} ({getattr(e, 'filename', '') or ''})")
            continue
        if made is not None:
            return made, ""
        reasons.append(f"v{version}: not mounted or no controller delegated")
    return None, "; ".join(reasons)


def _mounts() -> list[tuple[str, str, str, list[str]]]:
    """(mount point, root within the hierarchy, fs type, super options) of each cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if tail and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[4], fields[3], tail[0], tail[2].split(",") if len(tail) > 2 else []))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _directory(mount_point: str, mount_root: str, path: str) -> str:
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root) :] or "/"
    return os.path.join(mount_point, path.lstrip("/"))


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(value)


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read()


def _create_v2(slots: int, limits: SlotLimits, tag: str) -> SlotCgroups | None:
    own = _own_cgroups().get("")
    mounts = [m for m in _mounts() if m[2] == "cgroup2"]
    if own is None or not mounts:
        return None
    point, root, _, _ = mounts[0]
    base = _directory(point, root, own)
    if not set(CONTROLLERS) <= set(_read(base, "cgroup.controllers").split()):
        return None
    enable = " ".join("+" + c for c in CONTROLLERS)
    if not set(CONTROLLERS) <= set(_read(base, "cgroup.subtree_control").split()):
        _write(base, "cgroup.subtree_control", enable)  # EBUSY where our own cgroup holds processes
    parent = os.path.join(base, f"oi-code-{tag}")
    os.mkdir(parent)
    made = SlotCgroups(2, {}, CONTROLLERS, [parent])
    try:
        _write(parent, "cgroup.subtree_control", enable)
        for slot in range(slots):
            directory = os.path.join(parent, f"slot{slot}")
            os.mkdir(directory)
            made.created.append(directory)
            _write(directory, "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # a kernel without swap accounting
                _write(directory, "memory.swap.max", "0")
            _write(directory, "pids.max", str(limits.max_processes))
            _write(directory, "cpu.max", f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}")
            made.slot_dirs[slot] = [directory]
    except BaseException:
        made.close()
        raise
    return made


def _create_v1(slots: int, limits: SlotLimits, tag: str) -> SlotCgroups | None:
    own = _own_cgroups()
    mounts = {}
    for point, root, fstype, options in _mounts():
        for controller in CONTROLLERS:
            if fstype == "cgroup" and controller in options and controller in own:
                mounts.setdefault(controller, _directory(point, root, own[controller]))
    if not mounts:
        return None
    controllers = tuple(c for c in CONTROLLERS if c in mounts)
    made = SlotCgroups(1, {slot: [] for slot in range(slots)}, controllers)
    try:
        for controller in controllers:
            for slot in range(slots):
                directory = os.path.join(mounts[controller], f"oi-code-{tag}-slot{slot}")
                os.mkdir(directory)
                made.created.append(directory)
                _limit_v1(controller, directory, limits)
                made.slot_dirs[slot].append(directory)
    except BaseException:
        made.close()
        raise
    return made


def _limit_v1(controller: str, directory: str, limits: SlotLimits) -> None:
    if controller == "memory":
        _write(directory, "memory.limit_in_bytes", str(limits.memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # memory+swap, where swap accounting is on
            _write(directory, "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
    elif controller == "pids":
        _write(directory, "pids.max", str(limits.max_processes))
    else:
        _write(directory, "cpu.cfs_period_us", str(_CPU_PERIOD_US))
        _write(directory, "cpu.cfs_quota_us", str(int(limits.cpus * _CPU_PERIOD_US)))
