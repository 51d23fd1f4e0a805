"""The Hugging Face Hub, asked once and briefly: whether a name can be fetched, and what a failure means.

transformers and datasets retry an unreachable Hub for most of a minute and then print pages of traceback;
a run checks its model and dataset names first with one request under `HUB_TIMEOUT_S` (models.py,
data/sources.py) and turns a failure into one line.
"""

from __future__ import annotations

import os

HUB_TIMEOUT_S = 5.0


def offline() -> bool:
    """HF_HUB_OFFLINE is set: the libraries read their caches only, and fail at once without a copy."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def failure_line(error: BaseException, what: str, remedy: str, revision: str | None = None) -> str:
    """One line for a failed Hub request about `what`; `remedy` follows a network failure."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(error, GatedRepoError):
        return f"{what}: gated on the Hub: accept its terms and log in (hf auth login)"
    if isinstance(error, RevisionNotFoundError):
        return f"{what}: the Hub has no revision {revision!r} of it"
    if isinstance(error, RepositoryNotFoundError):
        return f"{what}: not on the Hugging Face Hub (or it is private)"
    return (  # network: name resolution, refused, timed out, proxy
        f"{what}: the Hugging Face Hub did not answer within {HUB_TIMEOUT_S:.0f} s ({type(error).__name__}: "
        f"{error}): {remedy}"
    )
