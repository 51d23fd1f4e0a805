"""The registries of verifiers, tools and environments: the built-ins and a user's module register alike.

Every name a run looks up is registered with one of three decorators, in the module that defines it:

    from open_instruct.extensions import register_environment, register_tool, register_verifier

    @register_verifier("my_task")
    def my_task(inp, settings): ...          # VerifierInput, RewardSettings -> a score in [0, 1]

The built-ins do the same in the modules `BUILTIN_VERIFIER_MODULES` and `BUILTIN_AGENT_MODULES` name. Those
are imported before any lookup (`registered_verifiers`, `registered_tools`, `registered_environments`) and
before any registration from outside them, so a lookup sees every built-in and a user's name is checked
against theirs. A name is registered once: tools and environments share their names (both are --tools
values), and verifier names are registered lower-cased (`verifier_key`), as rows' names are looked up.

Every process of a run that looks names up (the driver, which checks them before anything starts, and each
generation engine, which scores and runs the rollouts) loads a user's modules with `load_extensions`: the
modules named by --extension_modules (importable there: installed, or on PYTHONPATH) and every module that an
installed package declares under the entry-point group `open_instruct.extensions`. Verifiers run in the
reward workers by reference (module and name), so a verifier defined at module level works there too.
See docs/extending.md.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from open_instruct.errors import UserError

if TYPE_CHECKING:
    from open_instruct.agents.base import Environment, Tool
    from open_instruct.rewards.base import Verifier

ENTRY_POINT_GROUP = "open_instruct.extensions"

Registered = TypeVar("Registered")  # a decorator hands back what it registered, its type unchanged

# By name, not imported here: each of them imports this module to register what it defines.
BUILTIN_VERIFIER_MODULES = tuple(
    f"open_instruct.rewards.{module}"
    for module in (
        "gsm8k",
        "math_answer",
        "string_match",
        "length",
        "ifeval",
        "code_tests",
        "passthrough",
        "llm_judge",
        "rubric",
    )
)
BUILTIN_AGENT_MODULES = tuple(
    f"open_instruct.agents.{module}" for module in ("tools", "web_tools", "mcp_tools", "environments", "sandbox_env")
)

# Written only by the decorators below and read only through `registered_*`, which import the built-ins first.
_verifiers: dict[str, Verifier] = {}
_tools: dict[str, type[Tool]] = {}
_environments: dict[str, type[Environment]] = {}
_builtins_imported: set[tuple[str, ...]] = set()
_extensions_loaded: set[str] = set()


class ExtensionError(UserError):
    """An extension module that cannot be imported, or a name registered twice."""


def load_extensions(modules: Sequence[str] = ()) -> list[str]:
    """Import the entry points of `ENTRY_POINT_GROUP` and each of `modules`, each once per process; returns
    the modules imported by this call. A failing import is an `ExtensionError` naming the module and why."""
    wanted = [entry.value.split(":")[0] for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    loaded = []
    for module in [*wanted, *modules]:
        if module in _extensions_loaded:
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
        _extensions_loaded.add(module)
        loaded.append(module)
    return loaded


def verifier_key(name: str) -> str:
    """The registry's form of a verifier name: lower-case, as a dataset row's name is looked up."""
    return name.lower()


def register_verifier(*names: str) -> Callable[[Registered], Registered]:
    """Register a verifier (`VerifierInput, RewardSettings -> VerifierResult`) under `names`, normalised
    (`verifier_key`): a row whose `dataset` column names one, in any case, is scored by it."""

    def decorate(fn: Registered) -> Registered:
        _builtins_first(fn, BUILTIN_VERIFIER_MODULES)
        keys = [verifier_key(name) for name in names]
        for key in keys:
            _check_free(key, "a verifier", fn, _verifiers)
        _verifiers.update(dict.fromkeys(keys, fn))
        return fn

    return decorate


def register_tool(kind: str) -> Callable[[Registered], Registered]:
    """Register a tool class (an `agents.base.Tool`) under `kind`, the --tools value."""

    def decorate(cls: Registered) -> Registered:
        _builtins_first(cls, BUILTIN_AGENT_MODULES)
        _check_free(kind, "a tool or environment", cls, _tools, _environments)
        _tools[kind] = cls
        return cls

    return decorate


def register_environment(name: str) -> Callable[[Registered], Registered]:
    """Register an environment class (an `agents.base.Environment`) under `name`, the --tools value and a
    row's `env_config` `env_name`."""

    def decorate(cls: Registered) -> Registered:
        _builtins_first(cls, BUILTIN_AGENT_MODULES)
        _check_free(name, "a tool or environment", cls, _tools, _environments)
        _environments[name] = cls
        return cls

    return decorate


def registered_verifiers() -> Mapping[str, Verifier]:
    """Every verifier by its normalised name, the built-ins included."""
    _import_builtins(BUILTIN_VERIFIER_MODULES)
    return MappingProxyType(_verifiers)


def registered_tools() -> Mapping[str, type[Tool]]:
    """Every tool class by its --tools name, the built-ins included."""
    _import_builtins(BUILTIN_AGENT_MODULES)
    return MappingProxyType(_tools)


def registered_environments() -> Mapping[str, type[Environment]]:
    """Every environment class by its --tools name, the built-ins included."""
    _import_builtins(BUILTIN_AGENT_MODULES)
    return MappingProxyType(_environments)


def _builtins_first(registered: Any, builtin_modules: tuple[str, ...]) -> None:
    # A built-in registers while its own module is imported, which may be from within this import of the
    # others, so it does not wait for them; whatever else registers is checked against all of them.
    if getattr(registered, "__module__", None) not in builtin_modules:
        _import_builtins(builtin_modules)


def _import_builtins(modules: tuple[str, ...]) -> None:
    if modules not in _builtins_imported:
        for module in modules:
            importlib.import_module(module)
        _builtins_imported.add(modules)


def _check_free(name: str, what: str, registered: Any, *registries: Mapping[str, Any]) -> None:
    for registry in registries:
        taken = registry.get(name)
        if taken is not None and taken is not registered:
            raise ExtensionError(f"{name!r} is already {what} ({taken.__module__}.{taken.__qualname__})")
