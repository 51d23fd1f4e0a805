"""The learner variants of what CI checks on the default path (tests/integration/test_learner.py): pi_old taken
from the training forward at ZeRO-3, and ZeRO-Offload with the per-tensor AdamW taking the default ZeRO-3 step."""

from __future__ import annotations

import pytest
from helpers.learner_runs import pi_old_matches_the_separate_pass, run_group

from open_instruct import cluster


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    cluster.init_ray(min_logical_cpus=3)
    yield
    ray.shutdown()


def test_pi_old_from_the_zero3_training_forward_matches_the_separate_pass(model_path, groups):
    pi_old_matches_the_separate_pass(model_path, groups, stage=3)


def test_offloaded_unfused_zero3_learners_take_the_same_step(model_path, groups):
    """--deepspeed_offload_param/--deepspeed_offload_optimizer (ZeRO-Offload to CPU memory), the per-tensor
    AdamW (--fused_optimizer False) and --backend_timeout: the same update as the default ZeRO-3 learner."""
    before, (default, _), _, _ = run_group(model_path, groups, stage=3)
    _, (offloaded, _), _, _ = run_group(
        model_path,
        groups,
        stage=3,
        deepspeed_offload_param=True,
        deepspeed_offload_optimizer=True,
        fused_optimizer=False,
        backend_timeout=5,
    )
    assert max((default[n] - offloaded[n]).abs().max().item() for n in default) < 1e-5
    assert max((offloaded[n] - before[n]).abs().max().item() for n in before) > 1e-4
