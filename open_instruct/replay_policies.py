"""Replay-buffer policies: which complete groups a batch gets (selection) and what staleness costs (age).

* Selection: `StreamingFifo` (default: order of group completion, each group trained once) or
  `Reuse(max_uses=k)` (fresh groups first, then replays of the least-used ones, for data-poor
  regimes).
* Age (age = learner version minus the oldest weight version in a group): `NoAgeLimit` (default)
  or `MaxAge(k)`, which drops groups older than `k` versions or down-weights them.

Pure logic, used by `replay_buffer.ReplayBuffer`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class Candidate:
    """A complete group as a selection policy sees it."""

    seq: int  # order of completion in the buffer: lower completed earlier
    uses: int  # times already trained
    prompt_id: str


class SelectionPolicy(Protocol):
    """Chooses the groups of a batch and bounds how often a group is trained."""

    @property
    def max_uses(self) -> int:
        """A group leaves the buffer after it was trained this many times."""
        ...

    def select(self, candidates: Sequence[Candidate], num_groups: int, rng: random.Random) -> list[int]:
        """Return exactly `num_groups` distinct `seq`s from `candidates` (all of which have
        `uses < max_uses`). Randomness must come from `rng` only, so runs replay with the seed."""
        ...


class AgePolicy(Protocol):
    """Maps a group's age (in learner versions) to its loss weight, or None to drop it."""

    def weight(self, age: int) -> float | None: ...


@dataclass(frozen=True, slots=True)
class StreamingFifo:
    """Default: complete groups in the order they completed; each group is trained exactly once."""

    @property
    def max_uses(self) -> int:
        return 1

    def select(self, candidates: Sequence[Candidate], num_groups: int, rng: random.Random) -> list[int]:
        return [c.seq for c in sorted(candidates, key=lambda c: c.seq)[:num_groups]]


@dataclass(frozen=True, slots=True)
class Reuse:
    """Replay groups up to `max_uses` times (data-poor regimes); batches stay fixed-size.

    Sampling: fresh (never trained) groups first, in completion order; the rest of the batch is
    filled with already-trained groups, least-used first. Among equally-used groups the choice is
    uniform at random from the buffer's seeded RNG: completion order correlates with length (short
    samples finish first), so a deterministic oldest-first replay would replay the short groups.
    A group is never twice in one batch. Already-trained groups also give way to fresh data when
    the buffer is full (see `ReplayBuffer.add`). `Reuse(1)` behaves like `StreamingFifo`.
    """

    max_uses: int = 2

    def __post_init__(self) -> None:
        if self.max_uses < 1:
            raise ValueError(f"Reuse.max_uses must be >= 1, got {self.max_uses}")

    def select(self, candidates: Sequence[Candidate], num_groups: int, rng: random.Random) -> list[int]:
        ordered = sorted(candidates, key=lambda c: c.seq)
        chosen = [c.seq for c in ordered if c.uses == 0][:num_groups]
        by_uses: dict[int, list[Candidate]] = defaultdict(list)
        for c in ordered:
            if c.uses > 0:
                by_uses[c.uses].append(c)
        for uses in sorted(by_uses):
            need = num_groups - len(chosen)
            if need <= 0:
                break
            level = by_uses[uses]
            picked = level if len(level) <= need else sorted(rng.sample(level, need), key=lambda c: c.seq)
            chosen.extend(c.seq for c in picked)
        return chosen


@dataclass(frozen=True, slots=True)
class NoAgeLimit:
    """Default: every group is trained at weight 1.0 however old (the loss's importance ratio corrects)."""

    def weight(self, age: int) -> float | None:
        return 1.0


@dataclass(frozen=True, slots=True)
class MaxAge:
    """Groups more than `max_age` versions behind the learner are dropped or down-weighted.

    `action="drop"`: such groups are evicted (counted in `buffer/evicted_total`). Dropping biases
    training toward short completions; prefer `"downweight"`, which trains them at weight
    `decay ** (age - max_age)` (counted in `buffer/downweighted_total`), and drops them only once the
    weight falls below `min_weight` (0 = never).
    """

    max_age: int
    action: Literal["drop", "downweight"] = "drop"
    decay: float = 0.5
    min_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.max_age < 0:
            raise ValueError(f"MaxAge.max_age must be >= 0, got {self.max_age}")
        if self.action not in ("drop", "downweight"):
            raise ValueError(f"MaxAge.action must be 'drop' or 'downweight', got {self.action!r}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"MaxAge.decay must be in (0, 1], got {self.decay}")
        if not 0.0 <= self.min_weight <= 1.0:
            raise ValueError(f"MaxAge.min_weight must be in [0, 1], got {self.min_weight}")

    def weight(self, age: int) -> float | None:
        if age <= self.max_age:
            return 1.0
        if self.action == "drop":
            return None
        w = self.decay ** (age - self.max_age)
        return None if w < self.min_weight else w
