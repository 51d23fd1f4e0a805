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
