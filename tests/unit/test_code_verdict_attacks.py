"""A wrong program must not forge its verdict or its runtime (issue 48, "a verdict produced outside the
program's process").

Each attack is a wrong solution that tries to score on `/test_program` or `/test_program_stdio` of a real
service, in full mode (root: every kernel layer) and in the weak mode (Python guard only). Against the old
in-process harness each of these scored full marks; now an assert test runs in a judge process that never
runs program code (`code_server/remote_calls.py`), and the time is measured outside the program. Each attack
must score 0, and the correct solutions next to them must score 1, in every test form we accept.

Run: `.venv/bin/pytest tests/unit/test_code_verdict_attacks.py` (about 30 s; CPU only).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
import requests

from code_server import SandboxConfig, code_server

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 2) == 1", "assert all(add(i, 1) == i + 1 for i in range(3))"]


@pytest.fixture(scope="module", params=["full", "weak"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "full" and os.geteuid() != 0:
        pytest.skip("the full sandbox needs root")
    weak = {"kernel_isolation": False, "allow_weak_sandbox": True} if request.param == "weak" else {}
    with code_server(config=SandboxConfig(max_concurrency=2, **weak)) as (server, url):
        assert server.executor.layers["mode"] == request.param
        yield url


def judge(base: str, program: str, tests: list, limit: float = 3.0, stdio: bool = False) -> dict:
    path = "/test_program_stdio" if stdio else "/test_program"
    body = {"program": program, "tests": tests, "max_execution_time": limit}
    reply = requests.post(base + path, json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


# Wrong solutions (`add` returns 0, or nothing sensible) that attack the harness instead of adding.
FORGERIES = {
    "replaces builtins.exec and compile": """
import builtins
builtins.exec = lambda *args, **kwargs: None
builtins.compile = lambda *args, **kwargs: builtins.__dict__["eval"]("None")
def add(a, b):
    return 0
""",
    "calls the runner's done report from a caller's frame": """
import os, sys
frame = sys._getframe()
while frame is not None:
    for name, value in list(frame.f_locals.items()):
        if name == "send" and callable(value):
            value("done", runtime=0.0)
            os._exit(0)
    frame = frame.f_back
def add(a, b):
    return 0
""",
    "finds the token and status pipe through gc and writes done on every fd": """
import gc, json, os, re
tokens = {o for o in gc.get_objects() if type(o) is str and re.fullmatch(r"[0-9a-f]{32}", o)}
for cell_owner in gc.get_objects():
    if callable(cell_owner) and getattr(cell_owner, "__closure__", None):
        for cell in cell_owner.__closure__:
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if type(value) is str and re.fullmatch(r"[0-9a-f]{32}", value):
                tokens.add(value)
for token in tokens:
    for kind in ("start", "done"):
        line = json.dumps({"kind": kind, "token": token, "runtime": 0.0}) + "\\n"
        for fd in range(3, 64):
            try:
                os.write(fd, line.encode())
            except OSError:
                pass
    for fd in range(3, 64):  # and a fake answer to whoever might be asking
        try:
            os.write(fd, b'{"ok": true, "value": ["i", "0x3"]}\\n')
        except OSError:
            pass
os._exit(0)
def add(a, b):
    return 0
""",
    "reads its test from the caller's frames and hard-codes the answer": """
import ast, gc, sys
def find_expected(a, b):
    seen = []
    frame = sys._getframe()
    while frame is not None:
        seen.extend(frame.f_locals.values())
        seen.extend(frame.f_code.co_consts)
        frame = frame.f_back
    seen.extend(o for o in gc.get_objects() if type(o) is str)
    for item in seen:
        if type(item) is str and item.startswith("assert add("):
            try:
                node = ast.parse(item).body[0].test
                if ast.literal_eval(node.left.args[0]) == a and ast.literal_eval(node.left.args[1]) == b:
                    return ast.literal_eval(node.comparators[0])
            except Exception:
                continue
    return 0
def add(a, b):
    return find_expected(a, b)
""",
    "returns an object whose == is always true": """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def add(a, b):
    return Anything()
""",
    "returns an int subclass whose == is always true": """
class Sly(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return Sly(0)
""",
    "rewrites json.dumps so that an error report reads done": """
import json
real_dumps = json.dumps
def dumps(obj, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("kind") == "error":
        obj = {**obj, "kind": "done"}
        obj.pop("error", None)
    return real_dumps(obj, *args, **kwargs)
json.dumps = dumps
def add(a, b):
    return 0
""",
    "answers with built-ins of its own for the test's names": """
import dataclasses
import os
for fd in range(3, 64):
    try:
        os.write(fd, b'{"ok": true, "values": {"all": ["h", 1], "len": ["h", 1]}}\\n')
    except OSError:
        pass
def add(a, b):
    return 0
""",
    "exits cleanly before answering": """
import dataclasses
import os
os._exit(0)
def add(a, b):
    return a + b
""",
    "raises SystemExit inside the call": """
def add(a, b):
    raise SystemExit(0)
""",
    "prints status lines on stdout": """
import sys
print('{"kind": "done", "token": "0", "runtime": 0}')
print("passed")
def add(a, b):
    return 0
""",
}

CORRECT_ADD = "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize("attack", sorted(FORGERIES))
def test_a_forged_verdict_scores_zero(base: str, attack: str) -> None:
    reply = judge(base, FORGERIES[attack], ADD_TESTS)
    assert reply["results"] == [0, 0, 0], (attack, reply)


def test_forgery_through_an_always_true_comparison_fails_in_every_test_form(base: str) -> None:
    program = FORGERIES["returns an object whose == is always true"]
    tests = [
        "def check(candidate):\n    assert candidate(1, 2) == 3\ncheck(add)",
        "assert all(add(i, i) == 2 * i for i in range(3))",
        "x = add(2, 2)\nassert x == 4",
        "assert [add(1, 1)] == [2]",
        "assert add(1, 1) in (2,)",
    ]
    assert judge(base, program, tests)["results"] == [0] * len(tests)


def test_correct_solutions_pass_in_every_test_form(base: str) -> None:
    program = """
from collections import namedtuple
import math
Point = namedtuple("Point", "x y")
def add(a, b):
    return a + b
def rotate(matrix):
    matrix.reverse()
def halves(n):
    yield from (i / 2 for i in range(n))
def point():
    return Point(1, 2)
class Solution:
    def twoSum(self, nums, target):
        seen = {}
        for i, n in enumerate(nums):
            if target - n in seen:
                return [seen[target - n], i]
            seen[n] = i
def fails():
    raise ValueError("negative")
"""
    tests = [
        "assert add(1, 2) == 3",
        "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate('a', 'b') == 'ab'\ncheck(add)",
        "assert all(add(i, i) == 2 * i for i in range(5))",
        "m = [[1, 2], [3, 4]]\nrotate(m)\nassert m == [[3, 4], [1, 2]]",
        "assert list(halves(3)) == [0.0, 0.5, 1.0]",
        "assert point() == (1, 2)",
        "assert Solution().twoSum([2, 7, 11], 9) == [0, 1]",
        "assert math.isclose(add(0.1, 0.2), 0.3)",
        "try:\n    fails()\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    assert False",
        "assert add(10**5000, 1) == 10**5000 + 1",
        "assert add(b'a', b'b') == b'ab' and add((1,), (2,)) == (1, 2)",
    ]
    reply = judge(base, program, tests)
    assert reply["results"] == [1] * len(tests), reply


def test_values_that_are_not_plain_data_fail_without_harm(base: str) -> None:
    program = """
import sys
sys.setrecursionlimit(100000)
def deep(n):
    value = []
    for _ in range(n):
        value = [value]
    return value
def add(a, b):
    return deep(5000)
def cyclic():
    value = []
    value.append(value)
    return value
"""
    reply = judge(base, program, ["assert add(1, 2) == 3", "assert cyclic() == [[]]"])
    assert reply["results"] == [0, 0], reply
    assert judge(base, CORRECT_ADD, ADD_TESTS)["results"] == [1, 1, 1]


# Finds the runner's own report function (in the old in-process harness, the one that sent "done" with the
# program's runtime) and reports a runtime of 0 through it.
RUNTIME_FORGER = """
import gc, sys, time
def report_zero():
    for o in gc.get_objects():
        if callable(o) and getattr(o, "__name__", "") == "send":
            try:
                o("done", runtime=0.0)
            except Exception:
                pass
"""


BUSY = (
    "def busy(seconds):\n    end = time.process_time() + seconds\n    while time.process_time() < end:\n        pass\n"
)


def test_the_runtime_is_measured_outside_the_program(base: str) -> None:
    """A slow program that reports runtime 0 (through the runner's own report, found by walking frames) is
    still charged its time, in assert and stdio mode: an assert test's program its CPU time (the kernel's
    count, less the calibrated cost of answering the judge), a stdio program its wall time."""
    forge = RUNTIME_FORGER + BUSY
    assert_program = forge + "def add(a, b):\n    busy(0.4)\n    report_zero()\n    return a + b\n"
    reply = judge(base, assert_program, ["assert add(1, 2) == 3"])
    assert reply["results"] == [1] and reply["runtimes"][0] >= 0.35, reply
    stdio_program = forge + "a, b = map(int, input().split())\nprint(a + b)\ntime.sleep(0.4)\nreport_zero()\n"
    reply = judge(base, stdio_program, [{"input": "1 2\n", "output": "3\n"}], stdio=True)
    # The supervisor reads the start message a little after the runner sent it.
    assert reply["results"] == [1] and reply["runtimes"][0] >= 0.35, reply
    over = judge(base, assert_program, ["assert add(1, 2) == 3"], limit=0.2)
    assert over["results"] == [0] and over["statuses"] == ["timeout"], over


def test_the_perf_penalty_charges_a_forged_runtime(base: str) -> None:
    """Through the `code` verifier with --code_apply_perf_penalty: a correct program that computes for a fifth of
    its time limit and reports runtime 0 scores about 80%, as an honest one does."""
    from open_instruct.config.rewards import RewardConfig
    from open_instruct.rewards import RewardSettings, VerifierInput, get_verifier

    slow = RUNTIME_FORGER + BUSY + "def add(a, b):\n    busy(0.6)\n    report_zero()\n    return a + b\n"
    config = RewardConfig(code_api_url=base + "/test_program", code_apply_perf_penalty=True)
    # A limit with room on the wall clock: 0.6 s of CPU on a loaded machine takes longer.
    config = dataclasses.replace(config, code_max_execution_time=3.0)
    result = get_verifier("code")(
        VerifierInput(f"```python\n{slow}```", ["assert add(1, 2) == 3"]), RewardSettings(config)
    )
    assert result.details["pass_rate"] == 1.0 and result.score <= 0.85, result
