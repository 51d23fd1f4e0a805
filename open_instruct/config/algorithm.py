"""The GRPO objective: advantages, the clipped loss, the off-policy correction of streamed samples (importance
ratios), and the reference policy of the KL term."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from open_instruct.config.fields import arg

KL_ESTIMATORS = {"kl1": "kl1", "kl2": "kl2", "kl3": "kl3", "kl4": "kl4", "0": "kl1", "1": "kl2", "2": "kl3", "3": "kl4"}


@dataclass(frozen=True)
class AlgorithmConfig:
    _argument_group_name = "algorithm: GRPO loss, off-policy correction, reference policy"

    beta: float = arg(0.05, "KL penalty coefficient; > 0 loads a reference policy.", bounds=">= 0")
    kl_estimator: str = arg("kl3", "KL estimator: kl1, kl2, kl3, kl4 (or the numeric forms 0-3).")
    clip_lower: float = arg(0.2, "Lower PPO clip: ratio >= 1 - clip_lower.", bounds=">= 0")
    clip_higher: float = arg(0.272, "Upper PPO clip (DAPO clip-higher): ratio <= 1 + clip_higher.", bounds=">= 0")
    loss_denominator: str = arg("token", "'token' (mean over tokens) or a positive constant (Dr. GRPO).")
    num_epochs: int = arg(1, "Passes over each batch.", bounds=">= 1")
    num_mini_batches: int = arg(1, "Optimizer steps per batch and epoch.", bounds=">= 1")
    mask_truncated_completions: bool = arg(False, "Exclude samples cut at --response_length from the loss.")
    advantage_normalization_type: Literal["centered", "standard"] = arg(
        "centered", "Group advantages: reward minus group mean, or also divided by the group std."
    )
    filter_zero_std_samples: bool = arg(True, "Drop groups whose rewards are all equal (no signal; counted).")
    active_sampling: bool = arg(
        False,
        "Every step trains exactly --num_unique_prompts_rollout groups with reward spread: groups the filters drop "
        "(zero std, over --max_off_policy_steps) are replaced by admitting more prompts.",
    )
    no_resampling_pass_rate: float | None = arg(
        None,
        "Prompts whose group mean reward / max possible reward reached this rate are not admitted again in later "
        "epochs (kept in the resume state).",
        bounds="(0, 1]",
    )
    truncated_importance_sampling_ratio_cap: float = arg(
        2.0,
        "Cap of the learner/behaviour importance ratio for streamed, off-policy samples (0 disables).",
        bounds=">= 0",
    )
    importance_sampling_mode: Literal["truncate", "mask_token", "mask_sequence"] = arg(
        "truncate",
        "Beyond the cap: truncate the ratio (TIS), or also drop tokens / whole samples whose ratio "
        "is outside [1/cap, cap].",
    )
    loss_fn: Literal["dapo", "cispo"] = arg(
        "dapo", "dapo: clipped surrogate. cispo: REINFORCE with a stop-gradient weight min(ratio, 1 + clip_higher)."
    )
    record_entropy: bool = arg(False, "Log policy/entropy_avg: the policy's per-token entropy on trained tokens.")
    use_vllm_logprobs: bool = arg(
        False, "Anchor the PPO ratio at the engines' sampling logprobs instead of the learner's."
    )
    use_rho_correction: bool = arg(True, "Weight each token by its truncated importance ratio; False only logs it.")
    rho_clamp_lower_bound: float = arg(0.0, "Lower clamp on the importance weight.", bounds="(0, 1)", off=0)
    rho_clamp_upper_bound: float = arg(
        2.0,
        "Cap of the importance ratio (TIS): the same as --truncated_importance_sampling_ratio_cap.",
        bounds="> 1",
        off=0,
    )
    rho_mask_lower_bound: float = arg(0.0, "Drop tokens whose importance ratio is below this.", bounds="(0, 1)", off=0)
    rho_mask_upper_bound: float = arg(0.0, "Drop tokens whose importance ratio is above this.", bounds="> 1", off=0)
    rho_mask_sequence_level: bool = arg(
        False, "Mask and clamp with each sample's geometric-mean ratio instead of each token's."
    )
    rho_mask_tv_divergence: bool = arg(
        False, "VACO: mask by each sample's mean |ratio - 1| against the mask bounds, only tokens that push it further."
    )
    load_ref_policy: bool = arg(True, "Keep a frozen reference policy for the KL term; False requires --beta 0.")
    ref_policy_update_freq: int | None = arg(
        None,
        "Every N training steps the reference moves toward the policy by --alpha (Polyak); None keeps it fixed.",
        bounds=">= 1",
    )
    alpha: float = arg(
        0.6, "Polyak weight of --ref_policy_update_freq: ref <- (1 - alpha) ref + alpha policy.", bounds="[0, 1]"
    )

    @property
    def kl_estimator_name(self) -> str:
        """--kl_estimator as its kl1..kl4 name (open-instruct also accepts the indices 0-3)."""
        return KL_ESTIMATORS[str(self.kl_estimator).lower()]

    @property
    def constant_loss_denominator(self) -> float | None:
        """None: --loss_denominator token (the token mean); else the constant (Dr. GRPO) denominator."""
        return None if self.loss_denominator == "token" else float(self.loss_denominator)

    def problems(self) -> list[str]:
        checks = [
            (
                str(self.kl_estimator).lower() in KL_ESTIMATORS,
                f"--kl_estimator {self.kl_estimator!r} is not one of kl1, kl2, kl3, kl4 (or 0, 1, 2, 3)",
            ),
            (
                _is_token_or_positive(self.loss_denominator),
                f"--loss_denominator {self.loss_denominator!r} must be 'token' or a positive number",
            ),
            (
                not self.active_sampling or self.filter_zero_std_samples,
                "--active_sampling replaces the groups --filter_zero_std_samples drops; it needs that filter on "
                "(drop --no_filter_zero_std_samples or --active_sampling)",
            ),
            (
                self.load_ref_policy or self.beta == 0,
                f"--load_ref_policy False leaves the KL term (--beta {self.beta}) without a reference; "
                "pass --beta 0 or drop --load_ref_policy False",
            ),
            (
                self.rho_clamp_upper_bound == 2.0
                or self.truncated_importance_sampling_ratio_cap in (2.0, self.rho_clamp_upper_bound),
                "--rho_clamp_upper_bound and --truncated_importance_sampling_ratio_cap are the same cap; give one",
            ),
        ]
        return [message for ok, message in checks if not ok]


def _is_token_or_positive(denominator: str) -> bool:
    if denominator == "token":
        return True
    try:
        return float(denominator) > 0
    except ValueError:
        return False
