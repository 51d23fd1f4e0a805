"""The one exception type for problems a user causes and can fix: a flag, a path, a dataset row, a model or
dataset name, a service that does not answer.

`grpo_fast.py` prints these as one line naming the culprit, with no traceback (exit 2); a traceback is for our
bugs (any other exception), and `--verbose` shows it for every error. Each module raises its own subclass
(`ConfigError`, `DatasetError`, `ModelNotFound`, ...) so that its callers can still tell them apart.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; the message names what and where."""
