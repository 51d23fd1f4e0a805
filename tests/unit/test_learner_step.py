"""The learner-step benchmark's pure parts (`benchmarks.learner_step`): the row-cost fit, and its calibration on
the embedded model. (The benchmark itself runs in smoke mode in tests/nightly/test_benchmarks_quick.py.)"""

from __future__ import annotations

import pytest


def test_the_row_cost_fit_recovers_the_constants_of_its_points():
    from benchmarks.learner_step import fit_row_cost

    points = [(length, 3e-9 * length * length + 2e-6 * length) for length in (128, 512, 1024, 2048)]
    fit = fit_row_cost(points)
    assert fit["COST_QUADRATIC"] == pytest.approx(3e-9, rel=1e-6)
    assert fit["COST_LINEAR"] == pytest.approx(2e-6, rel=1e-6)


def test_calibration_times_forward_and_backward_of_every_row_length(model_path):
    """Measured on whatever else this machine runs, so only what holds under any load is asserted."""
    from benchmarks.learner_step import calibrate

    fit = calibrate(model_path, repeats=1)
    assert [length for length, _ in fit["points"]] == [128, 256, 512, 768, 1024, 1536, 2048]
    assert all(0 < seconds < 600 for _, seconds in fit["points"])
    assert fit["COST_QUADRATIC"] * 2048 * 2048 + fit["COST_LINEAR"] * 2048 > 0
