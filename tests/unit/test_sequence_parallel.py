"""--sequence_parallel_size: the shard windows (pure), the window logprobs against whole rows and the flag's
checks. A real 2-rank Ulysses group (DeepSpeed ZeRO-3 over gloo) taking the same step as one rank, and a whole
run under the flag, are in tests/integration/test_sequence_parallel_training.py."""

from __future__ import annotations

import pytest
import torch

from open_instruct.batching import BatchSettings
from open_instruct.learner.logprobs import packed_token_logprobs
from open_instruct.learner.sequence_parallel import FORWARD_INPUT_IDS, FORWARD_POSITION_IDS, shard
from open_instruct.packing import ROW_TENSOR_FIELDS, PackItem, collate, pack_singly


def one_document_rows():
    items = [
        PackItem(
            query_ids=(5, 6, 7),
            response_ids=(8, 9, 10, 11),
            behaviour_logprobs=(-1.0,) * 4,
            advantage=1.0,
            response_mask=None,
            version=0,
            sample_id="a/0",
        ),
        PackItem(
            query_ids=(5, 6),
            response_ids=(12, 13),
            behaviour_logprobs=(-2.0,) * 2,
            advantage=-1.0,
            response_mask=None,
            version=0,
            sample_id="a/1",
        ),
    ]
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
    assert (settings.data_parallel_ranks, settings.one_document_per_row, settings.learner.token_budget) == (
        2,
        True,
        512,
    )
