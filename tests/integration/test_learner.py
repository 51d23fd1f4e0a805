"""A real 2-rank DeepSpeed learner group (gloo, Ray actors) on the tiny model.

Same initial weights and the same batch under ZeRO-2 and ZeRO-3 must give the same update;
training on rewarded samples must raise their likelihood.
"""

from __future__ import annotations

import math

import pytest
from helpers.learner_runs import pi_old_matches_the_separate_pass, run_group

from open_instruct import batching


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray cluster for the module: each learner group releases its placement group when it ends."""
    import ray

    from open_instruct import cluster

    cluster.init_ray(min_logical_cpus=3)
    yield
    ray.shutdown()


def test_zero2_and_zero3_give_the_same_update(model_path, groups):
    before2, (after2_r0, after2_r1), history2, stats = run_group(model_path, groups, stage=2)
    before3, (after3_r0, _), history3, _ = run_group(model_path, groups, stage=3)
    assert stats.groups == 4 and stats.groups_filtered_zero_std == 0 and stats.samples_trained == 16
    for name, tensor in before2.items():
        assert (tensor == before3[name]).all()
    moved = max((after2_r0[n] - before2[n]).abs().max().item() for n in before2)
    assert moved > 1e-4  # the step changed the weights
    # Data-parallel ranks hold identical weights after the step.
    assert all(((after2_r0[n] - after2_r1[n]).abs().max().item() < 1e-7) for n in before2)
    worst = max((after2_r0[n] - after3_r0[n]).abs().max().item() for n in before2)
    assert worst < 1e-5 * 1e3, worst  # within 1% of one Adam step (lr 1e-3)
    for metrics in (history2[0], history3[0]):
        assert metrics["learner/trained_tokens"] > 0 and metrics["batch/groups_filtered_zero_std"] == 0
        assert abs(metrics["policy/ratio_avg"] - 1.0) < 1e-4  # first pass: learner == old policy


def test_training_raises_the_likelihood_of_rewarded_samples(model_path, groups):
    import torch
    from transformers import AutoModelForCausalLM

    taken, _tokenizer = groups
    before, (after, _), history, _ = run_group(model_path, groups, stage=2, steps=3, num_mini_batches=2)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    def rewarded_minus_unrewarded(state) -> float:
        model.load_state_dict(state, strict=False)
        gap = 0.0
        for group in taken:
            for c in group.completions:
                ids = torch.tensor([list(c.prompt_token_ids) + list(c.response_token_ids)])
                with torch.no_grad():
                    logprobs = torch.log_softmax(model(ids).logits[0, :-1], -1)
                target = ids[0, 1:]
                total = logprobs.gather(-1, target[:, None])[len(c.prompt_token_ids) - 1 :].sum().item()
                gap += total if c.reward > 0 else -total
        return gap

    assert rewarded_minus_unrewarded(after) > rewarded_minus_unrewarded(before) + 1.0
    # Later optimizer steps see a policy that moved: the ratio leaves 1 and the loss changes.
    assert history[0]["loss/policy_avg"] != pytest.approx(history[2]["loss/policy_avg"], abs=1e-6)


def test_a_cispo_step_with_entropy_recording(model_path, groups):
    import math

    before, (after, _), history, _ = run_group(model_path, groups, stage=2, loss_fn="cispo", record_entropy=True)
    assert max((after[n] - before[n]).abs().max().item() for n in before) > 1e-4
    vocab = before["model.embed_tokens.weight"].shape[0]
    assert 0 < history[0]["policy/entropy_avg"] <= math.log(vocab)
    assert history[0]["policy/clipfrac_avg"] == 0.0  # first pass: ratio 1, nothing clipped


def test_the_reference_drifts_toward_the_policy_by_the_polyak_rule(model_path, groups):
    extras: dict = {}
    before, (after, _), _, _ = run_group(
        model_path, groups, stage=3, beta=0.01, ref_policy_update_freq=1, alpha=0.25, extras=extras
    )
    reference = extras["reference"]
    worst = 0.0
    for name, initial in before.items():
        if name in reference:  # ref <- (1 - alpha) ref + alpha policy, with ref = the initial weights
            expected = 0.75 * initial + 0.25 * after[name]
            worst = max(worst, (reference[name] - expected).abs().max().item())
    assert worst < 1e-6, worst
    assert max((reference[n] - before[n]).abs().max().item() for n in reference if n in before) > 1e-5


def test_zero3_loads_the_policy_and_the_reference_partitioned_and_trains_as_zero2(model_path, groups):
    """Under ZeRO-3 each of 2 ranks holds about half of the policy and of the reference from the load on (they
    are built inside deepspeed.zero.Init, the reference in its own optimizer-less engine), and a step with a
    KL penalty moves the weights as ZeRO-2 does, whose ranks hold both models whole."""
    storage3: dict = {}
    storage2: dict = {}
    options = {"beta": 0.05, "param_persistence_threshold": 0, "ref_policy_update_freq": 1, "alpha": 0.5}
    before3, (after3, _), history3, _ = run_group(model_path, groups, stage=3, extras=storage3, **options)
    before2, (after2, _), history2, _ = run_group(model_path, groups, stage=2, extras=storage2, **options)
    for rank in storage3["storage"]:
        assert rank["held_bytes"] <= 0.55 * rank["whole_bytes"], rank
    for rank in storage2["storage"]:
        assert rank["held_bytes"] == rank["whole_bytes"], rank
    assert storage3["storage"][0]["whole_bytes"] == storage2["storage"][0]["whole_bytes"]
    assert all((before3[n] == before2[n]).all() for n in before2)
    assert max((after2[n] - before2[n]).abs().max().item() for n in before2) > 1e-4
    worst = max((after2[n] - after3[n]).abs().max().item() for n in before2)
    assert worst < 1e-5 * 1e3, worst  # within 1% of one Adam step (lr 1e-3), as ZeRO-2 against ZeRO-3 above
    drift = max((storage2["reference"][n] - storage3["reference"][n]).abs().max().item() for n in before2)
    assert drift < 1e-2 * 0.5, drift  # the Polyak-moved references agree too
    assert abs(history3[0]["objective/kl_avg"] - history2[0]["objective/kl_avg"]) < 1e-4


def test_dtype_attention_and_weight_decay_flags_reach_the_deepspeed_learner(model_path, groups):
    """--dtype bfloat16 (here on CPU) with --attn_implementation torch (SDPA) trains in bf16; with --weight_decay,
    --set_weight_decay_on_bias_and_norm False decays the norms too and leaves every other update unchanged."""
    import torch

    _, (in_bf16, _), history, _ = run_group(model_path, groups, stage=2, dtype="bfloat16", attn_implementation="torch")
    # full_state_dict hands out copies in the model's dtype: bf16 here.
    assert all(t.dtype == torch.bfloat16 for t in in_bf16.values())
    assert history[0]["learner/trained_tokens"] > 0 and math.isfinite(history[0]["loss/policy_avg"])
    _, (exempt, _), _, _ = run_group(model_path, groups, stage=2, weight_decay=0.5)
    _, (decayed, _), _, _ = run_group(
        model_path, groups, stage=2, weight_decay=0.5, set_weight_decay_on_bias_and_norm=False
    )
    assert not all(torch.equal(t, t.bfloat16().float()) for t in exempt.values())  # fp32 by default on CPU
    for name in exempt:
        differs = not torch.allclose(exempt[name], decayed[name], rtol=0, atol=1e-7)
        assert differs == name.endswith(("norm.weight", ".bias")), name


def test_pi_old_from_the_training_forward_matches_the_separate_pass(model_path, groups):
    """At ZeRO-2 (ZeRO-3: tests/nightly/test_learner_variants.py)."""
    pi_old_matches_the_separate_pass(model_path, groups, stage=2)


def test_token_budget_micro_batches_train_the_same_update_as_fixed_rows(model_path, groups):
    """The same samples as trimmed rows under a token budget, spread by cost: the same exact token mean, so
    the same update up to float summation order."""
    import torch

    before, (fixed, _), _, _ = run_group(model_path, groups, stage=2)
    _, (budget, _), _, _ = run_group(model_path, groups, stage=2, token_budget=256)
    # Adam's first step is g / (|g| + eps): summation-order noise in near-zero gradient entries is magnified
    # there, so the updates are compared as a whole and per entry against the step size (lr 1e-3).
    update = torch.cat([(fixed[n] - before[n]).flatten() for n in before])
    other = torch.cat([(budget[n] - before[n]).flatten() for n in before])
    assert update.norm() > 1e-3 and (update - other).norm() < 0.01 * update.norm()
    assert (update - other).abs().max() < 1e-4


def group_settings(model_path, tokenizer, world_size: int, stage: int, **learner_options):
    from open_instruct.learner.actor import learner_settings

    settings = learner_settings(
        model_path,
        total_steps=4,
        deepspeed_stage=stage,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        beta=0.0,
        truncated_importance_sampling_ratio_cap=0.0,
        **learner_options,
    )
    batch_settings = batching.batch_settings(
        tokenizer.pad_token_id, pack_length=128, num_learners_per_node=[world_size], per_device_train_batch_size=1
    )
    return settings, batch_settings, world_size


def test_a_universal_checkpoint_resumes_two_ranks_state_on_one_rank(model_path, groups, tmp_path):
    """--deepspeed_checkpoint_load_universal: the state of 2 ZeRO-2 ranks, converted once by ds_to_universal,
    loads into 1 rank. The next step then matches the uninterrupted 2-rank run, so the Adam moments came
    back too (a fresh optimizer would take a step of a different size)."""
    from open_instruct import cluster

    taken, tokenizer = groups
    with cluster.learner_group_for_a_while(*group_settings(model_path, tokenizer, 2, stage=2)) as two:
        two.setup()
        two.train_step(taken, 0)
        two.save_state(str(tmp_path))
        saved = two.full_state_dict()
        two.train_step(taken, 1)
        uninterrupted = two.full_state_dict()

    with cluster.learner_group_for_a_while(
        *group_settings(model_path, tokenizer, 1, 2, deepspeed_checkpoint_load_universal=True)
    ) as one:
        one.setup()
        assert one.load_state(str(tmp_path)) == 1
        assert (tmp_path / "learner_universal").is_dir() and not (tmp_path / "learner_universal.partial").exists()
        restored = one.full_state_dict()
        assert max((restored[n] - saved[n]).abs().max().item() for n in saved) == 0.0
        one.train_step(taken, 1)
        resumed = one.full_state_dict()
    step = max((uninterrupted[n] - saved[n]).abs().max().item() for n in saved)
    assert step > 1e-4
    assert max((resumed[n] - uninterrupted[n]).abs().max().item() for n in saved) < 1e-3 * step


def test_a_conversion_failure_names_the_checkpoint_in_one_line(tmp_path):
    from open_instruct.learner.deepspeed_setup import make_universal

    (tmp_path / "learner").mkdir()
    with pytest.raises(RuntimeError, match=r"ds_to_universal could not convert .*learner: ") as error:
        make_universal(str(tmp_path), "learner")
    assert "\n" not in str(error.value)
    assert not list(tmp_path.glob("learner_universal*"))
