"""Tests for the `gsm8k` verifier: last-number extraction and open-instruct's string comparison."""

import json
from pathlib import Path

import pytest

from open_instruct.rewards import RewardSettings, VerifierInput
from open_instruct.rewards.gsm8k import extract_last_number, gsm8k

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "rlvr_samples"
SETTINGS = RewardSettings()


def score(prediction: str, gold) -> float:
    return gsm8k(VerifierInput(prediction, gold), SETTINGS).score


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("Each box costs $3, so 6 boxes make 18.", "18"),
        ("The total is $1,250.", "1250"),
        ("So the answer is 1,000,000 dollars", "1000000"),
        ("It grew by 25%.", "25"),
        ("Distance: 42 km", "42"),
        ("The temperature dropped to -12 degrees.", "-12"),
        ("<answer>18</answer>", "18"),
        ("The answer is 0.25", "0.25"),
        ("The answer is +7", "7"),  # a leading plus is not part of the number
        ("#### 72", ["72"]),  # list-typed gold
        ("72", " 72\n"),  # gold whitespace
        ("The answer is 1,250", "1,250"),  # gold with thousands commas
    ],
)
def test_correct_answers(prediction, gold):
    assert score(prediction, gold) == 1.0


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("The temperature dropped to -12 degrees.", "12"),  # signs matter (#1530)
        ("It fell by 12.", "-12"),
        ("The price is 7.50", "7.5"),  # string comparison, as in open-instruct
        ("18.00", "18"),
        ("The answer is 18. Double-checking with 3 boxes.", "18"),  # the last number wins
        ("", "18"),
        ("I don't know.", "18"),
        ("1 000", "1000"),  # a space is not a thousands separator
    ],
)
def test_wrong_answers(prediction, gold):
    assert score(prediction, gold) == 0.0


def test_extraction_details():
    assert extract_last_number("10-15") == "-15"
    assert extract_last_number("3/4 of them") == "4"
    assert extract_last_number("no digits here") is None
    assert extract_last_number("between 1,2,3") == "123"


def test_number_after_answer_tags_wins():
    # Text outside the answer tags still counts: the last number anywhere is taken.
    assert score("<answer>18</answer> (that is 6 boxes)", "18") == 0.0
    assert score("<answer>18</answer> (that is 6 boxes)", "6") == 1.0


def test_think_block_used_only_when_answer_has_no_number():
    assert score("<think>3 * 6 = 18</think> The answer is eighteen.", "18") == 1.0
    assert score("<think>maybe 17</think> The answer is 18.", "18") == 1.0


def test_multi_element_gold_is_rejected():
    with pytest.raises(ValueError, match="one gold answer"):
        score("18", ["18", "19"])


def test_sample_row():
    row = json.loads((SAMPLES / "rlvr_gsm_math_if_mixed.jsonl").read_text().splitlines()[0])
    assert row["dataset"] == "gsm8k"
    assert score("24 / 4 = 6 boxes, 6 * $3 = $18. The answer is 18.", row["ground_truth"]) == 1.0
    assert score("The baker makes $24.", row["ground_truth"]) == 0.0
