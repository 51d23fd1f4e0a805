"""Tests for the `ifeval` (IFEvalG) and `ifeval_old` (Tulu 3) verifiers.

Every constraint family gets at least one passing and one failing response; the reference sample
rows check both label formats end to end.
"""

import json
from pathlib import Path

import pytest

from open_instruct.config.rewards import RewardConfig
from open_instruct.rewards import RewardSettings, VerifierInput
from open_instruct.rewards.ifeval import OLD_FUNCTIONS, UnknownInstructionError, ifeval, ifeval_old
from open_instruct.rewards.ifeval_checks import CHECKS, split_sentences, word_tokens, words

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "rlvr_samples"
SETTINGS = RewardSettings()

ENGLISH = "the weather is lovely today. we walked along the river and watched the boats go by."
FRENCH = "Le temps est magnifique aujourd'hui. Nous avons marché le long de la rivière avec nos amis."
THREE_BY_TWO_BY_THREE = (
    "I like tea. You like coffee.\n***\nWe drink water. They eat bread.\n***\nBirds sing songs. Dogs chase cats."
)

# (instruction_id, kwargs, passing response, failing response)
NEW_CASES = [
    (
        "keywords:existence",
        {"keywords": ["nectar", "bees"]},
        "Bees make honey from nectar.",
        "Bees make honey.",
    ),
    (
        "keywords:frequency",
        {"keyword": "honey", "frequency": 2, "relation": "at least"},
        "honey, Honey",
        "honey",
    ),
    ("keywords:frequency", {"keyword": "bee", "frequency": 2, "relation": "less than"}, "a bee", "bee bee"),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["cat", "dog"]},
        "A category of catalogs.",
        "My Dog barks.",
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
        "Zebra zone",
        "zebra",
    ),
    ("language:response_language", {"language": "fr"}, FRENCH, ENGLISH),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "One. Two.",
        "One. Two. Three.",
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "A\n***\nB\n***\nC", "A\n***\n\n***\nC"),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "one two three four five",
        "don't stop",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
        'Intro text.\n\n"However, more.',
        "Intro text.\n\nMoreover, more.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], at [address]",
        "Dear [name]",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Body.\n\nP. S. see you",
        "Body. PS: see you",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Body.\nP.P.S. later",
        "Body.\nP.S. later",
    ),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n  * two", "* one\n* two\n- three"),
    ("detectable_format:constrained_response", None, "Thinking... My answer is yes.", "Yes."),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*one* and **two**",
        "*one* and ** **",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nIntro\nSection 2\nMore",
        "Section 1 only",
    ),
    ("detectable_format:json_format", None, '```json\n{"a": 1}\n```', 'Here: {"a": 1}'),
    ("detectable_format:title", None, "<<My Title>>\nBody", "<< >> Body"),
    ("combination:two_responses", None, "Answer one.\n******\nAnswer two.", "Same.\n******\nSame."),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem."},
        "write a poem. Roses.",
        "A poem: roses",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        'Hi. "Any other questions?"',
        "Any other questions?.",
    ),
    ("startend:quotation", None, '"quoted text"', "quoted text"),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "THIS is VERY",
        "THIS is",
    ),
    ("change_case:english_capital", None, ENGLISH.upper(), ENGLISH),
    (
        "change_case:english_lowercase",
        None,
        ENGLISH,
        "The weather is lovely today. We walked along the river.",
    ),
    ("punctuation:no_comma", None, "no commas here", "a, b"),
    # AI2 additions
    (
        "copy:repeat_phrase",
        {"phrase": "the quick brown fox", "small_n": 2},
        "the slow brown fox ran. the quick red fox sat.",
        "the quick brown fox ran. the quick brown fox sat.",
    ),
    (
        "copy:copy",
        {"prompt_to_repeat": "Repeat me exactly."},
        "repeat me exactly.",
        "Repeat me exactly. Done.",
    ),
    (
        "new:copy_span_idx",
        {"prompt_to_repeat": "Hello brave new world", "n_start": 6, "n_end": 11},
        "Brave",
        "brave new",
    ),
    (
        "detectable_format:sentence_hyphens",
        None,
        "I like tea.-It is warm.-Try it.",
        "I like tea. - It is warm.",
    ),
    ("keywords:no_adjacent_consecutive", None, "zebras eat grass", "a big dog"),
    ("detectable_format:square_brackets", None, "[Hello] [world]", "[Hello] world"),
    ("keywords:word_once", {"keyword": "flight"}, "One flight.", "A flight and more flights."),
    (
        "keywords:word_count_different_numbers",
        {"keyword": "tea", "frequency": 2, "relation": "at least"},
        "tea, tea",
        "tea",
    ),
    ("keywords:exclude_word_harder", {"keyword": "blue"}, "Bluebirds are blue.", "The blue sky"),
    ("paragraphs:paragraphs", None, "A\n***\nB", "A\n***\nB\n***\nC"),
    ("paragraphs:paragraphs2", None, "A\n\nB", "A B"),
    (
        "first_word:first_word_sent",
        {"first_word": "the"},
        "The cat sat. The dog ran.",
        "The cat sat. A dog ran.",
    ),
    ("first_word:first_word_answer", {"first_word": "yes"}, "Yes it is.", "Yes, it is."),
    ("last_word:last_word_sent", {"last_word": "now"}, "Do it now. Go now!", "Do it now. Go later."),
    ("last_word:last_word_answer", {"last_word": "end"}, "This is the end.", "The end is near."),
    ("detectable_format:bigram_wrapping", None, "<<I am>> <<at home>>", "<<I am>> at home"),
    ("copy:copying_simple", {"prompt_to_repeat": "Copy this."}, " Copy this. ", "copy this."),
    (
        "copy:copying_multiple",
        {"prompt_to_repeat": "Hi there", "N": 2},
        "Hi there\n******\nHi there",
        "Hi there",
    ),
    ("punctuation:punctuation_dot", None, "No dots here!", "A dot."),
    ("punctuation:punctuation_exclamation", None, "Calm.", "Wow!"),
    ("count:lowercase_counting", {"N": 2}, "ONE two three", "one two three"),
    ("letters:letter_counting", {"N": 10, "relation": "less than"}, "short", "this is a long sentence"),
    (
        "letters:letter_counting2",
        {"letter": "s", "let_frequency": 3, "let_relation": "at least"},
        "sassy",
        "sad",
    ),
    (
        "count:counting_composition",
        {"n_sent": 2, "n_words": 3},
        THREE_BY_TWO_BY_THREE,
        THREE_BY_TWO_BY_THREE.replace("Dogs chase cats.", "Dogs chase small cats."),
    ),
    ("count:count_unique", None, "Every word differs here.", "The cat saw the dog."),
    (
        "count:count_increment_word",
        {"keyword1": "sun", "keyword2": "moon"},
        "sun, moon, moon",
        "The sun and the moon.",
    ),
    ("keywords:palindrome", None, "my racecar", "hello world"),
    (
        "keywords:keyword_specific_position",
        {"keyword": "blue", "n": 2, "m": 3},
        "Skies are grey. Today skies blue again.",
        "Skies are grey. Blue skies today.",
    ),
    ("keywords:start_end", None, "Hello there, my friend hello", "Hello there, my friend hello."),
]


def new_label(ids, kwargs) -> str:
    return str([{"instruction_id": list(ids), "kwargs": list(kwargs)}])


def run_new(response, label, settings=SETTINGS):
    return ifeval(VerifierInput(response, label), settings)


@pytest.mark.parametrize(("instruction_id", "kwargs", "good", "bad"), NEW_CASES, ids=[c[0] for c in NEW_CASES])
def test_new_constraint(instruction_id, kwargs, good, bad):
    label = new_label([instruction_id], [kwargs])
    assert run_new(good, label).score == 1.0
    assert run_new(bad, label).score == 0.0


def test_every_registered_constraint_is_tested():
    assert {c[0] for c in NEW_CASES} == set(CHECKS)


def test_fraction_and_require_all():
    label = new_label(["punctuation:no_comma", "keywords:word_once"], [None, {"keyword": "tea"}])
    assert run_new("I like tea", label).score == 1.0
    assert run_new("I like tea, and more tea", label).score == 0.0
    assert run_new("I like coffee", label).score == 0.5
    strict = RewardSettings(RewardConfig(ifeval_reward_mode="all"))
    assert run_new("I like coffee", label, strict).score == 0.0
    assert run_new("I like tea", label, strict).score == 1.0


def test_think_block_is_ignored():
    label = new_label(["punctuation:no_comma"], [None])
    assert run_new("<think>hmm, commas, here</think><answer>none here</answer>", label).score == 1.0
    assert run_new("<think>fine</think>", label).score == 0.0  # empty answer


def test_unknown_instruction_id_is_named():
    with pytest.raises(UnknownInstructionError, match="basic:count_unique"):
        run_new("text", new_label(["punctuation:no_comma", "basic:count_unique"], [None, None]))


def test_bad_kwargs_are_reported():
    with pytest.raises(ValueError, match="keywords:word_once"):
        run_new("text", new_label(["keywords:word_once"], [{"word": "tea"}]))
    with pytest.raises(ValueError, match="relation"):
        run_new(
            "tea",
            new_label(["keywords:frequency"], [{"keyword": "tea", "frequency": 1, "relation": "about"}]),
        )


def test_label_variants():
    # None-valued kwargs are dropped; JSON text (null) and decoded objects are accepted too.
    assert run_new("tea", new_label(["keywords:word_once"], [{"keyword": "tea", "unused": None}])).score == 1.0
    json_label = json.dumps([{"instruction_id": ["punctuation:no_comma"], "kwargs": [None]}])
    assert run_new("no commas", json_label).score == 1.0
    assert run_new("no commas", [{"instruction_id": ["punctuation:no_comma"], "kwargs": [None]}]).score == 1.0
    assert run_new("text", new_label([], [])).score == 0.0
    with pytest.raises(ValueError, match="cannot parse"):
        run_new("text", "not a label {")


def test_if_multi_upto5_samples():
    rows = [json.loads(line) for line in (SAMPLES / "if_multi_upto5.jsonl").read_text().splitlines()]
    assert "real row" in rows[0]["_note"]
    lowercase_answer = (
        "<think>Explain IPv6.</think>internet protocol version 6 is the newest version of the internet protocol. "
        "it gives every device a much larger address space than ipv4 and makes routing simpler."
    )
    assert run_new(lowercase_answer, rows[0]["ground_truth"]).score == 1.0
    assert run_new("IPv6 has MUCH larger addresses. It replaces IPv4 over time.", rows[0]["ground_truth"]).score == 0.0

    bees = (
        "Bees visit flowers and sip nectar. *** Inside the hive, bees pass it mouth to mouth, adding enzymes. "
        "*** Bees fan their wings so the water evaporates; the honey thickens, and busy sisters seal the cells "
        "with wax."
    )
    assert bees.lower().count("s") >= 20
    assert run_new(bees, rows[1]["ground_truth"]).score == 1.0
    assert run_new(bees.replace("nectar", "sugar"), rows[1]["ground_truth"]).score == pytest.approx(2 / 3)

    bottle = "This steel bottle keeps drinks *cold all day* and *hot all night*. Any other questions?"
    assert run_new(bottle, rows[2]["ground_truth"]).score == 1.0
    assert run_new(bottle.replace("drinks", "drinks, water"), rows[2]["ground_truth"]).score == 0.75

    bullets = "* Saves money\n* Improves fitness\n* Cuts emissions"
    result = run_new(bullets, rows[3]["ground_truth"])
    assert result.score == 0.5  # bullets pass; not JSON
    assert result.details["constraints"] == [
        ["detectable_format:number_bullet_lists", True],
        ["detectable_format:json_format", False],
    ]


# ---------------------------------------------------------------------------------------------
# Old Tulu 3 format

OLD_KEYS = [
    "N",
    "quantifier",
    "end_phrase",
    "keyword_list",
    "word",
    "forbidden_words",
    "letter",
    "i",
    "first_word",
    "postscript_marker",
    "options",
    "section_splitter",
    "original_prompt",
]


def old_label(func_name, **kwargs) -> str:
    label = {"func_name": func_name} | dict.fromkeys(OLD_KEYS) | kwargs
    return json.dumps(label)


OLD_CASES = [
    ("verify_keywords", {"keyword_list": ["Bee", "honey"]}, "bees make honey", "bees make wax"),
    ("verify_keyword_frequency", {"word": "tea", "N": 2}, "Tea and tea.", "Tea, tea and teas and tea."),
    ("validate_forbidden_words", {"forbidden_words": ["cat"]}, "A dog.", "A category."),
    ("verify_letter_frequency", {"letter": "a", "N": 2}, "a cat", "Aa"),
    ("validate_response_language", {"language": "fr"}, FRENCH, ENGLISH),
    ("verify_paragraph_count", {"N": 2}, "One.\n* * *\nTwo.", "One. Two."),
    ("validate_word_constraint", {"N": 10, "quantifier": "around"}, "w " * 11, "w " * 12),
    ("validate_word_constraint", {"N": 3, "quantifier": "at most"}, "one two", "one two three four"),
    ("verify_sentence_constraint", {"N": 2, "quantifier": "at least"}, "One. Two.", "One."),
    (
        "validate_paragraphs",
        {"N": 2, "first_word": "Then", "i": 2},
        "First.\n\nThen second.",
        "First.\n\nNext.",
    ),
    ("verify_postscript", {"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. P.S."),
    ("validate_placeholders", {"N": 1}, "Hello [name]", "Hello name"),
    ("verify_bullet_points", {"N": 2}, "* a\n- b", "* a\n* b\n* c"),
    ("validate_title", {}, "<<Title>>\nText", "Title\nText"),
    (
        "validate_choice",
        {"options": "('My answer is yes.', 'My answer is no.')"},
        "My answer is no.",
        "Not sure.",
    ),
    ("validate_highlighted_sections", {"N": 2}, "*a* then *b*", "*a* only"),
    ("validate_sections", {"N": 2, "section_splitter": "SECTION"}, "SECTION 1 a SECTION 2 b", "SECTION 1 a"),
    ("validate_json_format", {}, '{"k": [1, 2]}', "k: 1"),
    ("validate_repeat_prompt", {"original_prompt": "Say hi."}, "Say hi. Hi!", "Hi! Say hi."),
    ("validate_two_responses", {}, "First.******Second.", "Only one."),
    ("validate_uppercase", {}, "ALL CAPS 123", "Not all caps"),
    ("validate_lowercase", {}, "all lower", "Not lower"),
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "at least"}, "NASA and ESA", "NASA only"),
    ("validate_end", {"end_phrase": "Thanks."}, "Bye. Thanks.", "Thanks. Bye."),
    ("validate_quotation", {}, '"quoted"', "quoted"),
    ("validate_no_commas", {}, "no commas", "a, b"),
]


@pytest.mark.parametrize(("func_name", "kwargs", "good", "bad"), OLD_CASES, ids=[c[0] for c in OLD_CASES])
def test_old_function(func_name, kwargs, good, bad):
    label = old_label(func_name, **kwargs)
    assert ifeval_old(VerifierInput(good, label), SETTINGS).score == 1.0
    assert ifeval_old(VerifierInput(bad, label), SETTINGS).score == 0.0


def test_every_old_function_is_tested():
    assert {c[0] for c in OLD_CASES} == set(OLD_FUNCTIONS)


def test_old_format_errors():
    with pytest.raises(UnknownInstructionError, match="verify_everything"):
        ifeval_old(VerifierInput("text", old_label("verify_everything")), SETTINGS)
    with pytest.raises(ValueError, match="func_name"):
        ifeval_old(VerifierInput("text", new_label(["punctuation:no_comma"], [None])), SETTINGS)
    with pytest.raises(ValueError, match="verify_letter_frequency"):
        ifeval_old(VerifierInput("text", old_label("verify_letter_frequency", letter="a")), SETTINGS)


def test_mixed_set_samples_in_both_verifiers():
    rows = [json.loads(line) for line in (SAMPLES / "rlvr_gsm_math_if_mixed.jsonl").read_text().splitlines()]
    lowercase, paragraphs = rows[2], rows[3]
    assert "row as shown" in lowercase["_note"]
    answer = "ipv6 gives the internet far more addresses. it also simplifies routing."
    for verifier in (ifeval_old, ifeval):  # `ifeval` recognises the old format too
        assert verifier(VerifierInput(answer, lowercase["ground_truth"]), SETTINGS).score == 1.0
        assert verifier(VerifierInput("IPv6 is new.", lowercase["ground_truth"]), SETTINGS).score == 0.0
    sky = "Sunlight scatters. * * * Blue scatters most. * * * So the sky looks blue."
    assert ifeval_old(VerifierInput(sky, paragraphs["ground_truth"]), SETTINGS).score == 1.0
    assert ifeval_old(VerifierInput("Sunlight scatters.", paragraphs["ground_truth"]), SETTINGS).score == 0.0


# ---------------------------------------------------------------------------------------------
# Text utilities


def test_sentence_splitter():
    text = 'Dr. Smith arrived at 3.5 p.m. today. He said "hi!" Then J. Doe left?\n\nNew paragraph'
    assert split_sentences(text) == [
        "Dr. Smith arrived at 3.5 p.m. today.",
        'He said "hi!"',
        "Then J. Doe left?",
        "New paragraph",
    ]
    assert split_sentences("") == []


def test_word_tokenizer():
    assert word_tokens("I don't like U.S. cats, it's 1,000!") == [
        "I",
        "do",
        "n't",
        "like",
        "U.S.",
        "cats",
        ",",
        "it",
        "'s",
        "1,000",
        "!",
    ]
    assert words("Hello, world!") == ["Hello", "world"]


def test_language_detection_is_deterministic():
    label = new_label(["language:response_language"], [{"language": "en"}])
    short = "Ok sure thing."
    assert len({run_new(short, label).score for _ in range(5)}) == 1
