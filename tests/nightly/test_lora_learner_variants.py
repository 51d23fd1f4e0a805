"""--use_peft learners, the variants of what CI checks at ZeRO-2 and without sequence parallelism
(tests/integration/test_lora_learner.py): two sequence-parallel ranks take one rank's step, and an adapter
checkpoint resumes exactly at ZeRO-3 (partitioned adapter and base) and through DeepSpeed's universal
checkpoint."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import rewarded_groups
from helpers.lora_learners import lora_checkpoint_resumes_exactly, one_step

from open_instruct import cluster
from open_instruct.weights import adapter_names


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    cluster.init_ray(min_logical_cpus=3)
    yield
    ray.shutdown()


def test_sequence_parallel_lora_ranks_take_the_same_step_as_one_rank(model_path, tokenizer):
    groups = rewarded_groups(tokenizer, 2)
    before, alone, single = one_step(model_path, tokenizer, groups, 1, 3)
    _, split_rows, metrics = one_step(model_path, tokenizer, groups, 2, 3, sequence_parallel_size=2)
    assert metrics["learner/grad_norm"] == pytest.approx(single["learner/grad_norm"], rel=1e-4)
    names = [k for k in before if adapter_names.is_adapter_parameter(k)]
    update = torch.cat([(alone[n] - before[n]).flatten() for n in names])
    other = torch.cat([(split_rows[n] - before[n]).flatten() for n in names])
    assert update.norm() > 1e-3 and (update - other).norm() < 0.02 * update.norm()


@pytest.mark.parametrize("universal", [False, True], ids=["zero3", "universal"])
def test_a_zero3_lora_checkpoint_holds_the_adapter_and_resumes_exactly(model_path, tokenizer, tmp_path, universal):
    lora_checkpoint_resumes_exactly(model_path, tokenizer, tmp_path, stage=3, universal=universal)
