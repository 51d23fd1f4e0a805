"""What the judge trusts (issue 59): names the test did not import are the judge's own, handles yield no verdict,
no program output fails the request, and the weak mode's escapes are closed.

Each attack is a wrong program that tries to score on `/test_program` (or `/test_program_stdio`) of a real
service, in full mode (root: every kernel layer) and in the weak mode (Python guard only); against the first
judge each scored full marks. Each must score 0 with HTTP 200, and the correct program beside it must score 1.

Run: `.venv/bin/pytest tests/unit/test_code_verdict_trust.py` (CPU only).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

import code_server
from code_server import SandboxConfig
from code_server import code_server as start_service


@pytest.fixture(scope="module", params=["full", "weak"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "full" and os.geteuid() != 0:
        pytest.skip("the full sandbox needs root")
    weak = {"kernel_isolation": False, "allow_weak_sandbox": True} if request.param == "weak" else {}
    with start_service(config=SandboxConfig(max_concurrency=2, **weak)) as (server, url):
        assert server.executor.layers["mode"] == request.param
        yield url


def judge(base: str, program: str, tests: list, limit: float = 3.0, stdio: bool = False) -> dict:
    path = "/test_program_stdio" if stdio else "/test_program"
    body = {"program": program, "tests": tests, "max_execution_time": limit}
    reply = requests.post(base + path, json=body, timeout=120)
    assert reply.status_code == 200, reply.text  # no program makes the request fail as a whole
    return reply.json()


ALWAYS_TRUE = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    def __contains__(self, item):
        return True
    def __iter__(self):
        return iter(())
    __hash__ = object.__hash__
LAST = Anything()
"""

# (wrong program, tests) pairs: names the test reads without importing them, answered by the program.
UNIMPORTED_NAMES = {
    "math bound to the program's own isclose": (
        ALWAYS_TRUE + "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n    pi = LAST\n"
        "def f(x):\n    return 0\n",
        ["assert math.isclose(f(0.1), 0.3)", "assert f(1) == math.pi"],
    ),
    "import math, then rebinding it": (
        "import math\nclass Fake:\n    def isclose(self, *a, **k):\n        return True\nmath = Fake()\n"
        "def f(x):\n    return 0\n",
        ["assert math.isclose(f(0.1), 0.3)"],
    ),
    "sys.maxsize answered by the program": (
        ALWAYS_TRUE + "class sys:\n    maxsize = LAST\ndef f():\n    return LAST\n",
        ["assert f() == sys.maxsize"],
    ),
    "np.allclose answered by the program": (
        "class np:\n    allclose = staticmethod(lambda *a, **k: True)\ndef double(x):\n    return x\n",
        ["assert np.allclose(double([1, 2]), [2, 4])"],
    ),
    "constructors returning the program's last answer": (
        ALWAYS_TRUE + "Fraction = Counter = Decimal = deque = lambda *a, **k: LAST\n"
        "def third(n):\n    return LAST\ndef count(s):\n    return LAST\n",
        ["assert third(1) == Fraction(1, 3)", "assert count('aab') == Counter('aab')", "assert third(1) == Decimal(1)"],
    ),
    "pytest.approx answered by the program": (
        ALWAYS_TRUE + "class pytest:\n    approx = staticmethod(lambda *a, **k: LAST)\n"
        "approx = pytest.approx\ndef f(x):\n    return 0.0\n",
        ["assert f(0.1) == pytest.approx(0.3)", "assert approx(0.3) == f(0.1)"],
    ),
    "a bare isclose of the program's": (
        "def isclose(*a, **k):\n    return True\ndef f(x):\n    return 0\n",
        ["assert isclose(f(1), 2)"],
    ),
}

# The same forms with a correct program: with, and without, its own imports.
UNIMPORTED_CONTROLS = [
    (
        "import math, sys\nfrom fractions import Fraction\nfrom collections import Counter\n"
        "from math import isclose\n"
        "def f(x):\n    return x * 3 if x < 1 else math.pi * x\n"
        "def third(n):\n    return Fraction(n, 3)\ndef count(s):\n    return Counter(s)\n"
        "def big():\n    return sys.maxsize\n",
        [
            "assert math.isclose(f(0.1), 0.3)",
            "assert f(1) == math.pi",
            "assert big() == sys.maxsize",
            "assert third(1) == Fraction(1, 3)",
            "assert count('aab') == Counter('aab')",
            "assert isclose(f(0.1), 0.3)",
        ],
    ),
    (
        "import numpy as np\nimport pytest\ndef double(x):\n    return np.array(x) * 2\n",
        ["assert np.allclose(double([1, 2]), [2, 4]) and double([0.1])[0] == pytest.approx(0.2)"],
    ),
    (
        "def f(x):\n    return x * 3\ndef third(n):\n    return n / 3\n",
        ["assert math.isclose(f(0.1), 0.3)", "assert isclose(third(1), 1 / 3)", "assert f(0.1) == approx(0.3)"],
    ),
]


def judge_all(base: str, attacks: dict[str, tuple[str, list]]) -> dict[str, dict]:
    """Each attack's reply; the requests at once, as a batch of samples reaches the service."""
    with ThreadPoolExecutor(max_workers=len(attacks)) as pool:
        futures = {name: pool.submit(judge, base, program, tests) for name, (program, tests) in attacks.items()}
        return {name: future.result() for name, future in futures.items()}


def test_names_the_test_did_not_import_are_the_judges(base: str) -> None:
    for attack, reply in judge_all(base, UNIMPORTED_NAMES).items():
        assert reply["results"] == [0] * len(UNIMPORTED_NAMES[attack][1]), (attack, reply)


def test_correct_programs_pass_the_same_forms(base: str) -> None:
    controls = {str(i): control for i, control in enumerate(UNIMPORTED_CONTROLS)}
    for i, reply in judge_all(base, controls).items():
        assert reply["results"] == [1] * len(controls[i][1]), reply


HANDLE_ATTACKS = {
    "membership answered by the program's __contains__": (
        ALWAYS_TRUE + "def primes(n):\n    return LAST\n",
        ["assert 7 in primes(10)", "assert 3 in primes(5) and 5 in primes(5)"],
    ),
    "a handle's hash in a set": ("def find(x):\n    return object()\n", ["assert find(3) not in {None, -1}"]),
    "a handle's own truth": (ALWAYS_TRUE + "def is_sorted(x):\n    return LAST\n", ["assert is_sorted([3, 1])"]),
    "StopIteration ending all(map(...)) and zip(map(...))": (
        "def is_even(x):\n    raise StopIteration\ndef double(x):\n    raise StopIteration\n",
        [
            "assert all(map(is_even, [2, 3]))",
            "assert all(a == b for a, b in zip(map(double, [1, 2]), [2, 5]))",
        ],
    ),
}


def test_handles_decide_no_verdict(base: str) -> None:
    for attack, reply in judge_all(base, HANDLE_ATTACKS).items():
        assert reply["results"] == [0] * len(HANDLE_ATTACKS[attack][1]), (attack, reply)


def test_correct_programs_pass_where_handles_were_refused(base: str) -> None:
    program = (
        "class Node:\n    def __init__(self, val, nxt=None):\n        self.val, self.next = val, nxt\n"
        "def primes(n):\n    return [p for p in range(2, n) if all(p % d for d in range(2, p))]\n"
        "def find(x):\n    return x\ndef is_sorted(x):\n    return x == sorted(x)\n"
        "def is_even(x):\n    return x % 2 == 0\ndef double(x):\n    return 2 * x\n"
        "def chain(n):\n    return Node(1, Node(2)) if n else None\ndef evens():\n    yield from (0, 2)\n"
    )
    tests = [
        "assert 7 in primes(10)",
        "assert find(3) not in {None, -1}",
        "assert not is_sorted([3, 1])",
        "assert all(map(is_even, [2, 4]))",
        "assert all(a == b for a, b in zip(map(double, [1, 2]), [2, 4]))",
        "node, seen = chain(1), []\nwhile node:\n    seen.append(node.val)\n    node = node.next\n"
        "assert seen == [1, 2]",
        "g = evens()\nassert next(g) == 0 and next(g) == 2\ntry:\n    next(g)\nexcept StopIteration:\n    pass\n"
        "else:\n    assert False",
    ]
    reply = judge(base, program, tests)
    assert reply["results"] == [1] * len(tests), reply


SAYS_EQUAL = "    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n        return False\n"
SAYS_EQUAL += "    __hash__ = None\n"
MONEY_TESTS = [
    "assert add(Money(1), Money(2)) == Money(3)",
    "assert not add(Money(1), Money(2)) != Money(3)",
    "assert [add(Money(2), Money(2))] == [Money(4)]",
    "assert add(Money(0), Money(1)) in [Money(1)]",
]
LIST_NODE = "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
REVERSE = "def reverse(head):\n    prev = None\n    while head:\n"
REVERSE += "        head.next, prev, head = prev, head, head.next\n    return prev\n"

# Two program objects compared with each other: their `__eq__` and `__lt__` say whatever wins.
OBJECT_PAIRS = {
    "objects whose __eq__ says equal": (
        "class Money:\n    def __init__(self, cents):\n        self.cents = cents\n"
        + SAYS_EQUAL
        + "def add(a, b):\n    return Money(0)\n",
        MONEY_TESTS,
    ),
    "a linked list whose nodes say equal": (
        LIST_NODE + SAYS_EQUAL + "def reverse(head):\n    return head\n",
        ["assert reverse(ListNode(1, ListNode(2))) == ListNode(2, ListNode(1))"],
    ),
    "a date whose fields no attribute shows": (
        "import datetime\nclass Day(datetime.date):\n" + SAYS_EQUAL + "def next_day(d):\n    return Day(1999, 1, 1)\n",
        ["assert next_day(Day(2020, 1, 1)) == Day(2020, 1, 2)"],
    ),
    "an order the program's __lt__ says": (
        "class Version:\n    def __init__(self, text):\n        self.parts = [int(p) for p in text.split('.')]\n"
        "    def __lt__(self, other):\n        return True\n    __gt__ = __le__ = __ge__ = __lt__\n",
        [
            "assert Version('1.10') > Version('1.2')",
            "assert sorted([Version('1.10'), Version('1.2')])[0].parts == [1, 2]",
            "import pytest\nwith pytest.raises(TypeError):\n    Version('1.2') < Version('1.10')",
        ],
    ),
}


def test_program_objects_compared_with_each_other_decide_no_verdict(base: str) -> None:
    """The judge compares two program objects on their data (attributes, walked as far as they reach); it never
    asks their `__eq__`. Where it cannot (an order, a state past the attributes) the test fails with
    `error:Undecidable`, whatever the test catches."""
    replies = judge_all(base, OBJECT_PAIRS)
    for attack, reply in replies.items():
        assert reply["results"] == [0] * len(OBJECT_PAIRS[attack][1]), (attack, reply)
    for attack in ("a date whose fields no attribute shows", "an order the program's __lt__ says"):
        assert set(replies[attack]["statuses"]) == {"error:Undecidable"}, replies[attack]


def test_correct_program_objects_compare_on_their_data(base: str) -> None:
    controls = {
        "a dataclass, compared with another and as plain data": (
            "from dataclasses import dataclass\n@dataclass(slots=True)\nclass Money:\n    cents: int\n"
            "def add(a, b):\n    return Money(a.cents + b.cents)\n",
            [*MONEY_TESTS, "assert add(Money(1), Money(2)).cents == 3 and add(Money(1), Money(2)) != Money(4)"],
        ),
        "a linked list that defines __eq__, and a cycle": (
            LIST_NODE + "    def __eq__(self, other):\n        return isinstance(other, ListNode) and "
            "(self.val, self.next) == (other.val, other.next)\n"
            + REVERSE
            + "def ring():\n    node = ListNode(1)\n    node.next = node\n    return node\n",
            [
                "assert reverse(ListNode(1, ListNode(2))) == ListNode(2, ListNode(1))",
                "assert reverse(ListNode(1, ListNode(2))) != ListNode(1, ListNode(2))",
                "assert ring() == ring()",
            ],
        ),
        "ListNode and TreeNode without __eq__, walked by the test's helpers": (
            LIST_NODE + REVERSE + "class TreeNode:\n    def __init__(self, val, left=None, right=None):\n"
            "        self.val, self.left, self.right = val, left, right\n"
            "def insert(root, val):\n    if root is None:\n        return TreeNode(val)\n"
            "    if val < root.val:\n        root.left = insert(root.left, val)\n    else:\n"
            "        root.right = insert(root.right, val)\n    return root\n",
            [
                "def build(values):\n    head = None\n    for v in reversed(values):\n"
                "        head = ListNode(v, head)\n    return head\n"
                "def walk(node):\n    out = []\n    while node:\n        out.append(node.val)\n"
                "        node = node.next\n    return out\nassert walk(reverse(build([1, 2, 3]))) == [3, 2, 1]",
                "def inorder(node):\n    return inorder(node.left) + [node.val] + inorder(node.right) if node else []\n"
                "root = None\nfor v in [5, 2, 8, 1]:\n    root = insert(root, v)\n"
                "assert inorder(root) == [1, 2, 5, 8]\n"
                "node = ListNode(7)\nassert node == node and node != ListNode(7)",  # no __eq__: identity
            ],
        ),
    }
    for name, reply in judge_all(base, controls).items():
        assert reply["results"] == [1] * len(controls[name][1]), (name, reply)


# Finds the runner's status report (through its closure, as round 1's forgeries did) and writes a set-up
# failure after the start, hoping to turn a wrong answer into HTTP 500.
FORGED_SETUP_ERROR = """
import gc, json, os, re
for owner in gc.get_objects():
    if callable(owner) and getattr(owner, "__name__", "") == "send":
        try:
            owner("setup_error", error="forged", layers="not a dict")
            owner("start", layers=[1], notes=5)
        except Exception:
            pass
def add(a, b):
    return 0
"""

SERVICE_ERRORS = {
    "a forged setup_error after the start": (FORGED_SETUP_ERROR, ["assert add(1, 2) == 3"]),
    "a fraction whose gcd would burn the judge": (
        "from fractions import Fraction\ndef third(n):\n    return Fraction(2 ** 300000 + 1, 3 ** 200000)\n",
        ["assert third(1) == Fraction(1, 3)"],
    ),
    "an int past the judge's bound": ("def big():\n    return 1 << 2_000_000\n", ["assert big() == 1"]),
    "an exception class the judge cannot build": (
        "class Weird(UnicodeDecodeError):\n    pass\ndef f():\n    raise Weird('utf-8', b'x', 0, 1, 'bad')\n",
        ["assert f() == 1"],
    ),
}


def test_no_program_output_fails_the_request(base: str) -> None:
    for attack, reply in judge_all(base, SERVICE_ERRORS).items():
        assert reply["results"] == [0] * len(SERVICE_ERRORS[attack][1]), (attack, reply)


def test_no_stdio_output_fails_the_request(base: str) -> None:
    # A signalling NaN makes a Decimal comparison raise; an exponent this large is exact but far from 1.
    program = "print('-sNaN 1' if input() else 'sNaN 1e999999999999')"
    tests = [
        {"input": "\n", "output": "1\n"},
        {"input": "\n", "output": "NaN 1\n"},
        {"input": "x\n", "output": "NaN 1\n"},
        {"input": "x\n", "output": "-sNaN 1\n"},  # the same text: a pass
    ]
    assert judge(base, program, tests, stdio=True)["results"] == [0, 0, 0, 1]


def test_a_correct_solution_called_20000_times_passes_at_the_default_limit(base: str) -> None:
    """Each call is a pipe round trip between the judge and the program; the program is charged its CPU time
    less the calibrated cost of answering a request, so 20,000 calls of a trivial function cost about what
    they cost in-process, whatever the load. (In the strongest mode this machine has: the time accounting is
    the same in both.)"""
    mode = requests.get(base + "/health", timeout=10).json()["sandbox"]["mode"]
    if mode == "weak" and os.geteuid() == 0:
        pytest.skip("checked in full mode")
    test = "for i in range(20000):\n    assert add(i, 1) == i + 1"
    reply = judge(base, "def add(a, b):\n    return a + b\n", [test], limit=1.0)
    assert reply["results"] == [1] and 0 <= reply["runtimes"][0] < 0.5, reply
    slow = "import time\ndef add(a, b):\n    end = time.process_time() + 1.0\n    while time.process_time() < end:\n"
    slow += "        pass\n    return a + b\n"
    reply = judge(base, slow, ["assert add(1, 2) == 3"], limit=0.2)
    assert reply["statuses"] == ["timeout"], reply


# --------------------------------------------------------------------------------------------------
# Weak-mode escapes (each is also tried in full mode, where the kernel layers refuse it).

REMOTE_CALLS = os.path.join(os.path.dirname(code_server.__file__), "remote_calls.py")


def test_a_hard_link_to_the_services_code_is_refused(base: str) -> None:
    with open(REMOTE_CALLS, "rb") as f:
        before = f.read()
    program = f"""
import os
def attack():
    try:
        os.link({REMOTE_CALLS!r}, "rc.py")
        with open("rc.py", "a") as f:
            f.write("\\nraise SystemExit(0)\\n")
        return "linked"
    except OSError as e:
        return type(e).__name__
"""
    reply = judge(base, program, ["assert attack() == 'linked'"])
    assert reply["results"] == [0], reply
    with open(REMOTE_CALLS, "rb") as f:
        assert f.read() == before
    assert judge(base, "def add(a, b):\n    return 0\n", ["assert add(1, 2) == 3"])["results"] == [0]


def test_the_work_root_cannot_be_listed(base: str) -> None:
    program = """
import os
def others():
    root = os.path.dirname(os.getcwd())
    try:
        return sorted(set(os.listdir(root)) - {os.path.basename(os.getcwd())})
    except OSError:
        return None
"""
    # Run beside other tests, so their judges' directories exist while this one looks.
    tests = ["assert others() in (None, [])"] * 2
    assert judge(base, program, tests)["results"] == [1, 1]


def test_sqlite_and_fifos_outside_the_work_dir_are_refused(base: str) -> None:
    name = f"/tmp/oi-escape-{uuid.uuid4().hex}"
    program = f"""
import os, sqlite3
def attempts():
    done = []
    try:
        sqlite3.connect({name + ".db"!r}).execute("create table t (x)")
        done.append("sqlite")
    except Exception:
        pass
    try:
        os.mkfifo({name + ".fifo"!r})
        done.append("fifo")
    except Exception:
        pass
    sqlite3.connect(":memory:").execute("create table t (x)")  # in memory: allowed
    return done
"""
    assert judge(base, program, ["assert attempts() == []"])["results"] == [1]
    assert not os.path.exists(name + ".db") and not os.path.exists(name + ".fifo")


def test_the_sandbox_dev_is_minimal(base: str) -> None:
    """Full mode only: /dev holds null, zero, full, random, urandom and the fd links; no GPU (/dev/nvidia*),
    disk or terminal of the host."""
    if requests.get(base + "/health", timeout=10).json()["sandbox"]["mode"] != "full":
        pytest.skip("the weak mode has no mount namespace: /dev is the host's")
    reply = requests.post(
        base + "/execute", json={"code": "import os\nprint(sorted(os.listdir('/dev')))", "timeout": 5}, timeout=60
    ).json()
    expected = ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]
    assert reply["output"].strip() == str(expected), reply
