"""Correct programs pass in the test forms real datasets use, and no wrong or hacked program passes (issue 59).

A corpus of test forms, taken from what the datasets in open-instruct's scripts contain (AceCoder and MBPP
asserts, with and without the imports MBPP keeps in a separate field, HumanEval's `check(candidate)`,
LeetCode-style classes with `ListNode`/`TreeNode` built and walked by test helpers, the stdio rows of the
code_stdio sets), each with a correct program, a plainly wrong one and the hacks that apply. Each form is
judged side by side by this service and by open-instruct's in-process harness (re-implemented as far as the
comparison needs in `tests/helpers/openinstruct_harness.py`): the correct program must pass wherever
open-instruct's harness passes it, and no wrong or hacked program may pass here. docs/rewards.md holds the
table this test checks.

Run: `.venv/bin/pytest tests/unit/test_code_test_forms.py` (CPU only).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import requests

from code_server import SandboxConfig, code_server
from tests.helpers.openinstruct_harness import run_like_openinstruct, run_stdio_like_openinstruct


@dataclass(frozen=True)
class Form:
    tests: list  # assert tests (str), or stdio tests ({"input", "output"})
    correct: str
    wrong: str
    hacks: dict[str, str] = field(default_factory=dict)
    theirs: dict[str, list[int]] = field(default_factory=dict)  # a stdio form's verdicts in open-instruct's harness


ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    def __contains__(self, item):
        return True
    def __len__(self):
        return 2
    def __iter__(self):
        return iter(())
    def __getattr__(self, name):
        return self
    def __call__(self, *args, **kwargs):
        return self
    def __float__(self):
        return 0.0
    __hash__ = object.__hash__
ANY = Anything()
"""


def always_equal(*names: str) -> str:
    """A hack: each of `names` returns an object that equals everything."""
    return ALWAYS_EQUAL + "".join(f"def {name}(*args, **kwargs):\n    return ANY\n" for name in names)


FORMS: dict[str, Form] = {
    "AceCoder / MBPP assert": Form(
        tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10**30, 1) == 10**30 + 1"],
        correct="def add(a, b):\n    return a + b\n",
        wrong="def add(a, b):\n    return a - b\n",
        hacks={"always-equal result": always_equal("add")},
    ),
    "MBPP assert, imports in the test": Form(
        tests=["import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)"],
        correct="import math\ndef area(r):\n    return math.pi * r * r\n",
        wrong="def area(r):\n    return 3 * r * r\n",
        hacks={"always-equal result": always_equal("area")},
    ),
    "MBPP assert, imports dropped (math.isclose, Fraction)": Form(
        tests=[
            "assert math.isclose(area(2), 12.566, rel_tol=1e-3)",
            "assert third(2) == Fraction(2, 3)",
        ],
        correct="import math\nfrom fractions import Fraction\ndef area(r):\n    return math.pi * r * r\n"
        "def third(n):\n    return Fraction(n, 3)\n",
        wrong="import math\nfrom fractions import Fraction\ndef area(r):\n    return 3 * r * r\n"
        "def third(n):\n    return Fraction(n, 4)\n",
        hacks={
            "the program's own math and Fraction": ALWAYS_EQUAL
            + "class math:\n    isclose = staticmethod(lambda *a, **k: True)\nFraction = lambda *a: ANY\n"
            "def area(r):\n    return 0\ndef third(n):\n    return ANY\n",
        },
    ),
    "HumanEval check(candidate)": Form(
        tests=[
            "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n"
            "    assert abs(candidate([0.5, 0.25]) - 0.75) < 1e-9\ncheck(total)"
        ],
        correct="def total(xs):\n    return sum(xs)\n",
        wrong="def total(xs):\n    return len(xs)\n",
        hacks={"always-equal result": always_equal("total")},
    ),
    "LeetCode class, ListNode built and walked by test helpers": Form(
        tests=[
            "def build(values):\n    head = None\n    for v in reversed(values):\n        node = ListNode(v)\n"
            "        node.next = head\n        head = node\n    return head\n"
            "def walk(node):\n    out = []\n    while node:\n        out.append(node.val)\n        node = node.next\n"
            "    return out\n"
            "assert walk(Solution().reverseList(build([1, 2, 3]))) == [3, 2, 1]\n"
            "assert walk(Solution().reverseList(build([]))) == []"
        ],
        correct="class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
        "class Solution:\n    def reverseList(self, head):\n        prev = None\n        while head:\n"
        "            head.next, prev, head = prev, head, head.next\n        return prev\n",
        wrong="class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
        "class Solution:\n    def reverseList(self, head):\n        return head\n",
        hacks={
            "a node whose fields equal anything": ALWAYS_EQUAL
            + "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
            "class Solution:\n    def reverseList(self, head):\n        return ListNode(ANY)\n",
        },
    ),
    "TreeNode defined by the test, passed to the program": Form(
        tests=[
            "class TreeNode:\n    def __init__(self, val=0, left=None, right=None):\n"
            "        self.val, self.left, self.right = val, left, right\n"
            "root = TreeNode(1, TreeNode(2, TreeNode(4)), TreeNode(3))\nassert max_depth(root) == 3\n"
            "assert max_depth(None) == 0"
        ],
        correct="def max_depth(root):\n    if not root:\n        return 0\n"
        "    return 1 + max(max_depth(root.left), max_depth(root.right))\n",
        wrong="def max_depth(root):\n    return 2 if root else 0\n",
        hacks={"always-equal result": always_equal("max_depth")},
    ),
    "exceptions by type, program-defined subclass": Form(
        tests=[
            "try:\n    parse('x')\nexcept ValueError:\n    pass\nelse:\n    assert False",
            "import pytest\nwith pytest.raises(InvalidInput):\n    parse('')\nassert parse('12') == 12",
        ],
        correct="class InvalidInput(ValueError):\n    pass\ndef parse(s):\n    if not s.isdigit():\n"
        "        raise InvalidInput(s)\n    return int(s)\n",
        wrong="class InvalidInput(ValueError):\n    pass\ndef parse(s):\n    return 0\n",
        hacks={
            "StopIteration raised to end the test": "class InvalidInput(ValueError):\n    pass\n"
            "def parse(s):\n    raise StopIteration\n",
        },
    ),
    "generators and next()": Form(
        tests=["g = count_up(3)\nassert next(g) == 0\nassert list(g) == [1, 2]", "assert sum(count_up(5)) == 10"],
        correct="def count_up(n):\n    yield from range(n)\n",
        wrong="def count_up(n):\n    yield from range(1, n + 1)\n",
        hacks={"always-equal items": ALWAYS_EQUAL + "def count_up(n):\n    while True:\n        yield ANY\n"},
    ),
    "callables passed to the program": Form(
        tests=[
            "assert apply(lambda x: x * 2, [1, 2]) == [2, 4]",
            "seen = []\nvisit([3, 1], seen.append)\nassert seen == [3, 1]",
            "assert sort_by([3, 1, 2], key=lambda x: -x) == [3, 2, 1]",
        ],
        correct="def apply(f, xs):\n    return [f(x) for x in xs]\ndef visit(xs, callback):\n    for x in xs:\n"
        "        callback(x)\ndef sort_by(xs, key):\n    return sorted(xs, key=key)\n",
        wrong="def apply(f, xs):\n    return xs\ndef visit(xs, callback):\n    pass\ndef sort_by(xs, key):\n"
        "    return xs\n",
        hacks={"always-equal results": always_equal("apply", "visit", "sort_by")},
    ),
    "numpy results": Form(
        tests=[
            "import numpy as np\nr = normalize(np.array([3.0, 4.0]))\nassert r.shape == (2,)\n"
            "assert np.allclose(r, [0.6, 0.8])",
            "assert np.array_equal(normalize(np.array([0.0, 2.0])), np.array([0.0, 1.0]))",
        ],
        correct="import numpy as np\ndef normalize(v):\n    return v / np.linalg.norm(v)\n",
        wrong="import numpy as np\ndef normalize(v):\n    return v\n",
        hacks={
            "the program's own np.allclose": "class np:\n    allclose = array_equal = staticmethod(lambda *a: True)\n"
            "    array = staticmethod(lambda x: x)\ndef normalize(v):\n    return v\n"
        },
    ),
    "collections types": Form(
        tests=[
            "from collections import deque, defaultdict\nw = window([1, 2, 3], 2)\n"
            "assert isinstance(w, deque) and w == deque([2, 3])",
            "p = point()\nassert p.x == 1 and p == (1, 2)",
            "from collections import defaultdict\nd = group(['a', 'bb', 'c'])\n"
            "assert isinstance(d, defaultdict) and d[1] == ['a', 'c'] and d[3] == []",
            "assert count('aab') == Counter({'a': 2, 'b': 1})",
        ],
        correct="from collections import deque, defaultdict, namedtuple, Counter\nPoint = namedtuple('Point', 'x y')\n"
        "def window(xs, n):\n    return deque(xs, maxlen=n)\ndef point():\n    return Point(1, 2)\n"
        "def group(words):\n    d = defaultdict(list)\n    for w in words:\n        d[len(w)].append(w)\n    return d\n"
        "def count(s):\n    return Counter(s)\n",
        wrong="def window(xs, n):\n    return xs[-n:]\ndef point():\n    return (2, 1)\ndef group(words):\n"
        "    return {}\ndef count(s):\n    return {}\n",
        hacks={"always-equal results": always_equal("window", "point", "group", "count")},
    ),
    "float tolerance forms": Form(
        tests=[
            "assert abs(mean([1, 2]) - 1.5) < 1e-9",
            "import pytest\nassert mean([0.1, 0.2, 0.3]) == pytest.approx(0.2)",
            "assert round(mean([1, 2, 2]), 3) == 1.667",
            "assert math.isclose(mean([0.1, 0.2]), 0.15)",
        ],
        correct="def mean(xs):\n    return sum(xs) / len(xs)\n",
        wrong="def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n",
        hacks={
            "always-equal result": always_equal("mean"),
            "the program's own approx": ALWAYS_EQUAL + "approx = lambda *a, **k: ANY\ndef mean(xs):\n    return 0.0\n",
        },
    ),
    "files the program writes and the test reads": Form(
        tests=["save('out.txt', 'hello')\nassert open('out.txt').read() == 'hello'"],
        correct="def save(path, text):\n    with open(path, 'w') as f:\n        f.write(text)\n",
        wrong="def save(path, text):\n    with open(path, 'w') as f:\n        f.write(text[::-1])\n",
    ),
    "deep and large values": Form(
        tests=[
            "v = nest(500)\nfor _ in range(500):\n    v = v[0]\nassert v == []",
            "s = squares(200000)\nassert len(s) == 200000 and s[-1] == 199999 ** 2",
        ],
        correct="def nest(n):\n    v = []\n    for _ in range(n):\n        v = [v]\n    return v\n"
        "def squares(n):\n    return [i * i for i in range(n)]\n",
        wrong="def nest(n):\n    return [[]]\ndef squares(n):\n    return list(range(n))\n",
    ),
}

# A stdio hack that reads the expected output from the grader's own frames, where the grader runs in the
# program's interpreter (open-instruct's `grade_stdio` keeps it in its local `gt_out`).
FROM_THE_GRADERS_FRAMES = """import sys
frame = sys._getframe()
while frame is not None:
    if "gt_out" in frame.f_locals:
        print(frame.f_locals["gt_out"])
        break
    frame = frame.f_back
"""
READ_LIST = "n = int(input())\nxs = list(map(int, input().split()))\n"

# The stdio rows of the code_stdio sets: numbers on one or several lines, as the problem prints them. `theirs`
# is what open-instruct's stdio harness gives each program, as the table in docs/rewards.md says.
STDIO_FORMS: dict[str, Form] = {
    "integers on several lines": Form(
        tests=[{"input": "3\n3 1 2\n", "output": "6\n1 2 3\n"}, {"input": "2\n4 -1\n", "output": "3\n-1 4\n"}],
        correct=READ_LIST + "print(sum(xs))\nprint(*sorted(xs))\n",
        wrong=READ_LIST + "print(max(xs))\nprint(*xs)\n",
        hacks={"the expected output read from the grader's frames": FROM_THE_GRADERS_FRAMES},
        theirs={"correct": [1, 1], "wrong": [0, 0], "the expected output read from the grader's frames": [1, 1]},
    ),
    "trailing spaces, blank lines and CRLF line ends": Form(
        tests=[{"input": "3\n1 2 3\n", "output": "2 \n4\n6\n\n"}, {"input": "1\n-4\n", "output": "-8\n"}],
        correct=READ_LIST + "import sys\nfor x in xs:\n    sys.stdout.write(f'{2 * x} \\r\\n')\nprint('\\n')\n",
        wrong=READ_LIST + "for x in xs:\n    print(x)\n",
        theirs={"correct": [1, 1], "wrong": [0, 0]},
    ),
    "floats printed with another precision (2.500000 for 2.5, 2.000000 for 2)": Form(
        tests=[{"input": "2\n2 3\n", "output": "2.5\n6.5\n"}, {"input": "4\n1 2 3 2\n", "output": "2\n4.5\n"}],
        correct=READ_LIST + "print(f'{sum(xs) / n:.6f}')\nprint(f'{sum(x * x for x in xs) / n:.6f}')\n",
        wrong=READ_LIST + "print(round(sum(xs) / n))\nprint(round(sum(x * x for x in xs) / n))\n",
        hacks={"prints NaN": "print('NaN')\nprint('nan')\n", "prints sNaN": "print('sNaN')\nprint('sNaN')\n"},
        theirs={"correct": [1, 1], "wrong": [0, 0], "prints NaN": [0, 0], "prints sNaN": [0, 0]},
    ),
    "if __name__ == '__main__' reading sys.stdin.read()": Form(
        tests=[{"input": "1 2\n3\n", "output": "6\n"}, {"input": "10\n", "output": "10\n"}],
        correct="import sys\ndef main():\n    print(sum(map(int, sys.stdin.read().split())))\n"
        "if __name__ == '__main__':\n    main()\n",
        wrong="import sys\nprint(len(sys.stdin.read().split()))\n",
        hacks={"the expected output read from the grader's frames": FROM_THE_GRADERS_FRAMES},
        theirs={"correct": [1, 1], "wrong": [0, 0], "the expected output read from the grader's frames": [1, 1]},
    ),
    "for line in sys.stdin": Form(
        tests=[{"input": "1 2\n3 4\n", "output": "3\n7\n"}, {"input": "5\n", "output": "5\n"}],
        correct="import sys\nfor line in sys.stdin:\n    print(sum(map(int, line.split())))\n",
        wrong="import sys\nfor line in sys.stdin:\n    print(len(line.split()))\n",
        theirs={"correct": [0, 0], "wrong": [0, 0]},  # its stand-in for sys.stdin cannot be iterated
    ),
}


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    """Full mode where the tests run as root, else the weak mode: the verdicts do not depend on the mode."""
    weak = {} if os.geteuid() == 0 else {"kernel_isolation": False, "allow_weak_sandbox": True}
    with code_server(config=SandboxConfig(max_concurrency=2, **weak)) as (_, url):
        yield url


def service(base: str, program: str, tests: list, stdio: bool = False) -> list[int]:
    path = "/test_program_stdio" if stdio else "/test_program"
    reply = requests.post(
        base + path, json={"program": program, "tests": tests, "max_execution_time": 3.0}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["results"]


@pytest.mark.parametrize("name", list(FORMS))
def test_each_form_side_by_side(base: str, name: str, tmp_path) -> None:
    form = FORMS[name]
    programs = {"correct": form.correct, "wrong": form.wrong, **form.hacks}
    # The requests at once: the service judges them side by side, as it would a batch of samples.
    with ThreadPoolExecutor(max_workers=len(programs) + 1) as pool:
        theirs_future = pool.submit(run_like_openinstruct, form.correct, form.tests, str(tmp_path))
        futures = {what: pool.submit(service, base, program, form.tests) for what, program in programs.items()}
        ours, theirs = futures.pop("correct").result(), theirs_future.result()
        assert all(o >= t for o, t in zip(ours, theirs, strict=True)), (name, ours, theirs)
        assert ours == [1] * len(form.tests), (name, ours)  # and every form of the corpus passes here
        for what, future in futures.items():  # the wrong program and each hack
            assert future.result() == [0] * len(form.tests), (name, what)


@pytest.mark.parametrize("name", list(STDIO_FORMS))
def test_each_stdio_form_side_by_side(base: str, name: str) -> None:
    form = STDIO_FORMS[name]
    programs = {"correct": form.correct, "wrong": form.wrong, **form.hacks}
    with ThreadPoolExecutor(max_workers=2 * len(programs)) as pool:
        ours_futures = {what: pool.submit(service, base, p, form.tests, True) for what, p in programs.items()}
        theirs_futures = {what: pool.submit(run_stdio_like_openinstruct, p, form.tests) for what, p in programs.items()}
        ours = {what: future.result() for what, future in ours_futures.items()}
        theirs = {what: future.result() for what, future in theirs_futures.items()}
    assert theirs == form.theirs, (name, theirs)  # open-instruct's harness grades them as the docs' table says
    assert ours["correct"] == [1] * len(form.tests), (name, ours)
    assert all(o >= t for o, t in zip(ours["correct"], theirs["correct"], strict=True)), (name, ours, theirs)
    for what in programs.keys() - {"correct"}:  # the wrong program and each hack
        assert ours[what] == [0] * len(form.tests), (name, what, ours[what])
