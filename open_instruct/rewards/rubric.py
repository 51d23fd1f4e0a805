"""`rubric` verifier: an LLM judge grades the response against each rubric of the row, weighted.

Rows carry a JSON ground truth `{"query": ..., "rubrics": [{"description": ..., "weight": w, "title": ...}]}`
(open-instruct's format; `Question`, `rubric_item` and `Ingredient` are accepted spellings, and a one-element
list around it is unwrapped). Each rubric is one judge call on the OpenAI-compatible endpoint of the
general-* judges, made concurrently; the judge answers `{"score": s}` with s in 0..2. The score is
Σ (s/2)·w / Σ |w|: negative-weight rubrics (flaws) pull it below 0. The graded text is the last
`<answer>...</answer>` block when there is one, else the whole response.

The judge model is $RUBRIC_JUDGE_MODEL, else --llm_judge_model. A rubric whose call fails scores 0 and
keeps its weight (counted in the details); when every call fails the verifier raises, so the reward
pool records reward 0 and a verifier error.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult
from open_instruct.rewards.llm_judge import ask_judge

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SCORE = re.compile(r'"?score"?\s*[:=]\s*"?(-?\d+(?:\.\d+)?)', re.IGNORECASE)
_DESCRIPTION_KEYS = ("description", "rubric_item", "Ingredient")


def parse_rubric_truth(ground_truth: Any) -> dict[str, Any]:
    """{"query": str, "rubrics": [{"description", "weight", "title"}], ...other keys kept}; raises ValueError."""
    if isinstance(ground_truth, (list, tuple)) and len(ground_truth) == 1:
        ground_truth = ground_truth[0]
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(truth, dict) or not isinstance(truth.get("rubrics"), list):
        raise ValueError(
            f"a rubric ground truth is a JSON object with a 'rubrics' list, got {str(ground_truth)[:120]!r}"
        )
    rubrics = []
    for item in truth["rubrics"]:
        description = next((item[k] for k in _DESCRIPTION_KEYS if isinstance(item, dict) and item.get(k)), "")
        if not description:
            raise ValueError(f"rubric without a description: {item!r}")
        rubrics.append({**item, "description": str(description), "weight": float(item.get("weight", 1.0))})
    return {**truth, "query": str(truth.get("query", truth.get("Question", ""))), "rubrics": rubrics}


def graded_text(response: str) -> str:
    answers = _ANSWER.findall(response)
    return answers[-1].strip() if answers else response


def criterion_prompt(query: str, response: str, description: str) -> str:
    return (
        "You grade one response against one criterion only. Give 2 when the response fully meets it, 1 when "
        "partly, 0 when not (for a criterion that describes a flaw: 2 when the response has the flaw).\n\n"
        f"<question>{query}</question>\n<response>{response}</response>\n<criterion>{description}</criterion>\n\n"
        'Reply with JSON only: {"score": <0, 1 or 2>}'
    )


def parse_criterion_score(text: str) -> float:
    """The judge's 0..2 score scaled to [0, 1]; raises ValueError when the reply has none."""
    match = _SCORE.search(text)
    if match is None:
        raise ValueError(f"the rubric judge's reply has no score: {text[:200]!r}")
    return min(2.0, max(0.0, float(match.group(1)))) / 2.0


def judge_settings(settings: RewardSettings) -> RewardSettings:
    model = os.environ.get("RUBRIC_JUDGE_MODEL") or settings.reward.llm_judge_model
    return replace(settings, reward=replace(settings.reward, llm_judge_model=model))


@register_verifier("rubric")
def rubric(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    truth = parse_rubric_truth(inp.ground_truth)
    if not truth["rubrics"]:
        return VerifierResult(score=0.0, details={"rubrics": 0})
    query, response, judge = truth["query"] or inp.query, graded_text(inp.prediction), judge_settings(settings)

    def grade(item: dict) -> float | str:
        try:
            return parse_criterion_score(ask_judge(criterion_prompt(query, response, item["description"]), judge))
        except Exception as error:  # one failed criterion scores 0; all failing is the verifier's error
            return f"{type(error).__name__}: {error}"

    with ThreadPoolExecutor(max_workers=min(8, len(truth["rubrics"]))) as pool:
        grades = list(pool.map(grade, truth["rubrics"]))
    failures = [g for g in grades if isinstance(g, str)]
    if len(failures) == len(grades):
        raise RuntimeError(f"every rubric judge call failed, e.g. {failures[0]}")
    weights = [item["weight"] for item in truth["rubrics"]]
    total = sum(abs(w) for w in weights) or 1.0
    score = sum((0.0 if isinstance(g, str) else g) * w for g, w in zip(grades, weights)) / total
    return VerifierResult(score=score, details={"rubrics": len(grades), "failed": len(failures)})
