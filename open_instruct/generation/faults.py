"""What the driver keeps so that an engine's failure costs little: partial samples, resubmission, hang detection.

`PartialSamples` holds the response so far of every running sample, from the engines' `SampleProgress`
reports (and, when a run stops, from the samples it aborts), so a sample whose engine dies or whose run
is stopped continues later from its tokens instead of being generated again. `HangWatch` decides when an
engine that is still alive has stopped working: it neither answers a probe nor makes progress for
--engine_hang_timeout_s while it has samples running. Both are pure bookkeeping (no Ray), tested on their own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable

from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.messages import Completion, EngineStats, PartialSample, PromptRequest, SampleProgress


class PartialSamples:
    """The tokens so far of samples not delivered yet, by (prompt id, sample index)."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, int], PartialSample] = {}
        self.continued_samples = 0
        self.tokens_saved = 0  # response tokens continued from instead of generated again
        self.reprefilled_tokens = 0  # prompt + kept tokens prefilled again to continue

    def __len__(self) -> int:
        return len(self._samples)

    def report(self, progress: SampleProgress) -> None:
        key = (progress.prompt_id, progress.sample_index)
        kept = self._samples.get(key) or PartialSample(progress.sample_index, (), (), ())
        if progress.start != len(kept.token_ids):
            return  # a report that does not extend what is kept (a copy of a resubmitted sample): ignored
        self._samples[key] = kept.extended(progress.token_ids, progress.logprobs, progress.version_spans)

    def interrupted(self, completion: Completion) -> None:
        """An aborted sample (the run is stopping): its response so far, if longer than what was reported."""
        key = (completion.prompt_id, completion.sample_index)
        if len(completion.response_token_ids) > len(self._samples.get(key, _NONE).token_ids):
            self._samples[key] = PartialSample(
                completion.sample_index,
                completion.response_token_ids,
                completion.behaviour_logprobs,
                completion.version_spans,
            )

    def delivered(self, prompt_id: str, sample_index: int) -> None:
        self._samples.pop((prompt_id, sample_index), None)

    def attach(self, request: PromptRequest, sample_indices: tuple[int, ...]) -> PromptRequest:
        """`request` for `sample_indices` only, carrying what is kept of them; counted as continued."""
        partials = tuple(
            p for j in sample_indices if (p := self._samples.get((request.prompt_id, j))) is not None and p.token_ids
        )
        self.count(request, partials)
        return dataclasses.replace(request, sample_indices=sample_indices, partials=partials)

    def count(self, request: PromptRequest, partials: tuple[PartialSample, ...]) -> None:
        for partial in partials:
            self.continued_samples += 1
            self.tokens_saved += len(partial.token_ids)
            self.reprefilled_tokens += len(request.prompt_token_ids) + len(partial.token_ids)

    def of_prompt(self, prompt_id: str) -> tuple[PartialSample, ...]:
        return tuple(p for (pid, _), p in sorted(self._samples.items()) if pid == prompt_id and p.token_ids)

    def metrics(self) -> dict[str, float]:
        return {
            "engines/continued_samples_total": float(self.continued_samples),
            "engines/continued_tokens_saved_total": float(self.tokens_saved),
            "engines/reprefilled_tokens_total": float(self.reprefilled_tokens),
            "engines/partial_samples_kept": float(len(self._samples)),
        }


_NONE = PartialSample(-1, (), (), ())


# A prompt that is in flight, started nowhere and not in the queue may be one a living engine pulled and has
# not announced yet (`PromptStarted` follows the pull by one message): it is resubmitted only if this much
# later it is still unannounced.
UNANNOUNCED_SETTLE_S = 2.0


class Resubmission:
    """A failed engine's undelivered samples back to the prompt queue (`prompts`, a channel), for any engine:
    only the missing sample indices, each with what `partials` kept of it."""

    def __init__(
        self, prompts, ledger: DeliveryLedger, partials: PartialSamples, settle_s: float = UNANNOUNCED_SETTLE_S
    ):
        self.prompts, self.ledger, self.partials, self.settle_s = prompts, ledger, partials, settle_s
        self.samples = 0  # resubmitted
        self._requests: dict[str, PromptRequest] = {}  # admitted and not yet complete
        self._suspects: list[tuple[float, list[str]]] = []  # (when to decide, prompt ids)

    def __len__(self) -> int:
        """Prompts tracked: admitted and not yet complete, and suspects not decided yet."""
        return len(self._requests) + sum(len(suspects) for _, suspects in self._suspects)

    def admitted(self, request: PromptRequest) -> None:
        self._requests[request.prompt_id] = request

    def completed(self, prompt_id: str) -> None:
        self._requests.pop(prompt_id, None)

    def resubmit(self, prompt_ids: list[str]) -> None:
        for prompt_id in prompt_ids:
            delivered = self.ledger.delivered.get(prompt_id, set())
            request = self._requests[prompt_id]
            missing = tuple(j for j in request.samples_to_generate() if j not in delivered)
            self.ledger.reassign(prompt_id)
            self.samples += len(missing)
            self.prompts.put(self.partials.attach(request, missing), timeout=60)

    def look_for_unannounced(self) -> None:
        """Prompts an engine took from the queue but died before announcing are in flight, started nowhere and
        no longer queued. The queue is read and put back in order (the driver is its only producer); living
        engines' announcements in transit get `settle_s` before `resubmit_unannounced` decides, while every
        engine keeps pulling. A prompt a living engine announces even later is generated twice, and the pool
        drops the second copy."""
        queued = self.prompts.get_all()
        for request in queued:
            self.prompts.put(request, timeout=60)
        waiting = {request.prompt_id for request in queued}
        suspects = [p for p in self.ledger.in_flight() if p not in self.ledger.engine_of and p not in waiting]
        if suspects:
            self._suspects.append((time.monotonic() + self.settle_s, suspects))

    def decision_due(self) -> bool:
        return any(at <= time.monotonic() for at, _ in self._suspects)

    def resubmit_unannounced(self) -> None:
        """The suspects whose settle is over and that are still announced nowhere (take in the result queue
        first: an announcement may be waiting there)."""
        now = time.monotonic()
        due = [suspects for at, suspects in self._suspects if at <= now]
        self._suspects = [(at, suspects) for at, suspects in self._suspects if at > now]
        in_flight = set(self.ledger.in_flight())
        self.resubmit([p for suspects in due for p in suspects if p in in_flight and p not in self.ledger.engine_of])


@dataclasses.dataclass
class _Watched:
    probe: object = None  # the pending probe (a Ray ObjectRef in the pool), None between probes
    probe_sent_at: float = float("-inf")
    signature: Hashable = None  # changes whenever the engine makes progress (a token, a finished sample)
    # On the engine's own clock, so a driver busy elsewhere (a long training step) never looks like a stall.
    engine_clock: float = 0.0
    progress_clock: float = 0.0


class HangWatch:
    """Per engine: a probe every `probe_every_s`; hung when a probe goes unanswered for `timeout_s`, or when
    two answers `timeout_s` apart on the engine's clock (its uptime outside pauses) show samples running (not
    parked on a tool) and nothing changed. timeout_s 0: off."""

    def __init__(self, timeout_s: float, probe_every_s: float | None = None):
        self.timeout_s = timeout_s
        self.probe_every_s = probe_every_s if probe_every_s is not None else min(5.0, timeout_s / 4)
        self._engines: dict[int, _Watched] = {}

    def forget(self, engine_id: int) -> None:
        """A replaced engine starts with a clean record."""
        self._engines.pop(engine_id, None)

    def probe_due(self, engine_id: int, now: float) -> bool:
        watched = self._engines.setdefault(engine_id, _Watched())
        return self.timeout_s > 0 and watched.probe is None and now - watched.probe_sent_at >= self.probe_every_s

    def probe_sent(self, engine_id: int, probe: object, now: float) -> None:
        watched = self._engines[engine_id]
        watched.probe, watched.probe_sent_at = probe, now

    def pending(self) -> dict[int, object]:
        return {i: w.probe for i, w in self._engines.items() if w.probe is not None}

    def answered(self, engine_id: int, signature: Hashable, active_samples: int, engine_clock: float) -> None:
        w = self._engines[engine_id]
        w.probe = None
        if signature != w.signature or active_samples == 0 or engine_clock < w.engine_clock:
            w.progress_clock = engine_clock
        w.signature, w.engine_clock = signature, engine_clock

    def answered_stats(self, engine_id: int, stats: EngineStats) -> None:
        """`answered` from an engine's stats. Progress is a token, a finished sample or a new pause; pulling
        prompts is not (a stalled engine with room keeps pulling work it never does). Samples parked on a tool
        are not running. The clock is the engine's uptime outside pauses: a weight sync holds the running
        samples by design, however long it takes on a loaded machine."""
        pulse = (stats.token_outputs, stats.completed_samples, stats.pauses)
        active = stats.running_samples - stats.parked_samples
        self.answered(engine_id, pulse, active, stats.uptime_s - stats.paused_s)

    def hung(self, now: float) -> dict[int, str]:
        """Engines taken for hung, with why."""
        if self.timeout_s <= 0:
            return {}
        verdicts = {}
        for engine_id, w in self._engines.items():
            if w.probe is not None and now - w.probe_sent_at > self.timeout_s:
                verdicts[engine_id] = f"no answer for {now - w.probe_sent_at:.0f} s"
            elif w.engine_clock - w.progress_clock > self.timeout_s:
                verdicts[engine_id] = f"samples running but no token for {w.engine_clock - w.progress_clock:.0f} s"
        return {i: f"{why} (--engine_hang_timeout_s {self.timeout_s:g})" for i, why in verdicts.items()}
