"""Scored groups -> per-rank TrainBatches: advantages, filters, packing, an even split over ranks.

Pure logic (no Ray, no DeepSpeed), run by the driver for every step. Every rank receives the
same number of micro-batches (dummy rows pad the short ones) so no rank waits forever in a
collective, and each mini-batch's trained-token count over ALL ranks travels with the batch
so the loss is an exact token mean per optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from open_instruct.advantages import filter_zero_std_groups, group_advantages
from open_instruct.config.algorithm import AlgorithmConfig
from open_instruct.config.fields import groups_from_flags
from open_instruct.config.learner import LearnerConfig
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
    """How scored groups become the ranks' batches: the algorithm and learner flag groups as parsed, plus
    --mask_tool_use, --attn_implementation and the tokenizer's pad id."""

    pad_token_id: int
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    mask_tool_use: bool = True
    attn_implementation: str | None = None

    @classmethod
    def from_config(cls, cfg, pad_token_id: int) -> BatchSettings:
        return cls(pad_token_id, cfg.algorithm, cfg.learner, cfg.tools.mask_tool_use, cfg.model.attn_implementation)

    @property
    def data_parallel_ranks(self) -> int:
        """The ranks that each get their own share of a batch: a sequence-parallel group shares one."""
        return self.learner.world_size // self.learner.sequence_parallel_size

    @property
    def per_document_attention(self) -> bool:
        """Varlen (flash) kernels cost attention per document of a packed row; SDPA costs it per row."""
        return (self.attn_implementation or "").startswith("flash")

    @property
    def one_document_per_row(self) -> bool:
        """Token-budget rows of one document each: sequence parallelism without varlen kernels."""
        return self.learner.sequence_parallel_size > 1 and not self.per_document_attention


def batch_settings(pad_token_id: int, **values) -> BatchSettings:
    """BatchSettings from flag values by their names (`pack_length=128, num_mini_batches=2`), each into its
    group; unnamed flags keep their defaults. For benchmarks and tests that assemble without a whole run."""
    built, rest = groups_from_flags(values, {"algorithm": AlgorithmConfig, "learner": LearnerConfig})
    return BatchSettings(pad_token_id, **built, **rest)


@dataclass(frozen=True)
class BatchStats:
    groups: int
    groups_filtered_zero_std: int
    samples_trained: int
    samples_masked: int  # truncated (with mask_truncated) or failed samples kept out of the loss
    trained_tokens: int
    packed_rows: int
    balance: dict[str, float]  # packing.balance_metrics: padding fraction and rank imbalance


def _trained_tokens(completion, trains: bool, mask_tool_use: bool, trained_from_version: int = 0):
    """The loss mask of one sample: None (every token), all zeros, or zeros on tool/environment output and on
    tokens generated before `trained_from_version` (too old to train, kept as context)."""
    length = len(completion.response_token_ids)
    if not trains:
        return (0,) * length
    mask = [1] * length
    if completion.agent is not None and mask_tool_use:
        for start, end in completion.agent.observation_spans:
            mask[start:end] = [0] * (end - start)
    for span in completion.token_spans:
        if span.version < trained_from_version:
            mask[span.start : span.end] = [0] * (span.end - span.start)
    return None if all(mask) else tuple(mask)


def _packed_per_rank(items: list[PackItem], settings: BatchSettings, cost):
    """Packed rows, and each rank's micro-batches of them: token-budget rows balanced by attention cost, or
    fixed rows of --pack_length, --per_device_train_batch_size per micro-batch."""
    learner, ranks, pad = settings.learner, settings.data_parallel_ranks, settings.pad_token_id
    if learner.token_budget > 0:
        if settings.one_document_per_row:
            rows = pack_singly(items, pad)
        else:
            rows = pack_balanced(items, learner.token_budget, ranks, pad)
        return rows, split_by_cost(rows, ranks, pad, cost)
    rows = pack(items, learner.pack_length, pad)
    return rows, split_for_ranks(rows, ranks, learner.per_device_train_batch_size, pad, learner.pack_length)


def sampled_temperature(groups) -> float:
    """The one temperature the batch's samples were drawn at; greedy samples (0) are scored at 1."""
    temperatures = {c.temperature for g in groups for c in g.completions}
    if len(temperatures) > 1:
        raise ValueError(f"a batch mixes samples drawn at temperatures {sorted(temperatures)}: one log-prob scale each")
    return next(iter(temperatures), 1.0) or 1.0


def assemble(groups, step: int, settings: BatchSettings) -> tuple[list[TrainBatch], BatchStats]:
    """Turn replay-buffer groups into one TrainBatch per rank."""
    algorithm = settings.algorithm
    rewards_GN = torch.tensor([[c.reward for c in g.completions] for g in groups], dtype=torch.float64)
    kept = filter_zero_std_groups(rewards_GN, enabled=algorithm.filter_zero_std_samples)
    advantages_GN = group_advantages(rewards_GN, algorithm.advantage_normalization_type)
    items, masked = [], 0
    for g_index in kept.kept_group_indices:
        group = groups[g_index]
        for j, completion in enumerate(group.completions):
            trains = completion.finish_reason in ("stop", "length") and bool(completion.response_token_ids)
            if algorithm.mask_truncated_completions and completion.finish_reason != "stop":
                trains = False
            masked += not trains
            if not completion.response_token_ids:
                continue  # an error sample has nothing to pack; it was counted above
            weight = group.weights[j]
            items.append(
                PackItem(
                    query_ids=completion.prompt_token_ids,
                    response_ids=completion.response_token_ids,
                    behaviour_logprobs=completion.behaviour_logprobs,
                    advantage=float(advantages_GN[g_index, j]) * weight,
                    response_mask=_trained_tokens(
                        completion, trains, settings.mask_tool_use, group.trained_from_version
                    ),
                    version=completion.min_version,
                    sample_id=f"{completion.prompt_id}/{completion.sample_index}",
                )
            )

    def cost(row):
        return row_cost(row, settings.per_document_attention)

    rows, per_rank = _packed_per_rank(items, settings, cost)
    mini_tokens = [0] * algorithm.num_mini_batches
    for rank_micro in per_rank:
        for k, mini in enumerate(split_evenly(rank_micro, algorithm.num_mini_batches)):
            mini_tokens[k] += sum(row.num_trained_tokens for micro in mini for row in micro)
    temperature = sampled_temperature(groups)
    batches = [
        TrainBatch(step, tuple(tuple(m) for m in rank_micro), tuple(mini_tokens), temperature)
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
