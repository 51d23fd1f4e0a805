"""What a weight transport is: the declared interface every transport module satisfies, the registry that
names them, the error every party raises, and the wire-format checks they share.

A transport is a pair of modules rather than a class because each end loads its half by name in its own
process: the trainer side (`gloo`, `nccl`, `shm`, `ipc`: the constants below, the payloads, the learner's
calls) in the driver and the learners, and the engine side (`gloo_engine`, ...: vLLM's weight-transfer
engine, registered on import) in vLLM's worker, by the qualified name of `WORKER_EXTENSION`. The trainer
side imports no vLLM, which would cost each driver and learner process seconds of start-up. Two shapes
exist: a broadcast over a process group that the engines receive concurrently (`BroadcastTransport`), and
bytes staged once, loaded by the engines, then released (`StagedTransport`).
`tests/unit/test_weight_transports.py` checks every registered module against these Protocols.
"""

from __future__ import annotations

import importlib
import socket
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, Protocol

import torch

TRANSPORTS = ("gloo", "nccl", "shm", "ipc")
_ALIGN = 64


class WeightTransport(Protocol):
    BACKEND: str  # the transport's name (--vllm_sync_backend, SyncSettings.backend)
    ENGINE_BACKEND: str  # the engine's name for it in vLLM's WeightTransferEngineFactory
    WORKER_EXTENSION: str  # qualified name in the engine-side module vLLM imports in its worker (registers the engine)
    STAGED: bool  # True: stage → engines load → release; False: a broadcast received concurrently
    EVERY_RANK_STAGES: bool  # every learner rank stages its own copy (False: rank 0 is the only sender)
    HOLDS_PORT: bool  # rank 0's store adopts the port held for it (learner/rendezvous.py), passed as `listener`
    KEEPS_REFERENCES: bool  # the staged payload points into the sent tensors, so they must outlive the load
    RECEIVE_CAN_HANG: bool  # an engine's receive has no timeout of its own (it waits for a dead sender forever)
    ENGINE_ENV: dict[str, str]  # variables the engine process sets before vLLM starts

    def worker_init_info(
        self, host: str, port: int, world_size: int, timeout_s: float, rank_offset: int = 1
    ) -> dict: ...
    def trainer_init(
        self, host: str, port: int, world_size: int, timeout_s: float, listener: socket.socket | None = None
    ) -> Any: ...
    def trainer_close(self, group: Any) -> None: ...  # free what `trainer_init` returned (before a re-form too)


class BroadcastTransport(WeightTransport, Protocol):
    def update_info(
        self, names: list[str], dtype_names: list[str], shapes: list[list[int]], bucket_bytes: int
    ) -> dict: ...
    def trainer_send_stream(
        self,
        group: Any,
        named_tensors: Iterator[tuple[str, torch.Tensor]],
        dtype_names: Sequence[str],
        shapes: Sequence[Sequence[int]],
        bucket_bytes: int,
    ) -> int: ...


class StagedTransport(WeightTransport, Protocol):
    def trainer_stage(
        self,
        stager: Any,
        named_tensors: Iterator[tuple[str, torch.Tensor]],
        names: Sequence[str],
        dtype_names: Sequence[str],
        shapes: Sequence[Sequence[int]],
        tag: str = "",
    ) -> tuple[dict, int]: ...  # (this rank's update info, bytes staged); `stager` is what `trainer_init` returned
    def merge_staged(self, parts: Sequence[dict | None]) -> dict: ...
    def trainer_release(self, stager: Any) -> None: ...


def transport(backend: str) -> ModuleType:
    """The module implementing `backend` (see `WeightTransport`)."""
    if backend not in TRANSPORTS:
        raise ValueError(
            f"unknown weight-transfer backend {backend!r}: expected 'gloo' (CPU) or 'nccl' (GPU) over a group, "
            "or 'shm' (CPU) / 'ipc' (GPU) for engines sharing the learner's machine or GPU"
        )
    return importlib.import_module(f"open_instruct.weights.{backend}")


class WeightSyncError(RuntimeError):
    """A weight sync step failed or timed out; says which step and which actors.

    Raised by the driver, it also carries `step` and `party` (the actor whose failure is the cause, None
    for a timeout), and `retry`: False once engines were left in a receive they cannot leave, where
    replacing a dead engine and syncing again cannot succeed."""

    step: str | None = None
    party: str | None = None
    retry: bool = True
    replaced: tuple[str, ...] = ()  # engines left in a receive that were replaced (the sync may run again)

    @classmethod
    def of(cls, message: str, step: str, party: str | None = None) -> WeightSyncError:
        error = cls(message)
        error.step, error.party = step, party
        return error


# ----------------------------------------------------------------------------- wire format shared by all


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def nbytes(dtype_name: str, shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=getattr(torch, dtype_name)).element_size()


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def check_lengths(names: Sequence, dtype_names: Sequence, shapes: Sequence) -> None:
    """Update info describes each weight by a name, a dtype and a shape: three lists of one length."""
    if not (len(names) == len(dtype_names) == len(shapes)):
        raise ValueError(f"names/dtype_names/shapes lengths differ: {len(names)}/{len(dtype_names)}/{len(shapes)}")


def bucket_layout(dtype_names: Sequence[str], shapes: Sequence[Sequence[int]], bucket_bytes: int):
    """[(total_bytes, [(index, offset, nbytes), ...]), ...]: tensors in metadata order, greedily packed into
    buckets of at most `bucket_bytes` (a larger tensor gets its own), each at a 64-byte-aligned offset."""
    buckets: list[tuple[int, list[tuple[int, int, int]]]] = []
    current: list[tuple[int, int, int]] = []
    used = 0
    for i, (dt, shape) in enumerate(zip(dtype_names, shapes)):
        size = nbytes(dt, shape)
        if current and used + size > bucket_bytes:
            buckets.append((used, current))
            current, used = [], 0
        current.append((i, used, size))
        used = _align(used + size)
    if current:
        buckets.append((used, current))
    return buckets


def check_matches_metadata(i: int, name: str, tensor: torch.Tensor, dtype_names, shapes) -> None:
    """Refuse weight `i` unless it is what the engines were told: they would load garbage or wait forever."""
    if dtype_name(tensor.dtype) != dtype_names[i] or list(tensor.shape) != list(shapes[i]):
        raise ValueError(
            f"weight {i} ({name}) is {dtype_name(tensor.dtype)}{list(tensor.shape)} but the engines "
            f"were told {dtype_names[i]}{list(shapes[i])}"
        )
