"""Verifier registry: a verifier name (the RLVR row's `dataset` field) -> a pure scoring function.

Each verifier lives in its own module and registers itself with `@register_verifier("name", ...)`, the
decorator of `open_instruct.extensions` (which holds the registry) that a user's verifier uses too.
Verifiers are pure (str in, score out) so they can run in worker processes with timeouts;
the asynchronous pool that calls them lives in `open_instruct.rewards.scoring`.

scoring.py           the async reward pool: verifiers in worker processes with per-call timeouts
gsm8k.py             last-number verifier
math_answer.py       boxed / Minerva / answer-tag extraction, math-verify equivalence
string_match.py      string_f1, string_matcher, flan, puzzle, re_search, re_search_f1
length.py            max_length / up_to_max_length rewards
ifeval.py            IFEval / IFEvalG multi-constraint and old Tulu 3 formats
ifeval_checks.py     the instruction-following constraint checkers
code_tests.py        code / code_stdio verifiers: client of the code-execution service (code_server)
passthrough.py       scores 0: environment-only rows, whose reward is the environment's
llm_judge.py         general-* verifiers: an LLM judge on any OpenAI-compatible chat endpoint
rubric.py            rubric verifier: one judge call per weighted rubric of the row
evolving_rubrics.py  --apply_evolving_rubric_reward: the per-query rubric book and its per-step rewrite
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from open_instruct.config.rewards import RewardConfig
from open_instruct.extensions import registered_verifiers, verifier_key


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


class UnknownVerifierError(KeyError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(f"unknown verifier {name!r}; known verifiers: {', '.join(known)}")
        self.name = name

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


def available_verifiers() -> list[str]:
    return sorted(registered_verifiers())


def get_verifier(name: str) -> Verifier:
    """Look a verifier up by name, case-insensitively (datasets write both `MATH` and `math`)."""
    verifiers = registered_verifiers()
    try:
        return verifiers[verifier_key(name)]
    except KeyError:
        raise UnknownVerifierError(name, sorted(verifiers)) from None
