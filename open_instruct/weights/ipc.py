"""GPU `ipc` transport for `--single_gpu_mode`: weights pass by CUDA IPC handles, no process group.

An engine that shares a learner's GPU can map that learner's memory: NCCL refuses two ranks on one GPU,
and gloo would copy every weight to the host and back. Each learner rank stages its own copy (every
rank holds whole parameters under ZeRO-0/1/2, and a ZeRO-3 gather gives every rank the whole parameter),
exports one handle per tensor keyed by its GPU's UUID, and the driver merges the ranks' handles; each
engine rebuilds the tensors of the GPU it runs on. Same staged sequence as `weights.shm`:
stage → engines load → release.

The engine side is vLLM's `ipc` engine with our restoring reload (`weights.ipc_engine`, registered as
"ipc_restoring"); this module, the trainer side, imports no vLLM at module level. The
handles are exported with torch's `reduce_tensor`, which does not keep the storage alive: the learner
holds its staged tensors until `trainer_release`, after every engine has loaded.

Not exercised on the CPU machines the test suite runs on (CUDA IPC needs a GPU); the sequence around it
is the tested `shm` one, and `scripts/gpu_check.sh` runs it on a GPU.
"""

from __future__ import annotations

import base64
import pickle
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from open_instruct.weights.transport import check_matches_metadata

BACKEND = "ipc"
ENGINE_BACKEND = "ipc_restoring"
WORKER_EXTENSION = "open_instruct.weights.ipc_engine.RestoringIPCWorkerExtension"
HOLDS_PORT = False  # staged: no group, no port
STAGED = True
EVERY_RANK_STAGES = True  # each engine maps the memory of the learner on its own GPU
KEEPS_REFERENCES = True  # handles point into the staged tensors: a gathered ZeRO-3 shard must be copied
# A handle holds torch types (the tensor class, dtype, device) that vLLM's msgpack channel from AsyncLLM to its
# engine core cannot carry: the handles travel pickled (`ipc_handles_pickled`), which vLLM's worker unpickles
# only when this is set in the engine's process. The pickle comes from our own learner, never from a client.
RECEIVE_CAN_HANG = False  # a staged load maps memory that is already complete
ENGINE_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


@dataclass
class Stager:
    staged: list = field(default_factory=list)  # strong references to the exported tensors


def worker_init_info(host: str, port: int, world_size: int, timeout_s: float, rank_offset: int = 1) -> dict:
    del host, port, world_size, timeout_s, rank_offset
    return {"packed": False}  # one handle per tensor: nothing is reused while an engine may still read it


def trainer_init(
    host: str, port: int, world_size: int, timeout_s: float, listener: socket.socket | None = None
) -> Stager:
    del host, port, world_size, timeout_s, listener  # staged: no group
    return Stager()


def trainer_stage(
    stager: Stager,
    named_tensors: Iterator,
    names: Sequence[str],
    dtype_names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    tag: str = "",
) -> tuple[dict, int]:
    """Export every weight of this rank's GPU; returns (this rank's part of the update info, bytes)."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    del tag
    trainer_release(stager)
    device = torch.cuda.current_device()
    gpu_uuid = str(torch.cuda.get_device_properties(device).uuid)
    for i in range(len(dtype_names)):
        name, tensor = next(named_tensors)
        tensor = tensor.detach().to(f"cuda:{device}").contiguous()
        check_matches_metadata(i, name, tensor, dtype_names, shapes)
        stager.staged.append(tensor)
    # Exported only once every tensor passed its check: torch keeps an exported tensor's memory until a
    # receiver has opened and closed its handle, so a handle no engine ever opens is a leak until this
    # process exits (measured on an H200 by scripts/cuda_ipc_check.py).
    handles = [{gpu_uuid: reduce_tensor(tensor)[1]} for tensor in stager.staged]
    staged_bytes = sum(tensor.numel() * tensor.element_size() for tensor in stager.staged)
    torch.cuda.synchronize()  # the copies must be complete before another process reads them
    info = {"names": list(names), "dtype_names": list(dtype_names), "shapes": [list(s) for s in shapes]}
    return {**info, "ipc_handles": handles}, staged_bytes


def merge_staged(parts: Sequence[dict | None]) -> dict:
    """One update info for every engine: per tensor, the handles of every rank's GPU (by UUID), pickled
    (see `ENGINE_ENV`)."""
    staged = [p for p in parts if p is not None]
    if not staged:
        raise ValueError("no learner rank staged weights")
    first = staged[0]
    for rank, part in enumerate(staged[1:], start=1):
        if part["names"] != first["names"]:
            raise ValueError(f"learner rank {rank} staged other weights than rank 0")
    merged = [{} for _ in first["names"]]
    for part in staged:
        for slot, handle in zip(merged, part["ipc_handles"]):
            slot.update(handle)
    info = {key: value for key, value in first.items() if key != "ipc_handles"}
    return info | {"ipc_handles_pickled": base64.b64encode(pickle.dumps(merged)).decode("ascii")}


def trainer_release(stager: Stager) -> None:
    """Drop the staged copies; torch frees them once no engine maps them any more."""
    if stager.staged:
        import torch

        stager.staged.clear()
        torch.cuda.ipc_collect()


def trainer_close(group: Stager) -> None:
    """Close the trainer end (`group`, the name every transport's close takes, is the stager) before a
    re-form opens a new one: its staged copies and their handles go."""
    trainer_release(group)
