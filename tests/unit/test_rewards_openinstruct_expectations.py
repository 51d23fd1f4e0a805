"""open-instruct's verifier test expectations, replayed through our verifier registry.

Each case records one expectation from open-instruct's own tests (allenai/open-instruct at
e6c3044): the response, the label, the verifier that would score it there, the score it expects,
and where the expectation comes from (file and test). The cases are written out by hand here; only
the facts (inputs and expected outcomes) are taken over. A case whose expectation we deliberately
do not share carries `bug="why"` and asserts our score (`ours`) instead.

Sources and coverage:

- `open_instruct/test_ground_truth_utils.py`: every PuzzleMatcherVerifier (`puzzle`), F1Verifier
  (`string_f1`) and GSM8KVerifier (`gsm8k`) case, and the empty-instruction-list IFEvalVerifier
  case (`ifeval`). Skipped: the two `TestLMJudgeVerifier` tests (litellm retry/cost accounting and
  client clean-up), because we have no LLM-judge verifiers.
- `open_instruct/test_math_utils.py`: every `strip_string` case, both against our Hendrycks-style
  `strip_string` and end to end through `math` (a boxed answer against the normalised gold must
  match by the string rule alone).
- `open_instruct/test_if_functions.py`: every `validate_choice` and
  `validate_frequency_capital_words` case, through `ifeval_old` with Tulu 3 (`func_name`) labels.

The code-sandbox expectations from `open_instruct/code_utils/test_code_utils.py` live in
`tests/unit/test_code_sandbox_expectations.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from open_instruct.rewards import RewardSettings, VerifierInput, get_verifier
from open_instruct.rewards.math_answer import strip_string

SETTINGS = RewardSettings()

GROUND_TRUTH = "open_instruct/test_ground_truth_utils.py"
MATH_UTILS = "open_instruct/test_math_utils.py"
IF_FUNCTIONS = "open_instruct/test_if_functions.py"


@dataclass(frozen=True)
class Case:
    source: str  # "<file in open-instruct>::<test class.method>"
    name: str  # the parameterized case's name there
    verifier: str
    prediction: str
    label: Any
    expected: float  # open-instruct's expected score
    bug: str | None = None  # why we do not share the expectation
    ours: float | None = None  # our score when `bug` is set

    @property
    def id(self) -> str:
        return f"{self.source.rsplit('::', 1)[-1]}::{self.name}"


def puzzle(name: str, prediction: str, label: str, expected: float, test: str) -> Case:
    return Case(f"{GROUND_TRUTH}::TestPuzzleMatcherVerifier.{test}", name, "puzzle", prediction, label, expected)


def f1(name: str, prediction: str, label: Any, expected: float, test: str) -> Case:
    return Case(f"{GROUND_TRUTH}::TestF1Verifier.{test}", name, "string_f1", prediction, label, expected)


def gsm8k(name: str, prediction: str, label: str, expected: float) -> Case:
    source = f"{GROUND_TRUTH}::TestGSM8KVerifier.test_signed_number_extraction"
    return Case(source, name, "gsm8k", prediction, label, expected)


BASIC = "test_basic_scenarios"
SCENARIOS = "test_puzzle_matcher_scenarios"
SINGLE = "test_single_label"
LISTS = "test_list_labels"

GROUND_TRUTH_CASES = [
    puzzle("simple_match", "The answer is 42", "answer is 42", 1.0, BASIC),
    puzzle("with_thinking_tags", "<think>Let me solve this</think>Paris", "paris", 1.0, BASIC),
    puzzle("with_answer_tags", "<answer>New York City!</answer>", "new york city", 1.0, BASIC),
    puzzle("should_fail", "Wrong answer", "correct answer", 0.0, BASIC),
    puzzle(
        "complex_example",
        "<think>This is about geography</think><answer>The capital of France is Paris.</answer>",
        "capital of france is paris",
        1.0,
        BASIC,
    ),
    puzzle("exact_match_numbers", "42", "42", 1.0, SCENARIOS),
    puzzle("exact_match_text", "hello world", "hello world", 1.0, SCENARIOS),
    puzzle("case_insensitive", "Hello World", "hello world", 1.0, SCENARIOS),
    puzzle("thinking_tags_match", "<think>Let me think about this...</think>42", "42", 1.0, SCENARIOS),
    puzzle("thinking_tags_text_match", "<think>This is complex</think>hello world", "hello world", 1.0, SCENARIOS),
    puzzle("thinking_tags_no_match", "<think>Analysis...</think>Wrong Answer", "42", 0.0, SCENARIOS),
    puzzle("answer_tags_match", "<answer>42</answer>", "42", 1.0, SCENARIOS),
    puzzle("answer_tags_text_match", "<answer>hello world</answer>", "hello world", 1.0, SCENARIOS),
    puzzle("answer_tags_no_match", "<answer>wrong</answer>", "42", 0.0, SCENARIOS),
    puzzle("both_tags_match", "<think>Thinking...</think><answer>42</answer>", "42", 1.0, SCENARIOS),
    puzzle(
        "both_tags_text_match",
        "<think>Let me solve this step by step</think><answer>hello world</answer>",
        "hello world",
        1.0,
        SCENARIOS,
    ),
    puzzle("remove_articles_punctuation", "The answer is 42!", "answer is 42", 1.0, SCENARIOS),
    puzzle("remove_article_a", "A simple test.", "simple test", 1.0, SCENARIOS),
    puzzle("remove_punctuation", "Hello, world!", "hello world", 1.0, SCENARIOS),
    puzzle("normalize_whitespace", "  hello   world  ", "hello world", 1.0, SCENARIOS),
    puzzle("replace_tabs_newlines", "hello\tworld\n", "hello world", 1.0, SCENARIOS),
    puzzle("numbers_no_match", "42", "43", 0.0, SCENARIOS),
    puzzle("text_no_match", "hello", "world", 0.0, SCENARIOS),
    puzzle("empty_vs_nonempty", "", "42", 0.0, SCENARIOS),
    puzzle("capital_city", "<answer>London</answer>", "london", 1.0, SCENARIOS),
    puzzle("animal_with_article", "<think>Animal question</think>The elephant", "elephant", 1.0, SCENARIOS),
    puzzle("scientist_name", "<answer>Albert Einstein</answer>", "albert einstein", 1.0, SCENARIOS),
    puzzle(
        "literature_reference",
        "Romeo and Juliet by Shakespeare",
        "romeo and juliet by shakespeare",
        1.0,
        SCENARIOS,
    ),
    puzzle(
        "country_name",
        "<answer>United States of America</answer>",
        "united states of america",
        1.0,
        SCENARIOS,
    ),
    # F1 = 2PR/(P+R); "hello world" against "hello" has P = 1/2, R = 1, so 2/3.
    f1("exact_match", "hello world", "hello world", 1.0, SINGLE),
    f1("partial_match", "hello world", "hello", 2 / 3, SINGLE),
    f1("no_match", "hello world", "goodbye", 0.0, SINGLE),
    f1("with_thinking", "<think>Let me think...</think>hello world", "hello world", 1.0, SINGLE),
    f1("with_thinking_partial", "<think>Analysis</think>hello world", "hello", 2 / 3, SINGLE),
    f1("with_answer_tags", "<answer>hello world</answer>", "hello world", 1.0, SINGLE),
    f1("both_tags", "<think>Thinking...</think><answer>hello world</answer>", "hello world", 1.0, SINGLE),
    # A list of references scores the best one.
    f1("first_matches_best", "hello world", ["hello world", "goodbye"], 1.0, LISTS),
    f1("second_matches_best", "hello world", ["goodbye", "hello world"], 1.0, LISTS),
    f1("partial_matches", "hello world", ["hello", "world"], 2 / 3, LISTS),
    f1("none_match_well", "hello world", ["foo", "bar", "baz"], 0.0, LISTS),
    f1("single_element_list", "hello world", ["hello world"], 1.0, LISTS),
    f1("list_with_thinking", "<think>hmm</think>hello world", ["goodbye", "hello world"], 1.0, LISTS),
    gsm8k("negative_integer", "Therefore the answer is -3", "-3", 1.0),
    gsm8k("positive_integer", "Therefore the answer is +7", "+7", 1.0),
    gsm8k("negative_decimal", "Final answer: -3.5", "-3.5", 1.0),
    # open-instruct writes this response as a raw string with a doubled backslash; kept as is.
    gsm8k("boxed_negative_integer", "The result is \\\\boxed{-3}", "-3", 1.0),
    gsm8k("wrong_sign", "Therefore the answer is 3", "-3", 0.0),
    Case(
        f"{GROUND_TRUTH}::TestIFEvalVerifierEmptyInstructions.test_empty_instruction_list_returns_zero_score",
        "empty_instruction_list",
        "ifeval",
        "some non-empty response",
        str([{"instruction_id": [], "kwargs": []}]),
        0.0,
    ),
]

# (input, what open-instruct's strip_string turns it into)
STRIP_STRING_CASES = [
    ("\\frac{1}{2}", "\\frac{1}{2}"),
    ("\\frac 1 2", "\\frac{1}{2}"),
    ("  \\frac{1}{2}  ", "\\frac{1}{2}"),
    ("\\left(\\frac{1}{2}\\right)", "(\\frac{1}{2})"),
    ("50\\%", "50"),
    ("0.5", "\\frac{1}{2}"),
    ("\\tfrac{3}{4}", "\\frac{3}{4}"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("1 + 2", "1+2"),
]
STRIP_STRING_SOURCE = f"{MATH_UTILS}::TestStripString.test_latex_normalization"


def old_label(func_name: str, **kwargs: Any) -> str:
    return json.dumps({"func_name": func_name, **kwargs})


def choice(name: str, text: str, options: list[str], expected: bool) -> Case:
    source = f"{IF_FUNCTIONS}::TestValidateChoice.test_validate_choice"
    return Case(source, name, "ifeval_old", text, old_label("validate_choice", options=options), float(expected))


def capitals(name: str, text: str, n: int, quantifier: str, expected: bool) -> Case:
    source = f"{IF_FUNCTIONS}::TestValidateFrequencyCapitalWords.test_validate_frequency_capital_words"
    label = old_label("validate_frequency_capital_words", N=n, quantifier=quantifier)
    return Case(source, name, "ifeval_old", text, label, float(expected))


IF_FUNCTION_CASES = [
    choice("option_in_text", "I believe the answer is B", ["A", "B", "C", "D"], True),
    choice("option_appears", "I choose red", ["red", "blue"], True),
    choice("no_option_present", "I choose green", ["red", "blue"], False),
    choice("exact_match", "red", ["red", "blue"], True),
    # "around" 5 allows max(round(0.5), 1) = 1 either way (open-instruct PR #1646).
    capitals("around_exact", "AAA BBB CCC DDD EEE", 5, "around", True),
    capitals("around_off_by_one_low", "AAA BBB CCC DDD", 5, "around", True),
    capitals("around_off_by_one_high", "AAA BBB CCC DDD EEE FFF", 5, "around", True),
    capitals("around_far_off", "AAA BBB", 5, "around", False),
    capitals("at_least_satisfied", "AAA BBB CCC", 2, "at least", True),
    capitals("at_most_violated", "AAA BBB CCC DDD", 2, "at most", False),
]

CASES = GROUND_TRUTH_CASES + IF_FUNCTION_CASES


def score(case: Case) -> float:
    return get_verifier(case.verifier)(VerifierInput(case.prediction, case.label), SETTINGS).score


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_expectation(case: Case):
    got = score(case)
    if case.bug is None:
        assert got == pytest.approx(case.expected), f"{case.source} [{case.name}]"
    else:
        assert case.ours is not None and case.ours != case.expected, "a bug case must say what we score instead"
        assert got == pytest.approx(case.ours), f"{case.source} [{case.name}]: {case.bug}"


@pytest.mark.parametrize(("raw", "normalised"), STRIP_STRING_CASES, ids=[c[0] for c in STRIP_STRING_CASES])
def test_strip_string(raw: str, normalised: str):
    assert strip_string(raw) == normalised


@pytest.mark.parametrize(("raw", "normalised"), STRIP_STRING_CASES, ids=[c[0] for c in STRIP_STRING_CASES])
def test_boxed_answer_matches_its_normal_form(raw: str, normalised: str):
    result = get_verifier("math")(VerifierInput(f"So the answer is $\\boxed{{{raw}}}$.", normalised), SETTINGS)
    assert result.score == 1.0
    # The string rule alone must match them, as it does in open-instruct's training (no sympy there).
    assert result.details["by"] == "string"


def test_case_counts():
    # Guards against silently losing cases when the tables are edited.
    by_file = {path: sum(c.source.startswith(path) for c in CASES) for path in (GROUND_TRUTH, MATH_UTILS, IF_FUNCTIONS)}
    by_file[MATH_UTILS] += len(STRIP_STRING_CASES)
    assert by_file == {GROUND_TRUTH: 48, MATH_UTILS: 9, IF_FUNCTIONS: 10}
    assert len({c.id for c in CASES}) == len(CASES)
