"""How far generation runs ahead of the learner: a fixed `--async_steps N`, or `--async_steps auto`.

By Little's law (`metrics.async_steps_needed`) the learner never waits for a batch when the
lookahead covers a group's admission-to-last-sample latency in units of learner steps. `auto`
measures both every step and follows that need:

* it smooths the measured need (an exponential moving average), so one slow group does not
  swing the lookahead;
* it moves by at most one step at a time; it grows as soon as the need exceeds it (a starving
  learner costs throughput) but shrinks only when the need stayed clearly lower (by `margin`) for
  `patience` steps in a row, so a need hovering at a boundary does not make it oscillate;
* Little's law on the *mean* group latency undercounts a heavy tail: the learner still waits for the batch's
  slowest groups at the lookahead it names (simulated at the long-reasoning shape, 32 engines and 16
  learners with answers up to 16k tokens, it settled at 5 where 8 removes the wait). So the learner's wait
  itself also counts: a step in which it waited more than `wait_tolerance` of the step grows the lookahead
  by one, then gives the pipeline the time a new admission takes to arrive (the need, in steps) before it
  may grow again for that reason. A lookahead reached that way is a floor the estimate cannot shrink below,
  until the need falls by `release` (the latency dropped: the wait that set the floor is gone);
* it stays within [1, max_off_policy_steps]: more lookahead than the staleness bound would only
  produce samples the bound throws away.

The staleness window K (`staleness.OffPolicyWindow.of` the run's `StalenessPolicy`) is the other half of the
pacing: a fixed K, or with `auto` one that trades the learner's wait against off-policy health (see its
docstring).
Under `--async_steps auto` the lookahead never exceeds the window's current K.

Pure logic; the training loop calls `Pacing.update` once per step and logs what it returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from open_instruct.staleness import OffPolicyWindow

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


class Pacing:
    """The lookahead and the staleness window of a run, updated together once per step."""

    def __init__(self, lookahead: Lookahead, window: OffPolicyWindow):
        self.lookahead, self.window = lookahead, window
        self._advised = False
        self._clamp_lookahead()

    @classmethod
    def from_config(cls, cfg) -> Pacing:
        policy = cfg.staleness_policy
        lookahead = Lookahead.adaptive(policy.bound) if cfg.async_steps_auto else Lookahead.fixed(cfg.lookahead_max)
        return cls(lookahead, OffPolicyWindow.of(policy))

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
