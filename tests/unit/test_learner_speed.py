"""Learner speed, pure parts: token-budget micro-batches spread by estimated compute, the padding and
imbalance metrics, and when pi_old comes from the training forward instead of a separate pass.
(The real DeepSpeed checks of both are in test_learner.py.)"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from helpers.items import make_item

from benchmarks.learner_step import heavy_tailed_groups
from open_instruct.batching import BatchSettings, assemble, batch_settings
from open_instruct.learner.actor import LearnerSettings, learner_settings
from open_instruct.packing import (
    COST_LINEAR,
    COST_QUADRATIC,
    balance_metrics,
    iter_documents,
    pack,
    pack_balanced,
    row_cost,
    split_by_cost,
    split_for_ranks,
)

PAD = 1


def heavy_items(count: int = 40, seed: int = 0):
    rng = random.Random(seed)
    return [make_item(f"s{i}", 8, min(500, max(1, int(rng.lognormvariate(0, 1.2) * 40))), seed=i) for i in range(count)]


def test_token_budget_rows_are_trimmed_and_every_rank_runs_the_same_number_of_micro_batches():
    items = heavy_items()
    rows = pack_balanced(items, 512, 1, PAD)
    assert all(row.pack_length == row.num_real_tokens <= 512 for row in rows)
    for world in (1, 2, 3, 8):
        per_rank = split_by_cost(rows, world, PAD)
        assert len({len(micro) for micro in per_rank}) == 1
        assert all(len(mb) == 1 for micro in per_rank for mb in micro)  # one row per micro-batch
        placed = [row for micro in per_rank for mb in micro for row in mb if row.sample_ids]
        assert Counter(id(r) for r in placed) == Counter(id(r) for r in rows)  # each row once
        documents = sorted(d.sample_id for d in iter_documents(placed))
        assert documents == sorted(i.sample_id for i in items)
        fillers = [row for micro in per_rank for mb in micro for row in mb if not row.sample_ids]
        assert all(row.pack_length == 1 for row in fillers)


def test_cost_balancing_evens_out_ranks_better_than_row_counts_and_wastes_no_padding():
    items = heavy_items(60)
    fixed = split_for_ranks(pack(items, 512, PAD), 4, 1, PAD, 512)
    budget = split_by_cost(pack_balanced(items, 512, 4, PAD), 4, PAD)
    fixed_metrics, budget_metrics = balance_metrics(fixed), balance_metrics(budget)
    assert budget_metrics["batch/padding_frac"] < 0.01 < fixed_metrics["batch/padding_frac"]
    # Fixed rows all cost the same (padding included), so their loads are even but inflated: compare the
    # slowest rank, which sets the step time, and require the budget's ranks to be within 10%.
    assert budget_metrics["batch/max_rank_cost_s"] < fixed_metrics["batch/max_rank_cost_s"]
    assert budget_metrics["batch/rank_imbalance"] < 0.1


def test_balance_metrics_by_hand():
    a, b = pack_balanced([make_item("a", 4, 6)], 10, 1, PAD)[0], pack([make_item("b", 2, 2)], 10, PAD)[0]
    metrics = balance_metrics([[[a]], [[b]]])
    assert metrics["batch/padding_frac"] == pytest.approx(6 / 20)  # b holds 4 real tokens of 10
    # Both rows are 10 positions long, so their estimated costs (and the ranks' loads) are equal.
    assert metrics["batch/rank_imbalance"] == pytest.approx(0.0)
    assert row_cost(a) == pytest.approx(COST_QUADRATIC * 100 + COST_LINEAR * 10)
    two_docs = pack_balanced([make_item("c", 2, 3), make_item("d", 2, 3)], 10, 1, PAD)[0]
    assert row_cost(two_docs, per_document_attention=True) == pytest.approx(COST_QUADRATIC * 50 + COST_LINEAR * 10)


def test_assemble_with_a_token_budget_keeps_the_exact_token_mean_and_reports_the_shape():
    groups = heavy_tailed_groups(prompts=6, samples=4, max_response=400)
    shape = {"pack_length": 512, "num_learners_per_node": [2], "per_device_train_batch_size": 1}
    fixed = batch_settings(PAD, micro_batch_token_budget=0, **shape)
    budget = batch_settings(PAD, micro_batch_token_budget=1024, **shape)
    fixed_batches, fixed_stats = assemble(groups, 0, fixed)
    budget_batches, budget_stats = assemble(groups, 0, budget)
    assert fixed_stats.trained_tokens == budget_stats.trained_tokens
    assert budget_batches[0].mini_batch_tokens == fixed_batches[0].mini_batch_tokens
    assert len(budget_batches[0].micro_batches) == len(budget_batches[1].micro_batches)
    assert budget_stats.balance["batch/padding_frac"] < fixed_stats.balance["batch/padding_frac"]
    assert set(fixed_stats.balance) == {"batch/padding_frac", "batch/rank_imbalance", "batch/max_rank_cost_s"}


@pytest.mark.parametrize(
    ("mini_batches", "forced", "reuse"), [(1, False, True), (2, False, False), (1, True, False), (4, False, False)]
)
def test_pi_old_comes_from_the_training_forward_only_with_one_mini_batch(mini_batches, forced, reuse):
    settings = learner_settings("m", num_mini_batches=mini_batches, separate_old_logprob_pass=forced)
    assert settings.old_logprobs_from_training_pass is reuse


def test_resource_flags_shape_the_deepspeed_config_and_the_engines(model_path):
    from open_instruct.config.core import ConfigError, parse_config
    from open_instruct.learner.deepspeed_setup import deepspeed_config

    zero = deepspeed_config(
        stage=3, micro_batch_size=1, world_size=16, offload_param=True, offload_optimizer=True, hpz_partition_size=8
    )["zero_optimization"]
    assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "cpu"
    assert zero["zero_hpz_partition_size"] == 8
    # One node's worth of ranks (or fewer) has nothing to split: no ZeRO++ partitioning.
    assert (
        "zero_hpz_partition_size"
        not in deepspeed_config(stage=3, micro_batch_size=1, world_size=8)["zero_optimization"]
    )
    assert "offload_param" not in deepspeed_config(stage=2, micro_batch_size=1, offload_param=True)["zero_optimization"]
    cfg = parse_config(
        [
            "--deepspeed_stage",
            "3",
            "--deepspeed_offload_param",
            "--no_fused_optimizer",
            "--backend_timeout",
            "7",
            "--no_gather_whole_model",
            "--deepspeed_zpg",
            "4",
        ]
    )
    learner = LearnerSettings.from_config(cfg, model_path).learner
    assert (learner.deepspeed_offload_param, learner.fused_optimizer, learner.backend_timeout) == (True, False, 7)
    assert (learner.gather_whole_model, learner.deepspeed_zpg) == (False, 4)
    for argv, flag in (
        (["--deepspeed_offload_param"], "--deepspeed_offload_param needs --deepspeed_stage 3"),
        (["--vllm_sync_backend", "mpi"], "--vllm_sync_backend mpi"),
        (["--micro_batch_token_budget", "100"], "--micro_batch_token_budget 100"),
    ):
        with pytest.raises(ConfigError, match=flag):
            parse_config(argv)


def test_the_token_budget_defaults_to_the_pack_length_for_one_row_micro_batches():
    from open_instruct.config.core import parse_config

    def budget(*argv: str) -> int:
        return BatchSettings.from_config(parse_config(["--pack_length", "512", *argv]), 0).learner.token_budget

    assert budget() == 512  # one row per micro-batch either way; this one is not padded to --pack_length
    assert budget("--per_device_train_batch_size", "2") == 0  # several rows per micro-batch: fixed rows
    assert budget("--micro_batch_token_budget", "0") == 0
    assert budget("--micro_batch_token_budget", "2048") == 2048


def test_learner_threads_come_from_the_cores_a_rank_may_use():
    """Ray gives a num_cpus=1 actor OMP_NUM_THREADS=1: on a GPU node that would step an offloaded optimizer on one
    core. The learners of a node split its cores; on a CPU node they leave a share to the engines."""
    from open_instruct.learner.deepspeed_setup import learner_threads

    assert learner_threads(True, usable_cores=96, node_learners=8, world_size=16) == 12
    assert learner_threads(True, usable_cores=4, node_learners=8, world_size=8) == 1
    assert learner_threads(False, usable_cores=16, node_learners=2, world_size=2) == 5  # 16 // (2 learners + 1)
    assert learner_threads(False, usable_cores=2, node_learners=2, world_size=2) == 1
    assert learner_threads(False, usable_cores=3, node_learners=1, world_size=1, pinned=True) == 3
