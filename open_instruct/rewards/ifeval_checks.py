"""IFEvalG constraint checkers (IFEval originals + AI2 additions), keyed by `instruction_id`.

Each checker is `fn(text, **kwargs) -> bool` over the answer-side text (think block removed by the
caller). Semantics follow the IFEvalG registry used by open-instruct (`open_instruct/IFEvalG/` in its
repository). Deliberate differences, all in the direction of the
instruction's wording:

- No NLTK: sentences come from `split_sentences` (a deterministic punctuation splitter with an
  abbreviation list that also breaks at blank lines) and tokens from `word_tokens` (a small
  Treebank-like tokenizer: punctuation marks are their own tokens, `n't`/`'s`-style clitics split).
  Counts can differ from punkt on unusual text.
- `count:counting_composition`, `count:count_unique` and `keywords:keyword_specific_position`
  count words only (punctuation tokens ignored, uniqueness case-insensitive); NLTK counted `.` as
  a word, which made e.g. "no repeated word" impossible for any text with two sentences.
- Keywords are matched literally (`re.escape`), not as regular expressions.
- Language detection uses `langdetect` with a fixed seed so short texts score deterministically.
- Missing required kwargs raise instead of being replaced by random values as IFEval does.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable

CHECKS: dict[str, Callable[..., bool]] = {}


def check(*instruction_ids: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    def decorate(fn: Callable[..., bool]) -> Callable[..., bool]:
        for instruction_id in instruction_ids:
            CHECKS[instruction_id] = fn
        return fn

    return decorate


# ---------------------------------------------------------------------------------------------
# Text utilities

# Words whose trailing period does not end a sentence.
_ABBREVIATION_WORDS = (
    "mr mrs ms dr prof sr jr st vs etc e.g i.e u.s u.k a.m p.m no fig approx inc ltd co corp dept est mt "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
)
_ABBREVIATIONS = frozenset(_ABBREVIATION_WORDS.split())
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)")


def split_sentences(text: str) -> list[str]:
    """Split at `.`/`!`/`?` runs followed by whitespace, and at blank lines.

    A period after a known abbreviation or a single letter (an initial) does not end a sentence.
    """
    sentences: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        start = 0
        for match in _SENTENCE_END.finditer(block):
            if match.group().startswith(".") and len(match.group().rstrip("\"'”’)]")) == 1:
                word = re.search(r"([\w.]+)$", block[start : match.start()])
                stem = word.group(1).lower() if word else ""
                if stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha()):
                    continue
            sentences.append(block[start : match.end()])
            start = match.end()
        sentences.append(block[start:])
    return [s.strip() for s in sentences if s.strip()]


_TOKEN = re.compile(
    r"\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|(?:[A-Za-z]\.){2,}|\d+(?:[.,]\d+)+|\w+(?:-\w+)*|\.\.\.|--|\S",
    re.IGNORECASE,
)


def word_tokens(text: str) -> list[str]:
    """NLTK-`word_tokenize`-like tokens: words, numbers, clitics and single punctuation marks."""
    return _TOKEN.findall(text)


def words(text: str) -> list[str]:
    return [tok for tok in word_tokens(text) if any(ch.isalnum() for ch in tok)]


def count_sub(text: str, keyword: str) -> int:
    """Case-insensitive substring count (IFEval counts `art` inside `start`)."""
    return len(re.findall(re.escape(keyword), text, flags=re.IGNORECASE))


# The only relations IFEvalG checkers know. open-instruct rejects any other spelling when it builds
# the checker (an error, not a score), so "at most", "exactly" or "At least" raise here as well.
RELATIONS = ("less than", "at least")


def compare(actual: int, relation: str, threshold: int) -> bool:
    if relation == "less than":
        return actual < threshold
    if relation == "at least":
        return actual >= threshold
    raise ValueError(f"unknown relation {relation!r}; IFEvalG supports {' and '.join(map(repr, RELATIONS))}")


_LANGDETECT_LOCK = threading.Lock()


def detect_language(text: str) -> str | None:
    """ISO 639-1 code from langdetect (seeded), or None when the text has no usable features."""
    from langdetect import DetectorFactory, LangDetectException, detect

    with _LANGDETECT_LOCK:  # its lazy profile loading is not thread-safe
        DetectorFactory.seed = 0
        try:
            return detect(text)
        except LangDetectException:
            return None


def _as_list(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _split_stars(text: str) -> list[str] | None:
    """`***`-separated paragraphs; empty leading/trailing parts dropped, an empty middle -> None."""
    parts = re.split(r"\s?\*\*\*\s?", text)
    kept = []
    for index, part in enumerate(parts):
        if part.strip():
            kept.append(part)
        elif 0 < index < len(parts) - 1:
            return None
    return kept


def _split_blank_lines(text: str) -> list[str] | None:
    parts = text.split("\n\n")
    kept = []
    for index, part in enumerate(parts):
        if part.strip():
            kept.append(part)
        elif 0 < index < len(parts) - 1:
            return None
    return kept


# ---------------------------------------------------------------------------------------------
# IFEval originals


@check("keywords:existence")
def keywords_existence(text: str, keywords: list[str]) -> bool:
    return all(count_sub(text, kw) > 0 for kw in _as_list(keywords))


@check("keywords:frequency", "keywords:word_count_different_numbers")
def keyword_frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    return compare(count_sub(text, keyword), relation, frequency)


@check("keywords:forbidden_words")
def forbidden_words(text: str, forbidden_words: list[str]) -> bool:
    return not any(
        re.search(r"\b" + re.escape(w) + r"\b", text, flags=re.IGNORECASE) for w in _as_list(forbidden_words)
    )


@check("keywords:letter_frequency", "letters:letter_counting2")
def letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return compare(Counter(text.lower())[letter.lower()], let_relation, let_frequency)


@check("language:response_language")
def response_language(text: str, language: str) -> bool:
    detected = detect_language(text)
    return detected is None or detected == language  # IFEval treats "undetectable" as a pass


@check("length_constraints:number_sentences")
def number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    return compare(len(split_sentences(text)), relation, num_sentences)


@check("length_constraints:number_paragraphs")
def number_paragraphs(text: str, num_paragraphs: int) -> bool:
    parts = _split_stars(text)
    return parts is not None and len(parts) == num_paragraphs


@check("length_constraints:number_words")
def number_words(text: str, num_words: int, relation: str) -> bool:
    return compare(len(re.findall(r"\w+", text)), relation, num_words)


@check("length_constraints:nth_paragraph_first_word")
def nth_paragraph_first_word(text: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = [p for p in re.split(r"\n\n", text) if p.strip()]
    if len(paragraphs) != num_paragraphs or not 1 <= nth_paragraph <= len(paragraphs):
        return False
    word = paragraphs[nth_paragraph - 1].split()[0].lstrip("'\"")
    word = re.split(r"[.,?!'\"]", word, maxsplit=1)[0]
    return word.lower() == first_word.lower()


@check("detectable_content:number_placeholders")
def number_placeholders(text: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[.*?\]", text)) >= num_placeholders


@check("detectable_content:postscript")
def postscript(text: str, postscript_marker: str) -> bool:
    if postscript_marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif postscript_marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(postscript_marker.lower()) + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))


@check("detectable_format:number_bullet_lists")
def number_bullet_lists(text: str, num_bullets: int) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == num_bullets


@check("detectable_format:constrained_response")
def constrained_response(text: str) -> bool:
    return any(option in text for option in ("My answer is yes.", "My answer is no.", "My answer is maybe."))


@check("detectable_format:number_highlighted_sections")
def highlighted_sections(text: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h[2:-2].strip()]
    return len(single) + len(double) >= num_highlights


@check("detectable_format:multiple_sections")
def multiple_sections(text: str, section_spliter: str, num_sections: int) -> bool:
    sections = re.split(r"\s?" + re.escape(section_spliter) + r"\s?\d+\s?", text)
    return len(sections) - 1 >= num_sections


def strip_json_fences(text: str) -> str:
    text = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    return text.removesuffix("```").strip()


@check("detectable_format:json_format")
def json_format(text: str) -> bool:
    try:
        json.loads(strip_json_fences(text))
    except ValueError:
        return False
    return True


@check("detectable_format:title")
def title(text: str) -> bool:
    return any(t[2:-2].strip() for t in re.findall(r"<<[^\n]+>>", text))


@check("combination:two_responses")
def two_responses(text: str) -> bool:
    parts = text.split("******")
    kept = []
    for index, part in enumerate(parts):
        if part.strip():
            kept.append(part.strip())
        elif 0 < index < len(parts) - 1:
            return False
    return len(kept) == 2 and kept[0] != kept[1]


@check("combination:repeat_prompt")
def repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


@check("startend:end_checker")
def end_checker(text: str, end_phrase: str) -> bool:
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@check("startend:quotation")
def quotation(text: str) -> bool:
    text = text.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


@check("change_case:capital_word_frequency")
def capital_word_frequency(text: str, capital_frequency: int, capital_relation: str) -> bool:
    return compare(sum(tok.isupper() for tok in word_tokens(text)), capital_relation, capital_frequency)


@check("change_case:english_capital")
def english_capital(text: str) -> bool:
    detected = detect_language(text)
    return text.isupper() and detected in (None, "en")


@check("change_case:english_lowercase")
def english_lowercase(text: str) -> bool:
    detected = detect_language(text)
    return text.islower() and detected in (None, "en")


@check("punctuation:no_comma")
def no_comma(text: str) -> bool:
    return "," not in text


# ---------------------------------------------------------------------------------------------
# AI2 additions (IFEvalG)


@check("copy:repeat_phrase")
def repeat_phrase(text: str, phrase: str, small_n: int) -> bool:
    ref = phrase.split()
    if len(ref) < 2:
        return False
    found = re.findall(re.escape(ref[0]) + r" .*? " + re.escape(ref[-1]), text)
    if len(found) != small_n:
        return False
    for candidate in found:
        tokens = candidate.split()
        if len(tokens) != len(ref) or sum(a != b for a, b in zip(tokens, ref, strict=True)) != 1:
            return False
    return True


@check("copy:copy")
def copy_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower() == prompt_to_repeat.strip().lower()


@check("new:copy_span_idx")
def copy_span_idx(text: str, prompt_to_repeat: str, n_start: int, n_end: int) -> bool:
    return text.strip().lower() == prompt_to_repeat[n_start:n_end].strip().lower()


@check("detectable_format:sentence_hyphens")
def sentence_hyphens(text: str) -> bool:
    parts = text.strip().split("-")
    if len(parts) < 2:
        return False
    return all(part and part == part.strip() and len(split_sentences(part)) == 1 for part in parts)


@check("keywords:no_adjacent_consecutive")
def no_adjacent_consecutive(text: str) -> bool:
    initials = [w[0].lower() for w in text.split()]
    return not any(a.isalpha() and b.isalpha() and ord(b) - ord(a) == 1 for a, b in itertools.pairwise(initials))


@check("detectable_format:square_brackets")
def square_brackets(text: str) -> bool:
    tokens = text.split()
    return bool(tokens) and all(t.startswith("[") and t.endswith("]") for t in tokens)


@check("keywords:word_once")
def word_once(text: str, keyword: str) -> bool:
    return count_sub(text, keyword) == 1


@check("keywords:exclude_word_harder")
def exclude_word_harder(text: str, keyword: str) -> bool:
    return f" {keyword} " not in text


@check("paragraphs:paragraphs")
def two_star_paragraphs(text: str) -> bool:
    return number_paragraphs(text, 2)


@check("paragraphs:paragraphs2")
def two_blank_line_paragraphs(text: str) -> bool:
    parts = _split_blank_lines(text)
    return parts is not None and len(parts) == 2


@check("first_word:first_word_sent")
def first_word_sent(text: str, first_word: str) -> bool:
    sentences = split_sentences(text)
    return bool(sentences) and all(s.split()[0].lower() == first_word.lower() for s in sentences)


@check("first_word:first_word_answer")
def first_word_answer(text: str, first_word: str) -> bool:
    tokens = text.split()
    return bool(tokens) and tokens[0].lower() == first_word.lower()


def _bare(word: str) -> str:
    return re.sub(r"[^\w\s]", "", word).lower()


@check("last_word:last_word_sent")
def last_word_sent(text: str, last_word: str) -> bool:
    sentences = split_sentences(text)
    return bool(sentences) and all(_bare(s.split()[-1]) == _bare(last_word) for s in sentences)


@check("last_word:last_word_answer")
def last_word_answer(text: str, last_word: str) -> bool:
    tokens = text.split()
    return bool(tokens) and _bare(tokens[-1]) == _bare(last_word)


@check("detectable_format:bigram_wrapping")
def bigram_wrapping(text: str) -> bool:
    tokens = text.split()
    if not tokens:
        return False
    for i in range(0, len(tokens), 2):
        pair = tokens[i : i + 2]
        if not (pair[0].startswith("<<") and pair[-1].endswith(">>")):
            return False
    return True


@check("copy:copying_simple")
def copying_simple(text: str, prompt_to_repeat: str) -> bool:
    return text.strip() == prompt_to_repeat.strip()


@check("copy:copying_multiple")
def copying_multiple(text: str, prompt_to_repeat: str, N: int) -> bool:
    copies = text.split("******")
    return len(copies) == N and all(c.strip() == prompt_to_repeat.strip() for c in copies)


@check("punctuation:punctuation_dot")
def no_dot(text: str) -> bool:
    return "." not in text


@check("punctuation:punctuation_exclamation")
def no_exclamation(text: str) -> bool:
    return "!" not in text


@check("count:lowercase_counting")
def lowercase_counting(text: str, N: int) -> bool:
    return len(re.findall(r"\b[a-z]+\b", text)) <= N


@check("letters:letter_counting")
def letter_counting(text: str, N: int, relation: str) -> bool:
    # This one checker never validates its relation in open-instruct: an unknown one just fails.
    if relation not in RELATIONS:
        return False
    return compare(len(re.findall(r"[a-zA-Z]", text)), relation, N)


@check("count:counting_composition")
def counting_composition(text: str, n_sent: int, n_words: int) -> bool:
    paragraphs = _split_stars(text)
    if paragraphs is None or len(paragraphs) != 3:
        return False
    for paragraph in paragraphs:
        sentences = split_sentences(paragraph)
        if len(sentences) != n_sent or any(len(words(s)) != n_words for s in sentences):
            return False
    return True


@check("count:count_unique")
def count_unique(text: str) -> bool:
    lowered = [w.lower() for w in words(text)]
    return bool(lowered) and len(lowered) == len(set(lowered))


@check("count:count_increment_word")
def count_increment_word(text: str, keyword1: str, keyword2: str) -> bool:
    return count_sub(text, keyword1) == 1 and count_sub(text, keyword2) == 2


@check("keywords:palindrome")
def palindrome(text: str) -> bool:
    return any(w == w[::-1] for w in text.lower().split())


@check("keywords:keyword_specific_position")
def keyword_specific_position(text: str, keyword: str, n: int, m: int) -> bool:
    sentences = split_sentences(text)
    if not 1 <= n <= len(sentences):
        return False
    sentence_words = words(sentences[n - 1])
    return 1 <= m <= len(sentence_words) and sentence_words[m - 1].lower() == keyword.lower()


@check("keywords:start_end")
def start_end(text: str) -> bool:
    # Punctuation tokens count here: the instruction forbids anything after the last word.
    tokens = word_tokens(text)
    return len(tokens) >= 2 and tokens[0].lower() == tokens[-1].lower()
