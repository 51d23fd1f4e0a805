"""Packing items with random token ids and float32-exact logprobs, and the spans of a packed row's documents, for
the packing, logprobs and learner-speed tests."""

from __future__ import annotations

import torch

from open_instruct.packing import PackedRow, PackItem


def make_item(
    sample_id: str,
    query_len: int,
    response_len: int,
    *,
    seed: int = 0,
    vocab: int = 200,
    mask: tuple[int, ...] | None = None,
    version: int = 3,
) -> PackItem:
    """An item whose floats are float32-representable (as engine logprobs are), so round trips are exact."""
    gen = torch.Generator().manual_seed(seed)
    return PackItem(
        query_ids=tuple(torch.randint(10, vocab, (query_len,), generator=gen).tolist()),
        response_ids=tuple(torch.randint(10, vocab, (response_len,), generator=gen).tolist()),
        behaviour_logprobs=tuple((-torch.rand(response_len, generator=gen) * 5).tolist()),
        advantage=float(torch.randn((), generator=gen)),
        response_mask=mask,
        version=version,
        sample_id=sample_id,
    )


def doc_spans(row: PackedRow) -> list[tuple[int, int]]:
    """[start, end) of each document k = 1.. in the row, asserting it is one contiguous block."""
    spans = []
    for k in range(1, row.num_documents + 1):
        where = (row.doc_ids == k).nonzero().flatten()
        start, end = int(where[0]), int(where[-1]) + 1
        assert where.numel() == end - start, f"document {k} is not contiguous"
        spans.append((start, end))
    return spans
