"""Saves at any size: the model save, the reference's checkpoint and its resume gather one parameter at a time
under ZeRO-3, rank 0 alone copies and writes, in the model's dtype (`learner/gathered.py`), on real 2-rank
learners (gloo)."""

from __future__ import annotations

import pytest

from open_instruct import batching


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    from open_instruct import cluster

    cluster.init_ray(min_logical_cpus=3)
    yield
    ray.shutdown()


def two_ranks(model_path, tokenizer, **options):
    from open_instruct import cluster
    from open_instruct.learner.actor import learner_settings

    settings = learner_settings(
        model_path,
        total_steps=4,
        deepspeed_stage=3,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        truncated_importance_sampling_ratio_cap=0.0,
        **{"beta": 0.0, **options},
    )
    batch_settings = batching.batch_settings(
        tokenizer.pad_token_id, pack_length=128, num_learners_per_node=[2], per_device_train_batch_size=1
    )
    return cluster.learner_group_for_a_while(settings, batch_settings, 2)


def test_a_zero3_save_loads_back_in_transformers_equal_to_the_trained_weights(model_path, groups, tmp_path):
    """After a step, the 2 ranks' save (streamed, rank 0 writes) is a model transformers loads whose every weight
    equals the trained one; rank 1 kept no copy. Its moved reference, saved with the state, comes back on resume
    (rank 0 reads it, the gathers hand it to rank 1) equal to what was saved."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    taken, tokenizer = groups
    options = {"beta": 0.05, "ref_policy_update_freq": 1, "alpha": 0.5}
    with two_ranks(model_path, tokenizer, **options) as learners:
        learners.setup()
        learners.train_step(taken, 0)
        trained = ray.get([actor.full_state_dict.remote() for actor in learners.actors])
        learners.save_model(str(tmp_path / "model"))
        learners.save_state(str(tmp_path / "state"))
        reference = ray.get([actor.reference_state_dict.remote() for actor in learners.actors])
    assert trained[1] == {} and reference[1] == {}  # under ZeRO-3 only rank 0 copies
    trained, reference = trained[0], reference[0]
    assert all(t.dtype == torch.float32 for t in trained.values())  # the model's dtype on CPU
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    state = dict(loaded.named_parameters())
    assert set(state) == set(trained)
    assert all(torch.equal(state[name], trained[name]) for name in trained)
    assert max((reference[n] - trained[n]).abs().max().item() for n in trained) > 0  # the reference lags
    assert (tmp_path / "state" / "reference" / "model.safetensors").is_file()

    with two_ranks(model_path, tokenizer, **options) as fresh:
        fresh.setup()
        assert fresh.load_state(str(tmp_path / "state")) == 1
        restored = ray.get([actor.reference_state_dict.remote() for actor in fresh.actors])[0]
    assert all(torch.equal(restored[name], reference[name]) for name in reference)


def test_a_save_in_several_shards_loads_back(model_path, tmp_path):
    """Past a shard's size the save is numbered files and an index, as transformers writes them."""
    import torch
    from transformers import AutoModelForCausalLM

    from open_instruct.learner.gathered import SAFE_INDEX, save_hf_model

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    files = save_hf_model(model, tmp_path, partitioned=False, write=True, shard_bytes=1 << 20)
    assert len(files) > 1 and (tmp_path / SAFE_INDEX).is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.dtype == torch.bfloat16
    expected = dict(model.named_parameters())
    assert all(torch.equal(p, expected[n]) for n, p in loaded.named_parameters())


def test_a_zero3_save_peaks_at_one_parameter_not_a_whole_model(tmp_path, monkeypatch):
    """2 ZeRO-3 ranks (gloo): the save's peak memory (the kernel's high-water mark) stays a fraction of one
    model copy on each rank, where one gather of the whole model with an fp32 copy takes two copies."""
    from benchmarks.weight_sync import build_model
    from benchmarks.zero3_memory import run_stage

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))  # freed tensors go back to the system at once
    path, _ = build_model(512, 4, tmp_path)
    for rank in run_stage(str(path), 3, 2, tmp_path):
        whole = rank["whole_model_bytes"]
        streamed = rank["save, one parameter at a time_peak_bytes"]
        gathered = rank["whole-gather save, fp32 copy per rank_peak_bytes"]
        assert gathered > 1.5 * whole, rank
        assert streamed < 0.35 * whole and streamed < 5 * rank["largest_parameter_bytes"], rank


def test_a_merged_lora_save_scores_as_base_plus_adapter_in_the_base_dtype(model_path, tmp_path):
    """The merged save (one layer at a time) is a plain model, in the base's dtype, whose logits are peft's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from open_instruct.learner.gathered import save_merged_lora

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)  # a trained adapter: peft starts B at zero
    save_merged_lora(peft_model, tmp_path, partitioned=False, write=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert merged.dtype == torch.float32 and not any("lora" in n for n, _ in merged.named_parameters())
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        expected = peft_model.eval()(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)(ids).logits
        got = merged(ids).logits
    assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, plain, atol=1e-3)
