"""String-comparison verifiers: `string_f1`, `string_matcher`, `flan`, `puzzle`, `re_search` and `re_search_f1`.

All four compare a piece of the response with a reference after SQuAD-style normalisation
(lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace):

- `string_f1`: token F1 of the answer-side text (think block removed) against the reference;
  a list of references scores the best one.
- `string_matcher`: exact match of the text inside the last `<answer>...</answer>`; 0 when the
  tags are missing, so it also rewards the answer format.
- `flan`: exact match of the text after the last "The answer is: ".
- `puzzle`: exact match of the whole answer-side text.
- `re_search` (Search-R1): exact match of the first `<finish>...</finish>` span (tags in any case)
  against any reference.
- `re_search_f1` (ReSearch): token F1 of the text closed by `</finish>` after the last `<finish>`; a
  response in that format whose F1 is 0 still scores 0.1.

The two search verifiers read a string label as JSON when it parses (a list is a list of references),
as the search datasets store them.

`remove_thinking` and `normalize_text` are shared with the ifeval verifiers.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from typing import Any

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult

_PUNCT_TABLE = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def remove_thinking(text: str) -> str:
    """The answer-side text: after the last `</think>`, without answer tags or the chat role marker.

    Responses from the `tulu_thinker` template start inside the think block, so only the closing
    tag is reliable; text without any `</think>` is taken whole.
    """
    text = text.replace("<|assistant|>", "")
    text = text.rsplit("</think>", 1)[-1]
    return text.replace("<answer>", "").replace("</answer>", "").strip()


def normalize_text(text: str) -> str:
    """SQuAD answer normalisation: lower-case, drop punctuation, drop articles, collapse spaces."""
    text = text.lower().translate(_PUNCT_TABLE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _normalize_label(text: str) -> str:
    # A one-letter multiple-choice gold such as "A" is itself an article and would normalise to "",
    # which any empty-ish answer ("the", "(A)") would then match. Keep articles in that case.
    normalized = normalize_text(text)
    if normalized:
        return normalized
    return " ".join(text.lower().translate(_PUNCT_TABLE).split())


def token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 over normalised bags of words (clipped counts); 0 if either side is empty."""
    pred_tokens = _normalize_label(prediction).split()
    ref_tokens = _normalize_label(reference).split()
    overlap = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> bool:
    ref = _normalize_label(reference)
    return bool(ref) and _normalize_label(prediction) == ref


def as_label_list(ground_truth: Any) -> list[str]:
    """Labels arrive as a string or a list of strings (the list-typed dataset variants)."""
    if isinstance(ground_truth, (list, tuple)):
        return [str(label) for label in ground_truth if label is not None]
    if ground_truth is None:
        return []
    return [str(ground_truth)]


@register_verifier("string_f1")
def string_f1(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    answer = remove_thinking(inp.prediction)
    labels = as_label_list(inp.ground_truth)
    scores = [token_f1(answer, label) for label in labels]
    return VerifierResult(score=max(scores, default=0.0), extracted=answer)


@register_verifier("string_matcher")
def string_matcher(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    _, opened, tail = inp.prediction.rpartition("<answer>")
    answer, closed, _ = tail.partition("</answer>")
    if not (opened and closed):
        return VerifierResult(score=0.0, details={"reason": "no <answer>...</answer> span"})
    hit = any(exact_match(answer, label) for label in as_label_list(inp.ground_truth))
    return VerifierResult(score=float(hit), extracted=answer.strip())


@register_verifier("flan")
def flan(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    answer = inp.prediction.rsplit("The answer is: ", 1)[-1].strip()
    hit = any(exact_match(answer, label) for label in as_label_list(inp.ground_truth))
    return VerifierResult(score=float(hit), extracted=answer)


@register_verifier("puzzle")
def puzzle(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    answer = remove_thinking(inp.prediction)
    hit = any(exact_match(answer, label) for label in as_label_list(inp.ground_truth))
    return VerifierResult(score=float(hit), extracted=answer)


_FINISH = re.compile(r"<finish>(.*?)</finish>", re.IGNORECASE | re.DOTALL)


def _json_label(ground_truth: Any) -> Any:
    """The search datasets store labels JSON-encoded; a label that is not JSON is taken as text."""
    if not isinstance(ground_truth, str):
        return ground_truth
    try:
        return json.loads(ground_truth)
    except json.JSONDecodeError:
        return ground_truth.strip()


def _squad_f1(prediction: str, reference: str) -> float:
    # Plain SQuAD normalisation on both sides (no one-letter exception): these verifiers score free text.
    pred_tokens, ref_tokens = normalize_text(prediction).split(), normalize_text(reference).split()
    overlap = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


@register_verifier("re_search")
def re_search(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    label = _json_label(inp.ground_truth)
    labels = label if isinstance(label, list) else [label]
    match = _FINISH.search(inp.prediction)
    answer = match.group(1).strip() if match else ""
    if not answer:
        return VerifierResult(score=0.0, details={"reason": "no non-empty <finish>...</finish> span"})
    hit = any(normalize_text(answer) == normalize_text(str(ref)) for ref in labels)
    return VerifierResult(score=float(hit), extracted=answer)


@register_verifier("re_search_f1")
def re_search_f1(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    text = inp.prediction
    if "<finish>" not in text and "</finish>" not in text:
        return VerifierResult(score=0.0, details={"reason": "no <finish> tag"})
    answer = text.rsplit("<finish>", 1)[-1].split("</finish>", 1)[0]
    if not answer:
        return VerifierResult(score=0.0, details={"reason": "empty <finish> span"})
    label = _json_label(inp.ground_truth)
    labels = label if isinstance(label, list) else [label]
    f1 = max((_squad_f1(answer, str(ref)) for ref in labels), default=0.0)
    # The format is rewarded a little even when the answer shares no token with the reference.
    return VerifierResult(score=f1 if f1 > 0 else 0.1, extracted=answer)
