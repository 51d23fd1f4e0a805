"""Quantifier and relation semantics of the IFEval verifiers, swept over N = 1..100.

Each sweep scores generated responses through the verifier registry and compares the score with a
one-line reference formula written here from open-instruct's stated rule (its current
`if_functions.py` and `IFEvalG/instructions.py`):

- Tulu 3 functions (`ifeval_old`): "at least" is `>=`, "at most" is `<=`; "around" allows
  `max(round(0.1 * N), 1)` for words and capital words (open-instruct PR #1646) and a flat 1 for
  sentences.
- IFEvalG checkers (`ifeval`): "less than" is `<`, "at least" is `>=`; no other relation exists.

A single N hides these rules (at N = 10 the tolerance is 1 under every candidate rule), hence the
sweeps. The counted responses are built so that our counters and open-instruct's agree on them
(plain words, one-clause sentences, all-caps acronyms), which keeps the sweep about the relation.
"""

from __future__ import annotations

import json

import pytest

from open_instruct.rewards import RewardSettings, VerifierInput, get_verifier
from open_instruct.rewards.ifeval import around_tolerance

SETTINGS = RewardSettings()
NS = range(1, 101)


def reference_around_tolerance(n: int) -> int:
    return max(round(n * 0.1), 1)


OLD_REFERENCE = {
    "at least": lambda actual, n, tol: actual >= n,
    "at most": lambda actual, n, tol: actual <= n,
    "around": lambda actual, n, tol: abs(actual - n) <= tol,
}

# func_name -> (response with `count` counted units, tolerance for "around", smallest count).
# Word counts start at 1: an empty answer scores 0 whatever the quantifier (see the last test).
OLD_SWEEPS = {
    "validate_word_constraint": (lambda count: " ".join(["word"] * count), reference_around_tolerance, 1),
    "verify_sentence_constraint": (lambda count: " ".join(["Birds sing."] * count), lambda n: 1, 1),
    "validate_frequency_capital_words": (
        lambda count: " ".join(["NASA"] * count + ["launches", "rockets"]),
        reference_around_tolerance,
        0,
    ),
}


def old_label(func_name: str, n: int, quantifier: str) -> str:
    return json.dumps({"func_name": func_name, "N": n, "quantifier": quantifier, "end_phrase": None})


def old_score(func_name: str, text: str, n: int, quantifier: str) -> float:
    verifier = get_verifier("ifeval_old")
    return verifier(VerifierInput(text, old_label(func_name, n, quantifier)), SETTINGS).score


@pytest.mark.parametrize("quantifier", sorted(OLD_REFERENCE))
@pytest.mark.parametrize("func_name", sorted(OLD_SWEEPS))
def test_old_quantifiers_over_range(func_name, quantifier):
    make_text, tolerance, lowest = OLD_SWEEPS[func_name]
    rule = OLD_REFERENCE[quantifier]
    mismatches = []
    for n in NS:
        # Both edges of the widest band in play (word "around") with a margin, which also covers the
        # single edge of "at least" / "at most".
        band = reference_around_tolerance(n) + 3
        for actual in range(max(lowest, n - band), n + band + 1):
            expected = float(rule(actual, n, tolerance(n)))
            got = old_score(func_name, make_text(actual), n, quantifier)
            if got != expected:
                mismatches.append((n, actual, got, expected))
    assert not mismatches, f"{len(mismatches)} mismatches (N, count, got, expected), first: {mismatches[:5]}"


@pytest.mark.parametrize(
    ("n", "tolerance"),
    [(1, 1), (5, 1), (9, 1), (10, 1), (14, 1), (15, 2), (25, 2), (35, 4), (45, 4), (100, 10)],
)
def test_around_tolerance_values(n, tolerance):
    # Python's round sends ties to the even neighbour; open-instruct inherits that, so must we.
    assert around_tolerance(n) == reference_around_tolerance(n) == tolerance


def test_issue_example_off_by_one_from_five_is_around():
    for func_name in ("validate_word_constraint", "validate_frequency_capital_words"):
        make_text = OLD_SWEEPS[func_name][0]
        assert old_score(func_name, make_text(4), 5, "around") == 1.0
        assert old_score(func_name, make_text(6), 5, "around") == 1.0
        assert old_score(func_name, make_text(7), 5, "around") == 0.0


def test_sentence_around_is_plus_minus_one_at_any_n():
    make_text = OLD_SWEEPS["verify_sentence_constraint"][0]
    assert old_score("verify_sentence_constraint", make_text(89), 100, "around") == 0.0
    assert old_score("verify_sentence_constraint", make_text(99), 100, "around") == 1.0
    assert old_score("verify_sentence_constraint", make_text(101), 100, "around") == 1.0
    assert old_score("verify_sentence_constraint", make_text(102), 100, "around") == 0.0


@pytest.mark.parametrize("quantifier", ["exactly", "equal to", "At least", "around "])
def test_old_unknown_quantifier_never_scores(quantifier):
    # open-instruct returns False for any other spelling; we raise, which the reward pool turns
    # into the same 0 while counting the broken label.
    with pytest.raises(ValueError, match="quantifier"):
        old_score("validate_word_constraint", "one two three", 3, quantifier)


def test_new_format_verifier_agrees_on_old_labels():
    # `ifeval` scores old-format labels with the same functions; spot-check the band edges.
    make_text = OLD_SWEEPS["validate_word_constraint"][0]
    for n in (5, 25, 35, 60):
        label = old_label("validate_word_constraint", n, "around")
        for actual in range(n - 6, n + 7):
            expected = old_score("validate_word_constraint", make_text(actual), n, "around")
            got = get_verifier("ifeval")(VerifierInput(make_text(actual), label), SETTINGS).score
            assert got == expected


def test_empty_answer_scores_zero_even_for_at_most():
    # Deliberate: open-instruct's old verifier has no empty-answer check, so "" satisfies "at most N
    # words" there; its newer `ifeval` verifier returns 0 for an empty answer and so do both of ours.
    assert old_score("validate_word_constraint", "", 10, "at most") == 0.0


# ---------------------------------------------------------------------------------------------
# IFEvalG relations

NEW_REFERENCE = {"less than": lambda actual, n: actual < n, "at least": lambda actual, n: actual >= n}

# instruction_id -> (kwargs for threshold n and relation r, response with `count` units, lowest count)
NEW_SWEEPS = {
    "keywords:frequency": (
        lambda n, r: {"keyword": "tea", "frequency": n, "relation": r},
        lambda count: " ".join(["tea"] * count + ["cup"]),
        0,
    ),
    "keywords:word_count_different_numbers": (
        lambda n, r: {"keyword": "tea", "frequency": n, "relation": r},
        lambda count: " ".join(["Tea"] * count + ["cup"]),
        0,
    ),
    "keywords:letter_frequency": (
        lambda n, r: {"letter": "z", "let_frequency": n, "let_relation": r},
        lambda count: "Z" * count + " ok",
        0,
    ),
    "letters:letter_counting2": (
        lambda n, r: {"letter": "z", "let_frequency": n, "let_relation": r},
        lambda count: "z" * count + " ok",
        0,
    ),
    "letters:letter_counting": (
        lambda n, r: {"N": n, "relation": r},
        lambda count: "a" * count + " 42",
        0,
    ),
    "length_constraints:number_words": (
        lambda n, r: {"num_words": n, "relation": r},
        lambda count: " ".join(["word"] * count),
        1,
    ),
    "length_constraints:number_sentences": (
        lambda n, r: {"num_sentences": n, "relation": r},
        lambda count: " ".join(["Birds sing."] * count),
        1,
    ),
    "change_case:capital_word_frequency": (
        lambda n, r: {"capital_frequency": n, "capital_relation": r},
        lambda count: " ".join(["NASA"] * count + ["launches", "rockets"]),
        0,
    ),
}


def new_label(instruction_id: str, kwargs: dict) -> str:
    return str([{"instruction_id": [instruction_id], "kwargs": [kwargs]}])


def new_score(instruction_id: str, kwargs: dict, text: str) -> float:
    return get_verifier("ifeval")(VerifierInput(text, new_label(instruction_id, kwargs)), SETTINGS).score


@pytest.mark.parametrize("relation", sorted(NEW_REFERENCE))
@pytest.mark.parametrize("instruction_id", sorted(NEW_SWEEPS))
def test_new_relations_over_range(instruction_id, relation):
    make_kwargs, make_text, lowest = NEW_SWEEPS[instruction_id]
    rule = NEW_REFERENCE[relation]
    mismatches = []
    for n in NS:
        for actual in range(max(lowest, n - 3), n + 4):
            expected = float(rule(actual, n))
            got = new_score(instruction_id, make_kwargs(n, relation), make_text(actual))
            if got != expected:
                mismatches.append((n, actual, got, expected))
    assert not mismatches, f"{len(mismatches)} mismatches (N, count, got, expected), first: {mismatches[:5]}"


@pytest.mark.parametrize("relation", ["at most", "exactly", "more than", "At least", "less than "])
@pytest.mark.parametrize("instruction_id", sorted(set(NEW_SWEEPS) - {"letters:letter_counting"}))
def test_new_unknown_relation_is_an_error(instruction_id, relation):
    # open-instruct's checkers refuse these while being built, so a row using one never scores.
    make_kwargs, make_text, _ = NEW_SWEEPS[instruction_id]
    with pytest.raises(ValueError, match="relation"):
        new_score(instruction_id, make_kwargs(3, relation), make_text(3))


@pytest.mark.parametrize("relation", ["at most", "exactly", "At least"])
def test_letter_counting_unknown_relation_fails_quietly(relation):
    # The one IFEvalG checker that does not validate its relation: open-instruct's check returns
    # None there, which scores 0.
    make_kwargs, make_text, _ = NEW_SWEEPS["letters:letter_counting"]
    assert new_score("letters:letter_counting", make_kwargs(3, relation), make_text(3)) == 0.0
