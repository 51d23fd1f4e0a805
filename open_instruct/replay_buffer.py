"""Replay buffer: groups streamed Completions by prompt and hands learners fixed-size batches of groups.

Engines push one `Completion` per finished sample; a prompt's `samples_per_prompt` samples form a GRPO
group. The buffer holds samples until their group is complete (incomplete groups wait), then serves
complete groups in the order they completed, `take(num_groups, learner_version)` at a time; each group
is trained once. Two rules can keep a complete group out of training:

* **zero reward spread** (`drop_zero_std`, on with --active_sampling): a group whose rewards are all
  equal has zero advantage everywhere; it is dropped as it completes, so every batch has signal;
* **staleness** (`max_age`, from --max_off_policy_steps and --off_policy_action): a group whose age
  (learner version minus the oldest weight version of any of its tokens) exceeds `max_age.max_age`
  is dropped, or, with `action="downweight"`, trained at weight `0.5 ** (age - max_age)`.

Every dropped group is reported once through `pop_dropped()`, with its reason, so the caller can
replace it (admit the prompt again, or another one) and account for it: nothing disappears silently.

Memory is bounded in samples and in tokens (prompt + response). When a sample would not fit, `add`
returns `AddResult.REJECTED_FULL` instead of growing: the caller keeps the completion (e.g. in the
result queue) and offers it again later. That is back-pressure, not loss.

**Why a full buffer cannot deadlock.** A buffer full of *incomplete* groups would deadlock the run
if it rejected the very samples that complete them. So room is reserved per group, not per sample:
the first sample of a prompt opens a group only if the whole group fits (`samples_per_prompt`
sample slots and, with a token cap, its actual tokens plus `max_sample_tokens` for each missing
sample). Samples of an already-open group are therefore always accepted and never push the buffer
past its caps. Every open group completes as its samples arrive, and `ready`/`take` refuse batch
sizes the caps cannot hold (`capacity_groups`), so a batch always becomes available. The one thing
the caller must do: after a rejection, keep offering the *other* completions it has (no
head-of-line blocking), because those may be the samples that complete open groups.

Staleness: dropping stale samples biases training toward short completions (long ones finish late
and are the stale ones), and streaming alone trains short samples first. `metrics()` reports the
length distribution of what was generated (accepted), trained and dropped so that bias is visible.

Pure logic: no Ray, no torch. `state()` / `from_state()` snapshot the contents for checkpoints.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from open_instruct.messages import Completion

AGE_HISTOGRAM_BUCKETS = 4  # buckets 0 .. 3 versions old, then one for 4 or more
DropReason = Literal["zero_std", "stale"]


class AddResult(enum.Enum):
    """What `ReplayBuffer.add` did with a completion."""

    ACCEPTED = "accepted"
    REJECTED_FULL = "rejected_full"  # back-pressure: keep the completion and offer it again later

    @property
    def accepted(self) -> bool:
        return self is AddResult.ACCEPTED


@dataclass(frozen=True, slots=True)
class Group:
    """One complete GRPO group as handed to a learner.

    `completions` are in sample order (index 0 .. n-1) whatever order they arrived in. `weights` holds
    one loss weight per sample (1.0 unless the age rule down-weights the group; the whole group gets
    the same weight so the group-relative advantage baseline is not tilted). `age` is the learner
    version minus the group's oldest weight version, at the time it was taken.
    """

    prompt_id: str
    completions: tuple[Completion, ...]
    weights: tuple[float, ...] = ()  # empty means 1.0 for every sample
    age: int = 0

    def __post_init__(self) -> None:
        if not self.weights:
            object.__setattr__(self, "weights", (1.0,) * len(self.completions))
        if len(self.weights) != len(self.completions):
            raise ValueError(f"group {self.prompt_id}: {len(self.weights)} weights for {len(self.completions)} samples")
        if [c.sample_index for c in self.completions] != list(range(len(self.completions))):
            raise ValueError(f"group {self.prompt_id}: completions must be in sample order 0..n-1")

    @property
    def num_samples(self) -> int:
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        return sum(sample_tokens(c) for c in self.completions)

    @property
    def min_version(self) -> int:
        return min(c.min_version for c in self.completions)

    @property
    def mean_reward(self) -> float:
        return sum(c.reward for c in self.completions) / len(self.completions)

    @property
    def response_lengths(self) -> tuple[int, ...]:
        return tuple(len(c.response_token_ids) for c in self.completions)


@dataclass(frozen=True, slots=True)
class DroppedGroup:
    """A complete group that will not be trained, and why (`zero_std` or `stale`)."""

    prompt_id: str
    reason: DropReason
    completions: tuple[Completion, ...]
    age: int


def sample_tokens(completion: Completion) -> int:
    """Tokens a sample occupies in the buffer (and in a packed batch): prompt plus response."""
    return len(completion.prompt_token_ids) + len(completion.response_token_ids)


def has_reward_spread(completions: Iterable[Completion]) -> bool:
    rewards = [c.reward for c in completions]
    return max(rewards) > min(rewards)


@dataclass(frozen=True, slots=True)
class MaxAge:
    """Groups more than `max_age` versions behind the learner are dropped or down-weighted
    (--max_off_policy_steps, --off_policy_action).

    `action="drop"`: such groups are dropped (reported by `pop_dropped`). Dropping biases training
    toward short completions; `"downweight"` trains them at weight `0.5 ** (age - max_age)` instead
    (counted in `buffer/downweighted_total`): halved per version over the bound.
    """

    max_age: int
    action: Literal["drop", "downweight"] = "drop"

    def __post_init__(self) -> None:
        if self.max_age < 0:
            raise ValueError(f"MaxAge.max_age must be >= 0, got {self.max_age}")
        if self.action not in ("drop", "downweight"):
            raise ValueError(f"MaxAge.action must be 'drop' or 'downweight', got {self.action!r}")

    def weight(self, age: int) -> float | None:
        """The group's loss weight at `age`, or None to drop it."""
        if age <= self.max_age:
            return 1.0
        return None if self.action == "drop" else 0.5 ** (age - self.max_age)


# ---------------------------------------------------------------------------------------------------
# Snapshot


@dataclass(frozen=True)
class GroupRecord:
    """One group in a snapshot: its samples so far (sample order) and its completion order."""

    prompt_id: str
    completions: tuple[Completion, ...]
    seq: int | None  # None while incomplete


@dataclass(frozen=True)
class BufferState:
    """Plain-data snapshot of a `ReplayBuffer` (contents, counters, length windows) for checkpoint/resume.

    Rules and caps are configuration, not state: pass them again to `ReplayBuffer.from_state`.
    """

    groups: tuple[GroupRecord, ...]  # open groups in opening order, then complete ones in completion order
    next_seq: int
    learner_version: int
    counters: dict[str, int]
    generated_lengths: tuple[int, ...]
    trained_lengths: tuple[int, ...]
    dropped_lengths: tuple[int, ...]


# ---------------------------------------------------------------------------------------------------
# The buffer


@dataclass
class _Entry:
    prompt_id: str
    samples: dict[int, Completion] = field(default_factory=dict)
    tokens: int = 0
    seq: int | None = None
    oldest_version: int | None = None  # set once complete: a complete group's samples never change

    def min_version(self) -> int:
        if self.oldest_version is not None:
            return self.oldest_version
        return min(c.min_version for c in self.samples.values())

    def complete(self, seq: int) -> None:
        self.seq = seq
        self.oldest_version = min(c.min_version for c in self.samples.values())

    def ordered(self) -> tuple[Completion, ...]:
        return tuple(self.samples[i] for i in sorted(self.samples))


_COUNTERS = (
    "accepted",
    "rejected_full",
    "dropped_zero_std_groups",
    "dropped_stale_groups",
    "dropped_samples",
    "downweighted_groups",
    "trained_groups",
    "trained_samples",
)


class ReplayBuffer:
    """Groups completions by prompt; serves fixed-size batches of complete groups (see module doc).

    Driver pattern, once per step::

        for c in pending: (kept if buf.add(c) is AddResult.REJECTED_FULL)
        buf.evict(version); replace(buf.pop_dropped())
        if buf.ready(num_groups): batch = buf.take(num_groups, version)

    Caps: `max_samples` samples; optionally `max_tokens` tokens (prompt + response), which needs
    `max_sample_tokens` (the longest prompt plus `response_length`) to reserve room for samples
    not yet arrived. A sample longer than `max_sample_tokens` is a configuration error (ValueError).
    """

    def __init__(
        self,
        *,
        samples_per_prompt: int,
        max_samples: int,
        max_tokens: int | None = None,
        max_sample_tokens: int | None = None,
        max_age: MaxAge | None = None,
        drop_zero_std: bool = False,
        length_window: int = 10_000,
    ):
        if samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
        if max_samples < samples_per_prompt:
            raise ValueError(f"max_samples={max_samples} cannot hold one group of {samples_per_prompt}")
        if max_tokens is not None:
            if max_sample_tokens is None or max_sample_tokens < 1:
                raise ValueError("a token cap (max_tokens) needs max_sample_tokens >= 1 to reserve room for groups")
            if max_tokens < samples_per_prompt * max_sample_tokens:
                raise ValueError(
                    f"max_tokens={max_tokens} cannot hold one group of {samples_per_prompt} x "
                    f"{max_sample_tokens} tokens"
                )
        self.samples_per_prompt = samples_per_prompt
        self.max_samples = max_samples
        self.max_tokens = max_tokens
        self.max_sample_tokens = max_sample_tokens
        self.max_age = max_age
        self.drop_zero_std = drop_zero_std
        self._open: dict[str, _Entry] = {}  # opening order
        self._complete: dict[int, _Entry] = {}  # keyed and ordered by completion seq
        self._by_prompt: dict[str, _Entry] = {}
        self._dropped: list[DroppedGroup] = []  # not yet collected by `pop_dropped`
        self._next_seq = 0
        self._learner_version = 0
        self._judged: tuple[int, int] | None = None  # (version, next_seq) of the last `evict` pass
        self._size_samples = 0
        self._size_tokens = 0
        self._reserved_tokens = 0  # actual tokens + max_sample_tokens per missing sample of open groups
        self._counters = dict.fromkeys(_COUNTERS, 0)
        # Groups dropped for zero spread since the last complete group that had spread (stale ones aside):
        # with --active_sampling, how long the run has gone without a trainable group.
        self.zero_std_streak = 0
        # Bounded windows of response lengths (the most recent `length_window` samples each).
        self._generated_lengths: deque[int] = deque(maxlen=length_window)
        self._trained_lengths: deque[int] = deque(maxlen=length_window)
        self._dropped_lengths: deque[int] = deque(maxlen=length_window)

    # ---- capacity

    @property
    def capacity_groups(self) -> int:
        """How many whole groups the caps are guaranteed to hold: the largest satisfiable batch."""
        groups = self.max_samples // self.samples_per_prompt
        if self.max_tokens is not None:
            assert self.max_sample_tokens is not None
            groups = min(groups, self.max_tokens // (self.samples_per_prompt * self.max_sample_tokens))
        return groups

    @property
    def size_samples(self) -> int:
        return self._size_samples

    @property
    def size_tokens(self) -> int:
        return self._size_tokens

    @property
    def reserved_samples(self) -> int:
        # Every group present, open or complete, holds room for all its samples.
        return len(self._by_prompt) * self.samples_per_prompt

    def _fits_new_group(self, completion: Completion) -> bool:
        """Whether a group opened by `completion` fits whole."""
        if self.reserved_samples + self.samples_per_prompt > self.max_samples:
            return False
        if self.max_tokens is not None:
            assert self.max_sample_tokens is not None
            need = sample_tokens(completion) + (self.samples_per_prompt - 1) * self.max_sample_tokens
            if self._reserved_tokens + need > self.max_tokens:
                return False
        return True

    def _check_batch_size(self, num_groups: int) -> None:
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        if num_groups > self.capacity_groups:
            # Would never become ready: the caps cannot hold that many groups at once.
            raise ValueError(
                f"a batch of {num_groups} groups can never be ready: the caps hold {self.capacity_groups} "
                f"groups (max_samples={self.max_samples}, max_tokens={self.max_tokens}, "
                f"max_sample_tokens={self.max_sample_tokens}, samples_per_prompt={self.samples_per_prompt})"
            )

    # ---- producer side

    def add(self, completion: Completion) -> AddResult:
        """Store one finished sample. `REJECTED_FULL` means: keep it and offer it again later.

        Only the first sample of a prompt can be rejected (its group must fit whole); samples of a
        group already present are always accepted. Raises ValueError for eval completions, sample
        indices out of range, duplicate samples, and samples longer than `max_sample_tokens`.
        """
        self._check_sample(completion)
        n = self.samples_per_prompt
        tokens = sample_tokens(completion)
        entry = self._by_prompt.get(completion.prompt_id)
        if entry is None:
            if not self._fits_new_group(completion):
                self._counters["rejected_full"] += 1
                return AddResult.REJECTED_FULL
            entry = _Entry(completion.prompt_id)
            self._open[entry.prompt_id] = entry
            self._by_prompt[entry.prompt_id] = entry
            self._reserved_tokens += (n - 1) * (self.max_sample_tokens or 0)
        else:
            if entry.seq is not None or completion.sample_index in entry.samples:
                raise ValueError(f"sample {completion.sample_index} of {completion.prompt_id} delivered twice")
            self._reserved_tokens -= self.max_sample_tokens or 0  # the reserved slot is now used
        entry.samples[completion.sample_index] = completion
        entry.tokens += tokens
        self._size_samples += 1
        self._size_tokens += tokens
        self._reserved_tokens += tokens
        self._counters["accepted"] += 1
        self._generated_lengths.append(len(completion.response_token_ids))
        if len(entry.samples) == n:
            del self._open[entry.prompt_id]
            entry.complete(self._next_seq)
            self._next_seq += 1
            self._complete[entry.seq] = entry
            # Staleness first: a doomed group's aborted samples score 0 and would pass for zero spread.
            if self.max_age is not None and self.max_age.weight(self._age(entry)) is None:
                self._drop(entry, "stale")
            elif self.drop_zero_std and not has_reward_spread(entry.samples.values()):
                self._drop(entry, "zero_std")
                self.zero_std_streak += 1
            else:
                self.zero_std_streak = 0
        return AddResult.ACCEPTED

    def _check_sample(self, completion: Completion) -> None:
        if completion.is_eval:
            raise ValueError(
                f"eval completion {completion.prompt_id}#{completion.sample_index} sent to the training "
                "replay buffer; route is_eval completions to evaluation"
            )
        if not 0 <= completion.sample_index < self.samples_per_prompt:
            raise ValueError(
                f"sample_index {completion.sample_index} of {completion.prompt_id} out of range for "
                f"samples_per_prompt={self.samples_per_prompt}"
            )
        tokens = sample_tokens(completion)
        if self.max_sample_tokens is not None and tokens > self.max_sample_tokens:
            raise ValueError(
                f"{completion.prompt_id}#{completion.sample_index} has {tokens} tokens > max_sample_tokens="
                f"{self.max_sample_tokens}; the token cap's room reservation would be wrong"
            )

    def _remove(self, entry: _Entry) -> None:
        assert entry.seq is not None, "only complete groups leave the buffer"
        del self._complete[entry.seq]
        del self._by_prompt[entry.prompt_id]
        self._size_samples -= len(entry.samples)
        self._size_tokens -= entry.tokens
        self._reserved_tokens -= entry.tokens

    def _drop(self, entry: _Entry, reason: DropReason) -> None:
        completions = entry.ordered()
        self._dropped.append(DroppedGroup(entry.prompt_id, reason, completions, self._age(entry)))
        self._dropped_lengths.extend(len(c.response_token_ids) for c in completions)
        self._counters[f"dropped_{reason}_groups"] += 1
        self._counters["dropped_samples"] += len(completions)
        self._remove(entry)

    # ---- consumer side

    def ready(self, num_groups: int) -> bool:
        """True when `take(num_groups, ...)` can return a full batch (after `evict` at that version)."""
        self._check_batch_size(num_groups)
        return len(self._complete) >= num_groups

    def evict(self, learner_version: int) -> int:
        """Apply the age rule to complete groups; return how many groups were dropped.

        Incomplete groups are left alone: dropping one would strand its late samples (they would
        open a group that can never complete and hold reserved room forever). They are judged once
        complete. Idempotent for a given version; the driver calls it on every poll, so it does no
        work unless the version changed or a group completed since the last call.
        """
        self._learner_version = learner_version
        if self.max_age is None or self._judged == (learner_version, self._next_seq):
            return 0
        self._judged = (learner_version, self._next_seq)
        stale = [e for e in self._complete.values() if self.max_age.weight(self._age(e)) is None]
        for entry in stale:
            self._drop(entry, "stale")
        return len(stale)

    def pop_dropped(self) -> list[DroppedGroup]:
        """Groups dropped since the last call (zero reward spread, or stale), each reported once."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def take(self, num_groups: int, learner_version: int) -> list[Group]:
        """Exactly `num_groups` complete groups, oldest completion first, weighted by age.

        Applies `evict(learner_version)` first, so a stale group is never trained at full weight even
        if the caller skipped it; raises RuntimeError if fewer than `num_groups` groups remain
        (check `ready` after `evict`). Taken groups leave the buffer.
        """
        self._check_batch_size(num_groups)
        self.evict(learner_version)
        if len(self._complete) < num_groups:
            raise RuntimeError(f"take({num_groups}) but only {len(self._complete)} complete groups; check ready()")
        batch = []
        for seq in list(self._complete)[:num_groups]:
            entry = self._complete[seq]
            age = self._age(entry)
            weight = self.max_age.weight(age) if self.max_age is not None else 1.0
            assert weight is not None, "evict() just removed every group the age rule drops"
            completions = entry.ordered()
            batch.append(Group(entry.prompt_id, completions, (weight,) * len(completions), age))
            self._counters["trained_groups"] += 1
            self._counters["trained_samples"] += len(completions)
            self._counters["downweighted_groups"] += weight < 1.0
            self._trained_lengths.extend(len(c.response_token_ids) for c in completions)
            self._remove(entry)
        return batch

    def open_groups_older_than(self, version: int) -> list[str]:
        """Incomplete groups with a delivered token from before `version`: they cannot finish younger."""
        return [pid for pid, e in self._open.items() if e.min_version() < version]

    def _age(self, entry: _Entry) -> int:
        return max(0, self._learner_version - entry.min_version())

    # ---- metrics

    def metrics(self) -> dict[str, float]:
        """Namespaced gauges and counters; lengths are response tokens over the recent windows."""
        ages: list[int] = []
        for entry in self._by_prompt.values():
            ages.extend(max(0, self._learner_version - c.min_version) for c in entry.samples.values())
        histogram = [0] * (AGE_HISTOGRAM_BUCKETS + 1)
        for age in ages:
            histogram[min(age, AGE_HISTOGRAM_BUCKETS)] += 1
        c = self._counters
        out: dict[str, float] = {
            "buffer/size_samples": float(self._size_samples),
            "buffer/size_tokens": float(self._size_tokens),
            "buffer/reserved_samples": float(self.reserved_samples),
            "buffer/groups_complete": float(len(self._complete)),
            "buffer/groups_incomplete": float(len(self._open)),
            "buffer/accepted_total": float(c["accepted"]),
            "buffer/rejected_full_total": float(c["rejected_full"]),
            "buffer/dropped_zero_std_total": float(c["dropped_zero_std_groups"]),
            "buffer/dropped_stale_total": float(c["dropped_stale_groups"]),
            "buffer/dropped_samples_total": float(c["dropped_samples"]),
            "buffer/downweighted_total": float(c["downweighted_groups"]),
            "buffer/trained_groups_total": float(c["trained_groups"]),
            "buffer/trained_samples_total": float(c["trained_samples"]),
            "buffer/age_avg": sum(ages) / len(ages) if ages else 0.0,
            "buffer/age_max": float(max(ages, default=0)),
        }
        for bucket, count in enumerate(histogram):
            label = str(bucket) if bucket < AGE_HISTOGRAM_BUCKETS else f"{AGE_HISTOGRAM_BUCKETS}_plus"
            out[f"buffer/age_hist/{label}"] = float(count)
        if self.max_tokens is not None:
            out["buffer/reserved_tokens"] = float(self._reserved_tokens)
        for name, window in (
            ("generated", self._generated_lengths),
            ("trained", self._trained_lengths),
            ("dropped", self._dropped_lengths),
        ):
            out.update(_length_stats(f"buffer/{name}_length", window))
        generated_avg = out["buffer/generated_length_avg"]
        # < 1: training sees shorter samples than generation produces (streaming/dropping bias).
        out["buffer/trained_to_generated_length_ratio"] = (
            out["buffer/trained_length_avg"] / generated_avg if generated_avg > 0 else 0.0
        )
        return out

    # ---- checkpoint

    def state(self) -> BufferState:
        """Snapshot of the contents and counters (plain data: frozen dataclasses, tuples, ints).

        Dropped groups not yet collected by `pop_dropped` are the caller's to settle before saving."""
        groups = [GroupRecord(e.prompt_id, e.ordered(), None) for e in self._open.values()]
        groups += [GroupRecord(e.prompt_id, e.ordered(), e.seq) for e in self._complete.values()]
        return BufferState(
            groups=tuple(groups),
            next_seq=self._next_seq,
            learner_version=self._learner_version,
            counters=dict(self._counters),
            generated_lengths=tuple(self._generated_lengths),
            trained_lengths=tuple(self._trained_lengths),
            dropped_lengths=tuple(self._dropped_lengths),
        )

    @classmethod
    def from_state(cls, state: BufferState, **config: Any) -> ReplayBuffer:
        """A buffer with `config` (the constructor's arguments) and the snapshot's contents.

        Contents are restored as they were even if smaller caps no longer hold them: new groups are
        then rejected until the learner drains the excess.
        """
        buf = cls(**config)
        for record in state.groups:
            buf._restore(record)
        buf._complete = dict(sorted(buf._complete.items()))
        buf._next_seq = state.next_seq
        buf._learner_version = state.learner_version
        buf._counters.update({k: int(v) for k, v in state.counters.items() if k in buf._counters})
        buf._generated_lengths.extend(state.generated_lengths)
        buf._trained_lengths.extend(state.trained_lengths)
        buf._dropped_lengths.extend(state.dropped_lengths)
        return buf

    def _restore(self, record: GroupRecord) -> None:
        n = self.samples_per_prompt
        if record.prompt_id in self._by_prompt:
            raise ValueError(f"snapshot holds group {record.prompt_id} twice")
        entry = _Entry(record.prompt_id)
        for completion in record.completions:
            if not 0 <= completion.sample_index < n or completion.sample_index in entry.samples:
                raise ValueError(f"snapshot group {record.prompt_id} does not fit samples_per_prompt={n}")
            entry.samples[completion.sample_index] = completion
            entry.tokens += sample_tokens(completion)
        complete = len(entry.samples) == n
        if complete != (record.seq is not None):
            raise ValueError(f"snapshot group {record.prompt_id}: seq={record.seq} with {len(entry.samples)}/{n}")
        if complete:
            assert record.seq is not None
            entry.complete(record.seq)
            self._complete[record.seq] = entry
        else:
            self._open[entry.prompt_id] = entry
            self._reserved_tokens += (n - len(entry.samples)) * (self.max_sample_tokens or 0)
        self._by_prompt[entry.prompt_id] = entry
        self._size_samples += len(entry.samples)
        self._size_tokens += entry.tokens
        self._reserved_tokens += entry.tokens


def _percentile(ordered: Sequence[int], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def _length_stats(prefix: str, lengths: Iterable[int]) -> dict[str, float]:
    ordered = sorted(lengths)
    return {
        f"{prefix}_avg": sum(ordered) / len(ordered) if ordered else 0.0,
        f"{prefix}_p50": _percentile(ordered, 50),
        f"{prefix}_p90": _percentile(ordered, 90),
        f"{prefix}_max": float(ordered[-1]) if ordered else 0.0,
    }
