"""Tests for open_instruct.packing: layout invariants, round trip, rank split and collation. The log-probabilities
of packed rows (open_instruct.learner.logprobs) are tested in test_logprobs.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from helpers.items import doc_spans, make_item

from open_instruct.packing import (
    PAD_VERSION,
    PackedRow,
    PackItem,
    collate,
    dummy_row,
    iter_documents,
    pack,
    split_for_ranks,
    unpack,
)

PAD = 1
# Written out here, not taken from packing.ROW_TENSOR_FIELDS, so the test checks the module's list.
ROW_FIELDS = (
    "input_ids",
    "position_ids",
    "doc_ids",
    "is_response",
    "response_mask",
    "advantages",
    "behaviour_logprobs",
    "versions",
)


def varied_items(count: int = 12, max_len: int = 30, seed: int = 0) -> list[PackItem]:
    rng = random.Random(seed)
    items = []
    for i in range(count):
        query_len = rng.randint(1, max_len // 2)
        response_len = rng.randint(0, max_len - query_len)
        mask = tuple(rng.randint(0, 1) for _ in range(response_len)) if i % 3 == 0 else None
        items.append(make_item(f"s{i}", query_len, response_len, seed=seed * 100 + i, mask=mask, version=i % 4))
    return items


def sort_key(item: PackItem) -> str:
    return item.sample_id


# ----------------------------------------------------------------------------- layout


def test_round_trip_is_exact_as_multiset():
    items = varied_items(count=15)
    rows = pack(items, pack_length=40, pad_token_id=PAD)
    unpacked = list(iter_documents(rows))
    assert sorted(unpacked, key=sort_key) == sorted(items, key=sort_key)
    # Order is documented: rows in opening order, documents in placement order.
    assert [x.sample_id for x in unpacked] == [sid for row in rows for sid in row.sample_ids]


def test_pack_item_canonical_form():
    explicit_all_ones = make_item("a", 3, 4, mask=(1, 1, 1, 1))
    implicit = make_item("a", 3, 4, mask=None)
    assert explicit_all_ones.response_mask is None
    assert explicit_all_ones == implicit
    partial = make_item("b", 3, 4, mask=[1, 0, 1, 1])
    assert partial.response_mask == (1, 0, 1, 1)
    assert unpack(pack([partial], 16, PAD)[0]) == [partial]
    with pytest.raises(ValueError, match="empty query"):
        PackItem((), (5,), (-0.1,), 1.0, None, 0, "x")
    with pytest.raises(ValueError, match="behaviour logprobs"):
        PackItem((4,), (5, 6), (-0.1,), 1.0, None, 0, "x")
    with pytest.raises(ValueError, match="response_mask"):
        PackItem((4,), (5, 6), (-0.1, -0.2), 1.0, (1,), 0, "x")


def test_float64_advantage_round_trips_to_float32():
    item = PackItem((4, 5), (6,), (-0.5,), advantage=1 / 3, response_mask=None, version=0, sample_id="x")
    (back,) = unpack(pack([item], 8, PAD)[0])
    assert back.advantage == pytest.approx(1 / 3, rel=1e-7)
    assert back.advantage == float(torch.tensor(1 / 3, dtype=torch.float32))


def test_rows_have_pack_length_and_padding_at_end():
    pack_length = 40
    items = varied_items(count=15)
    rows = pack(items, pack_length=pack_length, pad_token_id=PAD)
    for row in rows:
        for name in ROW_FIELDS:
            assert getattr(row, name).shape == (pack_length,), name
        real = row.num_real_tokens
        assert real == sum(x.length for x in unpack(row))
        assert (row.doc_ids[:real] > 0).all() and (row.doc_ids[real:] == 0).all()
        assert (row.input_ids[real:] == PAD).all()
        assert not row.response_mask[real:].any() and not row.is_response[real:].any()
        assert (row.advantages[real:] == 0).all() and (row.behaviour_logprobs[real:] == 0).all()
        assert (row.versions[real:] == PAD_VERSION).all()
        # Padding is its own pseudo-document starting at position 0.
        assert row.position_ids[real:].tolist() == list(range(pack_length - real))


def test_position_ids_restart_per_document_and_no_document_is_split():
    items = varied_items(count=20, seed=1)
    rows = pack(items, pack_length=45, pad_token_id=PAD)
    by_id = {x.sample_id: x for x in items}
    seen = Counter(sid for row in rows for sid in row.sample_ids)
    assert seen == Counter(list(by_id))  # every document in exactly one row
    for row in rows:
        for (start, end), sid in zip(doc_spans(row), row.sample_ids):
            item = by_id[sid]
            assert end - start == item.length  # whole document in this row
            assert row.position_ids[start:end].tolist() == list(range(item.length))
            assert row.input_ids[start:end].tolist() == list(item.query_ids + item.response_ids)


def test_target_aligned_layout_of_masks_logprobs_advantages_versions():
    item = make_item("a", 3, 4, mask=(1, 0, 1, 1), version=7)
    other = make_item("b", 2, 2, seed=5, version=9)
    row = pack([item, other], pack_length=16, pad_token_id=PAD)[0]
    assert row.sample_ids == ("a", "b")  # longer first, then placement order
    # Document "a" occupies [0, 7): query [0, 3), response [3, 7); index t describes input_ids[t].
    assert row.is_response[:7].tolist() == [False] * 3 + [True] * 4
    assert row.response_mask[:7].tolist() == [False] * 3 + [True, False, True, True]
    assert row.behaviour_logprobs[3:7].tolist() == list(item.behaviour_logprobs)
    assert (row.behaviour_logprobs[:3] == 0).all()
    assert row.advantages[:7].tolist() == [pytest.approx(item.advantage)] * 7
    assert row.versions[:7].tolist() == [7] * 7 and row.versions[7:11].tolist() == [9] * 4
    assert row.response_mask[9:11].tolist() == [True, True]


def test_first_fit_decreasing_packs_tightly_and_exact_fit_is_allowed():
    # Lengths 6, 5, 4, 3, 2 into 10: FFD gives [6, 4], [5, 3, 2].
    items = [make_item(f"d{n}", 1, n - 1, seed=n) for n in (3, 6, 2, 5, 4)]
    rows = pack(items, pack_length=10, pad_token_id=PAD)
    assert [row.sample_ids for row in rows] == [("d6", "d4"), ("d5", "d3", "d2")]
    assert [row.num_real_tokens for row in rows] == [10, 10]
    exact = pack([make_item("full", 4, 6)], pack_length=10, pad_token_id=PAD)
    assert exact[0].num_real_tokens == 10 and (exact[0].doc_ids == 1).all()


def test_overlong_document_raises_naming_sample_and_lengths():
    items = [make_item("ok", 3, 3), make_item("prompt:0:17#2", 5, 8)]
    with pytest.raises(ValueError, match=r"'prompt:0:17#2' is 13 tokens \(5 query \+ 8 response\).*pack_length=12"):
        pack(items, pack_length=12, pad_token_id=PAD)


def test_pack_is_deterministic():
    items = varied_items(count=25, seed=2)
    first = pack(items, pack_length=50, pad_token_id=PAD)
    second = pack(list(items), pack_length=50, pad_token_id=PAD)
    assert [r.sample_ids for r in first] == [r.sample_ids for r in second]
    for a, b in zip(first, second):
        assert all(torch.equal(x, y) for x, y in zip(collate([a]).values(), collate([b]).values()))


# ----------------------------------------------------------------------------- rank split


def real_rows(count: int, pack_length: int = 32) -> list[PackedRow]:
    """`count` rows with distinct real-token counts (one document each)."""
    return [pack([make_item(f"r{i}", 2, 3 + i, seed=i)], pack_length, PAD)[0] for i in range(count)]


def assert_valid_split(split, rows, world_size, micro_batch_size):
    assert len(split) == world_size
    counts = {len(rank) for rank in split}
    assert len(counts) == 1, f"micro-batch counts differ across ranks: {[len(r) for r in split]}"
    placed = [row for rank in split for mb in rank for row in mb if not row.is_dummy]
    assert sorted(id(r) for r in placed) == sorted(id(r) for r in rows)  # each row exactly once
    for rank in split:
        for mb in rank:
            assert 1 <= len(mb) <= micro_batch_size
            for row in mb:
                if row.is_dummy:
                    assert row.num_trained_tokens == 0 and row.num_real_tokens == 0
                    assert (row.advantages == 0).all() and row.sample_ids == ()
    return counts.pop()


def test_split_for_ranks_uneven_rows_equal_micro_batches_with_masked_dummies():
    rows = real_rows(5)
    split = split_for_ranks(rows, world_size=2, micro_batch_size=1, pad_token_id=PAD, pack_length=32)
    assert assert_valid_split(split, rows, 2, 1) == 3
    dummies = [row for rank in split for mb in rank for row in mb if row.is_dummy]
    assert len(dummies) == 1
    assert dummies[0].pack_length == 32 and (dummies[0].input_ids == PAD).all()
    assert not dummies[0].response_mask.any()


@pytest.mark.parametrize(
    "num_rows,world_size,micro_batch_size,expected_mbs",
    [(5, 2, 2, 2), (2, 4, 1, 1), (7, 3, 2, 2), (8, 2, 3, 2), (0, 3, 2, 1)],
)
def test_split_for_ranks_equal_counts_for_many_shapes(num_rows, world_size, micro_batch_size, expected_mbs):
    rows = real_rows(num_rows)
    split = split_for_ranks(rows, world_size, micro_batch_size, pad_token_id=PAD, pack_length=32)
    assert assert_valid_split(split, rows, world_size, micro_batch_size) == expected_mbs


def test_split_for_ranks_balances_tokens_and_is_deterministic():
    rows = real_rows(8)  # real tokens 5..12
    split = split_for_ranks(rows, world_size=2, micro_batch_size=2, pad_token_id=PAD, pack_length=32)
    tokens = [sum(r.num_real_tokens for mb in rank for r in mb) for rank in split]
    assert sum(tokens) == sum(r.num_real_tokens for r in rows)
    assert abs(tokens[0] - tokens[1]) <= 2  # LPT with a 4-row cap: 34 vs 34 here
    again = split_for_ranks(rows, world_size=2, micro_batch_size=2, pad_token_id=PAD, pack_length=32)
    assert [[[id(r) for r in mb] for mb in rank] for rank in split] == [
        [[id(r) for r in mb] for mb in rank] for rank in again
    ]


def test_split_for_ranks_rejects_wrong_row_length():
    with pytest.raises(ValueError, match="expected pack_length=16"):
        split_for_ranks(real_rows(2, pack_length=32), 2, 1, pad_token_id=PAD, pack_length=16)


def test_collate_stacks_rows():
    rows = [*pack(varied_items(count=6), 40, PAD), dummy_row(40, PAD)]
    batch = collate(rows)
    assert set(batch) == set(ROW_FIELDS)
    for name, tensor in batch.items():
        assert tensor.shape == (len(rows), 40), name
        assert torch.equal(tensor[0], getattr(rows[0], name))
    assert batch["input_ids"].dtype == torch.long and batch["response_mask"].dtype == torch.bool
    assert batch["advantages"].dtype == torch.float32
