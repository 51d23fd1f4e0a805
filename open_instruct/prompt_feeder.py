"""Admission of prompts into generation, under the staleness bound, plus delivery accounting.

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

`DeliveryLedger` checks the "nothing lost" promise: every admitted prompt yields exactly
`num_samples` Completions, no sample is delivered twice, and it can name the prompts an
engine had in flight. Pure logic; no Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from dataclasses import dataclass

from open_instruct.messages import Completion, PromptRequest, SamplingSettings


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
        s = self.state
        if s.requeued:
            again, *rest = s.requeued
            self.state = dataclasses.replace(s, requeued=tuple(rest), admitted=s.admitted + 1)
            return self._request(self.rows[row_id(again)], _readmitted_id(again), learner_version, queued_at)
        epoch, position, excluded = s.epoch, s.position, s.excluded
        if position == len(self._order):
            epoch, position, excluded = epoch + 1, 0, s.solved  # solved prompts leave from the reshuffle on
            self._order = self._epoch_order(epoch, excluded)
        row = self.prompts[self._order[position]]
        self.state = dataclasses.replace(
            s, epoch=epoch, position=position + 1, admitted=s.admitted + 1, excluded=excluded
        )
        return self._request(row, f"{row.prompt_id}@{epoch}", learner_version, queued_at)

    def _request(self, row, prompt_id: str, learner_version: int, queued_at: float) -> PromptRequest:
        request = make_request(
            row, prompt_id, self.sampling, self.samples_per_prompt, self.seed, learner_version, queued_at=queued_at
        )
        override = self.ground_truth_overrides.get(row.prompt_id)
        return request if override is None else dataclasses.replace(request, ground_truths=override)


def _readmitted_id(prompt_id: str) -> str:
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


class DeliveryError(RuntimeError):
    pass


class DeliveryLedger:
    """Holds only prompts still owed samples: a long run admits millions, so a complete prompt is forgotten
    (its totals stay in `counts`). The exception is a prompt taken off a failed engine (`reassign`): its
    resubmitted samples may be generated twice, and `has` must still recognise the second copy; those are
    kept, at most the prompts in flight at each engine restart."""

    def __init__(self) -> None:
        # The sample indices owed per prompt, while tracked: all of them, or a resumed group's missing ones.
        self.expected: dict[str, frozenset[int]] = {}
        self.delivered: dict[str, set[int]] = {}
        self.engine_of: dict[str, int] = {}
        self.reassigned: set[str] = set()  # taken off a failed engine: samples may arrive twice (`has`)
        self.errors = 0
        self._admitted = self._expected_samples = self._delivered_samples = 0

    def admit(self, request: PromptRequest) -> None:
        # A complete prompt is forgotten, so this catches a second admission only while the first is tracked;
        # prompt ids are unique by construction (epoch and re-admission suffixes).
        if request.prompt_id in self.expected:
            raise DeliveryError(f"prompt {request.prompt_id} admitted twice")
        owed = frozenset(request.samples_to_generate())
        self.expected[request.prompt_id] = owed
        self.delivered[request.prompt_id] = set()
        self._admitted += 1
        self._expected_samples += len(owed)

    def started(self, prompt_id: str, engine_id: int) -> None:
        if prompt_id in self.expected:  # an announcement never brings back a forgotten prompt
            self.engine_of[prompt_id] = engine_id

    def reassign(self, prompt_id: str) -> None:
        """`prompt_id` leaves its engine (which failed) for another: keep its record once it completes."""
        self.engine_of.pop(prompt_id, None)
        if prompt_id in self.expected:
            self.reassigned.add(prompt_id)

    def deliver(self, completion: Completion) -> bool:
        """Record one sample; True when it completes its prompt's group."""
        owed = self.expected.get(completion.prompt_id)
        if owed is None:
            raise DeliveryError(f"completion for unknown prompt {completion.prompt_id} (or one already complete)")
        samples = self.delivered[completion.prompt_id]
        if completion.sample_index in samples or completion.sample_index not in owed:
            raise DeliveryError(
                f"sample {completion.sample_index} of {completion.prompt_id} delivered twice or out of range"
            )
        samples.add(completion.sample_index)
        self._delivered_samples += 1
        self.errors += completion.finish_reason == "error"
        complete = len(samples) == len(owed)
        if complete and completion.prompt_id not in self.reassigned:
            self._forget(completion.prompt_id)
        return complete

    def _forget(self, prompt_id: str) -> None:
        del self.expected[prompt_id], self.delivered[prompt_id]
        self.engine_of.pop(prompt_id, None)

    def has(self, prompt_id: str, sample_index: int) -> bool:
        return sample_index in self.delivered.get(prompt_id, ())

    def in_flight(self, engine_id: int | None = None) -> list[str]:
        """Admitted prompts with samples still missing (optionally: pulled by one engine)."""
        return sorted(
            prompt_id
            for prompt_id, owed in self.expected.items()
            if len(self.delivered.get(prompt_id, ())) < len(owed)
            and (engine_id is None or self.engine_of.get(prompt_id) == engine_id)
        )

    def counts(self) -> dict[str, int]:
        """Totals over the whole run, forgotten prompts included."""
        return {
            "admitted_prompts": self._admitted,
            "expected_samples": self._expected_samples,
            "delivered_samples": self._delivered_samples,
            "error_samples": self.errors,
        }

    def check_complete(self) -> None:
        """Raise, naming prompts, unless every admitted prompt got all its samples."""
        missing = self.in_flight()
        if missing:
            c = self.counts()
            raise DeliveryError(
                f"{c['delivered_samples']} of {c['expected_samples']} samples delivered; "
                f"{len(missing)} prompts incomplete, e.g. {missing[:5]}"
            )
