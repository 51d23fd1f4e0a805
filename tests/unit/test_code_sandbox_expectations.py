"""open-instruct's code-sandbox expectations, replayed through our `code` verifier and code service.

Source: `open_instruct/code_utils/test_code_utils.py` in allenai/open-instruct (at e6c3044), which
tests `get_successful_tests_fast(program, tests, max_execution_time)` directly. Each case here keeps
that test's facts (program behaviour, assert list, time limit, expected per-test results) in our own
wording, wraps the program in a ```` ```python ```` fence as a model response would, and scores it
with the registry's `code` verifier against a real `code_server` on 127.0.0.1. The per-test results
come back in the verifier's details; the score must be their mean.

Every case of that file is covered (29). `test_tiger_lab_acecode_sample` reads a record from
open-instruct's `test_data/`; we keep its fact (a completion with pass rate 1.0 passes every test)
with our own one-line solution and three of the record's asserts.

Why some expectations differ (`bug=`): open-instruct's first line of defence is a keyword filter
that scores 0 any program whose text contains `import os`, `threading`, `shutil`, `torch`, ... and
it leaves the network open. Our service has no keyword filter; it runs every program under process,
file-system and network isolation. So a harmless program that merely mentions a filtered word passes
here, and a program that opens a socket cannot. Cases with `note=` agree on the score but for a
different reason, which is recorded so a future change to either side is easy to diagnose.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from code_server import code_server
from open_instruct.config.rewards import RewardConfig
from open_instruct.rewards import RewardSettings, VerifierInput, get_verifier

SOURCE = "open_instruct/code_utils/test_code_utils.py"

FAIL = "assert False"
PASS = "assert True"
SLEEP = "import time\ntime.sleep(10)"
KEYWORD_FILTER = (
    "open-instruct zeroes any program whose text contains a filtered keyword ({word}) before running "
    "it; the program itself is harmless, and our sandbox runs it"
)


@dataclass(frozen=True)
class SandboxCase:
    test: str  # "<TestCase class>.<method>" in SOURCE
    name: str  # the parameterized case's name, or the method's subject
    program: str
    tests: tuple[str, ...]
    expected: tuple[int, ...]  # open-instruct's per-test results
    max_execution_time: float = 0.5
    bug: str | None = None  # why we do not share the expectation
    ours: tuple[int, ...] | None = None  # our per-test results when `bug` is set
    note: str | None = None  # same results, reached differently

    @property
    def id(self) -> str:
        return f"{self.test.split('.')[-1]}::{self.name}"


def case(
    test: str,
    name: str,
    program: str,
    tests: list[str],
    expected: list[int],
    ours: list[int] | None = None,
    **kw: Any,
) -> SandboxCase:
    return SandboxCase(
        test, name, program, tuple(tests), tuple(expected), ours=None if ours is None else tuple(ours), **kw
    )


FAST = "GetSuccessfulTestsFastTests"
NET = "ReliabilityGuardNetworkTests"
FS = "ReliabilityGuardFileSystemTests"
PROC = "ReliabilityGuardProcessTests"
RES = "ReliabilityGuardResourceTests"
IMPORTS = "ReliabilityGuardModuleImportTests"
EDGE = "ReliabilityGuardEdgeCaseTests"


def try_flag(flag: str, body: str) -> str:
    """A program that sets `flag` to whether `body` ran without raising."""
    indented = "\n".join("    " + line for line in body.splitlines())
    return f"try:\n{indented}\n    {flag} = True\nexcept Exception:\n    {flag} = False\n"


CASES = [
    # --- get_successful_tests_fast: pass, fail and timeout per test (default limit 1 s) ---
    case(
        f"{FAST}.test_mixed_pass_and_fail",
        "mixed",
        "a = 1",
        [FAIL, PASS, FAIL, PASS, PASS, SLEEP, PASS],
        [0, 1, 0, 1, 1, 0, 1],
        max_execution_time=1.0,
    ),
    case(
        f"{FAST}.test_all_fail_or_timeout",
        "all_fail_or_timeout",
        "a = 1",
        [FAIL, FAIL, SLEEP, SLEEP, SLEEP, SLEEP],
        [0, 0, 0, 0, 0, 0],
        max_execution_time=1.0,
    ),
    case(
        f"{FAST}.test_tiger_lab_acecode_sample",
        "acecode_oss_1",
        "def parse_tokens(tokens):\n    return list(tokens)\n",
        [
            "assert parse_tokens([('daddress', '123'), ('dcommand', 'print'), ('dosymbol', 'x')]) == "
            "[('daddress', '123'), ('dcommand', 'print'), ('dosymbol', 'x')]",
            "assert parse_tokens([('dcommand', 'run'), ('doaddress', '456')]) == "
            "[('dcommand', 'run'), ('doaddress', '456')]",
            "assert parse_tokens([]) == []",
        ],
        [1, 1, 1],
        max_execution_time=1.0,
    ),
    case(
        f"{FAST}.test_add_function_example",
        "add",
        "\n\ndef add(a, b):\n    return a + b\n",
        ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 0) == 1"],
        [1, 1, 0],
        max_execution_time=1.0,
    ),
    # --- network ---
    case(
        f"{NET}.test_socket_operations_allowed",
        "socket_created",
        "import socket\n" + try_flag("socket_created", "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)"),
        ["assert socket_created == True"],
        [1],
        bug="open-instruct lets graded code create sockets (the network is reachable from the sandbox); "
        "ours refuses socket creation, so the flag is False and the assert fails",
        ours=[0],
    ),
    case(
        f"{NET}.test_dangerous_imports_with_networking",
        "threading_with_socket",
        "import threading\nimport socket\ns = socket.socket()",
        [PASS],
        [0],
        note="keyword filter there; here the socket() call itself is refused, so the program raises",
    ),
    case(
        f"{NET}.test_dangerous_imports_with_networking",
        "multiprocessing_with_socket",
        "from multiprocessing import Pool\nimport socket\ns = socket.socket()",
        [PASS],
        [0],
        note="keyword filter there; here the socket() call itself is refused, so the program raises",
    ),
    # --- file system ---
    case(
        f"{FS}.test_file_operations_sandboxed",
        "file_operations",
        try_flag(
            "file_ops_work",
            "with open('test_file.txt', 'w') as f:\n    f.write('test')\n"
            "with open('test_file.txt') as f:\n    assert f.read() == 'test'",
        ),
        ["assert file_ops_work == True"],
        [1],
    ),
    case(
        f"{FS}.test_file_operations_sandboxed",
        "os_chdir_disabled",
        try_flag("chdir_works", "import os\nos.chdir('..')"),
        ["assert chdir_works == False"],
        [0],
        note="keyword filter (`import os`) there; here chdir succeeds (harmless: writes outside the "
        "work dir stay blocked), so the assert that it failed is false",
    ),
    case(
        f"{FS}.test_file_deletion_blocked",
        "os_remove",
        try_flag("remove_worked", "import os\nos.remove('some_file.txt')"),
        ["assert remove_worked == False"],
        [0],
        bug=KEYWORD_FILTER.format(word="import os") + "; the file does not exist, so remove() raises, "
        "the flag is False and the assert holds",
        ours=[1],
    ),
    case(
        f"{FS}.test_file_deletion_blocked",
        "os_unlink",
        try_flag("unlink_worked", "import os\nos.unlink('some_file.txt')"),
        # open-instruct's case asserts on `remove_worked`, a name this program never defines.
        ["assert remove_worked == False"],
        [0],
        note="keyword filter there; here the assert raises NameError (the name is not defined)",
    ),
    # --- processes ---
    case(
        f"{PROC}.test_subprocess_blocked",
        "popen",
        "import subprocess\n" + try_flag("popen_worked", "subprocess.Popen(['echo', 'hello'], stdout=subprocess.PIPE)"),
        ["assert popen_worked == False"],
        [1],
    ),
    case(
        f"{PROC}.test_os_system_blocked",
        "os_system",
        "import os\nexit_code = os.system('echo hello')\n",
        [PASS],
        [0],
        note="keyword filter there; here os.system is refused, so the program raises",
    ),
    case(
        f"{PROC}.test_os_operations_without_import",
        "os_alias",
        "try:\n    import os as operating_system\n    result = operating_system.system is None\n"
        "except Exception:\n    result = False\n",
        ["assert result == True"],
        [0],
        note="keyword filter there; here os.system is left in place (calling it is refused), so the "
        "`is None` check is False",
    ),
    # --- resources ---
    case(
        f"{RES}.test_infinite_recursion_protection",
        "recursion",
        "def recurse():\n    return recurse()\n"
        "try:\n    recurse()\n    recursion_failed = False\n"
        "except RecursionError:\n    recursion_failed = True\n",
        ["assert recursion_failed == True"],
        [1],
    ),
    case(
        f"{RES}.test_cpu_intensive_timeout",
        "cpu_bound",
        "result = 0\nfor i in range(10**10):\n    result += i\n",
        ["assert result > 0"],
        [0],
        max_execution_time=0.1,
    ),
    case(
        f"{RES}.test_faulthandler_disabled",
        "faulthandler",
        "import faulthandler\ntry:\n    is_enabled = faulthandler.is_enabled()\nexcept Exception:\n"
        "    is_enabled = None\n",
        ["assert is_enabled == False"],
        [1],
    ),
    # --- imports ---
    case(
        f"{IMPORTS}.test_dangerous_imports_blocked",
        "threading",
        "import threading\nthreading.Thread(target=lambda: None).start()",
        [PASS],
        [0],
        bug=KEYWORD_FILTER.format(word="threading") + "; a thread cannot leave the process, so it passes",
        ours=[1],
    ),
    case(
        f"{IMPORTS}.test_dangerous_imports_blocked",
        "multiprocessing",
        "from multiprocessing import Pool\nPool()",
        [PASS],
        [0],
        note="keyword filter there; here starting worker processes is refused",
    ),
    case(
        f"{IMPORTS}.test_dangerous_imports_blocked",
        "os_system",
        "import os\nos.system('ls')",
        [PASS],
        [0],
        note="keyword filter there; here os.system is refused",
    ),
    case(
        f"{IMPORTS}.test_dangerous_imports_blocked",
        "shutil_rmtree",
        "import shutil\nshutil.rmtree('/')",
        [PASS],
        [0],
        note="keyword filter there; here removing anything outside the work dir is refused",
    ),
    case(
        f"{IMPORTS}.test_dangerous_imports_blocked",
        "torch",
        "import torch\ntensor = torch.zeros(10)",
        [PASS],
        [0],
        note="keyword filter there; here the import fails (torch missing, or its start-up touches "
        "something the sandbox refuses)",
    ),
    case(
        f"{IMPORTS}.test_dangerous_imports_blocked",
        "sklearn",
        "from sklearn import datasets\ndata = datasets.load_iris()",
        [PASS],
        [0],
        note="keyword filter there; here the import fails",
    ),
    case(
        f"{IMPORTS}.test_safe_imports_allowed",
        "math_sqrt",
        "import math\nresult = math.sqrt(16)",
        ["assert result == 4.0"],
        [1],
    ),
    case(
        f"{IMPORTS}.test_safe_imports_allowed",
        "json_dumps",
        "import json\ndata = json.dumps({'a': 1})",
        ["assert data == '{\"a\": 1}'"],
        [1],
    ),
    case(
        f"{IMPORTS}.test_safe_imports_allowed",
        "re_compile",
        "import re\npattern = re.compile(r'\\d+')",
        ["assert pattern is not None"],
        [1],
    ),
    # --- edge cases ---
    case(
        f"{EDGE}.test_builtins_modifications",
        "exit_quit_nulled",
        "exit_disabled = exit is None\nquit_disabled = quit is None\n",
        ["assert exit_disabled == True", "assert quit_disabled == True"],
        [1, 1],
        bug="the expectation checks a mechanism of open-instruct's guard (it sets exit/quit to None), not "
        "a grading outcome; our isolation does not rely on it (a program that exits early cannot report "
        "a pass), so the builtins are intact and both asserts fail",
        ours=[0, 0],
    ),
    case(
        f"{EDGE}.test_working_directory_sandboxed",
        "write_in_cwd",
        try_flag(
            "sandboxed",
            "with open('sandbox_test.txt', 'w') as f:\n    f.write('test')\n"
            "with open('sandbox_test.txt') as f:\n    assert f.read() == 'test'",
        ),
        ["assert sandboxed == True"],
        [1],
    ),
    case(
        f"{EDGE}.test_shutil_operations_blocked",
        "shutil_rmtree_tmp",
        "import shutil\nshutil.rmtree('/tmp/test')\n",
        [PASS],
        [0],
        note="keyword filter there; here the removal raises (refused, or nothing there to remove)",
    ),
]


@pytest.fixture(scope="module")
def settings() -> Iterator[RewardSettings]:
    with code_server("127.0.0.1", 0) as (_, url):
        yield RewardSettings(RewardConfig(code_api_url=url))


@pytest.mark.parametrize("sandbox_case", CASES, ids=[c.id for c in CASES])
def test_expectation(sandbox_case: SandboxCase, settings: RewardSettings):
    c = sandbox_case
    run_settings = RewardSettings(replace(settings.reward, code_max_execution_time=c.max_execution_time))
    response = f"Here is my solution.\n```python\n{c.program}\n```\n"
    result = get_verifier("code")(VerifierInput(response, list(c.tests)), run_settings)
    want = c.expected if c.bug is None else c.ours
    assert tuple(result.details["results"]) == want, (
        f"{SOURCE}::{c.test} [{c.name}] statuses={result.details.get('statuses')} {c.bug or c.note or ''}"
    )
    assert result.score == pytest.approx(sum(want) / len(want))


def test_bug_cases_say_what_we_score_instead():
    for c in CASES:
        assert (c.bug is None) == (c.ours is None), c.id
        if c.bug is not None:
            assert c.ours != c.expected and len(c.ours) == len(c.tests), c.id
        assert len(c.expected) == len(c.tests), c.id
    assert len(CASES) == 29
    assert len({c.id for c in CASES}) == len(CASES)
