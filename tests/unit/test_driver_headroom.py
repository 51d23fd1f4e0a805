"""benchmarks.driver_headroom's arithmetic and its stand-in engine, without Ray: the cluster table's rates and
headroom, the long-reasoning lengths, and samples as the real engine would deliver them. The benchmark's
run on the real loop is the nightly tier's (tests/nightly/test_benchmarks_quick.py).
Run: `.venv/bin/pytest tests/unit/test_driver_headroom.py` (a second).
"""

from __future__ import annotations

import statistics

import pytest

from benchmarks.driver_headroom import CLUSTER_GPUS, InstantEngine, cluster_rows, long_reasoning_workload, scaled_shape
from benchmarks.simulation_projection import LONG_REASONING_CLUSTER
from open_instruct.messages import PromptRequest, SamplingSettings


def test_the_cluster_table_scales_the_long_reasoning_shape_and_the_slower_of_driver_and_queue_sets_the_headroom():
    simulated = []

    def rate(cluster, workload, driver_per_sample_s=0.0):  # the simulator's stand-in: 0.5 samples/s per GPU
        simulated.append((cluster, workload, driver_per_sample_s))
        free = 0.5 * (cluster.num_engines + cluster.num_learners)
        return 1.0 / (1.0 / free + driver_per_sample_s)

    rows = cluster_rows(steps=8, driver_s=0.001, queue_s=0.002, rate=rate)
    assert [r.gpus for r in rows] == list(CLUSTER_GPUS)
    for row in rows:
        assert row.engines + row.learners == row.gpus and row.engines == round(row.gpus * 2 / 3)  # 32 : 16
        assert row.cluster_samples_per_s == pytest.approx(0.5 * row.gpus)
        assert row.headroom == pytest.approx(500 / row.cluster_samples_per_s)  # the queue's 500/s, not the driver's
        # The serial loop: a step is the learners' time for its samples plus the driver's.
        assert 1 / row.serial_loop_samples_per_s == pytest.approx(1 / row.cluster_samples_per_s + 0.001)
        assert row.simulated_samples_per_s == pytest.approx(row.serial_loop_samples_per_s)
    # Each size simulated twice (free driver, then this one), its prompts per step in proportion to its GPUs.
    assert [driver for _, _, driver in simulated] == [0.0, 0.001] * len(CLUSTER_GPUS)
    for cluster, workload, _ in simulated:
        assert workload.num_steps == 8 and workload.prompts_per_step == round(256 * cluster_gpus(cluster) / 48)
    assert scaled_shape(48, 16)[0] == LONG_REASONING_CLUSTER  # at its own size the shape is itself


def cluster_gpus(cluster) -> int:
    return cluster.num_engines + cluster.num_learners


def test_the_workload_is_the_long_reasoning_one_and_a_smaller_cap_scales_its_median():
    full = long_reasoning_workload(prompts_per_step=4, num_steps=3)
    assert (full.samples_per_prompt, full.median_tokens, full.sigma, full.max_tokens) == (16, 4000, 0.8, 16384)
    small = long_reasoning_workload(prompts_per_step=4, num_steps=3, max_tokens=1024)
    assert small.max_tokens == 1024 and small.median_tokens == 250 and small.prompt_tokens == 32


def test_the_instant_engine_delivers_every_sample_of_a_prompt_with_the_workloads_lengths():
    engine = InstantEngine(engine_id=3, workload=long_reasoning_workload(prompts_per_step=1, num_steps=1))
    request = PromptRequest("p0", (1, 2, 3), (), (), SamplingSettings(max_tokens=16384), 16, 0, admitted_version=2)
    samples = [engine.sample(request, j) for j in request.samples_to_generate()]
    assert [c.sample_index for c in samples] == list(range(16)) and {c.engine_id for c in samples} == {3}
    lengths = [len(c.response_token_ids) for c in samples]
    assert all(len(c.behaviour_logprobs) == n and c.version_spans[0].end == n for c, n in zip(samples, lengths))
    assert max(lengths) <= 16384 and 1000 < statistics.median(lengths) < 16000
    assert {c.reward for c in samples} == {0.0, 1.0}  # spread in every group: none is filtered
    assert engine.stats().completed_samples == 16
