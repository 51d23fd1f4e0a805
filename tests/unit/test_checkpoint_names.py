"""MoE weight names: transformers 5 stacks a Qwen3-MoE's experts at load, and a weight sync must still send the
checkpoint's tensors (`mlp.experts.E.gate_proj.weight` ...), the names vLLM's qwen3_moe loader reads. A tiny
random Qwen3-MoE is made here; its sync metadata and tensors equal its saved checkpoint exactly, and the saved
model loads back in transformers unchanged."""

from __future__ import annotations

import pytest
import torch

from open_instruct.learner.weight_sender import weight_metadata
from open_instruct.weights.checkpoint_names import CheckpointNames

EXPERTS = 4


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=24,  # 2 x 24 != 32: a transposed expert would not fit
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_qwen3_moe")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


def loaded(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def checkpoint(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(f"{path}/model.safetensors")


def test_the_sync_sends_a_fused_moe_under_its_checkpoints_names_shapes_and_values(moe_path):
    model = loaded(moe_path)
    assert "model.layers.0.mlp.experts.gate_up_proj" in dict(model.named_parameters())  # fused at load
    names = CheckpointNames.of(model)
    assert names is not None and len(names.converted) == 2 * 2  # gate_up and down, in each layer
    saved = checkpoint(moe_path)

    named = list(model.named_parameters())
    metadata = weight_metadata(named, "float32", names)
    assert sorted(metadata.names) == sorted(saved) and len(set(metadata.names)) == len(metadata.names)
    assert all(tuple(saved[n].shape) == s for n, s in zip(metadata.names, metadata.shapes))
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in metadata.names

    sent = [pair for name, param in named for pair in names.tensors(name, param.detach())]
    assert [n for n, _ in sent] == list(metadata.names)  # the order the metadata announced
    assert all(torch.equal(tensor, saved[n]) for n, tensor in sent)


def test_a_model_transformers_does_not_convert_has_no_checkpoint_names(model_path):
    assert CheckpointNames.of(loaded(model_path)) is None


def test_a_saved_moe_loads_back_in_transformers_unchanged(moe_path, tmp_path):
    model = loaded(moe_path)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)  # a trained model
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.save_pretrained(tmp_path, state_dict=state)  # as the learner saves (learner/actor.py save_model)
    assert all(".experts.gate_up_proj" not in n for n in checkpoint(str(tmp_path)))
    back = dict(loaded(str(tmp_path)).named_parameters())
    assert set(back) == set(state) and all(torch.equal(back[n], state[n]) for n in state)
