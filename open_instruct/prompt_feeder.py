"""Admission of prompts into generation, under the staleness bound, plus delivery accounting.

`PromptFeeder` walks the training prompts epoch by epoch (shuffled per epoch with the run
seed) and admits at most `(learner_version + async_steps + 1) x prompts_per_step` prompts in
total: generation can run at most `async_steps` optimizer steps ahead of the learner. Each
admission is stamped with the learner version it was admitted under (which also salts the
engines' prefix cache). Prompt ids carry the epoch, so they are unique across epochs and,
because the walk is reproducible from `FeederState`, across restarts.

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
from collections import defaultdict
from dataclasses import dataclass

from open_instruct.messages import Completion, PromptRequest, SamplingSettings


@dataclass(frozen=True)
class FeederState:
    """Everything needed to continue the admission sequence after a restart."""

    epoch: int = 0
    position: int = 0  # next index into this epoch's shuffled order
    admitted: int = 0  # prompts admitted so far (all epochs)


def request_seed(run_seed: int, prompt_id: str) -> int:
    """A per-prompt sampling seed that does not depend on admission order or engine."""
    digest = hashlib.blake2b(f"{run_seed}/{prompt_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x3FFFFFFF


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
    ):
        if not prompts:
            raise ValueError("no training prompts to feed")
        self.prompts = prompts
        self.prompts_per_step = prompts_per_step
        self.samples_per_prompt = samples_per_prompt
        self.async_steps = async_steps
        self.sampling = sampling
        self.seed = seed
        self.state = state or FeederState()
        self._order = self._epoch_order(self.state.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def limit(self, learner_version: int) -> int:
        """Total admissions allowed while the learner is at `learner_version`."""
        return (learner_version + self.async_steps + 1) * self.prompts_per_step

    def admissible(self, learner_version: int) -> int:
        return max(0, self.limit(learner_version) - self.state.admitted)

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
        epoch, position = self.state.epoch, self.state.position
        if position == len(self._order):
            epoch, position = epoch + 1, 0
            self._order = self._epoch_order(epoch)
        row = self.prompts[self._order[position]]
        self.state = FeederState(epoch=epoch, position=position + 1, admitted=self.state.admitted + 1)
        return make_request(
            row,
            f"{row.prompt_id}@{epoch}",
            self.sampling,
            self.samples_per_prompt,
            self.seed,
            learner_version,
            queued_at=queued_at,
        )


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
    def __init__(self) -> None:
        self.expected: dict[str, int] = {}
        self.delivered: dict[str, set[int]] = defaultdict(set)
        self.engine_of: dict[str, int] = {}
        self.errors = 0

    def admit(self, request: PromptRequest) -> None:
        if request.prompt_id in self.expected:
            raise DeliveryError(f"prompt {request.prompt_id} admitted twice")
        self.expected[request.prompt_id] = request.num_samples

    def started(self, prompt_id: str, engine_id: int) -> None:
        self.engine_of[prompt_id] = engine_id

    def deliver(self, completion: Completion) -> bool:
        """Record one sample; True when it completes its prompt's group."""
        expected = self.expected.get(completion.prompt_id)
        if expected is None:
            raise DeliveryError(f"completion for unknown prompt {completion.prompt_id}")
        samples = self.delivered[completion.prompt_id]
        if completion.sample_index in samples or not 0 <= completion.sample_index < expected:
            raise DeliveryError(
                f"sample {completion.sample_index} of {completion.prompt_id} delivered twice or out of range"
            )
        samples.add(completion.sample_index)
        self.errors += completion.finish_reason == "error"
        return len(samples) == expected

    def in_flight(self, engine_id: int | None = None) -> list[str]:
        """Admitted prompts with samples still missing (optionally: pulled by one engine)."""
        return sorted(
            prompt_id
            for prompt_id, n in self.expected.items()
            if len(self.delivered.get(prompt_id, ())) < n
            and (engine_id is None or self.engine_of.get(prompt_id) == engine_id)
        )

    def counts(self) -> dict[str, int]:
        return {
            "admitted_prompts": len(self.expected),
            "expected_samples": sum(self.expected.values()),
            "delivered_samples": sum(len(s) for s in self.delivered.values()),
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
