"""How a response becomes a reward: the verifiers and their services, format and length shaping, judges and
evolving rubrics."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from open_instruct.config.fields import arg


def _default_code_api_url() -> str:
    """code_api_setup.sh exports CODE_API_URL (the service's base URL) for the job it starts."""
    base = os.environ.get("CODE_API_URL", "http://localhost:1234").rstrip("/")
    return base if base.endswith("/test_program") else base + "/test_program"


@dataclass(frozen=True)
class RewardConfig:
    _argument_group_name = "rewards and verifiers"

    apply_verifiable_reward: bool = arg(True, "Score responses with the verifier named by each row.")
    verification_reward: float = arg(10.0, "Reward for a fully correct response (scaled by the score).")
    non_stop_penalty: bool = arg(False, "Responses that did not stop get --non_stop_penalty_value instead.")
    non_stop_penalty_value: float = arg(0.0, "Reward for responses cut at --response_length.")
    format_reward: float = arg(
        0.0, "Added to the reward when the response closes its think block and then answers in <answer> tags."
    )
    ifeval_reward_mode: Literal["fraction", "all"] = arg(
        "fraction", "ifeval: score = fraction of constraints satisfied, or 1 only when all are."
    )
    remap_verifier: str | None = arg(None, "Point one verifier name at another: OLD=NEW.")
    code_api_url: str = field(
        default_factory=lambda: _default_code_api_url(),
        metadata={"help": "Code-execution API for the code verifier (default: $CODE_API_URL/test_program)."},
    )
    code_max_execution_time: float = arg(1.0, "Seconds per test in the code verifier.", bounds="> 0")
    code_pass_rate_reward_threshold: float = arg(0.0, "Code pass rates below this score 0.", bounds="[0, 1]")
    apply_r1_style_format_reward: bool = arg(
        False, "Reward responses that close </think> and then answer in <answer>...</answer>."
    )
    r1_style_format_reward: float = arg(1.0, "The format score given on a match.")
    additive_format_reward: bool = arg(
        False, "True: format score + verifier reward. False: the verifier reward counts only when the format matches."
    )
    llm_judge_model: str = arg(
        "azure/gpt-4o-mini-standard",
        "Model of the general-* judge verifiers, on the OpenAI-compatible endpoint $LLM_JUDGE_BASE_URL (or "
        "$OPENAI_BASE_URL); a 'provider/' prefix is dropped.",
    )
    llm_judge_max_tokens: int = arg(2048, "Judge completion tokens (general-* verifiers).", bounds=">= 1")
    llm_judge_max_context_length: int = arg(8192, "Judge context length (general-* verifiers).", bounds=">= 1")
    llm_judge_temperature: float = arg(1.0, "Judge temperature (general-* verifiers).", bounds="[0, 2]")
    llm_judge_timeout: int = arg(60, "Judge request timeout in seconds (general-* verifiers).", bounds="> 0")
    code_apply_perf_penalty: bool = arg(
        False, "code verifiers: weight each passed test by the unused share of its time limit."
    )
    max_length_verifier_max_length: int = arg(
        32768,
        "Given explicitly: the max_length verifiers divide the length deviation by this instead of by the "
        "target (see rewards/length.py).",
        bounds=">= 1",
    )
    apply_evolving_rubric_reward: bool = arg(
        False,
        "After each step an LLM writes new rubrics from the responses of rows graded by the `rubric` verifier; "
        "their later requests are graded with them (see evolving_rubrics.py).",
    )
    max_active_rubrics: int = arg(5, "Active evolving rubrics per query; the oldest retire first.", bounds=">= 1")
    cache_evolving_rubric_data_dir: str | None = arg(None, "Write each step's rubric generation (JSON) here.")

    @property
    def verifier_remap(self) -> dict[str, str]:
        """--remap_verifier OLD=NEW as {old: new}, lower-cased (verifier names are case-insensitive)."""
        if not self.remap_verifier:
            return {}
        old, new = self.remap_verifier.split("=")
        return {old.strip().lower(): new.strip().lower()}

    @property
    def r1_format_bonus(self) -> float:
        """The R1 format score added to a matching response's reward (additive mode only)."""
        return self.r1_style_format_reward if self.apply_r1_style_format_reward and self.additive_format_reward else 0.0

    @property
    def r1_format_gate(self) -> bool:
        """Non-additive R1 format reward: the verifier reward counts only when the format matches."""
        return self.apply_r1_style_format_reward and not self.additive_format_reward

    @property
    def max_possible_reward(self) -> float:
        """A perfect sample's reward, the denominator of pass rates (--no_resampling_pass_rate)."""
        return self.verification_reward + max(0.0, self.format_reward) + max(0.0, self.r1_format_bonus)

    @property
    def verifier_timeout_s(self) -> float:
        """How long one verifier call may take: a code verifier may spend its HTTP client's whole timeout,
        a judge its request timeout."""
        return max(30.0, min(300.0, 10 * self.code_max_execution_time), self.llm_judge_timeout) + 10

    def problems(self) -> list[str]:
        checks = [
            (
                self.remap_verifier is None or self.remap_verifier.count("=") == 1,
                f"--remap_verifier {self.remap_verifier!r} must look like OLD=NEW",
            ),
            (
                not self.apply_evolving_rubric_reward
                or bool(os.environ.get("LLM_JUDGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")),
                "--apply_evolving_rubric_reward needs an OpenAI-compatible endpoint for the rubric writer: set "
                "LLM_JUDGE_BASE_URL (or OPENAI_BASE_URL)",
            ),
        ]
        return [message for ok, message in checks if not ok]
