"""CPU `shm` transport: weights pass through one shared-memory file, no process group.

With `--single_gpu_mode` on a CPU node, learner and engine share the machine's memory, so a network
group (gloo over loopback: the bytes are copied into socket buffers and back) is needless work. The
learner stages every weight once into a memory-mapped file, the engines map the same file and load
from it, then the learner removes it. This is the CPU counterpart of vLLM's CUDA-IPC (`ipc`) path,
which `weights.ipc` uses on a shared GPU.

One sync is staged, not concurrent (unlike gloo/nccl, where `update` and the broadcast block on each
other): `trainer_stage` → every engine `update_weights(info)` → `trainer_release`. The file lives in
/dev/shm when it has room (else the temp directory: the page cache still makes it shared memory) and
its space is reserved up front, so a full disk is an error here instead of a SIGBUS in a write.
A failed update (a missing file, metadata that does not match) leaves the previous weights in place
(`weights.reload.RestoringReload`), like the other engines.

This module is the trainer side and imports no vLLM; the engine that loads the file is
`weights.shm_engine`, which vLLM imports in its worker by `WORKER_EXTENSION`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch

from open_instruct.weights.transport import bucket_layout, check_lengths, check_matches_metadata

logger = logging.getLogger(__name__)

BACKEND = "shm"
ENGINE_BACKEND = BACKEND
WORKER_EXTENSION = "open_instruct.weights.shm_engine.SharedMemoryWorkerExtension"
HOLDS_PORT = False  # staged: no group, no port
STAGED = True  # stage → engines load → release, instead of a concurrent broadcast
EVERY_RANK_STAGES = False  # one file on the node serves every engine: learner rank 0 writes it
KEEPS_REFERENCES = False  # the bytes are copied into the file: gathered ZeRO-3 shards may be freed at once
RECEIVE_CAN_HANG = False  # a staged load reads a file that is already complete
ENGINE_ENV: dict[str, str] = {}  # nothing the engine process must set for this transport
FILE_PREFIX = "open_instruct-weights-"


def layout(dtype_names: Sequence[str], shapes: Sequence[Sequence[int]]) -> tuple[int, list[tuple[int, int, int]]]:
    """(file bytes, [(index, offset, nbytes)]): gloo's bucket plan with one bucket holding everything."""
    buckets = bucket_layout(dtype_names, shapes, sys.maxsize)
    return buckets[0] if buckets else (0, [])


@dataclass
class SharedMemoryInit:
    """No rendezvous: every update names its own file (vLLM's `init_info`, sent as a dict)."""


@dataclass
class SharedMemoryUpdate:
    """One staged update (vLLM's `update_info`, sent as a dict): the file and the weights in it."""

    path: str
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    total_bytes: int

    def __post_init__(self):
        check_lengths(self.names, self.dtype_names, self.shapes)


# ----------------------------------------------------------------------------- trainer side


@dataclass
class Stager:
    """The trainer end: where files go, and the file of the sync in progress (removed by `trainer_release`)."""

    directory: str | None = None  # None: /dev/shm when it has room, else the temp directory
    staged_path: str | None = None


def worker_init_info(host: str, port: int, world_size: int, timeout_s: float, rank_offset: int = 1) -> dict:
    del host, port, world_size, timeout_s, rank_offset
    return asdict(SharedMemoryInit())


def trainer_init(
    host: str, port: int, world_size: int, timeout_s: float, listener: socket.socket | None = None
) -> Stager:
    del host, port, world_size, timeout_s, listener  # staged: no group
    for directory in ("/dev/shm", tempfile.gettempdir()):
        remove_orphans(directory)
    return Stager()


def remove_orphans(directory: str) -> list[str]:
    """Delete staged files whose learner process is gone (killed between stage and release: /dev/shm
    would keep a model's worth of memory until the machine reboots). Returns the paths removed."""
    removed = []
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in names:
        pid = name.removeprefix(FILE_PREFIX).split("-", 1)[0]
        if not name.startswith(FILE_PREFIX) or not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
    if removed:
        logger.warning("removed %d staged weight file(s) left by dead learners: %s", len(removed), removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _directory_for(total_bytes: int, preferred: str | None) -> str:
    if preferred is not None:
        return preferred
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        stats = os.statvfs("/dev/shm")
        if stats.f_bavail * stats.f_frsize >= 2 * total_bytes:  # room for this file and a sibling run's
            return "/dev/shm"
    return tempfile.gettempdir()


def trainer_stage(
    stager: Stager,
    named_tensors: Iterator,
    names: Sequence[str],
    dtype_names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    tag: str = "",
) -> tuple[dict, int]:
    """Write the weights, pulled one at a time, into a new file; returns (the engines' update info, bytes).
    The previous sync's file, if a release was missed, is removed first.

    Each tensor is checked against the metadata the engines will read it with."""
    trainer_release(stager)
    total, items = layout(dtype_names, shapes)
    directory = _directory_for(total, stager.directory)
    path = os.path.join(directory, f"{FILE_PREFIX}{os.getpid()}-{tag}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    stager.staged_path = path
    try:
        if total:
            os.posix_fallocate(fd, 0, total)
    except OSError as error:
        trainer_release(stager)
        raise OSError(f"cannot reserve {total / 2**20:.0f} MiB for staged weights in {directory}: {error}") from None
    finally:
        os.close(fd)
    mapped = torch.from_file(path, shared=True, size=total, dtype=torch.uint8)
    for i, off, nb in items:
        name, tensor = next(named_tensors)
        tensor = tensor.detach().cpu().contiguous()
        check_matches_metadata(i, name, tensor, dtype_names, shapes)
        mapped[off : off + nb].copy_(tensor.reshape(-1).view(torch.uint8))
    del mapped  # unmaps; the pages stay in the file for the engines
    # The engines load under the metadata's names, as with a broadcast (they are the learner's own names).
    info = SharedMemoryUpdate(path, list(names), list(dtype_names), [list(s) for s in shapes], total)
    return asdict(info), total


def merge_staged(parts: Sequence[dict | None]) -> dict:
    """The engines' update info from every learner rank's staging result: rank 0's file."""
    staged = [p for p in parts if p is not None]
    if len(staged) != 1:
        raise ValueError(f"expected one staged file (learner rank 0's), got {len(staged)}")
    return staged[0]


def trainer_release(stager: Stager) -> None:
    """Remove the staged file (engines that mapped it keep their pages until they unmap)."""
    path, stager.staged_path = stager.staged_path, None
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def trainer_close(group: Stager) -> None:
    """Close the trainer end (`group`, the name every transport's close takes, is the stager) before a
    re-form opens a new one: a file staged and never released goes."""
    trainer_release(group)


async def sync_weights(engine, stager: Stager, named_tensors, version: int | str, *, dtype=None) -> dict:
    """The whole in-flight update for an AsyncLLM in this event loop, like `weights.gloo.sync_weights`:
    stage (the engine still generating) → pause(keep, KV kept) → start → update(file) → finish(version) →
    resume → release. Returns timings; `total_s` is how long the engine was frozen."""
    import time

    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    from open_instruct.weights.gloo import make_update_info

    pairs = list(named_tensors)
    md = make_update_info(pairs, dtype)  # names, cast dtypes and shapes, as the gloo sync sends them
    cast = [(name, t.to(getattr(torch, dt))) for (name, t), dt in zip(pairs, md["dtype_names"])]
    try:
        started = time.perf_counter()
        info, staged = trainer_stage(stager, iter(cast), md["names"], md["dtype_names"], md["shapes"])
        staged_at = time.perf_counter()
        await engine.pause_generation(mode="keep", clear_cache=False)
        paused = time.perf_counter()
        try:
            await engine.start_weight_update()
            await engine.update_weights(WeightTransferUpdateRequest(update_info=info))
            await engine.finish_weight_update(weight_version=str(version))
        finally:
            await engine.resume_generation()
        done = time.perf_counter()
    finally:
        trainer_release(stager)
    return {
        "stage_s": staged_at - started,
        "pause_s": paused - staged_at,
        "transfer_s": done - paused,
        "total_s": done - staged_at,
        "bytes": staged,
    }
