"""The "nothing lost" promise, checked: every admitted prompt yields exactly `num_samples` Completions, no
sample is delivered twice, and the ledger can name the prompts an engine had in flight (to resubmit them when
it dies). Pure logic; no Ray.
"""

from __future__ import annotations

from open_instruct.messages import Completion, PromptRequest


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
