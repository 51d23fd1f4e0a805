"""--use_peft's pure parts on CPU: the flags (open-instruct's names and defaults, refusals with their reason), the
names the adapter travels under, the rank vLLM serves, the zero adapter engines start from, and the KL
reference with the adapter switched off (the base model exactly)."""

from __future__ import annotations

import json

import pytest
import torch

from open_instruct import adapters
from open_instruct.config.core import parse_config
from open_instruct.config.fields import ConfigError
from open_instruct.config.model import ModelConfig
from open_instruct.weights import adapter_names

LORA = ModelConfig(use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0)


def test_open_instructs_lora_flags_parse_with_its_defaults_into_the_model_group():
    cfg = parse_config(["--use_peft"])
    model = cfg.model
    assert (model.use_peft, model.lora_r, model.lora_alpha, model.lora_dropout) == (True, 16, 32, 0.05)
    assert (model.lora_target_modules, model.lora_modules_to_save, model.lora_task_type) == (None, None, "CAUSAL_LM")
    assert not hasattr(cfg.compat, "use_peft")
    given = parse_config(["--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"]).model
    assert given.lora_r == 4 and given.lora_target_modules == ["q_proj", "v_proj"]
    # Without --use_peft the companions parse and change nothing (open-instruct's scripts pass them either way).
    assert parse_config(["--lora_r", "64"]).model.use_peft is False


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--lora_modules_to_save", "lm_head"], "--lora_modules_to_save lm_head: not supported yet: vLLM serves whole"),
        (["--lora_task_type", "SEQ_CLS"], "--lora_task_type SEQ_CLS: the policy is a causal LM"),
        (["--lora_r", "600"], "--lora_r 600 is above 512"),
        (["--lora_r", "0"], "--lora_r"),
        (["--lora_dropout", "1.0"], "--lora_dropout"),
        (["--beta", "0.1", "--ref_policy_update_freq", "10"], "--ref_policy_update_freq 10 with --use_peft"),
    ],
)
def test_lora_values_that_cannot_work_are_refused_at_parse_time_with_the_reason(flags, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        parse_config(["--use_peft", *flags])


def test_an_adapter_is_served_at_the_smallest_vllm_rank_that_holds_it():
    assert [adapters.served_rank(r) for r in (1, 2, 8, 9, 16, 300, 512)] == [1, 8, 8, 16, 16, 320, 512]
    with pytest.raises(ValueError, match="513"):
        adapters.served_rank(513)


def test_adapter_tensors_travel_under_peft_saved_names():
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert adapter_names.wire_name(name) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert all(adapter_names.is_adapter_parameter(name.replace("lora_A", m)) for m in ("lora_A", "lora_B"))
    assert not adapter_names.is_adapter_parameter("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")


def peft_policy(model_path, seed: int = 0):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return get_peft_model(base, adapters.peft_config(LORA)).eval()


def test_the_zero_adapter_engines_start_from_has_the_learners_names_and_shapes(model_path, tmp_path):
    from safetensors.torch import load_file

    written = adapters.write_zero_adapter(model_path, LORA, str(tmp_path))
    tensors = load_file(str(tmp_path / adapter_names.ADAPTER_FILE))
    learner = {
        adapter_names.wire_name(name): tuple(p.shape)
        for name, p in peft_policy(model_path).named_parameters()
        if adapter_names.is_adapter_parameter(name)
    }
    assert written == len(tensors) == len(learner) == 4 * 7 * 2  # 4 layers x 7 linear modules x (A, B)
    assert {name: tuple(t.shape) for name, t in tensors.items()} == learner
    assert all(not t.any() for t in tensors.values())
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (8, 16, "all-linear")


def test_the_reference_with_the_adapter_off_scores_exactly_as_the_base_model(model_path):
    from transformers import AutoModelForCausalLM

    from open_instruct.learner.logprobs import packed_token_logprobs
    from open_instruct.learner.reference import AdapterOffReference

    policy = peft_policy(model_path)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, param in policy.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.5)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 17, 33, 2, 8, 41, 12]])
    mb = {
        "input_ids": ids,
        "position_ids": torch.arange(ids.shape[1])[None],
        "doc_ids": torch.ones_like(ids),
        "response_mask": torch.ones_like(ids),
    }
    with torch.no_grad():
        reference = packed_token_logprobs(AdapterOffReference(policy, policy), mb, 1.0)
        plain = packed_token_logprobs(base, mb, 1.0)
        with_adapter = packed_token_logprobs(policy, mb, 1.0)
    assert torch.equal(reference, plain)
    assert not torch.allclose(with_adapter, plain, atol=1e-3)  # the adapter was on the rest of the time
    assert list(AdapterOffReference(policy, policy).parameters()) == []


def test_preflight_with_lora_flags_states_the_adapter_and_names_a_module_the_model_lacks(capsys):
    from open_instruct import grpo_fast

    assert grpo_fast.main(["--preflight", "--use_peft", "--lora_r", "8", "--lora_alpha", "16"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "LoRA adapter" in line)
    assert line.startswith("  ok") and "r=8, alpha 16, 28 modules (all-linear): 94,208 parameters" in line
    assert "(8.68% of the model)" in line and "preflight: ready to launch" in out
    argv = ["--preflight", "--use_peft", "--lora_target_modules", "q_proj", "qkv_proj"]
    assert grpo_fast.main(argv) == 2
    out = capsys.readouterr().out
    assert "FAIL LoRA adapter: --lora_target_modules qkv_proj: no module of" in out and "checks failed" in out
