"""Verifiers, tools and environments from outside the package: a user scores their own task without a fork.

A user's module registers what it adds with the decorators the built-ins use:

    from open_instruct.extensions import register_environment, register_tool, register_verifier

    @register_verifier("my_task")
    def my_task(inp, settings): ...          # VerifierInput, RewardSettings -> a score in [0, 1]

and every process of a run that looks names up (the driver, which checks them before anything starts, and
each generation engine, which scores and runs the rollouts) loads it with `load_extensions`: the modules
named by --extension_modules (importable there: installed, or on PYTHONPATH) and every module that an
installed package declares under the entry-point group `open_instruct.extensions`. Verifiers run in the
reward workers by reference (module and name), so a verifier defined at module level works there too.
See docs/extending.md.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Sequence

from open_instruct.errors import UserError

ENTRY_POINT_GROUP = "open_instruct.extensions"

_loaded: set[str] = set()


class ExtensionError(UserError):
    """An extension module that cannot be imported, or that registers a name twice."""


def load_extensions(modules: Sequence[str] = ()) -> list[str]:
    """Import the entry points of `ENTRY_POINT_GROUP` and each of `modules`, each once per process; returns
    the modules imported by this call. A failing import is an `ExtensionError` naming the module and why."""
    wanted = [entry.value.split(":")[0] for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    loaded = []
    for module in [*wanted, *modules]:
        if module in _loaded:
            continue
        try:
            importlib.import_module(module)
        except ExtensionError:
            raise
        except Exception as error:
            source = "--extension_modules" if module in modules else f"the entry point group {ENTRY_POINT_GROUP}"
            first = str(error).splitlines()[0] if str(error) else ""
            raise ExtensionError(
                f"extension module {module!r} (from {source}) failed to import: {type(error).__name__}: {first}"
            ) from error
        _loaded.add(module)
        loaded.append(module)
    return loaded


def register_verifier(*names: str) -> Callable:
    """Register a verifier (`VerifierInput, RewardSettings -> VerifierResult`) under `names`: a row whose `dataset`
    column names one is scored by it."""
    from open_instruct.rewards import available_verifiers, register

    available_verifiers()  # the built-ins first: a user's verifier may not take a built-in's name

    def decorate(fn):
        try:
            return register(*names)(fn)
        except ValueError as error:
            raise ExtensionError(f"{error} (an extension may not replace a registered verifier)") from error

    return decorate


def register_tool(kind: str) -> Callable[[type], type]:
    """Register a tool class under `kind` (the --tools value). The class is built per engine as
    `cls(call_name, config)` (config: its --tool_configs JSON) and has `call_name`, `timeout_s`, `definition`
    (a ToolDefinition), `async call(args) -> StepResult` and `async close()`."""
    from open_instruct.agents.environments import ENVIRONMENTS
    from open_instruct.agents.tools import TOOLS

    def decorate(cls: type) -> type:
        _check_free(kind, TOOLS, ENVIRONMENTS, cls)
        TOOLS[kind] = cls
        return cls

    return decorate


def register_environment(name: str) -> Callable[[type], type]:
    """Register an environment class under `name` (the --tools value). A fresh instance serves each sample:
    `cls(**config)`, then `await reset(**row kwargs)`, `await step(call) -> StepResult`, `metrics()`, and the
    classmethod `tool_definitions()`; `response_role` is "tool" or "user" (see `agents.base.Environment`)."""
    from open_instruct.agents.environments import ENVIRONMENTS
    from open_instruct.agents.tools import TOOLS

    def decorate(cls: type) -> type:
        _check_free(name, TOOLS, ENVIRONMENTS, cls)
        ENVIRONMENTS[name] = cls
        return cls

    return decorate


def _check_free(name: str, tools: dict, environments: dict, cls: type) -> None:
    taken = tools.get(name) or environments.get(name)
    if taken is not None and taken is not cls:
        raise ExtensionError(f"{name!r} is already a tool or environment ({taken.__module__}.{taken.__qualname__})")
