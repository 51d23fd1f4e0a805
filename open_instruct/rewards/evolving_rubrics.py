"""Evolving rubrics (--apply_evolving_rubric_reward): after each training step an LLM reads each prompt's
responses and writes new rubrics that tell the good ones from the bad; later requests for that prompt are
graded with them.

Only groups graded by the `rubric` verifier take part (rewards/rubric.py scores them). Per query the
book keeps the dataset's own rubrics (persistent, never capped), the active evolving ones (at most
--max_active_rubrics; the oldest retire first and never come back) and the retired ones: all counted,
only the newest `RETIRED_KEPT` kept (all of them would grow the book every step). A prompt's new ground
truth is its row's with `rubrics` = persistent + active and a parallel `rubrics_types`; requests admitted
afterwards carry it, samples in flight keep the one they were admitted with, and eval prompts always use
the dataset's.

The generation model is $RUBRIC_GENERATION_MODEL, else --llm_judge_model, on the judge endpoint;
$RUBRIC_GENERATION_EXTRA_BODY (else $LLM_JUDGE_EXTRA_BODY) is merged into its requests. A call that
fails or replies without usable JSON skips that prompt for the step (counted). The book is part of
the resumable state (open-instruct loses it on resume). --cache_evolving_rubric_data_dir receives
one JSON file per step with the prompts' responses, the replies and the rubrics written.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from open_instruct.extensions import verifier_key
from open_instruct.prompt_feeder import row_id
from open_instruct.rewards import RewardSettings
from open_instruct.rewards.llm_judge import ask_judge
from open_instruct.rewards.rubric import parse_rubric_truth

RUBRIC_VERIFIER = "rubric"
RETIRED_KEPT = 32  # retired rubrics kept per query (the newest): they never come back, so only their count matters


@dataclass
class QueryRubrics:
    persistent: list[dict]
    active: list[dict] = field(default_factory=list)
    retired: list[dict] = field(default_factory=list)  # the newest RETIRED_KEPT of them
    retired_total: int = 0


@dataclass(frozen=True)
class RubricGroup:
    """One trained group whose row is graded by the rubric verifier."""

    row_id: str  # the dataset row (the prompt id without its epoch suffix)
    ground_truths: tuple[Any, ...]  # the row's labels as admitted, one per verifier
    verifier_index: int  # which label is the rubric verifier's
    responses: tuple[str, ...]


def generation_prompt(query: str, responses: Sequence[str], active: Sequence[dict]) -> str:
    shown = "".join(f"Response {i + 1}:\n{text}\n\n" for i, text in enumerate(responses))
    existing = json.dumps([{"title": r.get("title", ""), "description": r["description"]} for r in active])
    return (
        "You write grading rubrics for a question from several responses to it. Find the criteria that best "
        "separate the stronger responses from the weaker ones and that the existing rubrics do not already "
        "cover. Positive rubrics describe what excellent answers do; negative rubrics describe real mistakes "
        "(something a response does wrong, not something it leaves out). Each rubric has a short general "
        "title and a precise description. Write between 1 and 5 rubrics in all, none mirroring another; "
        "return empty lists when the existing rubrics already cover what matters.\n\n"
        f"Question: {query}\n\nResponses:\n{shown}Existing rubrics:\n{existing}\n\n"
        'Reply with JSON only: {"positive_rubrics": [{"title": "...", "description": "..."}], '
        '"negative_rubrics": [{"title": "...", "description": "..."}]}'
    )


def parse_generated(text: str) -> list[dict] | None:
    """The new rubrics (positive weight 1, negative -1), or None when the reply has no usable JSON."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        reply = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    rubrics = []
    for key, weight in (("positive_rubrics", 1.0), ("negative_rubrics", -1.0)):
        items = reply.get(key, []) if isinstance(reply, dict) else None
        if not isinstance(items, list):
            return None
        for item in items:
            if not isinstance(item, dict) or not str(item.get("description", "")).strip():
                return None
            rubrics.append(
                {"description": str(item["description"]).strip(), "weight": weight, "title": str(item.get("title", ""))}
            )
    return rubrics


class RubricBook:
    """Rubrics per query: the dataset's, the active evolving ones (FIFO-capped) and the retired ones."""

    def __init__(self, max_active: int, queries: dict[str, QueryRubrics] | None = None):
        self.max_active = max_active
        self.queries: dict[str, QueryRubrics] = queries if queries is not None else {}
        for entry in self.queries.values():  # a state saved before retired_total existed kept every retired one
            entry.retired_total = max(entry.retired_total, len(entry.retired))

    def entry(self, truth: dict) -> QueryRubrics:
        return self.queries.setdefault(truth["query"], QueryRubrics(persistent=list(truth["rubrics"])))

    def add(self, truth: dict, new: list[dict]) -> None:
        entry = self.entry(truth)
        entry.active += new
        overflow = len(entry.active) - self.max_active
        if overflow > 0:
            entry.retired = (entry.retired + entry.active[:overflow])[-RETIRED_KEPT:]
            entry.retired_total += overflow
            entry.active = entry.active[overflow:]

    def ground_truth(self, truth: dict) -> str:
        entry = self.entry(truth)
        rubrics = entry.persistent + entry.active
        types = ["persistent"] * len(entry.persistent) + ["evolving"] * len(entry.active)
        return json.dumps({**truth, "rubrics": rubrics, "rubrics_types": types})

    def totals(self) -> dict[str, float]:
        entries = self.queries.values()
        return {
            "evolving_rubrics/total_active": float(sum(len(e.active) for e in entries)),
            "evolving_rubrics/total_retired": float(sum(e.retired_total for e in entries)),
            "evolving_rubrics/total_persistent": float(sum(len(e.persistent) for e in entries)),
        }


class EvolvingRubrics:
    """The per-step update: one generation call per rubric-graded group, then new ground truths per row."""

    def __init__(
        self,
        max_active: int,
        generate: Callable[[str], str],
        dump_dir: str | None = None,
        state: dict[str, QueryRubrics] | None = None,
    ):
        self.book = RubricBook(max_active, state)
        self.generate = generate
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.overrides: dict[str, tuple[Any, ...]] = {}  # row id -> ground truths for its next requests

    @classmethod
    def from_config(cls, cfg, state: dict[str, QueryRubrics] | None = None) -> EvolvingRubrics:
        settings = generation_settings(RewardSettings.from_config(cfg))
        reward = cfg.reward

        def generate(prompt: str) -> str:
            return ask_judge(prompt, settings)

        return cls(reward.max_active_rubrics, generate, reward.cache_evolving_rubric_data_dir, state)

    def step(self, groups: Sequence[RubricGroup], step: int) -> dict[str, float]:
        truths = [parse_rubric_truth(g.ground_truths[g.verifier_index]) for g in groups]
        prompts = [
            generation_prompt(t["query"], g.responses, self.book.entry(t).active) for g, t in zip(groups, truths)
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(prompts)))) as pool:
            replies = list(pool.map(self._ask, prompts))
        written = [parse_generated(reply) if reply is not None else None for reply in replies]
        updated_rows = 0
        for truth, new in zip(truths, written):
            if new is None:
                continue
            self.book.add(truth, new)
            updated_rows += 1
        for group, truth in zip(groups, truths):  # every row of an updated query sees the same rubrics
            labels = list(group.ground_truths)
            labels[group.verifier_index] = self.book.ground_truth(truth)
            self.overrides[group.row_id] = tuple(labels)
        if self.dump_dir is not None:
            self._dump(step, groups, truths, replies, written)
        usable = [new for new in written if new is not None]
        return {
            "evolving_rubrics/groups": float(len(groups)),
            "evolving_rubrics/skipped": float(len(groups) - updated_rows),
            "evolving_rubrics/valid_rate": updated_rows / len(groups) if groups else 0.0,
            "evolving_rubrics/num_new_rubrics": sum(map(len, usable)) / len(usable) if usable else 0.0,
            "evolving_rubrics/num_overrides": float(len(self.overrides)),
            **self.book.totals(),
        }

    def _ask(self, prompt: str) -> str | None:
        try:
            return self.generate(prompt)
        except Exception:  # an unreachable or failing model skips this group for the step (counted)
            return None

    def _dump(self, step: int, groups, truths, replies, written) -> None:
        record = {
            "training_step": step,
            "timestamp": time.time(),
            "groups": [
                {"row_id": g.row_id, "query": t["query"], "responses": list(g.responses), "reply": r, "rubrics": w}
                for g, t, r, w in zip(groups, truths, replies, written)
            ],
        }
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        path = self.dump_dir / f"evolving_rubrics_step{step}_{os.getpid()}.json"
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(record, indent=1))
        staging.rename(path)


def generation_settings(settings: RewardSettings) -> RewardSettings:
    extra = os.environ.get("RUBRIC_GENERATION_EXTRA_BODY", settings.judge_extra_body)
    model = os.environ.get("RUBRIC_GENERATION_MODEL") or settings.reward.llm_judge_model
    reward = replace(settings.reward, llm_judge_model=model, llm_judge_temperature=0.0)
    return replace(settings, reward=reward, judge_extra_body=extra)


def rubric_groups(groups, requests: dict) -> list[RubricGroup]:
    """The trained groups graded by the rubric verifier, with their requests' labels (`requests`: prompt id ->
    PromptRequest as admitted)."""
    picked = []
    for group in groups:
        request = requests.get(group.prompt_id)
        names = [verifier_key(name) for name in (request.verifier_names if request else ())]
        if RUBRIC_VERIFIER not in names:
            continue
        picked.append(
            RubricGroup(
                row_id=row_id(group.prompt_id),
                ground_truths=tuple(request.ground_truths),
                verifier_index=names.index(RUBRIC_VERIFIER),
                responses=tuple(c.response_text for c in group.completions),
            )
        )
    return picked
