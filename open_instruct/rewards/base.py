"""What a verifier is: its input, its result, the settings it reads and its signature. Below the registry
(`open_instruct.extensions` stores verifiers of this type; this package looks them up), so that the registry
and the verifiers it holds do not name each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from open_instruct.config.rewards import RewardConfig


@dataclass(frozen=True)
class RewardSettings:
    """What scoring reads, built once on the driver and shared read-only: the reward flags as parsed
    (`settings.reward.code_api_url`, ...) plus what only the driver can resolve: the judge endpoint and key
    from its environment (engines on other nodes need not have them exported) and whether
    --max_length_verifier_max_length was given."""

    reward: RewardConfig = field(default_factory=RewardConfig)
    # general-* and rubric judges: any OpenAI-compatible chat endpoint (see rewards/llm_judge.py).
    judge_base_url: str = ""
    judge_api_key: str = ""
    judge_extra_body: str = ""  # JSON merged into each request (e.g. vLLM's structured_outputs)
    # The max_length verifiers' divisor of the length deviation; None divides by the target (rewards/length.py).
    max_length_normalizer: float | None = None
    # Target length (tokens) of the max_length verifiers when a row gives none.
    max_length_target: int = 4096
    # How long one verifier call may take before its worker is replaced (tests shorten it).
    verifier_timeout_s: float = field(default_factory=lambda: RewardConfig().verifier_timeout_s)

    @classmethod
    def from_config(cls, cfg) -> RewardSettings:
        import os

        reward = cfg.reward
        given_length_divisor = "max_length_verifier_max_length" in cfg.explicit_flags
        return cls(
            reward=reward,
            judge_base_url=judge_base_url(),
            judge_api_key=os.environ.get("LLM_JUDGE_API_KEY", os.environ.get("OPENAI_API_KEY", "")),
            judge_extra_body=os.environ.get("LLM_JUDGE_EXTRA_BODY", ""),
            max_length_normalizer=float(reward.max_length_verifier_max_length) if given_length_divisor else None,
            verifier_timeout_s=reward.verifier_timeout_s,
        )


def judge_base_url() -> str:
    """The judge endpoint of the general-* and rubric verifiers, from the environment (OpenAI's names too)."""
    import os

    return os.environ.get("LLM_JUDGE_BASE_URL", os.environ.get("OPENAI_BASE_URL", ""))


@dataclass(frozen=True)
class VerifierInput:
    prediction: str  # the decoded response only (no prompt), special tokens skipped
    ground_truth: Any  # the row's label for this verifier, in the dataset's own shape
    response_token_count: int = 0
    query: str = ""  # the decoded prompt (LLM judges read it)


@dataclass(frozen=True)
class VerifierResult:
    score: float  # in [0, 1]; scaled by --verification_reward later
    extracted: str | None = None  # what the verifier compared, for sample tables and debugging
    details: dict[str, Any] = field(default_factory=dict)


Verifier = Callable[[VerifierInput, RewardSettings], VerifierResult]
