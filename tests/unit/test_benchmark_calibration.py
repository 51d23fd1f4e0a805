"""The benchmarks' pure parts: the learner-step cost fit and its calibration on the embedded model, MFU/MBU
from a model's dimensions; and the regexes the tests' forced-turn engine (tests/helpers/forced_turns.py) gives
each sample. (The benchmarks themselves run in smoke mode in tests/nightly/test_benchmarks_quick.py.)"""

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


def test_mfu_and_mbu_from_model_dimensions():
    from benchmarks.replay import GPU_PEAKS, dense_params, utilization

    params = dense_params(hidden=4096, layers=32, vocab=128_000)  # a Llama-3-8B-like shape
    assert 6.9e9 < params < 7.1e9
    # 10k tokens/s at 100 decode steps/s on an H100.
    u = utilization(params, 10_000, 100, *GPU_PEAKS["H100"])
    assert u["mfu"] == pytest.approx(2 * params * 10_000 / 989e12)
    assert u["mbu"] == pytest.approx(2 * params * 100 / 3.35e12)
    assert 0 < u["mfu"] < 1 and 0 < u["mbu"] < 1


def test_a_forced_answer_is_the_rows_label_for_one_sample_and_another_regex_for_the_next():
    import re

    from helpers.forced_turns import GROUND_TRUTH, forced_regex

    from open_instruct.messages import PromptRequest, SamplingSettings

    request = PromptRequest("p", (1,), ((r"\frac{1}{2}", "0.5"),), ("math",), SamplingSettings(max_tokens=8), 2, 0, 0)
    answers = (r"\\boxed\{" + GROUND_TRUTH + r"\}", r"\\boxed\{0\}")
    right, wrong, right_again = (forced_regex(answers, request, i) for i in range(3))
    assert re.fullmatch(right, r"\boxed{\frac{1}{2}}") and right_again == right  # the first label, escaped
    assert re.fullmatch(wrong, r"\boxed{0}")
    assert forced_regex("<tool_call>", request, 1) == "<tool_call>"  # one regex: every sample
