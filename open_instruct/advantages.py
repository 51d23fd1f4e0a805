"""Group-relative advantages and the zero-signal group filter of GRPO.

GRPO samples N completions per prompt (a *group*) and scores each completion against its own
group: the advantage of sample j of group g is its reward minus the group mean, optionally
divided by the group standard deviation. A group whose rewards are all equal carries no
learning signal (every advantage is 0), so `--filter_zero_std_samples` drops such groups
before they take space in a training batch; the number dropped is reported.

Pure functions over `[G, N]` tensors (G groups, N samples per group); no process, device or
framework state. Groups are the rows: the batch assembler stacks the rewards of the complete
groups it has gathered and spreads the resulting advantages onto each sample's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["GroupFilterResult", "filter_zero_std_groups", "group_advantages", "zero_std_groups"]


def _as_float_groups(rewards_GN: torch.Tensor) -> torch.Tensor:
    if rewards_GN.dim() != 2:
        raise ValueError(f"rewards must be [groups, samples_per_group], got shape {tuple(rewards_GN.shape)}")
    # Integer rewards (0/1 verifiers) would make mean/std fail or truncate.
    return rewards_GN if rewards_GN.is_floating_point() else rewards_GN.double()


def zero_std_groups(rewards_GN: torch.Tensor) -> torch.Tensor:
    """`[G]` bool: True where every reward of the group is identical (no learning signal).

    Exact equality rather than `std < tol`: rewards are verifier outputs (0, 10, pass rates),
    and exact equality is what makes every centred advantage exactly zero.
    """
    rewards_GN = _as_float_groups(rewards_GN)
    return (rewards_GN == rewards_GN[:, :1]).all(dim=1)


def group_advantages(
    rewards_GN: torch.Tensor,
    normalization: Literal["centered", "standard"] = "centered",
    eps: float = 1e-8,
) -> torch.Tensor:
    """Advantages `[G, N]`: reward minus its group's mean; "standard" also divides by the group's std.

    "standard" uses the *population* std (`unbiased=False`, i.e. divide by N), as open-instruct
    does (numpy's default `ddof=0`): it is the spread of the group itself, is defined for any N,
    and makes each group's z-scores have unit variance. (torch's default, the unbiased std that
    TRL's GRPO uses, gives advantages smaller by sqrt((N-1)/N) and NaN for N = 1.) `eps` is added
    to the std so near-constant groups do not explode; its default is open-instruct's, so "standard"
    gives its numbers.

    Groups whose rewards are all equal get exactly 0 advantages in both modes (no NaN, and no
    1e-17 / eps leftovers from rounding in the mean).
    """
    if normalization not in ("centered", "standard"):
        raise ValueError(f"normalization must be 'centered' or 'standard', got {normalization!r}")
    rewards_GN = _as_float_groups(rewards_GN)
    advantages_GN = rewards_GN - rewards_GN.mean(dim=1, keepdim=True)
    if normalization == "standard":
        advantages_GN = advantages_GN / (rewards_GN.std(dim=1, unbiased=False, keepdim=True) + eps)
    return advantages_GN.masked_fill(zero_std_groups(rewards_GN)[:, None], 0.0)


@dataclass(frozen=True)
class GroupFilterResult:
    """Which groups survive `--filter_zero_std_samples`.

    kept_group_indices: row indices (ascending) of the groups that have reward variance; index
        the batch's groups / advantages with them (works for lists and tensors).
    num_filtered: how many groups were dropped (reported as a metric, never silently lost).
    """

    kept_group_indices: list[int]
    num_filtered: int

    @property
    def num_kept(self) -> int:
        return len(self.kept_group_indices)


def filter_zero_std_groups(rewards_GN: torch.Tensor, enabled: bool = True) -> GroupFilterResult:
    """Keep the groups with reward variance; `enabled=False` keeps every group (flag off)."""
    num_groups = _as_float_groups(rewards_GN).shape[0]
    if not enabled:
        return GroupFilterResult(kept_group_indices=list(range(num_groups)), num_filtered=0)
    zero_G = zero_std_groups(rewards_GN)
    kept = [int(i) for i in torch.nonzero(~zero_G).flatten().tolist()]
    return GroupFilterResult(kept_group_indices=kept, num_filtered=num_groups - len(kept))
