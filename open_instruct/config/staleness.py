"""How old a trained token may be: the staleness bound K and what happens to a group older than K.

The flags (`StalenessConfig`), and `StalenessPolicy`, which parses them once (with --async_steps, which sets K's
default) into the policy the loop, the replay buffer and the pacing ask (`cfg.staleness_policy`); the rules it
sets them (the age rule, the window K moves in) are `open_instruct.staleness`'s."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from open_instruct.config.fields import arg

# K when --async_steps auto and --max_off_policy_steps is not given: open-instruct's default lookahead, so
# `auto` never runs further ahead than an unchanged open-instruct script would.
DEFAULT_AUTO_BOUND = 8


@dataclass(frozen=True)
class StalenessConfig:
    _argument_group_name = "staleness (how old a trained token may be)"

    max_off_policy_steps: str | None = arg(
        None,
        "Staleness bound K: a group whose oldest token is more than K learner versions behind at training time "
        "gets --off_policy_action. Default: --async_steps (open-instruct's bound); 8 with --async_steps auto. "
        "'auto': K tunes itself within [--off_policy_window_min, --off_policy_window_max], widening while the "
        "learner waits for batches and narrowing when the off-policy health limits are crossed "
        "(--off_policy_min_ess_frac, --off_policy_max_truncated_frac).",
    )
    off_policy_window_min: int = arg(
        1, "With --max_off_policy_steps auto: the smallest K (where it starts).", bounds=">= 1"
    )
    off_policy_window_max: int = arg(
        DEFAULT_AUTO_BOUND, "With --max_off_policy_steps auto: the largest K (capacities are sized for it)."
    )
    off_policy_min_ess_frac: float = arg(
        0.9,
        "With --max_off_policy_steps auto: the narrowest effective sample size of a step's importance weights "
        "pi_old/mu, as a fraction of its tokens (offpolicy/ess_frac), before K narrows; 0: no limit.",
        bounds="[0, 1)",
    )
    off_policy_max_truncated_frac: float = arg(
        0.02,
        "With --max_off_policy_steps auto: the largest share of a step's tokens whose importance weight hits the "
        "cap (offpolicy/truncated_frac, --truncated_importance_sampling_ratio_cap) before K narrows; 1: no limit.",
        bounds="(0, 1]",
    )
    off_policy_action: Literal["mask", "requeue", "drop", "downweight"] = arg(
        "mask",
        "For groups over --max_off_policy_steps: train the group whole at full weight on its tokens at most K "
        "versions old, the older ones kept as context outside the loss, and requeue it only when no token is "
        "that young (mask: a long answer is not lost for its age); admit the prompt again, fresh (requeue); "
        "drop it and admit another (drop); or train it at weight 0.5^(lag - K) (downweight). Requeue and drop "
        "also abort running samples that can no longer finish within the bound.",
    )

    def problems(self) -> list[str]:
        value = "" if self.max_off_policy_steps is None else str(self.max_off_policy_steps).strip().lower()
        checks = [
            (
                value in ("", "auto") or value.isdigit(),
                f"--max_off_policy_steps {self.max_off_policy_steps!r} must be an integer >= 0 or 'auto'",
            ),
            (
                self.off_policy_window_min <= self.off_policy_window_max,
                f"--off_policy_window_min {self.off_policy_window_min} must be <= --off_policy_window_max "
                f"{self.off_policy_window_max}",
            ),
        ]
        return [message for ok, message in checks if not ok]


# The limits of the self-tuning window: given without --max_off_policy_steps auto they would do nothing.
WINDOW_FLAGS = frozenset(
    {"off_policy_window_min", "off_policy_window_max", "off_policy_min_ess_frac", "off_policy_max_truncated_frac"}
)


class OffPolicyAction(enum.Enum):
    """What happens to a group older than K (--off_policy_action)."""

    MASK = "mask"  # train it on its tokens at most K old, the rest as context; requeue it when none is
    REQUEUE = "requeue"  # admit the prompt again, fresh
    DROP = "drop"  # admit another prompt instead
    DOWNWEIGHT = "downweight"  # train it at weight 0.5^(lag - K)

    @property
    def trains_late_groups(self) -> bool:
        """Late groups are trained (on young tokens, or down-weighted): their running samples may finish."""
        return self in (OffPolicyAction.MASK, OffPolicyAction.DOWNWEIGHT)

    @property
    def requeues(self) -> bool:
        """A group that cannot be trained has its prompt admitted again (else another prompt replaces it)."""
        return self in (OffPolicyAction.MASK, OffPolicyAction.REQUEUE)

    @property
    def age_rule(self) -> Literal["drop", "downweight", "mask"]:
        """What the replay buffer does with a late group (requeue and drop both take it out of training)."""
        return self.value if self.trains_late_groups else "drop"  # type: ignore[return-value]


@dataclass(frozen=True)
class StalenessPolicy:
    """K and the off-policy action of a run. `bound` is K (with `auto`, the largest K the window may reach:
    capacities are sized for it); `minimum` the smallest K it may use."""

    action: OffPolicyAction
    bound: int
    minimum: int
    auto: bool = False
    min_ess_frac: float = 0.9
    max_truncated_frac: float = 0.02

    @classmethod
    def from_config(cls, cfg) -> StalenessPolicy:
        """From the staleness flags and --async_steps (K's default); the flags were validated by then."""
        return cls.from_flags(cfg.staleness, cfg.generation.async_steps)

    @classmethod
    def from_flags(cls, staleness, async_steps: str) -> StalenessPolicy:
        value = "" if staleness.max_off_policy_steps is None else str(staleness.max_off_policy_steps).strip().lower()
        action = OffPolicyAction(staleness.off_policy_action)
        limits = (staleness.off_policy_min_ess_frac, staleness.off_policy_max_truncated_frac)
        if value == "auto":
            return cls(action, staleness.off_policy_window_max, staleness.off_policy_window_min, True, *limits)
        if value:
            bound = int(value)
        else:
            lookahead = async_steps.strip().lower()
            bound = DEFAULT_AUTO_BOUND if lookahead == "auto" else int(lookahead)
        return cls(action, bound, bound, False, *limits)

    @property
    def flag_value(self) -> int | str:
        """K as --max_off_policy_steps would say it (the run summary's key)."""
        return "auto" if self.auto else self.bound

    def describe(self) -> str:
        """The policy in one phrase, as results tables state it: `K=2, mask` or `K=auto (1-8, ess >= 0.9,
        truncated <= 0.02), mask`."""
        if self.auto:
            limits = f"ess >= {self.min_ess_frac:g}, truncated <= {self.max_truncated_frac:g}"
            return f"K=auto ({self.minimum}-{self.bound}, {limits}), {self.action.value}"
        return f"K={self.bound}, {self.action.value}"

    def sync_interval_problems(self, sync_every: int) -> list[str]:
        """Between weight syncs the engines fall up to `sync_every - 1` versions behind the learner. A tighter
        bound dooms every sample before the next sync, which then never comes (the learner waits forever),
        unless late groups are down-weighted instead of dropped."""
        lag = sync_every - 1
        if self.action is OffPolicyAction.DOWNWEIGHT or self.minimum >= lag:
            return []
        return [
            f"--weight_sync_every_steps {sync_every} leaves the engines up to {lag} versions behind the learner, "
            f"more than the staleness bound {self.minimum} allows: nothing would be trainable before the next "
            f"sync; give --max_off_policy_steps >= {lag} (or --off_policy_action downweight)"
        ]
