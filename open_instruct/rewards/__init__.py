"""Verifier registry: a verifier name (the RLVR row's `dataset` field) -> a pure scoring function.

Each verifier lives in its own module and registers itself with `@register("name", ...)`.
Verifiers are pure (str in, score out) so they can run in worker processes with timeouts;
the asynchronous pool that calls them lives in `open_instruct.rewards.scoring`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class VerifierSettings:
    """Knobs some verifiers need; built once from the parsed config and shared read-only."""

    code_api_url: str = "http://localhost:1234/test_program"
    code_max_execution_time: float = 1.0
    code_pass_rate_reward_threshold: float = 0.0
    code_apply_perf_penalty: bool = False
    # Target length (tokens) for the max_length / up_to_max_length rewards.
    max_length_target: int = 4096
    # --max_length_verifier_max_length when given: the divisor of the length deviation; None divides by the target.
    max_length_normalizer: float | None = None
    # ifeval: True -> 1 only when every constraint holds; False -> fraction satisfied.
    ifeval_require_all: bool = False
    # general-* LLM judges: any OpenAI-compatible chat endpoint (see rewards/llm_judge.py).
    llm_judge_model: str = "azure/gpt-4o-mini-standard"
    llm_judge_base_url: str = ""
    llm_judge_api_key: str = ""
    llm_judge_extra_body: str = ""  # JSON merged into each request (e.g. vLLM's structured_outputs)
    llm_judge_max_tokens: int = 2048
    llm_judge_max_context_length: int = 8192
    llm_judge_temperature: float = 1.0
    llm_judge_timeout: float = 60.0

    @classmethod
    def from_config(cls, cfg) -> VerifierSettings:
        reward = cfg.reward
        return cls(
            code_api_url=reward.code_api_url,
            code_max_execution_time=reward.code_max_execution_time,
            code_pass_rate_reward_threshold=reward.code_pass_rate_reward_threshold,
            code_apply_perf_penalty=cfg.reward.code_apply_perf_penalty,
            ifeval_require_all=reward.ifeval_reward_mode == "all",
            max_length_normalizer=(
                float(cfg.reward.max_length_verifier_max_length)
                if "max_length_verifier_max_length" in cfg.explicit_flags
                else None
            ),
            **_judge_settings(cfg.reward),
        )


def judge_base_url() -> str:
    """The judge endpoint of the general-* and rubric verifiers, from the environment (OpenAI's names too)."""
    import os

    return os.environ.get("LLM_JUDGE_BASE_URL", os.environ.get("OPENAI_BASE_URL", ""))


def _judge_settings(x) -> dict[str, Any]:
    """--llm_judge_* flags, plus the endpoint from the environment (OpenAI's variable names)."""
    import os

    return {
        "llm_judge_model": x.llm_judge_model,
        "llm_judge_base_url": judge_base_url(),
        "llm_judge_api_key": os.environ.get("LLM_JUDGE_API_KEY", os.environ.get("OPENAI_API_KEY", "")),
        "llm_judge_extra_body": os.environ.get("LLM_JUDGE_EXTRA_BODY", ""),
        "llm_judge_max_tokens": x.llm_judge_max_tokens,
        "llm_judge_max_context_length": x.llm_judge_max_context_length,
        "llm_judge_temperature": x.llm_judge_temperature,
        "llm_judge_timeout": float(x.llm_judge_timeout),
    }


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


Verifier = Callable[[VerifierInput, VerifierSettings], VerifierResult]


class UnknownVerifierError(KeyError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(f"unknown verifier {name!r}; known verifiers: {', '.join(known)}")
        self.name = name

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


_REGISTRY: dict[str, Verifier] = {}

# Modules that register the built-in verifiers, imported on first lookup.
_BUILTIN_MODULES = (
    "gsm8k",
    "math_answer",
    "string_match",
    "length",
    "ifeval",
    "code_tests",
    "passthrough",
    "llm_judge",
    "rubric",
)
_builtins_loaded = False


def register(*names: str) -> Callable[[Verifier], Verifier]:
    def decorate(fn: Verifier) -> Verifier:
        for name in names:
            if name in _REGISTRY and _REGISTRY[name] is not fn:
                raise ValueError(f"verifier {name!r} registered twice")
            _REGISTRY[name] = fn
        return fn

    return decorate


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for module in _BUILTIN_MODULES:
            importlib.import_module(f"{__name__}.{module}")
        _builtins_loaded = True


def available_verifiers() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_verifier(name: str) -> Verifier:
    """Look a verifier up by name, case-insensitively (datasets write both `MATH` and `math`)."""
    _load_builtins()
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        raise UnknownVerifierError(name, sorted(_REGISTRY)) from None
