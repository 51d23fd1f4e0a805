"""--use_peft learner groups for real (DeepSpeed over gloo, Ray actors, the tiny model), and the adapter checkpoint
check that tests/integration (ZeRO-2) and tests/nightly (ZeRO-3, universal) both run. The caller's module holds
the Ray cluster."""

from __future__ import annotations

import torch
from helpers.batches import rewarded_groups

from open_instruct import batching, cluster
from open_instruct.weights import adapter_names

LORA = {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0}


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


def lora_checkpoint_resumes_exactly(model_path, tokenizer, tmp_path, stage: int, universal: bool) -> None:
    """The state after one step (adapter, Adam moments, RNG; not the frozen base) loads into a fresh group, whose
    next step equals the uninterrupted one (through DeepSpeed's universal checkpoint when `universal`:
    --deepspeed_checkpoint_load_universal). The saved model is a peft adapter; merged on request, it scores
    like base + adapter."""
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
