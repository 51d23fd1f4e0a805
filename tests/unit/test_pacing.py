"""The pacing controllers (pure): the lookahead of `--async_steps auto` (bounded, smooth, no oscillation) and the
staleness window of `--max_off_policy_steps auto` (widens on the learner's wait while health allows, narrows past
a health limit, within its bounds)."""

from __future__ import annotations

import itertools
import random

import pytest

from open_instruct.pacing import Lookahead, Pacing
from open_instruct.staleness import OffPolicyWindow


def test_a_fixed_lookahead_never_moves():
    lookahead = Lookahead.fixed(3)
    assert [lookahead.update(100.0, 1.0) for _ in range(5)] == [3] * 5 and not lookahead.auto


def test_auto_climbs_one_step_at_a_time_to_the_need_and_holds():
    lookahead = Lookahead.adaptive(maximum=8)
    path = [lookahead.update(group_latency_s=3.5, busy_step_s=1.0) for _ in range(12)]
    assert path[:3] == [2, 3, 4] and set(path[3:]) == {4}  # ceil(3.5) = 4, reached in steps of one


def test_auto_stays_within_one_and_the_bound():
    high = Lookahead.adaptive(maximum=3)
    assert max(high.update(50.0, 1.0) for _ in range(10)) == 3
    low = Lookahead.adaptive(maximum=5, start=4)
    assert min(low.update(0.1, 1.0) for _ in range(40)) == 1
    with pytest.raises(ValueError, match="bound >= 1"):
        Lookahead.adaptive(maximum=0)


def test_auto_shrinks_only_after_the_need_stayed_lower():
    lookahead = Lookahead.adaptive(maximum=8, start=5)
    lookahead.update(4.5, 1.0)  # the need is 5: stays
    path = [lookahead.update(1.5, 1.0) for _ in range(12)]
    assert path[0] == 5 and path[1] == 5  # one or two low measurements are not a trend
    assert all(0 <= a - b <= 1 for a, b in itertools.pairwise(path)) and path[-1] == 2


def test_noise_around_a_boundary_does_not_make_it_oscillate():
    rng = random.Random(0)
    lookahead = Lookahead.adaptive(maximum=8)
    path = [lookahead.update(3.0 + rng.uniform(-0.3, 0.3), 1.0) for _ in range(60)]
    settled = path[10:]
    changes = sum(a != b for a, b in itertools.pairwise(settled))
    assert changes <= 2 and set(settled) <= {3, 4}


def test_missing_measurements_change_nothing():
    lookahead = Lookahead.adaptive(maximum=8, start=2)
    assert lookahead.update(0.0, 1.0) == 2 and lookahead.update(5.0, 0.0) == 2


def test_a_waiting_learner_grows_auto_past_the_estimate_which_cannot_shrink_it_back():
    """Little's law on the mean latency says 3, but the learner waits until the lookahead is 5 (a heavy tail's
    slowest groups): the wait grows it, pausing between growths for the pipeline to answer, and holds it."""
    lookahead = Lookahead.adaptive(maximum=8)
    path = []
    for _ in range(30):
        waited = 0.5 if lookahead.current < 5 else 0.0
        path.append(lookahead.update(group_latency_s=3.0, busy_step_s=1.0, waited_s=waited))
    assert path[-10:] == [5] * 10 and max(path) == 5
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(path))
    assert path.index(5) > 5  # not one step per wait: each growth waits for its admissions to arrive


def test_auto_shrinks_again_once_the_latency_that_made_the_learner_wait_falls():
    lookahead = Lookahead.adaptive(maximum=8)
    for _ in range(30):
        lookahead.update(3.0, 1.0, waited_s=0.5 if lookahead.current < 5 else 0.0)
    assert lookahead.current == 5
    path = [lookahead.update(0.5, 1.0) for _ in range(40)]
    assert path[-1] == 1 and all(a - b in (0, 1) for a, b in itertools.pairwise(path))


def test_a_short_wait_is_tolerated():
    lookahead = Lookahead.adaptive(maximum=8, start=3)
    assert [lookahead.update(2.0, 1.0, waited_s=0.04) for _ in range(10)] == [3] * 10


def window(minimum: int = 1, maximum: int = 6, warmup_steps: int = 0) -> OffPolicyWindow:
    w = OffPolicyWindow.adaptive(minimum, maximum, min_ess_frac=0.9, max_truncated_frac=0.02)
    w.warmup_steps = warmup_steps
    return w


def test_health_headroom_is_the_distance_to_the_nearest_limit():
    w = window()
    assert w.health_headroom(1.0, 0.0) == 1.0 and w.health_headroom(None, None) == 1.0  # on-policy
    assert w.health_headroom(0.95, 0.0) == pytest.approx(0.5)  # halfway from 1 to the ess limit 0.9
    assert w.health_headroom(0.99, 0.015) == pytest.approx(0.25)  # the truncation limit is nearer
    assert w.health_headroom(0.85, 0.0) < 0 and w.health_headroom(1.0, 0.03) < 0  # past a limit


def test_a_fixed_window_never_moves():
    w = OffPolicyWindow.fixed(3)
    assert [w.update(0.9, 0.1, 0.5) for _ in range(4)] == [3] * 4 and w.change == 0 and not w.auto


def test_the_window_widens_while_the_learner_waits_and_health_allows_one_step_at_a_time():
    w = window()
    path = [w.update(waited_frac=0.3, ess_frac=0.99, truncated_frac=0.0) for _ in range(12)]
    # one version at a time, each followed by 2 steps that show the health of the wider lag
    assert path == [2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5] and w.change == 0


def test_the_window_counts_neither_the_pipeline_filling_nor_one_slow_batch_nor_a_lag_not_yet_reached():
    filling = window(warmup_steps=2)
    assert [filling.update(0.9, 1.0, 0.0) for _ in range(3)] == [1, 1, 2]  # the first two steps wait whatever K is
    once = window()
    assert [once.update(w, 1.0, 0.0) for w in (0.0, 0.0, 0.12, 0.0, 0.0)] == [1] * 5  # average 0.3 x 12% < 5%
    unreached = window(minimum=2)
    assert [unreached.update(0.5, 1.0, 0.0, lag_max=1) for _ in range(3)] == [2, 2, 2]  # lag 2 not measured yet
    assert unreached.update(0.5, 1.0, 0.0, lag_max=2) == 3


def test_the_window_widens_only_where_one_more_version_of_lag_is_predicted_inside_the_limits():
    # A deficit grows with the square of the lag: 1 - 0.95 at K=2 is predicted as 1 - 0.05 * (3/2)^2 = 0.8875 at 3.
    narrow, wide = window(minimum=2), window(minimum=4)
    assert narrow.update(0.5, 0.95, 0.0) == 2 and narrow.predicted_headroom() < 0
    assert wide.update(0.5, 0.95, 0.0) == 5  # at 4: 1 - 0.05 * (5/4)^2 = 0.922, inside
    # the worst step since the last move counts, not the latest one
    assert [narrow.update(0.5, 1.0, 0.0) for _ in range(3)] == [2, 2, 2]
    tails = window(minimum=2)
    assert tails.update(0.5, 1.0, 0.01) == 2  # 0.01 * 2.25 = 0.0225 capped weights: past the 0.02 limit


def test_the_window_holds_when_the_learner_is_fed_or_health_has_too_little_headroom():
    fed, thin = window(), window()
    assert [fed.update(0.01, 1.0, 0.0) for _ in range(5)] == [1] * 5  # a 1% wait is tolerated
    assert [thin.update(0.5, 0.92, 0.0) for _ in range(5)] == [1] * 5  # headroom 0.2 < 0.25: not worth it


def test_the_window_narrows_at_once_past_a_limit_down_to_its_minimum():
    w = window(minimum=2)
    for _ in range(20):
        w.update(0.5, 1.0, 0.0)
    assert w.current == 6
    # At once (a widening's wait does not delay it), then one per two steps (narrow_cooldown 1), to the minimum.
    path = [w.update(0.5, ess_frac=0.8, truncated_frac=0.0) for _ in range(10)]
    assert path == [5, 5, 4, 4, 3, 3, 2, 2, 2, 2] and w.change == 0
    w.update(0.5, 1.0, 0.05)  # the tails are past their limit too: it stays at the minimum
    assert w.current == 2


def test_pacing_keeps_an_automatic_lookahead_within_the_window():
    pacing = Pacing(Lookahead.adaptive(8, start=4), window(minimum=2))
    assert pacing.lookahead.current == 2 and pacing.lookahead.maximum == 2
    metrics = pacing.update(group_latency_s=10.0, busy_step_s=1.0, waited_s=0.5, learner={"offpolicy/ess_frac": 1.0})
    assert metrics["offpolicy/window"] == 3 and metrics["offpolicy/window_change"] == 1
    assert metrics["scheduling/async_steps"] == 3 == pacing.lookahead.maximum  # the need (10) is capped at K
    fixed = Pacing(Lookahead.fixed(4), window(minimum=2))
    assert fixed.update(10.0, 1.0, 0.5, {})["scheduling/async_steps"] == 4  # a fixed lookahead is the user's


def test_a_window_needs_ordered_bounds():
    with pytest.raises(ValueError, match="1 <= minimum <= maximum"):
        window(minimum=3, maximum=2)
