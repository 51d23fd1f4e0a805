"""Extension points (`open_instruct.extensions`): a user's module registers a verifier, a tool and an
environment, found through --extension_modules or an installed package's entry point; the names then pass the
launch checks. Each case runs in its own interpreter, so the registrations never reach other tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "extension_example"


def run_python(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_a_module_named_on_the_command_line_registers_a_verifier_a_tool_and_an_environment(tmp_path):
    code = """
import asyncio
from open_instruct.config.core import parse_config
from open_instruct.grpo_fast import launch_problems
from open_instruct.rewards import VerifierInput, RewardSettings, get_verifier
from open_instruct.agents.tools import TOOLS
from open_instruct.agents.environments import make_environment
from open_instruct.agents.base import ToolCall, ToolSpec
from open_instruct.agents.tools import make_tool

flags = ["--tools", "reverse_text", "countdown", "--tool_configs", '{"prefix": ">"}', "{}"]
before = launch_problems(parse_config(flags))  # importable, but nothing says to load it
assert before and "'reverse_text' is not a known tool or environment" in before[0], before
cfg = parse_config([*flags, "--extension_modules", "oi_example_extension"])
assert launch_problems(cfg) == [], launch_problems(cfg)
score = get_verifier("last_digit")(VerifierInput("so 12", "2"), RewardSettings()).score
tool = make_tool(ToolSpec("reverse_text", "reverse_text", {"prefix": ">"}))
env = make_environment("countdown", {})
asyncio.run(env.reset(start=1))
step = asyncio.run(env.step(ToolCall("tick")))
print(score, asyncio.run(tool.call({"text": "abc"})).result, step.reward, step.done)
"""
    # The package alone on the path (without the example's .dist-info, whose entry point would load it anyway).
    shutil.copytree(EXAMPLE / "oi_example_extension", tmp_path / "oi_example_extension")
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["1.0", ">cba", "1.0", "True"]


def test_an_installed_packages_entry_point_is_loaded_without_a_flag():
    """The example folder holds a .dist-info with an `open_instruct.extensions` entry point: on sys.path it is
    what an installed package looks like, and `load_extensions()` imports it with no module named."""
    code = """
from open_instruct.extensions import load_extensions
from open_instruct.rewards import available_verifiers
print(load_extensions(), "last_digit" in available_verifiers())
"""
    result = run_python(code, EXAMPLE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "['oi_example_extension'] True"


def test_an_extension_may_not_replace_a_built_in():
    code = """
from open_instruct.extensions import ExtensionError, register_tool, register_verifier
for register, name in ((register_tool, "python"), (register_verifier, "gsm8k")):
    try:
        register(name)(type("Mine", (), {}) if register is register_tool else (lambda inp, settings: 1.0))
    except ExtensionError as error:
        print(type(error).__name__, str(error).split(" (")[0].split(";")[0])
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("ExtensionError 'python' is already a tool or environment")
    assert lines[1] == "ExtensionError verifier 'gsm8k' registered twice", lines


def test_a_verifier_registered_with_capitals_is_found_by_a_row_in_any_case():
    """Rows' verifier names are looked up lower-cased; the name is normalised at registration the same way."""
    code = """
from open_instruct.data.rows import RowSettings, parse_row
from open_instruct.extensions import register_verifier
from open_instruct.rewards import available_verifiers, get_verifier

@register_verifier("MyCheck")
def my_check(inp, settings):
    return 1.0

settings = RowSettings("messages", "ground_truth", 64, False, False, None, (), tuple(available_verifiers()))
for name in ("mycheck", "MyCheck"):
    row = {"messages": [{"role": "user", "content": "hi"}], "ground_truth": "x", "dataset": name}
    print(parse_row(row, settings)[2] == [name], get_verifier(name) is my_check)
print("mycheck" in available_verifiers(), "MyCheck" in available_verifiers())
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True", "True", "True", "True", "False"]
