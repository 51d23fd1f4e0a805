"""Tests for the string verifiers (`string_f1`, `string_matcher`, `flan`, `puzzle`, `re_search`, `re_search_f1`)
and helpers."""

import json
import math
from pathlib import Path

import pytest

from open_instruct.rewards import RewardSettings, VerifierInput, get_verifier
from open_instruct.rewards.string_match import (
    flan,
    normalize_text,
    puzzle,
    remove_thinking,
    string_f1,
    string_matcher,
    token_f1,
)

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "rlvr_samples"
SETTINGS = RewardSettings()


def run(verifier, prediction, gold) -> float:
    return verifier(VerifierInput(prediction, gold), SETTINGS).score


def test_remove_thinking_rules():
    assert remove_thinking("<|assistant|>plan</think> <answer>Paris</answer> ") == "Paris"
    assert remove_thinking("a</think>b</think> c") == "c"  # after the *last* closing tag
    assert remove_thinking("no think block") == "no think block"


def test_squad_normalisation():
    assert normalize_text("The  well-known Answer, it's!") == "wellknown answer its"
    assert normalize_text("1,000 apples") == "1000 apples"
    assert normalize_text("“curly”") == "“curly”"  # only ASCII punctuation is removed


def test_token_f1_values():
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(2 * 1.0 * (2 / 3) / (1 + 2 / 3))
    assert token_f1("cat cat cat", "cat") == pytest.approx(0.5)  # clipped counts
    assert token_f1("", "cat") == 0.0
    assert token_f1("dog", "cat") == 0.0


def test_string_f1_strips_thinking_and_tags():
    gold = "Jupiter is the largest planet in the Solar System."
    assert (
        run(
            string_f1,
            "<think>Saturn? no</think><answer>Jupiter is the largest planet in the solar system</answer>",
            gold,
        )
        == 1.0
    )
    # Without stripping, "saturn no" would dilute precision.
    assert run(string_f1, "Saturn no</think>Jupiter", gold) == pytest.approx(token_f1("Jupiter", gold))
    assert run(string_f1, "<think>Jupiter is the largest planet</think>", gold) == 0.0  # empty answer


def test_string_f1_list_gold_takes_max():
    assert run(string_f1, "Paris", ["Lyon", "Paris"]) == 1.0
    assert run(string_f1, "Paris", ["Lyon", "Marseille"]) == 0.0
    assert run(string_f1, "Paris", []) == 0.0


def test_string_f1_sample_rows():
    rows = [json.loads(line) for line in (SAMPLES / "string_f1_400k.jsonl").read_text().splitlines()]
    assert run(string_f1, "x</think>" + rows[1]["ground_truth"], rows[1]["ground_truth"]) == 1.0
    partial = run(string_f1, "Jupiter is the biggest planet.", rows[1]["ground_truth"])
    assert 0.3 < partial < 0.9
    assert run(string_f1, "Bonjour, comment allez-vous ?", rows[2]["ground_truth"]) == 1.0


def test_string_matcher_needs_tags():
    assert run(string_matcher, "<answer>The Eiffel Tower</answer>", "eiffel tower") == 1.0
    assert run(string_matcher, "The Eiffel Tower", "eiffel tower") == 0.0
    assert run(string_matcher, "<answer>The Eiffel Tower", "eiffel tower") == 0.0
    assert run(string_matcher, "<answer>Big Ben</answer>", "eiffel tower") == 0.0


def test_string_matcher_takes_last_answer_span():
    text = "<think><answer>Lyon</answer></think><answer>Paris</answer>"
    assert run(string_matcher, text, "Paris") == 1.0
    assert run(string_matcher, text, "Lyon") == 0.0


def test_multiple_choice_letter_gold_is_not_matched_by_articles():
    # "A" normalises to "" under SQuAD rules; an answer of "the" must not match it.
    assert run(string_matcher, "<answer>(A)</answer>", "A") == 1.0
    assert run(string_matcher, "<answer>the</answer>", "A") == 0.0
    assert run(string_matcher, "<answer>B</answer>", "A") == 0.0
    assert run(string_f1, "A", "A") == 1.0


def test_flan():
    assert run(flan, "Reasoning... The answer is: Yes.", "yes") == 1.0
    assert run(flan, "The answer is: no. Then The answer is: yes", "yes") == 1.0
    assert run(flan, "The answer is: maybe", "yes") == 0.0


def test_puzzle():
    assert run(puzzle, "<think>try 41</think>42", "42") == 1.0
    assert run(puzzle, "<think>42</think>41", "42") == 0.0
    assert run(puzzle, "", "42") == 0.0


@pytest.mark.parametrize(
    "prediction, label, score",
    [
        ("I looked it up. <FINISH> Paris </finish>", "paris", 1.0),  # tags in any case, normalised match
        ("<finish>the Eiffel Tower!</finish>", '["Louvre", "Eiffel tower"]', 1.0),  # a JSON list of references
        ("<finish>Lyon</finish>", "Paris", 0.0),
        ("<finish>  </finish>", "Paris", 0.0),  # an empty answer
        ("Paris", "Paris", 0.0),  # no tags
    ],
)
def test_re_search_is_exact_match_of_the_finish_span(prediction, label, score):
    assert get_verifier("re_search")(VerifierInput(prediction, label), RewardSettings()).score == score


@pytest.mark.parametrize(
    "prediction, label, score",
    [
        ("<finish>new york city</finish>", "New York", 2 * (2 / 3) * 1 / (2 / 3 + 1)),
        ("<finish>a</finish><finish>Berlin wall</finish>", '["Berlin", "Rome"]', 2 * 0.5 * 1 / 1.5),  # last span
        ("<finish>Lyon</finish>", "Paris", 0.1),  # the format alone
        ("<finish></finish>", "Paris", 0.0),
        ("no tags at all", "Paris", 0.0),
    ],
)
def test_re_search_f1_scores_token_f1_with_a_format_floor(prediction, label, score):
    result = get_verifier("re_search_f1")(VerifierInput(prediction, label), RewardSettings())
    assert math.isclose(result.score, score)
