"""--use_peft learners for real (DeepSpeed over gloo, Ray actors, the tiny model): only the adapter trains, at
every ZeRO stage and under sequence parallelism; the KL reference is the base model (the adapter switched
off); a checkpoint holds the adapter and the optimizer state alone and resumes exactly; saved models are a
peft adapter and, when asked, the merged model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.batches import rewarded_groups

from open_instruct import batching, cluster
from open_instruct.weights import adapter_names

REPO = Path(__file__).resolve().parents[2]

LORA = {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    cluster.init_ray(min_logical_cpus=3)
    yield
    ray.shutdown()


def lora_learners(model_path, tokenizer, ranks: int, stage: int, sequence_parallel_size: int = 1, **options):
    """A learner group training the adapter (a context manager that releases it)."""
    from open_instruct.learner.actor import learner_settings

    settings = learner_settings(
        model_path,
        total_steps=4,
        deepspeed_stage=stage,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        truncated_importance_sampling_ratio_cap=0.0,
        sequence_parallel_size=sequence_parallel_size,
        param_persistence_threshold=0,
        **{"beta": 0.0, **LORA, **options},
    )
    batch_settings = batching.batch_settings(
        tokenizer.pad_token_id,
        pack_length=128,
        num_learners_per_node=[ranks],
        sequence_parallel_size=sequence_parallel_size,
        per_device_train_batch_size=1,
        micro_batch_token_budget=128 if sequence_parallel_size > 1 else 0,
    )
    return cluster.learner_group_for_a_while(settings, batch_settings, ranks)


def split(state: dict) -> tuple[dict, dict]:
    adapter = {k: v for k, v in state.items() if adapter_names.is_adapter_parameter(k)}
    return adapter, {k: v for k, v in state.items() if k not in adapter}


def one_step(model_path, tokenizer, groups, ranks: int, stage: int, **options) -> tuple[dict, dict, dict]:
    with lora_learners(model_path, tokenizer, ranks, stage, **options) as learners:
        learners.setup()
        before = learners.full_state_dict()
        report = learners.train_step(groups, 0)
        return before, learners.full_state_dict(), report.metrics


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


def test_sequence_parallel_lora_ranks_take_the_same_step_as_one_rank(model_path, tokenizer):
    groups = rewarded_groups(tokenizer, 2)
    before, alone, single = one_step(model_path, tokenizer, groups, 1, 3)
    _, split_rows, metrics = one_step(model_path, tokenizer, groups, 2, 3, sequence_parallel_size=2)
    assert metrics["learner/grad_norm"] == pytest.approx(single["learner/grad_norm"], rel=1e-4)
    names = [k for k in before if adapter_names.is_adapter_parameter(k)]
    update = torch.cat([(alone[n] - before[n]).flatten() for n in names])
    other = torch.cat([(split_rows[n] - before[n]).flatten() for n in names])
    assert update.norm() > 1e-3 and (update - other).norm() < 0.02 * update.norm()


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "lora_pi_old.py"), model_path, str(port)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["train_mode_differs"]
    assert report["rho_mean"] == report["rho_max"] == report["rho_sq_mean"] == 1.0, report


@pytest.mark.parametrize("stage, universal", [(2, False), (3, False), (3, True)], ids=["zero2", "zero3", "universal"])
def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly(model_path, tokenizer, tmp_path, stage, universal):
    """The state after one step (adapter, Adam moments, RNG; not the frozen base) loads into a fresh group,
    whose next step equals the uninterrupted one, at ZeRO-2 and ZeRO-3 (partitioned adapter and base), and
    through DeepSpeed's universal checkpoint (--deepspeed_checkpoint_load_universal). The saved model is a
    peft adapter; merged on request, it scores like base + adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    groups = rewarded_groups(tokenizer, 2)
    state_dir, model_dir = tmp_path / "state", tmp_path / "model"
    with lora_learners(model_path, tokenizer, 2, stage, save_merged_lora_model=True) as learners:
        learners.setup()
        learners.train_step(groups, 0)
        learners.save_state(str(state_dir))
        learners.save_model(str(model_dir))
        saved = learners.full_state_dict()
        learners.train_step(groups, 1)
        uninterrupted = learners.full_state_dict()
    stored = sum(f.stat().st_size for f in (state_dir / "learner").rglob("*.pt"))
    base_bytes = sum(v.numel() * 4 for k, v in split(saved)[1].items())
    assert stored < base_bytes / 2  # the adapter and its optimizer state, not the base model

    with lora_learners(model_path, tokenizer, 2, stage, deepspeed_checkpoint_load_universal=universal) as fresh:
        fresh.setup()
        assert fresh.load_state(str(state_dir)) == 1
        restored = fresh.full_state_dict()
        assert all(torch.equal(restored[k], saved[k]) for k in saved)
        fresh.train_step(groups, 1)
        resumed = fresh.full_state_dict()
    step = max((uninterrupted[k] - saved[k]).abs().max().item() for k in saved)
    assert step > 1e-4
    assert max((resumed[k] - uninterrupted[k]).abs().max().item() for k in saved) < 1e-3 * step

    assert (model_dir / "adapter_config.json").exists() and (model_dir / adapter_names.ADAPTER_FILE).exists()
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, str(model_dir)).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(model_dir / "merged"), dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode("What is 3 + 4?")])
    with torch.no_grad():
        expected, got = with_adapter(ids).logits, merged(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)(ids).logits
    assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, plain, atol=1e-4)
