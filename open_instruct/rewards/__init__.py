"""Verifier registry: a verifier name (the RLVR row's `dataset` field) -> a pure scoring function.

Each verifier lives in its own module and registers itself with `@register_verifier("name", ...)`, the
decorator of `open_instruct.extensions` (which holds the registry) that a user's verifier uses too.
Verifiers are pure (str in, score out) so they can run in worker processes with timeouts;
the asynchronous pool that calls them lives in `open_instruct.rewards.scoring`.

base.py              what a verifier is: VerifierInput, VerifierResult, RewardSettings, the Verifier signature
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

from open_instruct.extensions import registered_verifiers, verifier_key

# The verifier's contract (base.py), re-exported: verifiers and their callers import it from the package.
from open_instruct.rewards.base import RewardSettings as RewardSettings
from open_instruct.rewards.base import Verifier as Verifier
from open_instruct.rewards.base import VerifierInput as VerifierInput
from open_instruct.rewards.base import VerifierResult as VerifierResult
from open_instruct.rewards.base import judge_base_url as judge_base_url


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
