"""Staleness, the project's central trade: how old a trained token may be, and what happens to older ones.

K (`--max_off_policy_steps`) is the largest version lag a trained group may have: a group whose oldest token
is more than K learner versions behind when it trains gets the off-policy action (`OffPolicyAction`). K is
fixed, or tunes itself within bounds (`auto`: `OffPolicyWindow`). `StalenessPolicy` is the one object the
rest asks: the replay buffer for its age rule (`MaxAge`), the pacing for its window and the lookahead's
bound, the loop for what an untrainable group becomes and whether doomed samples are aborted.

Pure logic; parsed once from the configuration (`StalenessPolicy.from_config`).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Literal

from open_instruct.config.staleness import DEFAULT_AUTO_BOUND
from open_instruct.messages import Completion

logger = logging.getLogger(__name__)


class OffPolicyAction(enum.Enum):
    """What happens to a group older than K (--off_policy_action)."""

    MASK = "mask"  # train it on its tokens at most K old, the rest as context; requeue it when none is
    REQUEUE = "requeue"  # admit the prompt again, fresh
    DROP = "drop"  # admit another prompt instead
    DOWNWEIGHT = "downweight"  # train it at weight 0.5^(lag - K)

    @property
    def trains_late_groups(self) -> bool:
        """Late groups are trained (on young tokens, or down-weighted): their running samples may finish."""
        return self in (OffPolicyAction.MASK, OffPolicyAction.DOWNWEIGHT)

    @property
    def requeues(self) -> bool:
        """A group that cannot be trained has its prompt admitted again (else another prompt replaces it)."""
        return self in (OffPolicyAction.MASK, OffPolicyAction.REQUEUE)

    @property
    def age_rule(self) -> Literal["drop", "downweight", "mask"]:
        """What the replay buffer does with a late group (requeue and drop both take it out of training)."""
        return self.value if self.trains_late_groups else "drop"  # type: ignore[return-value]


@dataclass(frozen=True)
class StalenessPolicy:
    """K and the off-policy action of a run. `bound` is K (with `auto`, the largest K the window may reach:
    capacities are sized for it); `minimum` the smallest K it may use."""

    action: OffPolicyAction
    bound: int
    minimum: int
    auto: bool = False
    min_ess_frac: float = 0.9
    max_truncated_frac: float = 0.02

    @classmethod
    def from_config(cls, cfg) -> StalenessPolicy:
        """From the staleness flags and --async_steps (K's default); the flags were validated by then."""
        return cls.from_flags(cfg.staleness, cfg.generation.async_steps)

    @classmethod
    def from_flags(cls, staleness, async_steps: str) -> StalenessPolicy:
        value = "" if staleness.max_off_policy_steps is None else str(staleness.max_off_policy_steps).strip().lower()
        action = OffPolicyAction(staleness.off_policy_action)
        limits = (staleness.off_policy_min_ess_frac, staleness.off_policy_max_truncated_frac)
        if value == "auto":
            return cls(action, staleness.off_policy_window_max, staleness.off_policy_window_min, True, *limits)
        if value:
            bound = int(value)
        else:
            lookahead = async_steps.strip().lower()
            bound = DEFAULT_AUTO_BOUND if lookahead == "auto" else int(lookahead)
        return cls(action, bound, bound, False, *limits)

    @property
    def flag_value(self) -> int | str:
        """K as --max_off_policy_steps would say it (the run summary's key)."""
        return "auto" if self.auto else self.bound

    def describe(self) -> str:
        """The policy in one phrase, as results tables state it: `K=2, mask` or `K=auto (1-8, ess >= 0.9,
        truncated <= 0.02), mask`."""
        if self.auto:
            limits = f"ess >= {self.min_ess_frac:g}, truncated <= {self.max_truncated_frac:g}"
            return f"K=auto ({self.minimum}-{self.bound}, {limits}), {self.action.value}"
        return f"K={self.bound}, {self.action.value}"

    def age_rule(self) -> MaxAge:
        return MaxAge(self.bound, self.action.age_rule)

    def window(self) -> OffPolicyWindow:
        if self.auto:
            return OffPolicyWindow.adaptive(self.minimum, self.bound, self.min_ess_frac, self.max_truncated_frac)
        return OffPolicyWindow.fixed(self.bound)

    def sync_interval_problems(self, sync_every: int) -> list[str]:
        """Between weight syncs the engines fall up to `sync_every - 1` versions behind the learner. A tighter
        bound dooms every sample before the next sync, which then never comes (the learner waits forever),
        unless late groups are down-weighted instead of dropped."""
        lag = sync_every - 1
        if self.action is OffPolicyAction.DOWNWEIGHT or self.minimum >= lag:
            return []
        return [
            f"--weight_sync_every_steps {sync_every} leaves the engines up to {lag} versions behind the learner, "
            f"more than the staleness bound {self.minimum} allows: nothing would be trainable before the next "
            f"sync; give --max_off_policy_steps >= {lag} (or --off_policy_action downweight)"
        ]


def tokens_older_than(completion: Completion, version: int) -> int:
    """Response tokens of `completion` generated by a weight version older than `version`."""
    return sum(span.end - span.start for span in completion.token_spans if span.version < version)


def oldest_trained_version(completion: Completion, trained_from_version: int) -> int | None:
    """The oldest weight version among the tokens the loss trains when older ones are context only (None:
    it trains none)."""
    spans = completion.token_spans
    return min((s.version for s in spans if s.version >= trained_from_version and s.end > s.start), default=None)


@dataclass(frozen=True, slots=True)
class MaxAge:
    """Groups more than `max_age` versions behind the learner are dropped, down-weighted or trained on
    their young tokens only (K and `OffPolicyAction.age_rule`).

    `action="drop"`: such groups are dropped (reported by `pop_dropped`). Dropping biases training
    toward short completions; `"downweight"` trains them at weight `0.5 ** (age - max_age)` instead
    (counted in `buffer/downweighted_total`): halved per version over the bound. `"mask"` trains every
    group at full weight, but only on tokens at most `max_age` versions old; the older ones stay in
    the sample as context (counted in `buffer/context_only_tokens_total`). A group none of whose
    tokens is that young is dropped, as with "drop".
    """

    max_age: int
    action: Literal["drop", "downweight", "mask"] = "drop"

    def __post_init__(self) -> None:
        if self.max_age < 0:
            raise ValueError(f"MaxAge.max_age must be >= 0, got {self.max_age}")
        if self.action not in ("drop", "downweight", "mask"):
            raise ValueError(f"MaxAge.action must be 'drop', 'downweight' or 'mask', got {self.action!r}")

    def weight(self, age: int) -> float | None:
        """The group's loss weight at `age`, or None to drop it."""
        if age <= self.max_age or self.action == "mask":
            return 1.0
        return None if self.action == "drop" else 0.5 ** (age - self.max_age)

    def drops(self, age: int, newest_age: int) -> bool:
        """Whether a group whose oldest token is `age` versions old and newest `newest_age` is dropped: with
        mask only when no token of it is young enough to train (it would fill a batch slot with nothing)."""
        return newest_age > self.max_age if self.action == "mask" else self.weight(age) is None

    def trained_from(self, learner_version: int) -> int:
        """The oldest weight version whose tokens are trained at `learner_version` (0: all of them)."""
        return max(0, learner_version - self.max_age) if self.action == "mask" else 0


@dataclass
class OffPolicyWindow:
    """The staleness bound K; `--max_off_policy_steps auto` tunes it, a fixed one never changes.

    K buys throughput and costs health. A wider window lets generation run further ahead (and, under
    requeue or mask, loses fewer samples to age), which removes the learner's wait; it also trains tokens
    from older policies, whose importance weights pi_old/mu spread out. So `auto` reads both every step:

    * health is the step's `headroom`: how far its effective sample size fraction (`offpolicy/ess_frac`)
      and its share of capped importance weights (`offpolicy/truncated_frac`) are inside the user's limits,
      1 on-policy, 0 at a limit, negative past one;
    * past a limit, K narrows by one at once, whatever it did before: the buffer applies K when a group
      trains, so the next step already trains younger tokens; it may narrow again after `narrow_cooldown`
      steps, and widen again only after K steps;
    * when the learner waited more than `wait_tolerance` of its steps (a moving average that leaves out
      the first `warmup_steps`, which wait for the pipeline to fill whatever K is; one slow batch does
      not widen it either), K widens by one if the health one more version of lag would have stays
      inside the limits. The prediction takes the worst step since the last move (health varies with
      each batch's lags: one good step does not make a wider K safe) and scales its deficits
      (1 - ess_frac, truncated_frac) by ((K + 1) / K)^2: a log-ratio whose spread grows in proportion
      to the lag has a variance, and so an ess deficit, growing with its square. It widens only once a
      trained group has reached the current K since the last move: before that the health of lag K is
      not measured yet, and a K that no group reaches is not what the learner waits for. Then it waits
      `widen_cooldown` steps to see the health of the wider lag (a limit crossed then narrows K back);
    * it starts at `minimum`, the conservative end, and stays within [minimum, maximum].

    A step without importance statistics (a learner that logs none) counts as on-policy.
    """

    current: int
    auto: bool = False
    minimum: int = 1
    maximum: int = 1
    min_ess_frac: float = 0.9
    max_truncated_frac: float = 0.02
    wait_tolerance: float = 0.05
    wait_smoothing: float = 0.3  # weight of the newest step in the learner wait's moving average
    warmup_steps: int = 2  # a run's first steps wait for the pipeline to fill, whatever K: not counted
    narrow_cooldown: int = 1
    widen_cooldown: int = 2
    change: int = 0  # the last update's move: +1 widened, -1 narrowed, 0 held
    headroom: float = 1.0  # the last update's health headroom
    _updates: int = 0
    _narrow_from: int = 0  # the first update that may narrow again
    _widen_from: int = 0  # the first update that may widen again
    _wait: float | None = None  # the learner wait's moving average (share of a step)
    _worst_ess: float = 1.0  # the worst health since the last move
    _worst_truncated: float = 0.0
    _lag_reached: float = 0.0  # the largest group lag trained since the last move

    @classmethod
    def fixed(cls, steps: int) -> OffPolicyWindow:
        return cls(current=steps, minimum=steps, maximum=steps)

    @classmethod
    def adaptive(cls, minimum: int, maximum: int, min_ess_frac: float, max_truncated_frac: float) -> OffPolicyWindow:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"a self-tuning window needs 1 <= minimum <= maximum, got [{minimum}, {maximum}]")
        return cls(minimum, True, minimum, maximum, min_ess_frac, max_truncated_frac)

    def health_headroom(self, ess_frac: float | None, truncated_frac: float | None) -> float:
        """min over the limits of (distance to the limit) / (distance from on-policy to the limit)."""
        ess = 1.0 if ess_frac is None else (ess_frac - self.min_ess_frac) / (1.0 - self.min_ess_frac)
        tails = 1.0 if truncated_frac is None else 1.0 - truncated_frac / self.max_truncated_frac
        return min(ess, tails)

    def _forget_since_move(self) -> None:
        """What the window measured at the previous K no longer says anything about the new one."""
        self._worst_ess, self._worst_truncated, self._lag_reached = 1.0, 0.0, 0.0

    def predicted_headroom(self) -> float:
        """The headroom one more version of lag would leave, from the worst step since the last move."""
        growth = ((self.current + 1) / self.current) ** 2
        return self.health_headroom(1.0 - (1.0 - self._worst_ess) * growth, self._worst_truncated * growth)

    def update(
        self,
        waited_frac: float,
        ess_frac: float | None = None,
        truncated_frac: float | None = None,
        lag_max: float | None = None,
    ) -> int:
        """Feed one step's learner wait (share of the step), health and largest group lag; returns K for the
        next step."""
        self.change = 0
        self.headroom = self.health_headroom(ess_frac, truncated_frac)
        step, self._updates = self._updates, self._updates + 1
        self._worst_ess = min(self._worst_ess, 1.0 if ess_frac is None else ess_frac)
        self._worst_truncated = max(self._worst_truncated, truncated_frac or 0.0)
        self._lag_reached = max(self._lag_reached, self.current if lag_max is None else lag_max)
        if not self.auto:
            return self.current
        if step >= self.warmup_steps:
            smoothing = self.wait_smoothing
            self._wait = waited_frac if self._wait is None else smoothing * waited_frac + (1 - smoothing) * self._wait
        predicted = self.predicted_headroom()
        if self.headroom < 0 and self.current > self.minimum and step >= self._narrow_from:
            self.current, self.change = self.current - 1, -1
            self._narrow_from = step + 1 + self.narrow_cooldown
            self._widen_from = step + 1 + self.current  # not straight back: the narrower lag must show first
            self._forget_since_move()
            logger.info(
                "off-policy window narrowed to %d: ess_frac %s, truncated_frac %s past the limits (%.2f, %.3f)",
                self.current,
                ess_frac,
                truncated_frac,
                self.min_ess_frac,
                self.max_truncated_frac,
            )
        elif (
            self._wait is not None
            and self._wait > self.wait_tolerance
            and predicted >= 0
            and self._lag_reached >= self.current
            and self.current < self.maximum
            and step >= self._widen_from
        ):
            self.current, self.change = self.current + 1, 1
            self._widen_from = step + 1 + self.widen_cooldown
            logger.info(
                "off-policy window widened to %d: the learner waited %.0f%% of its steps, health predicted at "
                "this lag: headroom %.2f",
                self.current,
                100 * self._wait,
                predicted,
            )
            self._forget_since_move()
        return self.current
