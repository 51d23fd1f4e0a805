"""GPU `nccl` transport for the weight sync: the same five calls as `weights.gloo`.

The engine side is vLLM's `nccl` weight-transfer engine, extended by `RestoringNCCLWeightTransferEngine`
(`weights.nccl_engine`, registered as "nccl_restoring"): after a failed update it restores the previous
weights and re-processes the tied head like our gloo engine (`weights.reload`). This module builds the
init/update payloads and drives the trainer end (rank 0 of the transfer group); it imports no vLLM at
module level. Tensors go one by one (vLLM's unpacked mode), in
metadata order, straight from GPU memory.

The transfer itself is not exercised on the CPU machines the test suite runs on (no CUDA there); the call
sequence around it (`weights.sync.WeightSync`) is shared with the tested gloo backend, the engine's failure
path runs on CPU in the tests, and the teardown (the calls on the communicator, in order) on a stand-in of
vLLM's communicator (tests/unit/test_weight_group_teardown.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence

from open_instruct.weights.transport import check_matches_metadata

BACKEND = "nccl"  # the transport's name (SyncSettings.backend, --vllm_sync_backend)
ENGINE_BACKEND = "nccl_restoring"  # the engine's name in vLLM's WeightTransferEngineFactory
WORKER_EXTENSION = "open_instruct.weights.nccl_engine.RestoringNCCLWorkerExtension"
# vLLM's NCCL trainer_init binds the port itself, so rank 0 releases it before the engines join (a held socket
# closed under them would reset their early connections).
HOLDS_PORT = False
STAGED = False
EVERY_RANK_STAGES = False  # learner rank 0 is the only sender
KEEPS_REFERENCES = False  # a sent tensor may be freed at once
# vLLM's NCCL receive has no timeout: after a failed transfer an engine may never leave it (see weight_sync).
RECEIVE_CAN_HANG = True
ENGINE_ENV: dict[str, str] = {}  # nothing the engine process must set for this transport


# ----------------------------------------------------------------------------- trainer side


def worker_init_info(host: str, port: int, world_size: int, timeout_s: float, rank_offset: int = 1) -> dict:
    # NCCL rendezvous has no per-call timeout knob in vLLM's init info; the driver's timeout applies.
    del timeout_s
    return {
        "master_address": host,
        "master_port": port,
        "world_size": world_size,
        "rank_offset": rank_offset,
        "packed": False,
    }


def update_info(names: list[str], dtype_names: list[str], shapes: list[list[int]], bucket_bytes: int) -> dict:
    del bucket_bytes  # unpacked mode: one broadcast per tensor
    return {"names": list(names), "dtype_names": list(dtype_names), "shapes": [list(s) for s in shapes]}


def trainer_init(host: str, port: int, world_size: int, timeout_s: float, listener: socket.socket | None = None):
    del timeout_s, listener  # none: see HOLDS_PORT
    from vllm.distributed.weight_transfer.nccl_common import trainer_init as nccl_trainer_init

    return nccl_trainer_init({"master_address": host, "master_port": port, "world_size": world_size})


def trainer_close(group) -> None:
    """Abort learner rank 0's communicator: before the group is formed anew (the members changed), after a
    failed send, and when a send overran its watchdog. vLLM's `PyNcclCommunicator` has no `__del__`: dropping
    it would leave the NCCL communicator (its buffers and proxy thread, outside any memory budget) alive for
    the process's life, one per re-form. `destroy()` is `ncclCommAbort`, which also ends a broadcast of this
    communicator still blocked on a peer that is gone (the watchdog's send thread then returns). The
    rendezvous store it was formed through (rank 0 is the TCPStore master: a listening socket) goes with the
    last reference, dropped here so that a send thread that never returns does not keep it open."""
    group.destroy()
    if getattr(group, "group", None) is not None:
        group.group = None


def trainer_send_stream(
    group,
    named_tensors: Iterator,
    dtype_names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    bucket_bytes: int = 0,
) -> int:
    """Broadcast every tensor on `send_stream()`: the tensors are produced (gathered, cast, copied) on the
    current stream, which each broadcast waits for, never the other way round."""
    import torch

    sent = 0
    stream = send_stream()
    producer = torch.cuda.current_stream()
    for i in range(len(dtype_names)):
        name, tensor = next(named_tensors)
        check_matches_metadata(i, name, tensor, dtype_names, shapes)
        tensor = tensor.detach().to("cuda", non_blocking=True).contiguous()
        stream.wait_stream(producer)
        tensor.record_stream(stream)  # its memory is not reused before the broadcast has read it
        group.broadcast(tensor, src=0, stream=stream)
        sent += tensor.numel() * tensor.element_size()
    stream.synchronize()
    return sent


_SEND_STREAMS: dict[int, object] = {}


def send_stream():
    """The learner's dedicated CUDA stream for broadcasts (one per device). A broadcast to an engine that died
    never finishes and blocks its stream for good (a collective cannot be cancelled); on the default stream
    that would stall the learner's training and checkpointing too. Streams from torch's pool are created
    non-blocking (no implicit sync with the legacy default stream); this one comes from the high-priority
    pool, which DeepSpeed's and torch's own side streams (default priority) do not draw from. Only called on
    a GPU: the CPU paths (gloo, shm) never reach it."""
    import torch

    device = torch.cuda.current_device()
    if device not in _SEND_STREAMS:
        _SEND_STREAMS[device] = torch.cuda.Stream(device=device, priority=-1)
    return _SEND_STREAMS[device]
