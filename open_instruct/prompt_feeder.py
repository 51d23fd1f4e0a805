"""Admission of prompts into generation, under the staleness bound.

`PromptFeeder` walks the training prompts epoch by epoch (shuffled per epoch with the run
seed) and admits at most `(learner_version + async_steps + 1) x prompts_per_step + refills`
prompts in total: generation runs at most `async_steps` optimizer steps ahead of the learner.
`refills` are replacements for groups that will never be trained (dropped for zero reward spread
or staleness): each one is granted explicitly (`grant_refill`, or `requeue` to admit the same
prompt again), so replacements never let the run outrun the learner. Each admission is stamped
with the learner version it was admitted under (which also salts the engines' prefix cache).
Prompt ids carry the epoch (and a `+k` suffix for the k-th re-admission of a requeued prompt), so
they are unique across epochs and, because the walk is reproducible from `FeederState`, across
restarts. Prompts that reached `--no_resampling_pass_rate` (`record_pass_rate`) leave the order
from the next epoch on.
Pure logic; no Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from dataclasses import dataclass

from open_instruct.messages import PromptRequest, SamplingSettings


@dataclass(frozen=True)
class FeederState:
    """Everything needed to continue the admission sequence after a restart."""

    epoch: int = 0
    position: int = 0  # next index into this epoch's shuffled order
    admitted: int = 0  # prompts admitted so far (all epochs, re-admissions included)
    refills: int = 0  # admissions granted beyond the lookahead, to replace groups never trained
    requeued: tuple[str, ...] = ()  # prompt ids to admit again, fresh, before new ones
    solved: frozenset[str] = frozenset()  # row ids at or above --no_resampling_pass_rate
    excluded: frozenset[str] = frozenset()  # row ids left out of the current epoch's order


def request_seed(run_seed: int, prompt_id: str) -> int:
    """A per-prompt sampling seed that does not depend on admission order or engine."""
    digest = hashlib.blake2b(f"{run_seed}/{prompt_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x3FFFFFFF


def row_id(prompt_id: str) -> str:
    """The dataset row of an admitted prompt id ("<row id>@<epoch>[+<k>]")."""
    return prompt_id.rsplit("@", 1)[0]


class PromptFeeder:
    def __init__(
        self,
        prompts: list,  # data.PromptRow
        *,
        prompts_per_step: int,
        samples_per_prompt: int,
        async_steps: int,
        sampling: SamplingSettings,
        seed: int,
        state: FeederState | None = None,
        pass_rate_threshold: float | None = None,
        order_seed: int | None = None,
    ):
        if not prompts:
            raise ValueError("no training prompts to feed")
        self.prompts = prompts
        self.rows = {row.prompt_id: row for row in prompts}
        self.prompts_per_step = prompts_per_step
        self.samples_per_prompt = samples_per_prompt
        self.async_steps = async_steps  # the loop moves it with `--async_steps auto`
        self.sampling = sampling
        self.seed = seed
        self.order_seed = seed if order_seed is None else order_seed  # --data_loader_seed
        self.pass_rate_threshold = pass_rate_threshold
        self.state = state or FeederState()
        self._order = self._epoch_order(self.state.epoch, self.state.excluded)
        # Row id -> ground truths that replace the row's in its next requests (evolving rubrics rewrite them).
        self.ground_truth_overrides: dict[str, tuple] = {}

    def _epoch_order(self, epoch: int, excluded: frozenset[str]) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.order_seed * 1_000_003 + epoch).shuffle(order)
        kept = [i for i in order if self.prompts[i].prompt_id not in excluded]
        if not kept:
            raise RuntimeError(
                f"every training prompt reached --no_resampling_pass_rate {self.pass_rate_threshold}: "
                f"nothing is left to admit in epoch {epoch}; lower the rate or add data"
            )
        return kept

    def limit(self, learner_version: int) -> int:
        """Total admissions allowed while the learner is at `learner_version`."""
        return (learner_version + self.async_steps + 1) * self.prompts_per_step + self.state.refills

    def admissible(self, learner_version: int) -> int:
        return max(0, self.limit(learner_version) - self.state.admitted)

    def grant_refill(self, count: int = 1) -> None:
        """Allow `count` more admissions: replacements for groups that will never be trained."""
        self.state = dataclasses.replace(self.state, refills=self.state.refills + count)

    def requeue(self, prompt_id: str) -> None:
        """Admit `prompt_id`'s row again, fresh (next, before new prompts), in place of its dropped group."""
        self.state = dataclasses.replace(
            self.state, refills=self.state.refills + 1, requeued=(*self.state.requeued, prompt_id)
        )

    def record_pass_rate(self, prompt_id: str, rate: float) -> None:
        """A trained (or zero-spread) group's mean reward / max reward; solved rows leave later epochs."""
        if self.pass_rate_threshold is not None and rate >= self.pass_rate_threshold:
            self.state = dataclasses.replace(self.state, solved=self.state.solved | {row_id(prompt_id)})

    def admit(
        self, learner_version: int, max_count: int | None = None, now: float | None = None
    ) -> list[PromptRequest]:
        """The prompts admissible now, stamped with `learner_version` and `now` (default: the wall clock)."""
        count = self.admissible(learner_version)
        if max_count is not None:
            count = min(count, max_count)
        queued_at = time.time() if now is None else now
        return [self._next(learner_version, queued_at) for _ in range(count)]

    def _next(self, learner_version: int, queued_at: float) -> PromptRequest:
        state = self.state
        if state.requeued:
            again, *rest = state.requeued
            self.state = dataclasses.replace(state, requeued=tuple(rest), admitted=state.admitted + 1)
            return self._request(self.rows[row_id(again)], readmitted_id(again), learner_version, queued_at)
        epoch, position, excluded = state.epoch, state.position, state.excluded
        if position == len(self._order):
            epoch, position, excluded = epoch + 1, 0, state.solved  # solved prompts leave from the reshuffle on
            self._order = self._epoch_order(epoch, excluded)
        row = self.prompts[self._order[position]]
        self.state = dataclasses.replace(
            state, epoch=epoch, position=position + 1, admitted=state.admitted + 1, excluded=excluded
        )
        return self._request(row, f"{row.prompt_id}@{epoch}", learner_version, queued_at)

    def _request(self, row, prompt_id: str, learner_version: int, queued_at: float) -> PromptRequest:
        request = make_request(
            row, prompt_id, self.sampling, self.samples_per_prompt, self.seed, learner_version, queued_at=queued_at
        )
        override = self.ground_truth_overrides.get(row.prompt_id)
        return request if override is None else dataclasses.replace(request, ground_truths=override)


def readmitted_id(prompt_id: str) -> str:
    """ "row@0" -> "row@0+1" -> "row@0+2": each re-admission is a new, unique prompt id."""
    base, _, count = prompt_id.rpartition("+")
    if base and count.isdigit():
        return f"{base}+{int(count) + 1}"
    return f"{prompt_id}+1"


def make_request(
    row,
    prompt_id: str,
    sampling: SamplingSettings,
    num_samples: int,
    seed: int,
    version: int,
    is_eval: bool = False,
    queued_at: float | None = None,
) -> PromptRequest:
    return PromptRequest(
        prompt_id=prompt_id,
        prompt_token_ids=row.prompt_token_ids,
        ground_truths=row.ground_truths,
        verifier_names=row.verifier_names,
        sampling=sampling,
        num_samples=num_samples,
        seed=request_seed(seed, prompt_id),
        admitted_version=version,
        is_eval=is_eval,
        queued_at=time.time() if queued_at is None else queued_at,
        agent=getattr(row, "agent", None),
    )


def record_prompts(path: str, requests: list[PromptRequest]) -> None:
    """One JSON line per admitted prompt: what a replay benchmark needs to regenerate it."""
    with open(path, "a") as f:
        for r in requests:
            record = {
                "prompt_id": r.prompt_id,
                "prompt_token_ids": list(r.prompt_token_ids),
                "num_samples": r.num_samples,
                "seed": r.seed,
                "admitted_version": r.admitted_version,
                "queued_at": r.queued_at,
                "sampling": dataclasses.asdict(r.sampling),
            }
            f.write(json.dumps(record) + "\n")
