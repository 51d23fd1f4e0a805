"""Building blocks of the flag groups, shared by `config` and the groups that live next to their feature.

A flag is a dataclass field: its `help` metadata is its only documentation, its `kind` metadata (none: it
works) says when it does not work here, and its `bounds` the values it takes; `--help` prints all three.
"""

from __future__ import annotations

import copy
import difflib
import operator
from dataclasses import Field, field, fields
from types import MappingProxyType
from typing import Any

from open_instruct.errors import UserError

# A flag's kind is field metadata (`arg(..., kind=...)`); `help_for_argparse` writes it into the help text that
# --help prints, and `flag_kind` reads it back for the docs and the checks. No kind: the flag works here.
BEAKER_ONLY = "beaker_only"  # Ai2 infrastructure; accepted so launch scripts run, no effect
NO_EFFECT = "no_effect"  # open-instruct's grpo_fast ignores it too; a non-default value is warned about
PENDING = "pending"  # a feature not built yet; any value but the default is refused with the reason
KIND_LABELS = {
    BEAKER_ONLY: "Beaker only",
    NO_EFFECT: "no effect (as in open-instruct)",
    PENDING: "not supported yet",
}
_HELP_PREFIXES = {
    BEAKER_ONLY: "[Beaker only: accepted for compatibility with open-instruct scripts; no effect here] ",
    NO_EFFECT: "[no effect, as in open-instruct's grpo_fast: {reason}] ",
    PENDING: "[not supported yet: {reason}] ",
}
_OUR_KEYS = ("kind", "reason", "bounds", "off")
_COMPARISONS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class ConfigError(UserError, ValueError):
    """A flag value or combination that cannot run; the message names the flag and the fix."""


def arg(
    default: Any = None,
    help: str = "",
    kind: str | None = None,
    reason: str = "",
    bounds: str | None = None,
    off: Any = None,
    **kwargs,
) -> Any:
    """A dataclass field whose `help` is the single documentation source of its flag; `kind` (BEAKER_ONLY,
    NO_EFFECT, PENDING) says when it does not work here, and `reason` why. `bounds` (">= 1", "> 0", "[0, 1)",
    "(0, 1]") are the values it takes, checked when a `Config` is built (`out_of_bounds`); `off` is one more
    value outside them that turns the feature off (0 for the --rho_* bounds). None, an unset flag, always passes."""
    if kind is not None and kind not in KIND_LABELS:
        raise ValueError(f"unknown flag kind {kind!r}")
    if bounds is not None:
        _within(0, bounds)  # a malformed bound fails where the flag is declared, not when a user meets it
    metadata = {"help": help, **kwargs}
    if kind:
        metadata.update(kind=kind, reason=reason)
    if bounds:
        metadata["bounds"] = bounds
    if off is not None:
        metadata["off"] = off
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def flag_kind(flag: Field) -> str:
    """'works', or why it does not: 'Beaker only', 'no effect (as in open-instruct)', 'not supported yet'."""
    kind = flag.metadata.get("kind")
    return KIND_LABELS[kind] if kind else "works"


def moved_flags(group, kind: str) -> list[tuple[str, Any, str]]:
    """(flag, value, reason) of every flag of `group` of `kind` whose value is not its default."""
    found = []
    for flag in fields(group):
        if flag.metadata.get("kind") != kind:
            continue
        default = flag.default_factory() if callable(flag.default_factory) else flag.default  # type: ignore[misc]
        value = getattr(group, flag.name)
        if value != default:
            found.append((flag.name, value, flag.metadata["reason"]))
    return found


def refused_flags(group) -> list[str]:
    """The flags of `group` marked not supported yet (PENDING) given a value other than their default: one line
    each. Any group may hold such a flag (`core.unsupported_features` asks every group)."""
    moved = moved_flags(group, PENDING)
    return [f"--{name} {shown(value)}: not supported yet: {reason}" for name, value, reason in moved]


def shown(value: Any) -> str:
    """A flag's value as it is written on the command line."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def rendered_help(flag: Field) -> str:
    """The help --help prints: the kind and its reason first, then what the flag does and the values it takes."""
    kind = flag.metadata.get("kind")
    prefix = _HELP_PREFIXES[kind].format(reason=flag.metadata.get("reason", "")) if kind else ""
    values = f" Must be {allowed_values(flag)}." if "bounds" in flag.metadata else ""
    return f"{prefix}{flag.metadata.get('help', '')}{values}".strip()


def allowed_values(flag: Field) -> str:
    """A flag's bounds in words: '>= 1', 'in (0, 1]', '0 (off) or > 1'."""
    bounds = flag.metadata["bounds"]
    allowed = bounds if bounds[0] in "<>" else f"in {bounds}"
    return f"{flag.metadata['off']} (off) or {allowed}" if "off" in flag.metadata else allowed


def out_of_bounds(group) -> list[str]:
    """One line for each flag of `group` whose value lies outside its declared bounds."""
    problems = []
    for flag in fields(group):
        value, bounds = getattr(group, flag.name), flag.metadata.get("bounds")
        if bounds is None or value is None or ("off" in flag.metadata and value == flag.metadata["off"]):
            continue
        if not _within(value, bounds):
            problems.append(f"--{flag.name} {value} must be {allowed_values(flag)}")
    return problems


def _within(value: float, bounds: str) -> bool:
    if bounds[0] in "[(" and bounds[-1] in "])":
        low, high = (float(end) for end in bounds[1:-1].split(","))
        above = value >= low if bounds[0] == "[" else value > low
        return above and (value <= high if bounds[-1] == "]" else value < high)
    comparison, limit = bounds.split()
    return _COMPARISONS[comparison](value, float(limit))


def help_for_argparse(flag: Field) -> Field:
    """`flag` as HfArgumentParser should see it: it hands every metadata key to `add_argument`, which
    knows none of `kind`, `reason`, `bounds` and `off`, so those become part of the help text."""
    shown = copy.copy(flag)
    metadata = {key: value for key, value in flag.metadata.items() if key not in _OUR_KEYS}
    shown.metadata = MappingProxyType({**metadata, "help": rendered_help(flag)})
    return shown


def mixer_problems(flag: str, mix: list[str]) -> list[str]:
    if len(mix) % 2:
        return [f"{flag} takes NAME WEIGHT pairs; got an odd number of values: {' '.join(mix)}"]
    problems = []
    for name, weight in zip(mix[::2], mix[1::2]):
        try:
            if float(weight) <= 0:
                problems.append(f"{flag}: weight of {name} must be > 0, got {weight}")
        except ValueError:
            problems.append(f"{flag}: weight of {name} must be a number (fraction or row count), got {weight!r}")
    return problems


def unknown_flags_message(parser, remaining: list[str]) -> str:
    known = [opt for action in parser._actions for opt in action.option_strings]
    lines = []
    after_unknown_flag = False
    for token in remaining:
        if not token.startswith("-"):
            if not after_unknown_flag:  # values of an unknown flag are part of that one complaint
                lines.append(f"unexpected value {token!r} (does the flag before it take fewer values?)")
            continue
        after_unknown_flag = True
        flag = token.split("=")[0]
        close = difflib.get_close_matches(flag, known, n=1)
        lines.append(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    return "; ".join(lines) + ". Run with --help for the full list."


def groups_from_flags(values: dict[str, Any], groups: dict[str, type], defaults=None) -> tuple[dict, dict]:
    """Flag values by name, each filed into the group that declares it: ({attribute: group instance}, the
    values no group declares). `defaults` ({attribute: {flag: value}}) replace flag defaults unless given."""
    given = {name: dict((defaults or {}).get(name, {})) for name in groups}
    rest = {}
    for flag, value in values.items():
        owner = next((name for name, group in groups.items() if flag in {f.name for f in fields(group)}), None)
        if owner is None:
            rest[flag] = value
        else:
            given[owner][flag] = value
    return {name: group(**given[name]) for name, group in groups.items()}, rest
