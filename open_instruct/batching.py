"""Scored groups -> per-rank TrainBatches: advantages, filters, packing, an even split over ranks.

Pure logic (no Ray, no DeepSpeed), run by the driver for every step. Every rank receives the
same number of micro-batches (dummy rows pad the short ones) so no rank waits forever in a
collective, and each mini-batch's trained-token count over ALL ranks travels with the batch
so the loss is an exact token mean per optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from open_instruct.advantages import filter_zero_std_groups, group_advantages
from open_instruct.messages import TrainBatch
from open_instruct.packing import (
    PackItem,
    balance_metrics,
    pack,
    pack_balanced,
    pack_singly,
    row_cost,
    split_by_cost,
    split_evenly,
    split_for_ranks,
)


@dataclass(frozen=True)
class BatchSettings:
    pack_length: int
    pad_token_id: int
    world_size: int
    micro_batch_size: int
    num_mini_batches: int = 1
    advantage_normalization: str = "centered"
    filter_zero_std: bool = True
    mask_truncated: bool = False
    mask_tool_use: bool = True
    token_budget: int = 0  # > 0: one trimmed row of at most this many tokens per micro-batch (split_by_cost)
    per_document_attention: bool = False  # attention cost per document (varlen kernels), else per row
    one_document_per_row: bool = False  # token budget rows of one document each (sequence parallelism, SDPA)

    @classmethod
    def from_config(cls, cfg, pad_token_id: int) -> BatchSettings:
        algorithm = cfg.algorithm
        flash = (cfg.model.attn_implementation or "").startswith("flash")
        sequence_parallel = cfg.learner.sequence_parallel_size
        return cls(
            pack_length=cfg.learner.pack_length,
            pad_token_id=pad_token_id,
            world_size=cfg.world_size // sequence_parallel,  # data-parallel ranks: each SP group shares a batch
            micro_batch_size=cfg.learner.per_device_train_batch_size,
            num_mini_batches=algorithm.num_mini_batches,
            advantage_normalization=algorithm.advantage_normalization_type,
            filter_zero_std=algorithm.filter_zero_std_samples,
            mask_truncated=algorithm.mask_truncated_completions,
            mask_tool_use=cfg.tools.mask_tool_use,
            token_budget=cfg.learner.token_budget,
            per_document_attention=flash,
            one_document_per_row=sequence_parallel > 1 and not flash,
        )


@dataclass(frozen=True)
class BatchStats:
    groups: int
    groups_filtered_zero_std: int
    samples_trained: int
    samples_masked: int  # truncated (with mask_truncated) or failed samples kept out of the loss
    trained_tokens: int
    packed_rows: int
    balance: dict[str, float]  # packing.balance_metrics: padding fraction and rank imbalance


def _trained_tokens(completion, trains: bool, mask_tool_use: bool) -> tuple[int, ...] | None:
    """The loss mask of one sample: None (every token), all zeros, or zeros on tool/environment output."""
    length = len(completion.response_token_ids)
    if not trains:
        return (0,) * length
    if completion.agent is None or not mask_tool_use or not completion.agent.observation_spans:
        return None
    mask = [1] * length
    for start, end in completion.agent.observation_spans:
        mask[start:end] = [0] * (end - start)
    return tuple(mask)


def assemble(groups, step: int, settings: BatchSettings) -> tuple[list[TrainBatch], BatchStats]:
    """Turn replay-buffer groups into one TrainBatch per rank."""
    rewards_GN = torch.tensor([[c.reward for c in g.completions] for g in groups], dtype=torch.float64)
    kept = filter_zero_std_groups(rewards_GN, enabled=settings.filter_zero_std)
    advantages_GN = group_advantages(rewards_GN, settings.advantage_normalization)
    items, masked = [], 0
    for g_index in kept.kept_group_indices:
        group = groups[g_index]
        for j, completion in enumerate(group.completions):
            trains = completion.finish_reason in ("stop", "length") and bool(completion.response_token_ids)
            if settings.mask_truncated and completion.finish_reason != "stop":
                trains = False
            masked += not trains
            if not completion.response_token_ids:
                continue  # an error sample has nothing to pack; it was counted above
            weight = group.weights[j] if getattr(group, "weights", None) else 1.0
            items.append(
                PackItem(
                    query_ids=completion.prompt_token_ids,
                    response_ids=completion.response_token_ids,
                    behaviour_logprobs=completion.behaviour_logprobs,
                    advantage=float(advantages_GN[g_index, j]) * weight,
                    response_mask=_trained_tokens(completion, trains, settings.mask_tool_use),
                    version=completion.min_version,
                    sample_id=f"{completion.prompt_id}/{completion.sample_index}",
                )
            )

    def cost(row):
        return row_cost(row, settings.per_document_attention)

    if settings.token_budget > 0:
        if settings.one_document_per_row:
            rows = pack_singly(items, settings.pad_token_id)
        else:
            rows = pack_balanced(items, settings.token_budget, settings.world_size, settings.pad_token_id)
        per_rank = split_by_cost(rows, settings.world_size, settings.pad_token_id, cost)
    else:
        rows = pack(items, settings.pack_length, settings.pad_token_id)
        per_rank = split_for_ranks(
            rows, settings.world_size, settings.micro_batch_size, settings.pad_token_id, settings.pack_length
        )
    mini_tokens = [0] * settings.num_mini_batches
    for rank_micro in per_rank:
        for k, mini in enumerate(split_evenly(rank_micro, settings.num_mini_batches)):
            mini_tokens[k] += sum(row.num_trained_tokens for micro in mini for row in micro)
    batches = [
        TrainBatch(step=step, micro_batches=tuple(tuple(m) for m in rank_micro), mini_batch_tokens=tuple(mini_tokens))
        for rank_micro in per_rank
    ]
    stats = BatchStats(
        groups=len(groups),
        groups_filtered_zero_std=kept.num_filtered,
        samples_trained=sum(1 for item in items if item.response_mask is None or any(item.response_mask)),
        samples_masked=masked,
        trained_tokens=sum(mini_tokens),
        packed_rows=len(rows),
        balance=balance_metrics(per_rank, cost),
    )
    return batches, stats
