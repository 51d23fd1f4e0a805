"""Tests for open_instruct.learner.logprobs: the chunked log-softmax kernel against the plain expression (values
and gradients, fp64 and bf16), the tempered entropy, the shift onto prediction positions, and packed rows on a
real model.

The key test runs a real (random-init) tiny Qwen2 on a row holding several documents and
checks its log-probabilities against running each document alone; negative controls show
the comparison would fail if attention crossed documents.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.items import doc_spans, make_item

from open_instruct.learner.logprobs import (
    logprobs_from_logits,
    packed_token_logprobs,
    to_prediction_positions,
    token_entropy_from_logits,
)
from open_instruct.packing import PackItem, collate, dummy_row, pack, unpack

PAD = 1


# ----------------------------------------------------------------------------- prediction positions


def test_to_prediction_positions_moves_each_value_onto_the_logit_predicting_it():
    item = make_item("a", 3, 4, mask=(1, 0, 1, 1), version=7)
    other = make_item("b", 2, 2, seed=5, version=9)
    row = pack([item, other], pack_length=16, pad_token_id=PAD)[0]
    assert row.response_mask[:7].tolist() == [False] * 3 + [True, False, True, True]  # target-aligned
    shifted = to_prediction_positions(row.response_mask[None])
    assert shifted.dtype == torch.bool
    assert shifted[0, :6].tolist() == [False, False, True, False, True, True]
    assert not shifted[0, -1]  # the last logit predicts nothing in the row


# ----------------------------------------------------------------------------- logprobs from logits


def naive_logprobs(logits_BTV, input_ids_BT, temperature):
    full = torch.log_softmax(logits_BTV.double() / temperature, dim=-1)
    picked = full[:, :-1].gather(-1, input_ids_BT[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_from_logits_matches_log_softmax_values_and_gradients(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=gen, dtype=torch.float64) * 3
    ids = torch.randint(0, 11, (3, 7), generator=gen)
    weights = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = logprobs_from_logits(ours_in, ids, temperature, chunk_tokens=4)  # several chunks
    ref = naive_logprobs(ref_in, ids, temperature)
    assert ours.dtype == torch.float32 and ours.shape == (3, 7)
    assert (ours[:, 0] == 0).all()
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=0)
    (ours.double() * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, atol=1e-5, rtol=0)


def test_logprobs_from_logits_bf16_and_document_starts():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 9, 13, generator=gen) * 2).bfloat16()
    ids = torch.randint(0, 13, (2, 9), generator=gen)
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]] * 2)
    ours = logprobs_from_logits(logits, ids, 1.0, position_ids_BT=positions, chunk_tokens=5)
    ref = naive_logprobs(logits.float(), ids, 1.0).float()
    starts = positions == 0
    assert (ours[starts] == 0).all()  # a document's first token has no in-document prediction
    assert (ref[:, 3] != 0).all()  # ...which the unmasked computation would have filled in
    torch.testing.assert_close(ours[~starts], ref[~starts], atol=1e-5, rtol=0)


def test_token_entropy_from_logits_is_the_tempered_entropy_of_the_distribution_that_sampled_each_token():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]])
    entropy = token_entropy_from_logits(logits, temperature=2.0, chunk_tokens=2)
    # Target-aligned: position t holds the entropy of the distribution at t - 1 that sampled token t.
    assert entropy[0, 0] == 0 and entropy[0, 1] == pytest.approx(math.log(4))
    p0 = torch.softmax(torch.tensor([10.0, 0, 0, 0]) / 2.0, dim=-1)
    assert entropy[0, 2] == pytest.approx(float(-(p0 * p0.log()).sum()), rel=1e-5)


# ----------------------------------------------------------------------------- packed logprobs on a real model


@pytest.fixture(scope="module")
def tokenizer():
    from open_instruct.data.embedded_default import build_tokenizer

    return build_tokenizer()


def tiny_qwen2(tokenizer, attn_implementation: str):
    from open_instruct.data.embedded_default import build_untrained_model

    model = build_untrained_model(tokenizer)
    model.set_attn_implementation(attn_implementation)
    return model.eval()


def model_items(tokenizer, lengths: list[tuple[int, int]], seed: int = 0) -> list[PackItem]:
    vocab = len(tokenizer)
    return [
        make_item(f"doc{i}", q, r, seed=seed + i, vocab=vocab, mask=(0,) + (1,) * (r - 1) if i == 1 else None)
        for i, (q, r) in enumerate(lengths)
    ]


def per_document_logprobs(model, item: PackItem, temperature: float) -> torch.Tensor:
    """Reference: the document alone, unpadded, default positions and mask."""
    ids = torch.tensor([item.query_ids + item.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return logprobs_from_logits(logits, ids, temperature)[0]


def compare_to_per_document(model, rows, logprobs_BT, temperature):
    """Max |packed - alone| over every non-start token, and over trained response tokens only."""
    worst_all = worst_trained = 0.0
    for b, row in enumerate(rows):
        for (start, end), item in zip(doc_spans(row), unpack(row)):
            alone = per_document_logprobs(model, item, temperature)
            packed = logprobs_BT[b, start:end]
            assert packed[0] == 0 and alone[0] == 0
            diff = (packed - alone).abs()
            worst_all = max(worst_all, float(diff.max()))
            trained = row.response_mask[start:end]
            if trained.any():
                worst_trained = max(worst_trained, float(diff[trained].max()))
    return worst_all, worst_trained


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_packed_logprobs_equal_per_document_logprobs(tokenizer, attn_implementation):
    model = tiny_qwen2(tokenizer, attn_implementation)
    assert model.config.use_cache  # the HF default that would silently disable packed masking
    items = model_items(tokenizer, [(6, 9), (12, 4), (3, 17), (9, 2)])  # 62 tokens, 4 documents
    rows = pack(items, pack_length=72, pad_token_id=tokenizer.pad_token_id)
    assert len(rows) == 1 and rows[0].num_documents == 4 and rows[0].num_real_tokens < 72  # padding too
    batch = collate(rows)
    with torch.no_grad():
        logprobs = packed_token_logprobs(model, batch, temperature=0.7)
    assert logprobs.shape == (1, 72)
    worst_all, worst_trained = compare_to_per_document(model, rows, logprobs, 0.7)
    assert worst_all < 1e-4 and worst_trained < 1e-4

    # Negative control 1: one continuous position range (no restarts) = plain causal attention
    # across documents. The later documents' logprobs must change, so the test above can fail.
    crossing = dict(batch, position_ids=torch.arange(72)[None])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=crossing["position_ids"]).logits
    crossed = logprobs_from_logits(logits, batch["input_ids"], 0.7, position_ids_BT=batch["position_ids"])
    assert compare_to_per_document(model, rows, crossed, 0.7)[1] > 1e-2

    # Negative control 2: restarting positions but HF's default use_cache=True -> a DynamicCache
    # exists, transformers skips packed-sequence detection and attention crosses documents.
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=None).logits
    trap = logprobs_from_logits(logits, batch["input_ids"], 0.7, position_ids_BT=batch["position_ids"])
    assert compare_to_per_document(model, rows, trap, 0.7)[1] > 1e-2, (
        "transformers now builds the packed mask even with use_cache=True; the note in "
        "packed_token_logprobs can be relaxed"
    )


def test_packed_logprobs_multi_row_batch_with_dummy_and_gradients(tokenizer):
    model = tiny_qwen2(tokenizer, "sdpa")
    items = model_items(tokenizer, [(5, 11), (8, 8), (4, 3), (10, 6), (2, 9), (7, 1)], seed=10)
    rows = [
        *pack(items, pack_length=40, pad_token_id=tokenizer.pad_token_id),
        dummy_row(40, tokenizer.pad_token_id),
    ]
    assert len(rows) >= 3 and max(r.num_documents for r in rows) >= 2
    batch = collate(rows)
    logprobs = packed_token_logprobs(model, batch)
    worst_all, worst_trained = compare_to_per_document(model, rows, logprobs.detach(), 1.0)
    assert worst_all < 1e-4 and worst_trained < 1e-4
    # A policy-gradient-style loss backpropagates, and the dummy row contributes nothing.
    mask = batch["response_mask"].float()
    loss = -(logprobs * batch["advantages"] * mask).sum() / mask.sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
