"""benchmarks.driver_headroom's arithmetic and its stand-in engine, without Ray: the cluster table's rates and
headroom, the original request's lengths, and samples as the real engine would deliver them. The benchmark's
run on the real loop is the nightly tier's (tests/nightly/test_benchmarks_quick.py).
Run: `.venv/bin/pytest tests/unit/test_driver_headroom.py` (a second).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.driver_headroom import CLUSTER_GPUS, InstantEngine, cluster_rows, request_workload
from open_instruct.messages import PromptRequest, SamplingSettings


def test_the_cluster_table_scales_the_request_and_the_slower_of_driver_and_queue_sets_the_headroom():
    rows = cluster_rows(per_gpu_samples_per_s=0.5, driver_s=0.001, queue_s=0.002)
    assert [r.gpus for r in rows] == list(CLUSTER_GPUS)
    for row in rows:
        assert row.engines + row.learners == row.gpus and row.engines == round(row.gpus * 2 / 3)  # 32 : 16
        assert row.cluster_samples_per_s == pytest.approx(0.5 * row.gpus)
        assert row.headroom == pytest.approx(500 / row.cluster_samples_per_s)  # the queue's 500/s, not the driver's
        # The serial loop: a step is the learners' time for its samples plus the driver's.
        assert 1 / row.serial_loop_samples_per_s == pytest.approx(1 / row.cluster_samples_per_s + 0.001)


def test_the_workload_is_the_original_requests_and_a_smaller_cap_scales_its_median():
    full = request_workload(prompts_per_step=4, num_steps=3)
    assert (full.samples_per_prompt, full.median_tokens, full.sigma, full.max_tokens) == (16, 4000, 0.8, 16384)
    small = request_workload(prompts_per_step=4, num_steps=3, max_tokens=1024)
    assert small.max_tokens == 1024 and small.median_tokens == 250 and small.prompt_tokens == 32


def test_the_instant_engine_delivers_every_sample_of_a_prompt_with_the_workloads_lengths():
    engine = InstantEngine(engine_id=3, workload=request_workload(prompts_per_step=1, num_steps=1))
    request = PromptRequest("p0", (1, 2, 3), (), (), SamplingSettings(max_tokens=16384), 16, 0, admitted_version=2)
    samples = [engine.sample(request, j) for j in request.samples_to_generate()]
    assert [c.sample_index for c in samples] == list(range(16)) and {c.engine_id for c in samples} == {3}
    lengths = [len(c.response_token_ids) for c in samples]
    assert all(len(c.behaviour_logprobs) == n and c.version_spans[0].end == n for c, n in zip(samples, lengths))
    assert max(lengths) <= 16384 and 1000 < statistics.median(lengths) < 16000
    assert {c.reward for c in samples} == {0.0, 1.0}  # spread in every group: none is filtered
    assert engine.stats().completed_samples == 16
