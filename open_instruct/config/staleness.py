"""How old a trained token may be: the staleness bound K and what happens to a group older than K.

The flags only; `open_instruct.staleness.StalenessPolicy` parses them once (with --async_steps, which
sets K's default) into the rule the loop, the replay buffer and the pacing ask."""

from __future__ import annotations

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
