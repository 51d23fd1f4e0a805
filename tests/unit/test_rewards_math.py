"""Tests for `math` / `strict_math`: extraction, LaTeX equivalence, and working off the main thread.

The thread tests guard against open-instruct's bug where SIGALRM-based timeouts silently disable
symbolic equivalence outside the main thread (which is where training calls verifiers).
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from open_instruct.rewards import RewardSettings, VerifierInput
from open_instruct.rewards.math_answer import (
    candidates,
    last_boxed,
    math_verifier,
    strict_math_verifier,
    strip_string,
)

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "rlvr_samples"
SETTINGS = RewardSettings()

# (boxed prediction, gold): each equivalent only through real math equivalence or normalisation.
EQUIVALENT = [
    ("0.50", "\\frac{1}{2}"),
    ("\\frac{2}{4}", "\\frac{1}{2}"),
    ("1,000", "1000"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("3.0", "3"),
    ("\\frac{7}{2}", "3.5"),
    ("x^2+2x+1", "(x+1)^2"),
]
NOT_EQUIVALENT = [
    ("0.51", "\\frac{1}{2}"),
    ("\\frac{3}{4}", "\\frac{1}{2}"),
    ("1,001", "1000"),
    ("2\\sqrt{3}", "\\sqrt{8}"),
    ("-3", "3"),
    ("\\frac{2}{7}", "3.5"),
    ("x^2+1", "(x+1)^2"),
]


def score(prediction: str, gold, strict: bool = False) -> float:
    verifier = strict_math_verifier if strict else math_verifier
    return verifier(VerifierInput(prediction, gold), SETTINGS).score


def _boxed_scores(pairs):
    return [score(f"The answer is $\\boxed{{{pred}}}$.", gold) for pred, gold in pairs]


def test_equivalence_in_main_thread():
    assert _boxed_scores(EQUIVALENT) == [1.0] * len(EQUIVALENT)
    assert _boxed_scores(NOT_EQUIVALENT) == [0.0] * len(NOT_EQUIVALENT)


def test_equivalence_in_thread_pool_worker():
    with ThreadPoolExecutor(max_workers=2) as pool:
        good = pool.submit(_boxed_scores, EQUIVALENT).result()
        bad = pool.submit(_boxed_scores, NOT_EQUIVALENT).result()
    assert good == [1.0] * len(EQUIVALENT)
    assert bad == [0.0] * len(NOT_EQUIVALENT)


def test_equivalence_in_plain_thread():
    results = {}
    thread = threading.Thread(target=lambda: results.update(good=_boxed_scores(EQUIVALENT)))
    thread.start()
    thread.join()
    assert results["good"] == [1.0] * len(EQUIVALENT)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("so $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("\\boxed{\\left( 1, \\frac{\\pi}{2} \\right)}", "(1,\\frac{\\pi}{2})"),
        ("first \\boxed{4}, corrected: \\boxed{5}", "5"),  # the last box wins
        ("\\boxed{5} then a truncated \\boxed{\\frac{1", "5"),  # unclosed last box -> previous one
        ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
        ("\\boxed{12 \\text{ cm}}", "12"),
        ("\\boxed{90^\\circ}", "90"),
        ("\\boxed{\\$18}", "18"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("\\boxed{-\\frac{1}{3}}", "-\\frac13"),
        ("\\boxed 7", "7"),
        ("Final Answer: The final answer is $\\frac{5}{6}$. I hope it is correct.", "\\frac{5}{6}"),
        ("Final Answer: The final answer is 1,000. I hope it is correct.", "1000"),
        ("<think>it is 4?</think><answer>(1,2)</answer>", "(1,2)"),
        ("<answer>The answer is $x = 0.5$</answer>", "\\frac{1}{2}"),
        ("We get $y = 3$ and so $x = 2$", "2"),  # text between the last two dollars
        ("5", "5"),  # whole-output fallback
        ("\\boxed{\\frac{1}{2}}", ["\\frac{1}{2}"]),  # list-typed gold
    ],
)
def test_correct(prediction, gold):
    assert score(prediction, gold) == 1.0


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("\\boxed{-5}", "5"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{2}"),
        ("", "5"),
        ("\\boxed{}", "5"),
        ("\\boxed{5}", ""),  # empty gold never matches
        ("The answer is 5", "5"),  # no marker: the whole output is compared as a string
        ("I think the result is 5, but maybe 6", "5"),
        ("\\boxed{6", "6"),  # a truncated box is no answer
    ],
)
def test_wrong(prediction, gold):
    assert score(prediction, gold) == 0.0


def test_answer_outside_tags_is_still_a_candidate():
    # Both the boxed answer and the tag content are candidates; either may match.
    text = "<answer>5</answer> Actually \\boxed{6}"
    assert score(text, "6") == 1.0
    assert score(text, "5") == 1.0
    assert score(text, "7") == 0.0


def test_strict_math_uses_only_minerva_sentence():
    assert score("\\boxed{5}", "5", strict=True) == 0.0
    minerva = "Final Answer: The final answer is $5$. I hope it is correct."
    assert score(minerva, "5", strict=True) == 1.0
    assert score(minerva, "6", strict=True) == 0.0
    assert score("5", "5", strict=True) == 1.0


def test_last_boxed_extraction():
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces do not nest
    assert last_boxed("\\boxed 5</answer>") == "5"
    assert last_boxed("no box") is None


def test_candidates_report_explicit_markers():
    assert candidates("\\boxed{3}", strict=False) == (["3"], True)
    assert candidates("just text", strict=False) == (["just text"], False)


def test_hendrycks_normalisation():
    assert strip_string("\\frac12") == "\\frac{1}{2}"
    assert strip_string("x = \\dfrac{3}{4}") == "\\frac{3}{4}"
    assert strip_string("\\sqrt3") == "\\sqrt{3}"
    assert strip_string("3/4") == "\\frac{3}{4}"
    assert strip_string("0.5") == "\\frac{1}{2}"
    assert strip_string("\\left(1, 2\\right)") == "(1,2)"


def test_sample_rows():
    rows = [json.loads(line) for line in (SAMPLES / "orz_math.jsonl").read_text().splitlines()]
    answers = ["$\\boxed{0.5}$", "\\boxed{5}", "\\boxed{\\frac{\\sqrt3}{2}}", "\\boxed{(1, 2)}"]
    assert [score(a, row["ground_truth"]) for a, row in zip(answers, rows)] == [1.0] * 4
    assert [score("\\boxed{7}", row["ground_truth"]) for row in rows] == [0.0] * 4
    mixed = json.loads((SAMPLES / "rlvr_gsm_math_if_mixed.jsonl").read_text().splitlines()[1])
    assert score("$\\frac12 + \\frac13 = \\boxed{\\frac{5}{6}}$", mixed["ground_truth"]) == 1.0
