"""The learner's one seam between full fine-tuning and a LoRA adapter (`learner.policy_weights`), on CPU with the
embedded model: chosen once from --use_peft, and each side's answers (what trains and syncs under which names,
the reference, the saves, DeepSpeed's checkpoint flags)."""

from __future__ import annotations

import json

import pytest
import torch

from open_instruct.learner.actor import learner_settings
from open_instruct.learner.policy_weights import AdapterWeights, FullWeights
from open_instruct.learner.reference import AdapterOffReference, ReferencePolicy
from open_instruct.weights import adapter_names

LORA = {"use_peft": True, "lora_r": 8, "lora_alpha": 16}


def base_model(model_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)


def never_loaded():
    raise AssertionError("an adapter's reference is the base itself: no copy is loaded")


class FakeEngine:
    """What the reference needs of a DeepSpeed engine: the module it wraps and its device."""

    def __init__(self, module):
        self.module, self.device = module, torch.device("cpu")


def test_the_choice_is_made_once_from_use_peft_and_sets_pi_old_and_the_checkpoint_flags():
    full = learner_settings("m")
    assert type(full.weights) is FullWeights and full.weights is full.weights
    assert (full.weights.exclude_frozen_parameters, full.weights.load_module_strict) == (False, True)
    assert not full.weights.drops_out and full.old_logprobs_from_training_pass
    adapter = learner_settings("m", **LORA, lora_dropout=0.05)
    assert type(adapter.weights) is AdapterWeights
    # The base is not checkpointed, so the checkpoint is loaded into a fresh base without its frozen weights.
    assert (adapter.weights.exclude_frozen_parameters, adapter.weights.load_module_strict) == (True, False)
    assert adapter.weights.drops_out and not adapter.old_logprobs_from_training_pass  # eval-mode pass for pi_old
    assert not learner_settings("m", **LORA, lora_dropout=0.0).weights.drops_out


def test_full_weights_sync_every_parameter_and_load_a_frozen_reference_only_with_a_kl_penalty(model_path):
    model = base_model(model_path)
    weights = learner_settings(model_path, beta=0.05).weights
    assert weights.wrap(model) is model
    assert [name for name, _ in weights.synced(model)] == [name for name, _ in model.named_parameters()]
    assert weights.checkpoint_names(model) is None  # Qwen2: no load-time conversion
    assert learner_settings(model_path, beta=0.0).weights.load_reference(never_loaded) is None
    loaded = weights.load_reference(lambda: base_model(model_path))
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    reference = weights.reference(FakeEngine(model), loaded, {}, None)
    assert isinstance(reference, ReferencePolicy) and reference.model is loaded and not reference.partitioned
    assert weights.reference(FakeEngine(model), None, {}, None) is None


def test_adapter_weights_train_and_sync_the_adapter_alone_and_score_the_reference_with_it_off(model_path):
    weights = learner_settings(model_path, **LORA, beta=0.05).weights
    policy = weights.wrap(base_model(model_path))
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    synced = weights.synced(policy)
    assert trainable and all(adapter_names.is_adapter_parameter(name) for name in trainable)
    assert {name for name, _ in synced} == {adapter_names.wire_name(name) for name in trainable}
    assert all(".default." not in name for name, _ in synced)  # peft's saved names, as the engines read them
    assert weights.checkpoint_names(policy) is None
    assert weights.load_reference(never_loaded) is None
    engine = FakeEngine(policy)
    reference = weights.reference(engine, None, {}, None)
    assert isinstance(reference, AdapterOffReference) and reference.policy is engine
    assert learner_settings(model_path, **LORA, beta=0.0).weights.reference(engine, None, {}, None) is None


@pytest.mark.parametrize("merged", [False, True])
def test_an_adapter_is_saved_in_peft_format_and_merged_on_request(model_path, tmp_path, merged):
    from safetensors.torch import load_file

    weights = learner_settings(model_path, **LORA, save_merged_lora_model=merged).weights
    policy = weights.wrap(base_model(model_path))
    weights.save(policy, str(tmp_path), rank=0)
    saved = load_file(str(tmp_path / adapter_names.ADAPTER_FILE))
    assert sorted(saved) == sorted(name for name, _ in weights.synced(policy))
    assert json.loads((tmp_path / "adapter_config.json").read_text())["r"] == 8
    assert not (tmp_path / "model.safetensors").exists()
    assert (tmp_path / "merged" / "model.safetensors").exists() is merged
