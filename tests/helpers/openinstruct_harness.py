"""open-instruct's in-process assert harness, re-implemented only as far as comparing verdicts needs.

open-instruct's `code_utils.get_successful_tests_fast` skips a program that contains a keyword of its
`should_execute` list, then for each test starts a `multiprocessing.Process` that applies
`reliability_guard()` (which sets `exit`/`quit` to None and disables process and file-removal functions),
runs `exec(program)` and `exec(test)` in one fresh namespace, and records 1 if both return; the parent joins
for `max_execution_time` and kills what is still running. Here one helper interpreter forks a child per test
(the same fresh namespace and guard-free semantics a correct program sees), with a CPU alarm at the limit.

For stdio programs, `get_successful_tests_stdio` applies the same keyword filter, then in one process (killed
after `limit * len(tests) + 5` s) grades every test with LiveCodeBench's `grade_stdio`: the program, its
top-level imports kept and every other statement moved into the body of one function, runs after a prelude of
star imports (math, collections, itertools, sys, ...), once per test, with `sys.stdin` and `open` replaced by
the test's input (its `readline` gives lines without their newline) and `sys.stdout` captured; `SystemExit` ends
a run normally, and each run has a SIGALRM of `ceil(limit)` s. The output then matches when both texts, stripped
and split at each newline, have as many lines and each pair of stripped lines is equal as text or as lists of
`Decimal`s. That comparison runs outside any `try`: a line that makes it raise (`sNaN`) zeroes the whole
batch. `run_stdio_like_openinstruct` does the same in one helper interpreter.

The corpus test (`tests/unit/test_code_test_forms.py`) compares these verdicts with the service's.
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


# The modules LiveCodeBench's prelude star-imports and imports, in its order.
_PRELUDE_MODULES = [
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
]
PRELUDE = (
    "".join(f"from {m} import *\n" for m in (*_PRELUDE_MODULES, "builtins", "typing"))
    + "".join(f"import {m}\n" for m in _PRELUDE_MODULES)
    + "sys.setrecursionlimit(50000)\n"
)

_STDIO_CHILD = r"""
import ast, builtins, io, json, math, signal, sys
from decimal import Decimal

job = json.loads(sys.stdin.read())
real_stdout = sys.stdout


class Alarm(Exception):
    pass


def on_alarm(signum, frame):
    raise Alarm


def as_function(code):
    # The `if __name__ == '__main__':` block, when last, is unwrapped; imports stay at the top level and the
    # rest becomes the body of `wrapped_function`, after the prelude.
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:
        pass
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        function = ast.FunctionDef(
            name="wrapped_function",
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=body, decorator_list=[], lineno=-1, type_params=[],
        )
        return job["prelude"] + "\n" + ast.unparse(imports) + "\n" + ast.unparse(function)
    except Exception:
        return code


class TestInput:
    # What the program reads: `readline` gives the next line without its newline, `readlines` every line
    # without newlines, `read` the whole text; `buffer.read` the whole bytes, `buffer.readline` always the
    # first line. Other attributes are a StringIO's; there is no `__iter__` (`for line in sys.stdin` fails).
    def __init__(self, text):
        self.text, self.lines, self.other = text, iter(text.split("\n")), io.StringIO(text)
        self.buffer = Buffer(text.encode())

    def read(self, *args):
        return self.text

    def readline(self, *args):
        return next(self.lines)

    def readlines(self, *args):
        return self.text.split("\n")

    def __getattr__(self, name):
        return getattr(self.other, name)


class Buffer:
    def __init__(self, data):
        self.data = data

    def read(self, *args):
        return self.data

    def readline(self, *args):
        return self.data.split(b"\n")[0] + b"\n"


def lines(text):
    return [line.strip() for line in text.strip().split("\n")]


def decimals(line):
    try:
        return [Decimal(token) for token in line.split()]
    except Exception:
        return None


def matches(prediction, gt_out):
    got, want = lines(prediction), lines(gt_out)
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        if a != b and (decimals(a) is None or decimals(b) is None or decimals(a) != decimals(b)):
            return False
    return True


def grade(program, tests, limit):
    signal.signal(signal.SIGALRM, on_alarm)
    namespace = {"__name__": "tmp_sol"}
    signal.alarm(limit)
    try:
        code = as_function(program)
        exec(code, namespace)
        # A program that names `class Solution` is graded through an instance of it (none at the top level
        # once the program is a function's body, so such a program fails).
        owner = namespace["Solution"]() if "class Solution" in code else None
        method = namespace["wrapped_function"] if owner is None else owner.wrapped_function
    except BaseException:
        return [0] * len(tests)
    finally:
        signal.alarm(0)
    results = []
    for test in tests:
        gt_inp, gt_out = test["input"], test["output"]
        captured = io.StringIO()
        sys.stdin, sys.stdout = TestInput(gt_inp), captured
        builtins.open = lambda *args, **kwargs: io.StringIO(gt_inp)
        signal.alarm(limit)
        try:
            try:
                method()
            except SystemExit:
                pass
            prediction = captured.getvalue()
        except Exception:
            prediction = None
        finally:
            signal.alarm(0)
            sys.stdout = real_stdout
        results.append(0 if prediction is None else int(matches(prediction, gt_out)))
    return results


for name in ("exit", "quit"):
    setattr(builtins, name, None)
try:
    results = grade(job["program"], job["tests"], math.ceil(job["limit"]))
except BaseException:
    results = [0] * len(job["tests"])  # a comparison that raised (sNaN): the batch's results stay 0
real_stdout.write("RESULTS=" + json.dumps(results) + "\n")
"""


def run_stdio_like_openinstruct(program: str, tests: list[dict], limit: float = 3.0) -> list[int]:
    """open-instruct's per-test stdio verdicts (1 pass, 0 fail) for `program` on `tests` ({input, output})."""
    if any(word in program for word in DANGEROUS):
        return [0] * len(tests)
    job = {"program": program, "tests": tests, "limit": limit, "prelude": PRELUDE}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _STDIO_CHILD],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=limit * len(tests) + 5,
        )
    except subprocess.TimeoutExpired:
        return [0] * len(tests)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULTS=")]
    return json.loads(found[-1].removeprefix("RESULTS=")) if found else [0] * len(tests)
