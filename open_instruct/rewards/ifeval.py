"""Instruction-following verifiers `ifeval` (IFEvalG multi-constraint) and `ifeval_old` (Tulu 3).

Both check the answer-side text (after the last `</think>`, answer tags removed); an empty answer
scores 0.

`ifeval` labels are a Python-literal string of a one-element list of
`{'instruction_id': [...], 'kwargs': [...]}` (kwargs entries may be None, None-valued keys are
dropped). The score is the fraction of constraints satisfied, or 1/0 for all/any-failed with
--ifeval_reward_mode. An empty constraint list scores 0. An unknown instruction
id raises `UnknownInstructionError` naming it (the reward pool turns that into a counted 0).

`ifeval_old` labels are a JSON object `{"func_name": ..., <flat keys, unused ones null>}`; the
named function below is called with the non-null keys it accepts and scores 1/0. Its quantifiers
follow open-instruct's current code: "at least" / "at most" are inclusive; "around" allows
`max(round(0.1 * N), 1)` for word and capital-word counts and a flat +-1 for sentence counts.
The IFEvalG relations ("less than" / "at least") live in `ifeval_checks.compare`.

Unlike open-instruct, `ifeval` recognises an old-format label (a `func_name` object) and scores it
with the old functions instead of raising, so the mixed Tulu 3 set works without a remap.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable
from typing import Any

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult
from open_instruct.rewards.ifeval_checks import CHECKS, detect_language, split_sentences, strip_json_fences
from open_instruct.rewards.string_match import remove_thinking


class UnknownInstructionError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# Old Tulu 3 functions (`ifeval_old`), named as in the dataset's `func_name`.


def around_tolerance(n: int) -> int:
    """How far a word or capital-word count may be from N and still be "around" N.

    open-instruct's rule (its PR #1646): 10% of N rounded with Python's `round`, whose ties go to the
    even number (N = 25 allows 2, N = 35 allows 4), and never less than 1 (N = 5 allows 1).
    """
    return max(round(n * 0.1), 1)


def _quantified(actual: int, quantifier: str, n: int, tolerance: int) -> bool:
    # Spelled exactly as open-instruct compares them; it scores any other quantifier 0, and raising
    # gives the same 0 through the reward pool while counting the bad label.
    if quantifier == "at least":
        return actual >= n
    if quantifier == "at most":
        return actual <= n
    if quantifier == "around":
        return abs(actual - n) <= tolerance
    raise ValueError(f"unknown quantifier {quantifier!r}; expected 'at least', 'at most' or 'around'")


def verify_keywords(text: str, keyword_list: list[str]) -> bool:
    lowered = text.lower()
    return all(kw.lower() in lowered for kw in keyword_list)


def verify_keyword_frequency(text: str, word: str, N: int) -> bool:
    return re.findall(r"\b\w+\b", text.lower()).count(word.lower()) == N


def validate_forbidden_words(text: str, forbidden_words: list[str]) -> bool:
    lowered = text.lower()
    return not any(w.lower() in lowered for w in forbidden_words)


def verify_letter_frequency(text: str, letter: str, N: int) -> bool:
    if len(letter) != 1:
        raise ValueError(f"letter must be a single character, got {letter!r}")
    return text.count(letter) == N


def validate_response_language(text: str, language: str) -> bool:
    return detect_language(text) == language


def verify_paragraph_count(text: str, N: int) -> bool:
    return sum(1 for part in text.split("* * *") if part.strip()) == N


def validate_word_constraint(text: str, N: int, quantifier: str) -> bool:
    return _quantified(len(text.split()), quantifier, N, around_tolerance(N))


def verify_sentence_constraint(text: str, N: int, quantifier: str) -> bool:
    # Sentences get a flat +-1 for "around" in open-instruct, whatever N is.
    return _quantified(len(split_sentences(text)), quantifier, N, 1)


def validate_paragraphs(text: str, N: int, first_word: str, i: int) -> bool:
    paragraphs = text.split("\n\n")
    return len(paragraphs) == N and 1 <= i <= N and paragraphs[i - 1].strip().startswith(first_word)


def verify_postscript(text: str, postscript_marker: str) -> bool:
    index = text.find(postscript_marker)
    # The marker has to introduce something, not just appear.
    return index != -1 and len(text[index:].strip()) > len(postscript_marker)


def validate_placeholders(text: str, N: int) -> bool:
    return len(re.findall(r"\[(.*?)\]", text)) >= N


def verify_bullet_points(text: str, N: int) -> bool:
    return sum(1 for line in text.split("\n") if line.strip().startswith(("* ", "- "))) == N


def validate_title(text: str) -> bool:
    return bool(re.search(r"<<[^\n]+>>", text))


def _options(options: Any) -> list[str]:
    if isinstance(options, str):
        try:
            parsed = ast.literal_eval(options)
        except (ValueError, SyntaxError):
            return [options]
        return [str(o) for o in parsed] if isinstance(parsed, (list, tuple)) else [str(parsed)]
    return [str(o) for o in options]


def validate_choice(text: str, options: Any) -> bool:
    return any(option.strip() and option.strip() in text for option in _options(options))


def validate_highlighted_sections(text: str, N: int) -> bool:
    return len([h for h in re.findall(r"\*(.*?)\*", text) if h.strip()]) >= N


def validate_sections(text: str, N: int, section_splitter: str) -> bool:
    sections = text.split(section_splitter)
    if sections and not sections[0].strip():
        sections = sections[1:]
    return len(sections) == N


def validate_json_format(text: str) -> bool:
    try:
        json.loads(strip_json_fences(text))
    except ValueError:
        return False
    return True


def validate_repeat_prompt(text: str, original_prompt: str) -> bool:
    return text.strip().startswith(original_prompt.strip())


def validate_two_responses(text: str) -> bool:
    parts = text.split("******")
    return len(parts) == 2 and bool(parts[0].strip()) and parts[0].strip() != parts[1].strip()


def validate_uppercase(text: str) -> bool:
    return text == text.upper()


def validate_lowercase(text: str) -> bool:
    return text == text.lower()


def validate_frequency_capital_words(text: str, N: int, quantifier: str) -> bool:
    return _quantified(len(re.findall(r"\b[A-Z]+\b", text)), quantifier, N, around_tolerance(N))


def validate_end(text: str, end_phrase: str) -> bool:
    return text.strip().endswith(end_phrase.strip())


def validate_quotation(text: str) -> bool:
    text = text.strip()
    return len(text) > 1 and text.startswith('"') and text.endswith('"')


def validate_no_commas(text: str) -> bool:
    return "," not in text


OLD_FUNCTIONS: dict[str, Callable[..., bool]] = {
    fn.__name__: fn
    for fn in (
        verify_keywords,
        verify_keyword_frequency,
        validate_forbidden_words,
        verify_letter_frequency,
        validate_response_language,
        verify_paragraph_count,
        validate_word_constraint,
        verify_sentence_constraint,
        validate_paragraphs,
        verify_postscript,
        validate_placeholders,
        verify_bullet_points,
        validate_title,
        validate_choice,
        validate_highlighted_sections,
        validate_sections,
        validate_json_format,
        validate_repeat_prompt,
        validate_two_responses,
        validate_uppercase,
        validate_lowercase,
        validate_frequency_capital_words,
        validate_end,
        validate_quotation,
        validate_no_commas,
    )
}


# ---------------------------------------------------------------------------------------------
# Label parsing and scoring


def _parse_label(ground_truth: Any) -> dict[str, Any]:
    """The constraint dict from either label format (string or already-decoded object)."""
    label = ground_truth
    if isinstance(label, str):
        try:
            label = ast.literal_eval(label)
        except (ValueError, SyntaxError):
            try:  # JSON text: the old format, or a new-format label written with null/true/false
                label = json.loads(ground_truth)
            except ValueError:
                raise ValueError(f"cannot parse ifeval label: {ground_truth[:200]!r}") from None
    if isinstance(label, (list, tuple)):
        if not label:
            raise ValueError("empty ifeval label list")
        label = label[0]
    if isinstance(label, str):
        label = json.loads(label)
    if not isinstance(label, dict):
        raise TypeError(f"ifeval label must decode to a dict, got {type(label).__name__}")
    return label


def _call(fn: Callable[..., bool], what: str, text: str, kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(fn).bind(text, **kwargs)
    except TypeError as e:
        raise ValueError(f"bad arguments for {what}: {kwargs!r} ({e})") from None
    return bool(fn(text, **kwargs))


def score_old(text: str, label: dict[str, Any]) -> VerifierResult:
    name = label.get("func_name")
    fn = OLD_FUNCTIONS.get(name) if isinstance(name, str) else None
    if fn is None:
        raise UnknownInstructionError(f"unknown ifeval_old func_name {name!r}")
    # The label is a flat bag of every key; pass the non-null ones this function takes.
    accepted = set(inspect.signature(fn).parameters) - {"text"}
    kwargs = {k: v for k, v in label.items() if k in accepted and v is not None}
    if not text:
        return VerifierResult(score=0.0, extracted=text, details={"reason": "empty answer"})
    ok = _call(fn, name, text, kwargs)
    return VerifierResult(score=float(ok), extracted=text, details={"constraints": [[name, ok]]})


def score_new(text: str, label: dict[str, Any], require_all: bool) -> VerifierResult:
    ids = label.get("instruction_id")
    if not isinstance(ids, (list, tuple)):
        raise TypeError(f"ifeval label needs an instruction_id list, got {ids!r}")
    all_kwargs = label.get("kwargs") or [None] * len(ids)
    if len(all_kwargs) != len(ids):
        raise ValueError(f"ifeval label has {len(ids)} instruction ids but {len(all_kwargs)} kwargs")
    # Resolve every id first so an unknown one is reported even when an earlier check fails.
    checks = []
    for instruction_id in ids:
        if instruction_id not in CHECKS:
            raise UnknownInstructionError(f"unknown IFEval instruction id {instruction_id!r}")
        checks.append(CHECKS[instruction_id])
    if not text:
        return VerifierResult(score=0.0, extracted=text, details={"reason": "empty answer"})
    results: list[list[Any]] = []
    for instruction_id, fn, kwargs in zip(ids, checks, all_kwargs, strict=True):
        kwargs = {k: v for k, v in (kwargs or {}).items() if v is not None}
        results.append([instruction_id, _call(fn, instruction_id, text, kwargs)])
    passed = sum(ok for _, ok in results)
    if not results:
        score = 0.0
    elif require_all:
        score = float(passed == len(results))
    else:
        score = passed / len(results)
    return VerifierResult(score=score, extracted=text, details={"constraints": results})


@register_verifier("ifeval")
def ifeval(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    label = _parse_label(inp.ground_truth)
    text = remove_thinking(inp.prediction)
    if "func_name" in label:
        return score_old(text, label)
    return score_new(text, label, require_all=settings.reward.ifeval_reward_mode == "all")


@register_verifier("ifeval_old")
def ifeval_old(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    label = _parse_label(inp.ground_truth)
    text = remove_thinking(inp.prediction)
    if "func_name" not in label:
        raise ValueError("ifeval_old needs a label with func_name (new-format labels use `ifeval`)")
    return score_old(text, label)
