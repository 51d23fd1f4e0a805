"""`--off_policy_action mask`, pure parts: a group over the staleness bound is trained whole, the tokens older
than the bound stay in the packed row as context, and only the younger ones enter the loss."""

from __future__ import annotations

from dataclasses import replace

from open_instruct.batching import assemble, batch_settings
from open_instruct.messages import Completion, VersionSpan
from open_instruct.replay_buffer import ReplayBuffer
from open_instruct.staleness import MaxAge

PAD = 0
PROMPT = (5, 6, 7)
SPANS = (VersionSpan(0, 0, 6), VersionSpan(2, 6, 10), VersionSpan(3, 10, 12))  # 6 old, 6 young tokens


def straggler(j: int) -> Completion:
    return Completion(
        prompt_id="long",
        sample_index=j,
        prompt_token_ids=PROMPT,
        response_token_ids=tuple(range(10, 22)),
        behaviour_logprobs=(-0.5,) * 12,
        finish_reason="stop",
        version_spans=SPANS,
        admitted_version=0,
        engine_id=0,
        reward=float(j),
    )


def trained_masks(action: str) -> tuple[list, object]:
    buffer = ReplayBuffer(samples_per_prompt=2, max_samples=8, max_age=MaxAge(1, action))
    for j in range(2):
        buffer.add(straggler(j))
    groups = buffer.take(1, learner_version=3)
    batches, stats = assemble(groups, 0, batch_settings(PAD, pack_length=64, micro_batch_token_budget=0))
    rows = [row for micro in batches[0].micro_batches for row in micro if row.num_documents]
    return [row.response_mask[row.is_response].tolist() for row in rows], stats


def test_mask_trains_only_the_tokens_within_the_bound_and_keeps_the_old_ones_as_context():
    masks, stats = trained_masks("mask")
    [mask] = masks  # both samples in one packed row, each with its 12 response positions
    assert mask == ([False] * 6 + [True] * 6) * 2  # version-0 tokens are context; versions 2 and 3 train
    assert stats.trained_tokens == 12 and stats.samples_trained == 2


def test_downweight_trains_every_token_of_the_same_group():
    masks, stats = trained_masks("downweight")
    assert all(bit for mask in masks for bit in mask) and stats.trained_tokens == 24


def test_a_sample_without_recorded_spans_counts_as_generated_at_its_admitted_version():
    bare = replace(straggler(0), version_spans=(), admitted_version=2)
    assert bare.token_spans == (VersionSpan(2, 0, 12),) and bare.min_version == 2
    assert replace(bare, response_token_ids=(), behaviour_logprobs=()).token_spans == ()
    assert straggler(0).token_spans == SPANS  # recorded spans are the spans
