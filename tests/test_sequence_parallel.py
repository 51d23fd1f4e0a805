"""--sequence_parallel_size: the shard windows (pure), the window logprobs against whole rows, the flag's
checks, and a real 2-rank Ulysses group (DeepSpeed ZeRO-3 over gloo) taking the same step as one rank."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import rewarded_groups

from open_instruct.batching import BatchSettings, assemble
from open_instruct.learner.sequence_parallel import FORWARD_INPUT_IDS, FORWARD_POSITION_IDS, shard
from open_instruct.packing import ROW_TENSOR_FIELDS, PackItem, collate, pack_singly, packed_token_logprobs


def one_document_rows():
    items = [
        PackItem(query_ids=(5, 6, 7), response_ids=(8, 9, 10, 11), behaviour_logprobs=(-1.0,) * 4, advantage=1.0,
                 response_mask=None, version=0, sample_id="a/0"),
        PackItem(query_ids=(5, 6), response_ids=(12, 13), behaviour_logprobs=(-2.0,) * 2, advantage=-1.0,
                 response_mask=None, version=0, sample_id="a/1"),
    ]  # fmt: skip
    return pack_singly(items, pad_token_id=0)


def test_one_document_rows_are_trimmed_longest_first():
    rows = one_document_rows()
    assert [int(r.input_ids.shape[0]) for r in rows] == [7, 4]
    assert [int(r.doc_ids.max()) for r in rows] == [1, 1]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_the_windows_of_a_group_cover_every_target_once_and_the_slices_every_input(size):
    [row, _] = one_document_rows()
    batch = collate([row])
    shards = [shard(batch, rank, size) for rank in range(size)]
    length = batch["input_ids"].shape[1]
    local = -(-length // size)
    assert all(s[FORWARD_INPUT_IDS].shape[1] == local for s in shards)
    inputs = torch.cat([s[FORWARD_INPUT_IDS] for s in shards], dim=1)
    assert torch.equal(inputs[:, :length], batch["input_ids"]) and not inputs[:, length:].any()
    positions = torch.cat([s[FORWARD_POSITION_IDS] for s in shards], dim=1)
    assert torch.equal(positions[0], torch.arange(local * size))  # monotonic through the padding
    for name in ROW_TENSOR_FIELDS:
        window = torch.cat([s[name] for s in shards], dim=1)
        assert torch.equal(window[:, : length - 1], batch[name][:, 1:]), name  # target t+1 at logit t
        assert not window[:, length - 1 :].bool().any() or name == "versions", name


def test_the_window_logprobs_of_one_shard_are_the_whole_rows_targets(model_path):
    from transformers import AutoModelForCausalLM

    from open_instruct.learner.sequence_parallel import window_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    batch = collate(one_document_rows()[:1])
    whole = packed_token_logprobs(model, batch)
    window, entropy = window_logprobs(model, shard(batch, 0, 1), 1.0, with_entropy=True)
    assert torch.allclose(window[:, :-1], whole[:, 1:], atol=1e-5)
    assert window[0, -1] == 0 and entropy[0, -1] == 0 and (entropy[:, :-1] > 0).all()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--deepspeed_stage", "2"], "needs --deepspeed_stage 3"),
        (["--deepspeed_stage", "3", "--num_learners_per_node", "3"], "must divide the 3 learner ranks"),
        (["--deepspeed_stage", "3", "--per_device_train_batch_size", "2"], "one row per micro-batch"),
        (["--deepspeed_stage", "3", "--importance_sampling_mode", "mask_sequence"], "mask_sequence needs the whole"),
    ],
)
def test_the_flag_refuses_what_ulysses_cannot_run(argv, message):
    from open_instruct.config.core import ConfigError, parse_config

    with pytest.raises(ConfigError, match=message):
        parse_config(["--sequence_parallel_size", "2", "--num_learners_per_node", "2", *argv])


def test_a_sequence_parallel_group_is_one_data_parallel_rank_of_one_document_rows():
    from open_instruct.config.core import parse_config

    cfg = parse_config(["--sequence_parallel_size", "2", "--num_learners_per_node", "4", "--deepspeed_stage", "3"])
    settings = BatchSettings.from_config(cfg, 0)
    assert (settings.world_size, settings.one_document_per_row, settings.token_budget) == (2, True, 512)


@pytest.mark.slow
def test_two_ulysses_ranks_take_the_same_step_as_one_rank_with_whole_rows(model_path):
    """The same one-document rows, trained by one ZeRO-3 rank and by a sequence-parallel group of two (each
    rank half of every row, attention all-to-all over gloo): the same update, up to float summation order."""
    import ray
    from transformers import AutoTokenizer

    from open_instruct import cluster
    from open_instruct.learner.actor import LearnerSettings
    from open_instruct.learner.group import LearnerGroup

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    groups = rewarded_groups(tokenizer, 2)
    batch_settings = BatchSettings(
        pack_length=128, pad_token_id=tokenizer.pad_token_id, world_size=1, micro_batch_size=1, token_budget=128,
        one_document_per_row=True,
    )  # fmt: skip
    [batch], _ = assemble(groups, 0, batch_settings)
    assert all(int(row.doc_ids.max()) == 1 for micro in batch.micro_batches for row in micro)

    def step(ranks: int) -> tuple[dict, dict]:
        settings = LearnerSettings(
            model_path=model_path, deepspeed_stage=3, learning_rate=1e-3, lr_scheduler_type="constant",
            micro_batch_size=1, total_steps=1, importance_ratio_cap=0.0, sequence_parallel_size=ranks,
        )  # fmt: skip
        cluster.init_ray(min_logical_cpus=3)
        try:
            learners = LearnerGroup(cluster.create_learner_actors(settings, [ranks]), batch_settings)
            learners.setup()
            before = learners.full_state_dict()
            report = learners.train_step(groups, 0)
            return before, learners.full_state_dict(), report.metrics
        finally:
            ray.shutdown()

    before, alone, single = step(1)
    _, split, metrics = step(2)
    # The gradients agree (their norm to float precision); Adam's first step is g / (|g| + eps), which
    # magnifies summation-order noise in near-zero gradient entries, so the updates are compared as a whole.
    assert metrics["learner/grad_norm"] == pytest.approx(single["learner/grad_norm"], rel=1e-5)
    update = torch.cat([(alone[n] - before[n]).flatten() for n in before])
    other = torch.cat([(split[n] - before[n]).flatten() for n in before])
    assert update.norm() > 1e-3 and (update - other).norm() < 0.02 * update.norm()
    # The logged statistics are token means over the group: the same as one rank's.
    for key in ("loss/policy_avg", "policy/ratio_avg"):
        assert metrics[key] == pytest.approx(single[key], abs=1e-5), key


@pytest.mark.slow
def test_a_run_with_two_sequence_parallel_learners_trains_syncs_and_saves(tmp_path):
    """The whole stack under --sequence_parallel_size 2: engines, the Ulysses learner group, weight syncs
    from it, and a resumable state."""
    from helpers.runs import COMMON, run_grpo, steps_logged

    steps = 2
    args = list(COMMON)
    args[args.index("--total_episodes") + 1] = str(steps * 32)
    args += ["--sequence_parallel_size", "2", "--num_learners_per_node", "2", "--deepspeed_stage", "3"]
    args += ["--checkpoint_state_freq", "1", "--checkpoint_state_dir", str(tmp_path / "state")]
    code, log = run_grpo(args, tmp_path / "run", timeout_s=900)
    assert code == 0, log[-4000:]
    assert steps_logged(tmp_path / "run") == list(range(steps))
    assert (tmp_path / "state" / "latest").exists()
