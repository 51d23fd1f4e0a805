"""The replay benchmark's pure parts (`benchmarks.replay`): MFU and MBU from a model's dimensions. (The benchmark
itself runs in smoke mode in tests/nightly/test_benchmarks_quick.py.)"""

from __future__ import annotations

import pytest


def test_mfu_and_mbu_from_model_dimensions():
    from benchmarks.replay import GPU_PEAKS, dense_params, utilization

    params = dense_params(hidden=4096, layers=32, vocab=128_000)  # a Llama-3-8B-like shape
    assert 6.9e9 < params < 7.1e9
    # 10k tokens/s at 100 decode steps/s on an H100.
    u = utilization(params, 10_000, 100, *GPU_PEAKS["H100"])
    assert u["mfu"] == pytest.approx(2 * params * 10_000 / 989e12)
    assert u["mbu"] == pytest.approx(2 * params * 100 / 3.35e12)
    assert 0 < u["mfu"] < 1 and 0 < u["mbu"] < 1
