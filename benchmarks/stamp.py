"""Where and when a benchmark number was measured, and in which format: machine, commit, date and schema,
written into every result.

A number without its machine, commit and staleness policy cannot be compared with the next run's; the results
pages quote the stamp above each table (`docs/results/`). The schema names the benchmark that wrote the file and the
version of its format: code that reads a result file (`read_result`) refuses another benchmark's or an older
format in one line instead of failing on a missing key.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from open_instruct.errors import UserError

REPO = Path(__file__).resolve().parents[1]

# Each benchmark's result format; raise a version when a key its readers need changes (2: results carry one).
# The stamp's "staleness" (added later) is for people: readers never need it, and a file without it is read.
SCHEMA_VERSIONS = {
    "e2e": 2,
    "faults": 2,
    "generation": 2,
    "learner_step": 2,
    "lora": 1,
    "driver_headroom": 1,
    "replay": 2,
    "simulator": 2,
    "staleness_learning": 2,
    "weight_sync": 2,
    "window_cpu": 2,
    "window_sim": 2,
    "zero3_memory": 2,
}


class ResultFileError(UserError):
    """A result file this code cannot read: missing, not JSON, another benchmark's, or an older format."""


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


def stamp(benchmark: str, staleness: str | dict[str, str] = "") -> dict:
    """{"date", "commit", "dirty", "machine": {...}, "schema": {"name", "version"}, "staleness"}; commit is None
    outside a git checkout. `staleness`: the policy measured (`StalenessPolicy.describe`), one per mode where the
    modes differ, or "" where none applies (generation or a learner step alone)."""
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
        "schema": {"name": benchmark, "version": SCHEMA_VERSIONS[benchmark]},
        "staleness": staleness,
    }


def read_result(path: Path, benchmark: str) -> dict:
    """A result file of `benchmark` in the format this code reads, or a `ResultFileError` in one line."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such file") from None
    except (OSError, ValueError) as error:
        raise ResultFileError(f"{path}: not a readable JSON file ({type(error).__name__}: {error})") from None
    schema = (data.get("stamp") or {}).get("schema") if isinstance(data, dict) else None
    wanted = SCHEMA_VERSIONS[benchmark]
    if not isinstance(schema, dict) or (schema.get("name"), schema.get("version")) != (benchmark, wanted):
        found = f"{schema.get('name')} v{schema.get('version')}" if isinstance(schema, dict) else "no schema (older)"
        raise ResultFileError(
            f"{path}: a result of {found}, this code reads {benchmark} v{wanted}: measure it again "
            f"(python -m benchmarks.{benchmark})"
        )
    return data


def describe(s: dict) -> str:
    """A table's header: date, commit, machine, and the staleness policy measured (a line per mode where they
    differ)."""
    m = s["machine"]
    memory = f", {m['memory_gib']:.0f} GiB" if m.get("memory_gib") else ""
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    commit = f"{s['commit']}{' (uncommitted changes)' if s['dirty'] else ''}" if s["commit"] else "no git checkout"
    where = f"measured {s['date']} at commit {commit} on {m['cpu_count']} cores ({m['cpu_model']}){memory}{gpu}"
    staleness = s.get("staleness")
    if isinstance(staleness, dict):
        modes = "".join(f"\n  {mode}: {policy}" for mode, policy in staleness.items())
        return f"{where}\nstaleness policy per mode:{modes}"
    return f"{where}\nstaleness policy: {staleness}" if staleness else where


class _Tee:
    """A stream that writes to two."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def write(self, text: str) -> int:
        self.second.write(text)
        return self.first.write(text)

    def flush(self) -> None:
        self.first.flush()


@contextlib.contextmanager
def results_page(page: Path, title: str, result_stamp: dict):
    """What the benchmark prints inside, printed as usual and written to `page` too: the title, the stamp and the
    printed text as a code block, the page `PUBLISH=1 bash scripts/cpu_benchmarks.sh` copies into docs/results/."""
    copy = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, copy)):
        yield
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(page_text(title, result_stamp, copy.getvalue().strip()))


def page_text(title: str, result_stamp: dict, report: str) -> str:
    """A results page: the title, the stamp, and the report as a code block."""
    return f"# {title}\n\n{describe(result_stamp)}\n\n```\n{report}\n```\n"
