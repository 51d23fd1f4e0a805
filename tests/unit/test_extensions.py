"""The registries (`open_instruct.extensions`): the built-ins and a user's module register alike. A user's
module registers a verifier, a tool and an environment, found through --extension_modules or an installed
package's entry point; the names then pass the launch checks. Each case that registers or counts modules
runs in its own interpreter, so the registrations never reach other tests."""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

from open_instruct.agents.base import Tool, ToolDefinition
from open_instruct.extensions import BUILTIN_AGENT_MODULES, BUILTIN_VERIFIER_MODULES, registered_tools

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
    """Tools and environments share their names (both are --tools values); the built-ins are loaded before a
    user's name is checked, though nothing else imported them."""
    code = """
from open_instruct.extensions import ExtensionError, register_environment, register_tool, register_verifier
for register, name in (
    (register_tool, "python"),
    (register_environment, "python"),
    (register_tool, "counter"),
    (register_verifier, "GSM8K"),
):
    try:
        register(name)(type("Mine", (), {}) if register is not register_verifier else (lambda inp, settings: 1.0))
    except ExtensionError as error:
        print(type(error).__name__, error)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [
        "ExtensionError 'python' is already a tool or environment (open_instruct.agents.tools.PythonTool)",
        "ExtensionError 'python' is already a tool or environment (open_instruct.agents.tools.PythonTool)",
        "ExtensionError 'counter' is already a tool or environment (open_instruct.agents.environments.CounterEnv)",
        "ExtensionError 'gsm8k' is already a verifier (open_instruct.rewards.gsm8k.gsm8k)",
    ]


def test_every_built_in_is_found_through_the_one_registry():
    """Each module the registry names as built-in registers something, and everything registered in a fresh
    process comes from one of them."""
    code = """
from open_instruct.extensions import (
    BUILTIN_AGENT_MODULES, BUILTIN_VERIFIER_MODULES, registered_environments, registered_tools, registered_verifiers,
)
tools, environments, verifiers = registered_tools(), registered_environments(), registered_verifiers()
print(sorted(tools))
print(sorted(environments))
agents = {cls.__module__ for cls in [*tools.values(), *environments.values()]}
rewards = {fn.__module__ for fn in verifiers.values()}
print(agents == set(BUILTIN_AGENT_MODULES), rewards == set(BUILTIN_VERIFIER_MODULES))
print(all(name == name.lower() for name in verifiers), "gsm8k" in verifiers and "code_stdio" in verifiers)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [
        "['crawl4ai_browse', 'generic_mcp', 'http', 'jina_browse', 'python', 's2_search', 'serper_search']",
        "['counter', 'generic_sandbox', 'guess_number', 'wordle']",
        "True True",
        "True True",
    ]


def test_the_registry_names_every_package_module_that_registers():
    """A module of the package that registers but is missing from the registry's lists would be found only
    where something happened to import it."""
    decorators = {"register_verifier": "verifiers", "register_tool": "agents", "register_environment": "agents"}
    found: dict[str, set[str]] = {"verifiers": set(), "agents": set()}
    for path in (REPO / "open_instruct").rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in decorators:
                found[decorators[node.func.id]].add(module)
    assert found == {"verifiers": set(BUILTIN_VERIFIER_MODULES), "agents": set(BUILTIN_AGENT_MODULES)}


def test_a_built_in_module_imports_alone():
    """A built-in's registration does not import the other built-ins: the reward workers import each verifier
    module on its own, so one whose optional dependency is missing leaves the others working."""
    code = """
import sys
import open_instruct.rewards.gsm8k
import open_instruct.agents.environments
from open_instruct.extensions import BUILTIN_AGENT_MODULES, BUILTIN_VERIFIER_MODULES
print(sorted(m for m in (*BUILTIN_VERIFIER_MODULES, *BUILTIN_AGENT_MODULES) if m in sys.modules))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "['open_instruct.agents.environments', 'open_instruct.rewards.gsm8k']"


# Each built-in tool with a config that builds it without I/O or environment variables.
NO_IO_CONFIGS = {
    "python": {},
    "http": {"url": "http://127.0.0.1:9/"},
    "serper_search": {"api_key": "k"},
    "s2_search": {"api_key": "k"},
    "jina_browse": {"api_key": "k"},
    "crawl4ai_browse": {"api_key": "k", "api_url": "http://127.0.0.1:9/", "blocklist": []},
    "generic_mcp": {"server_url": "http://127.0.0.1:9/mcp"},
}


def test_every_built_in_tool_class_has_what_the_tool_protocol_states():
    """Structurally, member by member as the Protocol declares them: its attributes on a built instance, its
    methods with the same parameters and the same async-ness, and the constructor's two leading parameters."""
    attributes = {"call_name": str, "timeout_s": float, "definition": ToolDefinition}
    assert set(attributes) == set(Tool.__annotations__)
    methods = {name: fn for name, fn in vars(Tool).items() if inspect.isfunction(fn) and not name.startswith("_")}
    assert set(methods) == {"call", "close"}
    assert set(NO_IO_CONFIGS) == set(registered_tools())
    for kind, cls in registered_tools().items():
        assert list(inspect.signature(cls).parameters)[:2] == ["call_name", "config"], kind
        tool = cls("my_" + kind, NO_IO_CONFIGS[kind])
        for name, kind_of in attributes.items():
            assert isinstance(getattr(tool, name), kind_of), (kind, name)
        assert tool.call_name == tool.definition.name == "my_" + kind
        for name, declared in methods.items():
            mine = getattr(cls, name)
            assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(declared), (kind, name)
            assert inspect.signature(mine).parameters.keys() == inspect.signature(declared).parameters.keys()


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
