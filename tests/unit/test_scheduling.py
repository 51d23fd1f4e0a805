"""The lookahead controller of `--async_steps auto` (pure): bounded, smooth, no oscillation."""

from __future__ import annotations

import itertools
import random

import pytest

from open_instruct.scheduling import Lookahead


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
