"""CPU `gloo` backend for vLLM's native weight-transfer API (in-flight updates, KV cache kept): the
trainer side, and what both sides agree on.

vLLM 0.32 ships `nccl`/`ipc` weight-transfer engines, both CUDA-only. This transport adds a
`gloo` engine so a trainer process can sync new weights into a running (paused) AsyncLLM
over a torch `gloo` process group on CPU. GPU production keeps using `nccl` through the
same call sequence.

Engine side
    `weights.gloo_engine` holds the vLLM `WeightTransferEngine` and registers it under "gloo" in
    `WeightTransferEngineFactory` when imported. The worker creates its transfer engine right
    after `load_model`, so that module must already be imported in the worker process by then. Pass
        AsyncEngineArgs(..., weight_transfer_config=WeightTransferConfig(backend="gloo"),
                        worker_extension_cls=WORKER_EXTENSION)
    vLLM resolves `worker_extension_cls` by qualified name in `WorkerWrapperBase.init_worker`
    (before the model is loaded), which imports `weights.gloo_engine` inside the worker process
    and thereby runs the registration. This module itself imports no vLLM: the driver and the
    learners read it without paying for vLLM's import (seconds of CPU per process).

Trainer side
    group = trainer_init(host, port, world_size)          # rank 0, concurrently with
    await engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=...))
    info = make_update_info(named_tensors, dtype, bucket_bytes)   # metadata (RPC)
    trainer_send(group, named_tensors, dtype, bucket_bytes)       # tensors (process group)
    `update_weights` on the engine must run concurrently with `trainer_send`.
    `init_engine_transfer` / `sync_weights` below drive the whole sequence for an AsyncLLM
    living in the caller's event loop.

Wire format (both sides derive it from the metadata alone, so they cannot disagree):
tensors, in metadata order, are greedily packed into byte buckets of at most
`bucket_bytes` (a tensor larger than that gets a bucket of its own), each tensor starting
at a 64-byte-aligned offset; one `broadcast` per bucket from rank 0.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch

from open_instruct.weights.transport import bucket_layout, check_lengths, check_matches_metadata, dtype_name

BACKEND = "gloo"
ENGINE_BACKEND = BACKEND  # its name in vLLM's WeightTransferEngineFactory
WORKER_EXTENSION = "open_instruct.weights.gloo_engine.GlooWeightTransferWorkerExtension"
HOLDS_PORT = True  # vLLM's stateless group serves its store through the held socket
STAGED = False  # a broadcast the engines' `update_weights` receives concurrently (see weight_sync)
EVERY_RANK_STAGES = False  # learner rank 0 is the only sender
KEEPS_REFERENCES = False  # a sent tensor may be freed at once
RECEIVE_CAN_HANG = False  # the group's own timeout ends a receive whose sender is gone
ENGINE_ENV: dict[str, str] = {}  # nothing the engine process must set for this transport
DEFAULT_BUCKET_BYTES = 64 << 20
DEFAULT_TIMEOUT_S = 600.0


@dataclass
class GlooInitInfo:
    """What an engine needs to join the trainer's group (vLLM's `init_info`, sent as a dict)."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooUpdateInfo:
    """What an engine needs to receive one update (vLLM's `update_info`, sent as a dict): the wire plan."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def __post_init__(self):
        check_lengths(self.names, self.dtype_names, self.shapes)


# ----------------------------------------------------------------------------- trainer side


def trainer_init(
    host: str,
    port: int,
    world_size: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    listener: socket.socket | None = None,
):
    """Open the trainer end (rank 0, also the TCPStore master, served through `listener` when rank 0 holds the
    port). Blocks until every worker joins, so run it concurrently with the engine's `init_weight_transfer_engine`."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return stateless_init_torch_distributed_process_group(
        host, port, 0, world_size, backend="gloo", timeout=timedelta(seconds=timeout_s), listen_socket=listener
    )


def trainer_close(group) -> None:
    """Close the trainer end: before the group is formed anew (the members changed) and after a failed send.
    gloo has no abort: peers see the group end only when its sockets close, which happens when the last
    reference to `group` goes (the caller drops its own)."""
    from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

    stateless_destroy_torch_distributed_process_group(group)


def worker_init_info(
    host: str, port: int, world_size: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S, rank_offset: int = 1
) -> dict:
    """Init info for one engine; its workers take ranks rank_offset, rank_offset + 1, ..."""
    return asdict(GlooInitInfo(host, port, world_size, rank_offset=rank_offset, timeout_s=timeout_s))


def update_info(names: list[str], dtype_names: list[str], shapes: list[list[int]], bucket_bytes: int) -> dict:
    return asdict(GlooUpdateInfo(list(names), list(dtype_names), [list(s) for s in shapes], bucket_bytes))


def _prepared(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None):
    out = []
    for name, t in named_tensors:
        t = t.detach()
        full = getattr(t, "full_tensor", None)  # FSDP DTensor
        if callable(full):
            t = full()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out.append((name, t.cpu().contiguous()))
    return out


def make_update_info(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> dict:
    """Metadata for `update_weights` (the RPC half). Must describe exactly what `trainer_send` sends."""
    pairs = list(named_tensors)
    return asdict(
        GlooUpdateInfo(
            names=[n for n, _ in pairs],
            dtype_names=[
                dtype_name(dtype if dtype is not None and t.is_floating_point() else t.dtype) for _, t in pairs
            ],
            shapes=[list(t.shape) for _, t in pairs],
            bucket_bytes=bucket_bytes,
        )
    )


def trainer_send(
    group,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> int:
    """Broadcast the tensors (cast to `dtype`, HF names) from rank 0, bucketed; returns bytes sent."""
    pairs = _prepared(named_tensors, dtype)
    return trainer_send_stream(
        group, iter(pairs), [dtype_name(t.dtype) for _, t in pairs], [list(t.shape) for _, t in pairs], bucket_bytes
    )


def trainer_send_stream(
    group,
    named_tensors: Iterator[tuple[str, torch.Tensor]],
    dtype_names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> int:
    """Broadcast tensors pulled one at a time from an iterator, following the metadata's bucket plan.

    Only one bucket is materialized at a time, so a large model streams through bounded memory
    (the iterator may gather each ZeRO-3 parameter just before it is needed). Each tensor is
    checked against the metadata the receivers were given: a mismatch would otherwise load
    garbage or hang the group.
    """
    sent = 0
    for total, items in bucket_layout(dtype_names, shapes, bucket_bytes):
        buf = torch.zeros(total, dtype=torch.uint8)
        for i, off, nb in items:
            name, tensor = next(named_tensors)
            tensor = tensor.detach().cpu().contiguous()
            check_matches_metadata(i, name, tensor, dtype_names, shapes)
            buf[off : off + nb].copy_(tensor.reshape(-1).view(torch.uint8))
        group.broadcast(buf, 0).wait()
        sent += total
    return sent


def hf_named_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """HF parameter names+tensors to send. `named_parameters()` de-duplicates tied weights, so a
    tied `lm_head.weight` is not sent (vLLM's Qwen2 ties it to `embed_tokens` itself)."""
    return [(n, p) for n, p in model.named_parameters()]


async def init_engine_transfer(
    engine,
    host: str,
    port: int,
    world_size: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    listener: socket.socket | None = None,
):
    """Rendezvous an AsyncLLM (in this event loop) with a trainer group opened here (its store adopts `listener`,
    held on `port`); returns the group."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    rpc = asyncio.ensure_future(
        engine.init_weight_transfer_engine(
            WeightTransferInitRequest(init_info=worker_init_info(host, port, world_size, timeout_s))
        )
    )
    group = await asyncio.to_thread(trainer_init, host, port, world_size, timeout_s, listener)
    await rpc
    return group


async def sync_weights(
    engine,
    group,
    named_tensors,
    version: int | str,
    *,
    dtype: torch.dtype | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    pause: bool = True,
) -> dict:
    """The whole in-flight update: pause(keep, KV kept) → start → update ∥ broadcast → finish(version)
    → resume. Returns timings (s). With pause=False the caller must already have paused."""
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    pairs = _prepared(named_tensors, dtype)
    info = make_update_info(pairs, None, bucket_bytes)
    t0 = time.perf_counter()
    if pause:
        await engine.pause_generation(mode="keep", clear_cache=False)
    t1 = time.perf_counter()
    try:
        await engine.start_weight_update()
        rpc = asyncio.ensure_future(engine.update_weights(WeightTransferUpdateRequest(update_info=info)))
        sent = await asyncio.to_thread(trainer_send, group, pairs, None, bucket_bytes)
        await rpc
        await engine.finish_weight_update(weight_version=str(version))
    finally:
        if pause:
            await engine.resume_generation()
    t2 = time.perf_counter()
    return {"pause_s": t1 - t0, "transfer_s": t2 - t1, "total_s": t2 - t0, "bytes": sent}
