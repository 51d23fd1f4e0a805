"""Sequence packing for the learner: documents in, fixed-width rows out, and back.

GRPO samples have very different lengths; padding each to the longest wastes most of the
learner's compute. Instead each sample (query + response, one "document") is bin-packed
with others into rows of exactly `pack_length` tokens. The model sees every row with
`position_ids` that restart at 0 for each document and `attention_mask=None`; transformers
then derives a block-diagonal causal mask from the position restarts, so no token attends
across documents (see `learner.logprobs.packed_token_logprobs` for what was verified, and the one trap).

Alignment convention (used by every per-token tensor here): **target-aligned**. Index t of
`response_mask`, `advantages`, `behaviour_logprobs` and of the log-probabilities the learner computes
(`learner.logprobs`) all describe token `input_ids[t]`, as the *target* of the prediction
made from the logits at position t-1. So a loss is simply
`masked_mean(f(new_logprobs, behaviour_logprobs, advantages), response_mask)` with no
shifting. Position 0 of every document has no prediction inside its document; its
log-probability is defined as 0 and it is never a response token (queries are non-empty).

Pure torch: no Ray, vLLM or DeepSpeed, so it is cheap to unit-test and to reuse.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy
import torch

from open_instruct.messages import PackedRow

# Versions tensor value on padding tokens: no real weight version is negative.
PAD_VERSION = -1


# ----------------------------------------------------------------------------- data types


@dataclass(frozen=True, slots=True)
class PackItem:
    """One document to pack: a sample's query and response with what the loss needs per token.

    Canonical form (applied on construction, so `unpack(pack(x)) == x` holds exactly): sequences
    become tuples, and a `response_mask` of all ones becomes None (both mean "train every token").
    Floats are stored as float32 in packed rows: engine logprobs are float32 already and round
    trip exactly; an advantage computed in float64 comes back rounded to float32.
    """

    query_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]  # engine logprob of each response token
    advantage: float
    response_mask: tuple[int, ...] | None  # None: every response token is trained
    version: int  # weight version, for staleness metrics
    sample_id: str

    def __post_init__(self) -> None:
        # Frozen dataclass: canonicalise through object.__setattr__ (construction time only).
        # map() rather than a generator: the driver canonicalises every token of every trained sample, and a
        # generator's per-element frame costs as much again as the conversion.
        object.__setattr__(self, "query_ids", tuple(map(int, self.query_ids)))
        object.__setattr__(self, "response_ids", tuple(map(int, self.response_ids)))
        object.__setattr__(self, "behaviour_logprobs", tuple(map(float, self.behaviour_logprobs)))
        object.__setattr__(self, "advantage", float(self.advantage))
        object.__setattr__(self, "version", int(self.version))
        if not self.query_ids:
            # The first response token is predicted from the last query token; without one there
            # is nothing inside the document to predict it from.
            raise ValueError(f"sample {self.sample_id!r}: empty query; at least one query token is needed")
        if len(self.behaviour_logprobs) != len(self.response_ids):
            raise ValueError(
                f"sample {self.sample_id!r}: {len(self.behaviour_logprobs)} behaviour logprobs for "
                f"{len(self.response_ids)} response tokens"
            )
        if self.response_mask is not None:
            mask = tuple(map(int, self.response_mask))
            if len(mask) != len(self.response_ids):
                raise ValueError(
                    f"sample {self.sample_id!r}: response_mask has {len(mask)} entries for "
                    f"{len(self.response_ids)} response tokens"
                )
            if not {0, 1}.issuperset(mask):
                raise ValueError(f"sample {self.sample_id!r}: response_mask must hold only 0 and 1")
            object.__setattr__(self, "response_mask", None if all(mask) else mask)

    @property
    def length(self) -> int:
        """Tokens this document occupies in a packed row."""
        return len(self.query_ids) + len(self.response_ids)


# Tensor fields of PackedRow, in the order `collate` emits them.
ROW_TENSOR_FIELDS = (
    "input_ids",
    "position_ids",
    "doc_ids",
    "is_response",
    "response_mask",
    "advantages",
    "behaviour_logprobs",
    "versions",
)


# ----------------------------------------------------------------------------- packing


def pack(items: Sequence[PackItem], pack_length: int, pad_token_id: int) -> list[PackedRow]:
    """Bin-pack documents into rows of exactly `pack_length` tokens, first-fit decreasing.

    Documents are taken longest first (ties in input order) and each goes into the first
    open row with room, else a new row; rows come out in the order they were opened and
    documents sit in a row in the order they were placed. The result depends only on the
    input sequence, so every caller that packs the same items gets the same rows. FFD uses
    at most 11/9 OPT + 1 rows, plenty for training batches.

    Raises ValueError if a document is longer than `pack_length`: the config guarantees
    pack_length >= max prompt + max response, so this is a bug upstream, not a data issue.
    """
    if pack_length < 1:
        raise ValueError(f"pack_length must be positive, got {pack_length}")
    for item in items:
        if item.length > pack_length:
            raise ValueError(
                f"sample {item.sample_id!r} is {item.length} tokens ({len(item.query_ids)} query + "
                f"{len(item.response_ids)} response), longer than pack_length={pack_length}; the config "
                "must ensure pack_length >= max prompt length + response length"
            )
    order = sorted(range(len(items)), key=lambda i: (-items[i].length, i))
    bins: list[list[PackItem]] = []
    free: list[int] = []  # tokens still free in each bin
    for index in order:
        item = items[index]
        for b, room in enumerate(free):
            if item.length <= room:
                bins[b].append(item)
                free[b] -= item.length
                break
        else:
            bins.append([item])
            free.append(pack_length - item.length)
    return [_build_row(documents, pack_length, pad_token_id) for documents in bins]


def pack_balanced(items: Sequence[PackItem], token_budget: int, world_size: int, pad_token_id: int) -> list[PackedRow]:
    """Token-budget rows, as even as possible: a multiple of `world_size` rows of at most `token_budget`.

    Filling rows to the budget one after another (first-fit) leaves a short last row and row counts
    that ranks cannot share evenly. Instead the row count starts at the fewest rows the tokens need,
    rounded up to a multiple of `world_size`, and documents go longest first to the emptiest row with
    room; when one fits nowhere, `world_size` more rows are opened and the placement restarts. Rows
    are trimmed to their documents. Deterministic.
    """
    for item in items:
        if item.length > token_budget:
            raise ValueError(f"sample {item.sample_id!r} is {item.length} tokens, over the token budget {token_budget}")
    if not items:
        return []
    lengths = [item.length for item in items]
    order = sorted(range(len(items)), key=lambda i: (-lengths[i], i))
    count = math.ceil(math.ceil(sum(lengths) / token_budget) / world_size) * world_size
    while True:
        bins: list[list[PackItem]] = [[] for _ in range(count)]
        emptiest = [(0, b) for b in range(count)]  # a heap of (tokens used, row): the emptiest row first
        for index in order:
            # The emptiest row is the one with the most room: if the document does not fit there, it fits nowhere.
            used, b = emptiest[0]
            if used + lengths[index] > token_budget:
                break
            bins[b].append(items[index])
            heapq.heapreplace(emptiest, (used + lengths[index], b))
        else:
            used_by_row = {b: used for used, b in emptiest}
            return [_build_row(docs, used_by_row[b], pad_token_id) for b, docs in enumerate(bins) if docs]
        count += world_size


def pack_singly(items: Sequence[PackItem], pad_token_id: int) -> list[PackedRow]:
    """One row per document, as long as the document, longest first: for attention that cannot see document
    boundaries (sequence parallelism over SDPA, which is causal over the whole row)."""
    order = sorted(range(len(items)), key=lambda i: (-items[i].length, i))
    return [_build_row([items[i]], items[i].length, pad_token_id) for i in order]


def _tensor(values: tuple, dtype) -> torch.Tensor:
    """A tuple of Python numbers as a tensor: through numpy, which reads a tuple of ints or floats in a C loop
    about 2.5 times as fast as `torch.tensor` checks each element (the driver's cost per trained token)."""
    return torch.from_numpy(numpy.array(values, dtype=dtype))


def _build_row(documents: Sequence[PackItem], pack_length: int, pad_token_id: int) -> PackedRow:
    """Lay documents out left to right and pad the tail; values are target-aligned."""
    input_ids_L = torch.full((pack_length,), pad_token_id, dtype=torch.long)
    position_ids_L = torch.zeros(pack_length, dtype=torch.long)
    doc_ids_L = torch.zeros(pack_length, dtype=torch.long)
    is_response_L = torch.zeros(pack_length, dtype=torch.bool)
    response_mask_L = torch.zeros(pack_length, dtype=torch.bool)
    advantages_L = torch.zeros(pack_length, dtype=torch.float32)
    behaviour_logprobs_L = torch.zeros(pack_length, dtype=torch.float32)
    versions_L = torch.full((pack_length,), PAD_VERSION, dtype=torch.long)
    start = 0
    for k, item in enumerate(documents, start=1):
        query_end = start + len(item.query_ids)
        end = query_end + len(item.response_ids)
        input_ids_L[start:end] = _tensor(item.query_ids + item.response_ids, numpy.int64)
        position_ids_L[start:end] = torch.arange(end - start)
        doc_ids_L[start:end] = k
        advantages_L[start:end] = item.advantage
        versions_L[start:end] = item.version
        if end > query_end:
            is_response_L[query_end:end] = True
            if item.response_mask is None:
                response_mask_L[query_end:end] = True
            else:
                response_mask_L[query_end:end] = _tensor(item.response_mask, numpy.bool_)
            behaviour_logprobs_L[query_end:end] = _tensor(item.behaviour_logprobs, numpy.float32)
        start = end
    # Padding restarts at 0 like a document of its own, so a real token never attends to it.
    position_ids_L[start:] = torch.arange(pack_length - start)
    return PackedRow(
        input_ids=input_ids_L,
        position_ids=position_ids_L,
        doc_ids=doc_ids_L,
        is_response=is_response_L,
        response_mask=response_mask_L,
        advantages=advantages_L,
        behaviour_logprobs=behaviour_logprobs_L,
        versions=versions_L,
        sample_ids=tuple(item.sample_id for item in documents),
    )


def unpack(row: PackedRow) -> list[PackItem]:
    """The documents of one row, in row order: the exact inverse of `pack` (items are canonical).

    `[x for r in pack(items, ...) for x in unpack(r)]` holds the same items as `items`, reordered
    (rows in opening order, documents in placement order); dummy rows unpack to [].
    """
    items = []
    for k, sample_id in enumerate(row.sample_ids, start=1):
        in_doc = (row.doc_ids == k).nonzero().flatten()
        start, end = int(in_doc[0]), int(in_doc[-1]) + 1
        response = row.is_response[start:end]
        query_len = int((~response).sum())
        response_slice = slice(start + query_len, end)
        items.append(
            PackItem(
                query_ids=tuple(row.input_ids[start : start + query_len].tolist()),
                response_ids=tuple(row.input_ids[response_slice].tolist()),
                behaviour_logprobs=tuple(row.behaviour_logprobs[response_slice].tolist()),
                advantage=float(row.advantages[start]),
                response_mask=tuple(int(m) for m in row.response_mask[response_slice].tolist()),
                version=int(row.versions[start]),
                sample_id=sample_id,
            )
        )
    return items


def dummy_row(pack_length: int, pad_token_id: int) -> PackedRow:
    """A row of padding only: trains nothing, but runs the same forward/backward as a real row."""
    return _build_row((), pack_length, pad_token_id)


# ----------------------------------------------------------------------------- distribution


def split_for_ranks(
    rows: Sequence[PackedRow],
    world_size: int,
    micro_batch_size: int,
    pad_token_id: int,
    pack_length: int,
) -> list[list[list[PackedRow]]]:
    """Distribute rows over ranks as `result[rank][micro_batch] -> rows`, same micro-batch count everywhere.

    Every rank must run the same number of forward/backward passes, or the gradient
    all-reduce of one rank waits forever for another (filtering leaves arbitrary row counts).

    Algorithm (deterministic):
    1. Each rank may take at most `ceil(len(rows) / world_size)` rows, so the number of
       micro-batches `M = ceil(that / micro_batch_size)` is the smallest possible: compute
       per row is fixed (pack_length), so row count is what sets step time.
    2. Within that cap, rows are assigned longest-first (by real tokens, ties in input order)
       to the rank with the fewest real tokens so far (ties: fewer rows, then lower rank),
       the LPT greedy, which balances the tokens each rank's loss averages over.
    3. Each rank spreads its r rows over M micro-batches as evenly as possible (sizes differ
       by at most one, each <= micro_batch_size); if r < M, each empty micro-batch gets one
       fully masked dummy row (`dummy_row`).
    An empty `rows` still yields one dummy micro-batch per rank, so all ranks enter the same
    collectives for the step.
    """
    if world_size < 1 or micro_batch_size < 1:
        raise ValueError(f"world_size and micro_batch_size must be positive, got {world_size}, {micro_batch_size}")
    for row in rows:
        if row.pack_length != pack_length:
            raise ValueError(f"row of {row.pack_length} tokens, expected pack_length={pack_length}")
    cap = max(1, -(-len(rows) // world_size))
    num_micro_batches = -(-cap // micro_batch_size)
    per_rank: list[list[PackedRow]] = [[] for _ in range(world_size)]
    tokens = [0] * world_size
    for index in sorted(range(len(rows)), key=lambda i: (-rows[i].num_real_tokens, i)):
        open_ranks = [r for r in range(world_size) if len(per_rank[r]) < cap]
        rank = min(open_ranks, key=lambda r: (tokens[r], len(per_rank[r]), r))
        per_rank[rank].append(rows[index])
        tokens[rank] += rows[index].num_real_tokens
    result = []
    for assigned in per_rank:
        micro_batches: list[list[PackedRow]] = []
        start = 0
        for m in range(num_micro_batches):
            # Even split: the first (r mod M) micro-batches take one extra row.
            size = len(assigned) // num_micro_batches + (m < len(assigned) % num_micro_batches)
            micro_batches.append(
                list(assigned[start : start + size]) if size else [dummy_row(pack_length, pad_token_id)]
            )
            start += size
        result.append(micro_batches)
    return result


# Learner compute of one packed row: COST_QUADRATIC * attention + COST_LINEAR * tokens, in seconds of a
# forward + backward. Attention is quadratic in the row length when a dense (block-diagonal) mask is
# materialised (SDPA, eager: the CPU path) and in each document's length with varlen kernels (flash
# attention). Fitted by `python -m benchmarks.learner_step --calibrate` (a random 512x4
# Qwen2, gradient checkpointing, rows of 128..2048 tokens) on the 2-core CPU machine; only their ratio
# matters for balancing: the quadratic term equals the linear one at about 8k tokens.
COST_LINEAR = 5.6e-4
COST_QUADRATIC = 6.9e-8


def row_cost(row: PackedRow, per_document_attention: bool = False) -> float:
    """Estimated forward + backward seconds of `row` (see COST_LINEAR / COST_QUADRATIC)."""
    if per_document_attention:
        lengths = [int((row.doc_ids == k).sum()) for k in range(1, len(row.sample_ids) + 1)]
        attention = sum(length * length for length in lengths)
    else:
        attention = row.pack_length * row.pack_length
    return COST_QUADRATIC * attention + COST_LINEAR * row.pack_length


def split_by_cost(
    rows: Sequence[PackedRow], world_size: int, pad_token_id: int, cost=row_cost
) -> list[list[list[PackedRow]]]:
    """Token-budget micro-batches: one trimmed row each, spread so every rank's estimated compute is even.

    Every rank gets M = ceil(rows / world_size) micro-batches (the same count everywhere, or a
    collective would wait forever). Rows go most expensive first to the rank with the least estimated
    cost that still has room (ties: fewer rows, lower rank). A rank short of M rows runs one-token
    dummy rows, which train nothing and cost almost nothing. Deterministic.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    count = max(1, -(-len(rows) // world_size))
    costs = [cost(row) for row in rows]
    per_rank: list[list[PackedRow]] = [[] for _ in range(world_size)]
    load = [0.0] * world_size
    for index in sorted(range(len(rows)), key=lambda i: (-costs[i], i)):
        rank = min(
            (r for r in range(world_size) if len(per_rank[r]) < count), key=lambda r: (load[r], len(per_rank[r]), r)
        )
        per_rank[rank].append(rows[index])
        load[rank] += costs[index]
    return [
        [[row] for row in assigned] + [[dummy_row(1, pad_token_id)]] * (count - len(assigned)) for assigned in per_rank
    ]


def balance_metrics(per_rank: Sequence[Sequence[Sequence[PackedRow]]], cost=row_cost) -> dict[str, float]:
    """How much of the step's learner compute is padding, and how unevenly ranks are loaded.

    `batch/padding_frac`: padded positions over all positions of all micro-batches (every row of a
    micro-batch runs at its length). `batch/rank_imbalance`: max over mean of the ranks' estimated
    compute, minus 1 (0 = even; the step waits for the slowest rank). `batch/max_rank_cost_s`: that
    slowest rank's estimated seconds (padding costs as much as tokens)."""
    positions = padding = 0
    loads = []
    for micro_batches in per_rank:
        load = 0.0
        for rows in micro_batches:
            for row in rows:
                positions += row.pack_length
                padding += row.pack_length - row.num_real_tokens
                load += cost(row)
        loads.append(load)
    mean = sum(loads) / len(loads) if loads else 0.0
    return {
        "batch/padding_frac": padding / positions if positions else 0.0,
        "batch/rank_imbalance": max(loads) / mean - 1.0 if mean > 0 else 0.0,
        "batch/max_rank_cost_s": max(loads, default=0.0),
    }


def split_evenly(items: Sequence, parts: int) -> list[list]:
    """Contiguous chunks: micro-batches into mini-batches, on the driver and on every learner alike."""
    size = max(1, math.ceil(len(items) / parts))
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def collate(rows: Sequence[PackedRow]) -> dict[str, torch.Tensor]:
    """Stack rows into a batch: every field of `ROW_TENSOR_FIELDS` as a [B, pack_length] tensor."""
    if not rows:
        raise ValueError("collate needs at least one row")
    return {name: torch.stack([getattr(row, name) for row in rows]) for name in ROW_TENSOR_FIELDS}


def iter_documents(rows: Iterable[PackedRow]) -> Iterable[PackItem]:
    """Every document of `rows`, in row order then placement order (skips dummy rows)."""
    for row in rows:
        yield from unpack(row)
