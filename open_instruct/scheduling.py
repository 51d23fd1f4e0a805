"""How far generation runs ahead of the learner: a fixed `--async_steps N`, or `--async_steps auto`.

By Little's law (`metrics.async_steps_needed`) the learner never waits for a batch when the
lookahead covers a group's admission-to-last-sample latency in units of learner steps. `auto`
measures both every step and follows that need:

* it smooths the measured need (an exponential moving average), so one slow group does not
  swing the lookahead;
* it moves by at most one step at a time; it grows as soon as the need exceeds it (a starving
  learner costs throughput) but shrinks only when the need stayed clearly lower (by `margin`) for
  `patience` steps in a row, so a need hovering at a boundary does not make it oscillate;
* Little's law on the *mean* group latency undercounts a heavy tail: the learner still waits for the
  batch's slowest groups at the lookahead it names (at the seed's shape it settled at 5 where 8
  removes the wait). So the learner's wait itself also counts: a step in which it waited more than
  `wait_tolerance` of the step grows the lookahead by one, then gives the pipeline the time a new
  admission takes to arrive (the need, in steps) before it may grow again for that reason. A
  lookahead reached that way is a floor the estimate cannot shrink below, until the need falls by
  `release` (the latency dropped: the wait that set the floor is gone);
* it stays within [1, max_off_policy_steps]: more lookahead than the staleness bound would only
  produce samples the bound throws away.

The staleness window K (`--max_off_policy_steps`) is the other half of the pacing: a fixed K, or with
`auto` an `OffPolicyWindow` that trades the learner's wait against off-policy health (see its docstring).
Under `--async_steps auto` the lookahead never exceeds the window's current K.

Pure logic; the training loop calls `Pacing.update` once per step and logs what it returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class Lookahead:
    """The current lookahead; `auto` adapts it, a fixed one never changes."""

    current: int
    auto: bool = False
    maximum: int = 1
    smoothing: float = 0.3  # weight of the newest measurement in the moving average
    patience: int = 3  # steps the need must stay lower before the lookahead shrinks
    margin: float = 0.25  # how far below (current - 1) the need must be to count as lower
    wait_tolerance: float = 0.05  # share of a step the learner may wait before the lookahead grows for it
    release: float = 0.25  # how far the need must fall below its value at a floor to release the floor
    _need: float | None = None
    _lower_for: int = 0
    _floor: int = 1  # set by a growth on the learner's wait
    _floor_need: float = 0.0
    _cooldown: int = 0  # steps until the wait may grow the lookahead again

    @classmethod
    def fixed(cls, steps: int) -> Lookahead:
        return cls(current=steps, maximum=steps)

    @classmethod
    def adaptive(cls, maximum: int, start: int = 1) -> Lookahead:
        if maximum < 1:
            raise ValueError(f"an automatic lookahead needs a bound >= 1, got {maximum}")
        return cls(current=max(1, min(start, maximum)), auto=True, maximum=maximum)

    def update(self, group_latency_s: float, busy_step_s: float, waited_s: float = 0.0) -> int:
        """Feed one step's measurements (the step's time less the learner's wait, and that wait); returns the
        lookahead for the next admissions."""
        if not self.auto or group_latency_s <= 0 or busy_step_s <= 0:
            return self.current
        need = group_latency_s / busy_step_s
        self._need = need if self._need is None else self.smoothing * need + (1 - self.smoothing) * self._need
        self._cooldown = max(0, self._cooldown - 1)
        if self._floor > 1 and self._need < (1 - self.release) * self._floor_need:
            self._floor = 1  # the latency fell: the wait that set the floor is gone
        starving = waited_s > self.wait_tolerance * (busy_step_s + waited_s) and not self._cooldown
        if (self._need > self.current + 1e-9 or starving) and self.current < self.maximum:
            self.current += 1
            self._lower_for = 0
            if starving:
                self._floor, self._floor_need = self.current, self._need
                self._cooldown = max(1, round(self._need))
        elif self._need <= self.current - 1 - self.margin and self.current > self._floor:
            self._lower_for += 1
            if self._lower_for >= self.patience:
                self.current -= 1
                self._lower_for = 0
        else:
            self._lower_for = 0
        return self.current

    @property
    def smoothed_need(self) -> float:
        return self._need or 0.0


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


class Pacing:
    """The lookahead and the staleness window of a run, updated together once per step."""

    def __init__(self, lookahead: Lookahead, window: OffPolicyWindow):
        self.lookahead, self.window = lookahead, window
        self._advised = False
        self._clamp_lookahead()

    @classmethod
    def from_config(cls, cfg) -> Pacing:
        generation = cfg.generation
        if generation.off_policy_window_auto:
            window = OffPolicyWindow.adaptive(
                generation.off_policy_window_min,
                generation.off_policy_window_max,
                generation.off_policy_min_ess_frac,
                generation.off_policy_max_truncated_frac,
            )
        else:
            window = OffPolicyWindow.fixed(cfg.max_off_policy_steps)
        lookahead = (
            Lookahead.adaptive(cfg.max_off_policy_steps) if cfg.async_steps_auto else Lookahead.fixed(cfg.lookahead_max)
        )
        return cls(lookahead, window)

    def _clamp_lookahead(self) -> None:
        """An automatic lookahead runs no further ahead than the window's current K."""
        if self.lookahead.auto:
            self.lookahead.maximum = self.window.current
            self.lookahead.current = min(self.lookahead.current, self.window.current)

    def update(self, group_latency_s: float, busy_step_s: float, waited_s: float, learner: dict) -> dict[str, float]:
        """One step's measurements (its time less the learner's wait, that wait, the learner's metrics) in; the
        pacing metrics out."""
        step_s = busy_step_s + waited_s
        waited_frac = waited_s / step_s if step_s > 0 else 0.0
        self.window.update(
            waited_frac,
            learner.get("offpolicy/ess_frac"),
            learner.get("offpolicy/truncated_frac"),
            learner.get("staleness/version_lag_max"),
        )
        self._clamp_lookahead()
        return {
            "scheduling/async_steps": float(self.lookahead.update(group_latency_s, busy_step_s, waited_s)),
            "offpolicy/window": float(self.window.current),
            "offpolicy/window_change": float(self.window.change),
            "offpolicy/window_headroom": self.window.headroom,
        }

    def advise(self, step: int, needed: int, wait_frac: float) -> None:
        """Once per run: say when the learner starves because groups outlast a fixed lookahead."""
        lookahead = self.lookahead.current
        if (
            self._advised
            or self.lookahead.auto
            or lookahead == 0
            or step < lookahead + 2
            or wait_frac < 0.25
            or needed <= lookahead
        ):
            return
        self._advised = True
        logger.warning(
            "the learner waited %.0f%% of step %d: a group takes about %d training steps from admission "
            "to its last sample, more than --async_steps %d lets run ahead; at least --async_steps %d is "
            "needed to keep the learner fed (more samples in flight slow each group down, so check "
            "scheduling/async_steps_needed again, or let --async_steps auto follow it; the price is staleness: "
            "staleness/token_lag_avg)",
            100 * wait_frac,
            step,
            needed,
            lookahead,
            needed,
        )
