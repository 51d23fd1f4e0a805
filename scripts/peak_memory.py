"""Run a command and report the peak memory of its whole process tree (Ray, engines, learners included).

    .venv/bin/python scripts/peak_memory.py -- bash scripts/cpu_demo.sh

Hardware: any Linux machine. Samples every process descended from the command once per
`--interval` seconds and sums their proportional set size (PSS: shared pages split between the
processes sharing them, so shared libraries are not counted once per process). Prints the peak
and the wall time at the end and exits with the command's status.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psutil


def tree_pss_bytes(root: psutil.Process) -> int:
    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    started = time.monotonic()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_pss_bytes(root))
        time.sleep(args.interval)
    elapsed = time.monotonic() - started
    print(
        f"peak memory (PSS of the whole process tree): {peak / 2**30:.2f} GiB; wall time {elapsed:.0f} s",
        file=sys.stderr,
    )
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
