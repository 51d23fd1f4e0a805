"""Building blocks of the flag groups, shared by `config` and the groups that live next to their feature.

A flag is a dataclass field whose `help` metadata is its only documentation (what `--help` prints).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

BEAKER_ONLY = "[Beaker only: accepted for compatibility with open-instruct scripts; no effect here] "


class ConfigError(ValueError):
    """A flag value or combination that cannot run; the message names the flag and the fix."""


def arg(default: Any = None, help: str = "", **kwargs) -> Any:
    """A dataclass field whose `help` is the single documentation source of its flag."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})
