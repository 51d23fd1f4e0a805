"""Packing items with random token ids and float32-exact logprobs, for the packing and learner-speed tests."""

from __future__ import annotations

import torch

from open_instruct.packing import PackItem


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
