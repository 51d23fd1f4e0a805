"""Where and when a benchmark number was measured: machine, commit and date, written into every result.

A number without its machine and commit cannot be compared with the next run's; the docs quote the
stamp next to each table (`docs/benchmarks.md`).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def stamp() -> dict:
    """{"date", "commit", "dirty", "machine": {...}}; commit is None outside a git checkout."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    machine = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            machine["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": bool(status),
        "machine": machine,
    }


def describe(s: dict) -> str:
    """One line for a table's header: date, commit, machine."""
    m = s["machine"]
    memory = f", {m['memory_gib']:.0f} GiB" if m.get("memory_gib") else ""
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    commit = f"{s['commit']}{' (uncommitted changes)' if s['dirty'] else ''}" if s["commit"] else "no git checkout"
    return f"measured {s['date']} at commit {commit} on {m['cpu_count']} cores ({m['cpu_model']}){memory}{gpu}"
