"""--use_peft learners for real (DeepSpeed over gloo, Ray actors, the tiny model): only the adapter trains, at
every ZeRO stage; the KL reference is the base model (the adapter switched off); a checkpoint holds the adapter
and the optimizer state alone and resumes exactly; saved models are a peft adapter and, when asked, the merged
model. Under sequence parallelism, and the checkpoint at ZeRO-3 and universal: tests/nightly/
test_lora_learner_variants.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.batches import rewarded_groups
from helpers.lora_learners import lora_checkpoint_resumes_exactly, lora_learners, one_step, split

from open_instruct import cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    cluster.init_ray(min_logical_cpus=3)
    yield
    ray.shutdown()


def test_every_zero_stage_trains_the_adapter_alone_and_takes_the_same_step(model_path, tokenizer):
    groups = rewarded_groups(tokenizer, 2)
    updates = {}
    for stage in (0, 2, 3):
        before, after, _ = one_step(model_path, tokenizer, groups, 2, stage)
        adapter_before, base_before = split(before)
        adapter_after, base_after = split(after)
        assert adapter_before and set(base_before) == set(base_after)
        assert all(torch.equal(base_before[k], base_after[k]) for k in base_before), stage  # the base is frozen
        update = torch.cat([(adapter_after[k] - adapter_before[k]).flatten() for k in adapter_before])
        assert update.norm() > 1e-3, stage
        updates[stage] = update
    # Adam's first step is g / (|g| + eps): a gradient entry near zero flips with the summation order, which
    # differs between stages, so the updates are compared as a whole.
    for stage in (2, 3):
        assert (updates[stage] - updates[0]).norm() < 0.02 * updates[0].norm(), stage


def test_the_kl_reference_is_the_base_model_with_the_adapter_off(model_path, tokenizer):
    """Under ZeRO-3 with --beta: at the first step the adapter is zero, so the policy is the base and the KL is
    exactly 0; after a step it is not, and the KL is positive."""
    groups = rewarded_groups(tokenizer, 2)
    with lora_learners(model_path, tokenizer, 2, 3, beta=0.05) as learners:
        learners.setup()
        first = learners.train_step(groups, 0).metrics
        second = learners.train_step(groups, 1).metrics
    assert first["objective/kl_avg"] == 0.0
    assert second["objective/kl_avg"] > 0.0


def test_pi_old_has_no_dropout_so_rho_is_exactly_1_when_nothing_is_stale(model_path):
    """With --lora_dropout 0.05 and one mini-batch, pi_old comes from an eval-mode pass, not the training
    forward: against behaviour logprobs that are the current policy's own, rho is exactly 1. The helper also
    shows the training-mode forward differs (a training-mode pi_old would put dropout noise into rho)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "lora_pi_old.py"), model_path],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["train_mode_differs"]
    assert report["rho_mean"] == report["rho_max"] == report["rho_sq_mean"] == 1.0, report


def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly(model_path, tokenizer, tmp_path):
    """At ZeRO-2 (ZeRO-3's partitioned adapter and base, and the universal checkpoint: tests/nightly/
    test_lora_learner_variants.py)."""
    lora_checkpoint_resumes_exactly(model_path, tokenizer, tmp_path, stage=2, universal=False)
