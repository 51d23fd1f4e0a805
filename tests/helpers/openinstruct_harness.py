"""open-instruct's in-process assert harness, re-implemented only as far as comparing verdicts needs.

open-instruct's `code_utils.get_successful_tests_fast` skips a program that contains a keyword of its
`should_execute` list, then for each test starts a `multiprocessing.Process` that applies
`reliability_guard()` (which sets `exit`/`quit` to None and disables process and file-removal functions),
runs `exec(program)` and `exec(test)` in one fresh namespace, and records 1 if both return; the parent joins
for `max_execution_time` and kills what is still running. Here one helper interpreter forks a child per test
(the same fresh namespace and guard-free semantics a correct program sees), with a CPU alarm at the limit.
The corpus test (`tests/unit/test_code_test_forms.py`) compares its verdicts with the service's.
"""

from __future__ import annotations

import json
import subprocess
import sys

DANGEROUS = (
    "threading",
    "multiprocess",
    "multiprocessing",
    "import os",
    "from os",
    "shutil",
    "import torch",
    "from torch",
    "import sklearn",
    "from sklearn",
)

_CHILD = r"""
import builtins, json, os, signal, sys
job = json.loads(sys.stdin.read())
results = []
for test in job["tests"]:
    pid = os.fork()
    if pid == 0:
        os.chdir(job["workdir"])
        signal.setitimer(signal.ITIMER_REAL, job["limit"])
        for name in ("exit", "quit"):
            setattr(builtins, name, None)
        ok = 0
        try:
            context = {"__builtins__": builtins}
            exec(job["program"], context)
            exec(test, context)
            ok = 1
        except BaseException:
            pass
        sys.stdout.flush()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    results.append(int(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0))
print("RESULTS=" + json.dumps(results))
"""


def run_like_openinstruct(program: str, tests: list[str], workdir: str, limit: float = 3.0) -> list[int]:
    """open-instruct's per-test verdicts (1 pass, 0 fail) for `program` against assert `tests`."""
    if any(word in program for word in DANGEROUS):
        return [0] * len(tests)
    job = {"program": program, "tests": tests, "limit": limit, "workdir": workdir}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=30 + limit * len(tests),
        check=True,
    )
    # The last such line: a program may print one of its own first.
    line = [line for line in done.stdout.splitlines() if line.startswith("RESULTS=")][-1]
    return json.loads(line.removeprefix("RESULTS="))
