"""Building blocks of the flag groups, shared by `config` and the groups that live next to their feature.

A flag is a dataclass field whose `help` metadata is its only documentation (what `--help` prints).
"""

from __future__ import annotations

import difflib
from dataclasses import field
from typing import Any

from open_instruct.errors import UserError

BEAKER_ONLY = "[Beaker only: accepted for compatibility with open-instruct scripts; no effect here] "
# What a flag's help starts with says what kind of flag it is (see `flag_kind`); argparse passes every field
# metadata key on to `add_argument`, so the help text is the one place a kind can be written.
PENDING = "[not supported yet: "
NO_EFFECT = "[no effect, as in open-instruct's grpo_fast: "
KIND_PREFIXES = {
    BEAKER_ONLY: "Beaker only",
    NO_EFFECT: "no effect (as in open-instruct)",
    PENDING: "not supported yet",
}


class ConfigError(UserError, ValueError):
    """A flag value or combination that cannot run; the message names the flag and the fix."""


def arg(default: Any = None, help: str = "", **kwargs) -> Any:
    """A dataclass field whose `help` is the single documentation source of its flag."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


def flag_kind(help_text: str) -> str:
    """'works', or why it does not: 'Beaker only', 'no effect (as in open-instruct)', 'not supported yet'."""
    for prefix, kind in KIND_PREFIXES.items():
        if help_text.startswith(prefix):
            return kind
    return "works"


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
