"""GPU `nccl` transport for the weight sync: the same five calls as `weight_transfer_gloo`.

The engine side is vLLM's own `nccl` weight-transfer engine; this module only builds its
init/update payloads and drives the trainer end (rank 0 of the transfer group). Tensors go
one by one (vLLM's unpacked mode), in metadata order, straight from GPU memory.

Not exercised on the CPU machines the test suite runs on (no CUDA there); the call sequence
around it (`weight_sync.WeightSync`) is shared with the tested gloo backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

BACKEND = "nccl"


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


def trainer_init(host: str, port: int, world_size: int, timeout_s: float):
    del timeout_s
    from vllm.distributed.weight_transfer.nccl_common import trainer_init as nccl_trainer_init

    return nccl_trainer_init({"master_address": host, "master_port": port, "world_size": world_size})


def trainer_send_stream(
    group,
    named_tensors: Iterator,
    dtype_names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    bucket_bytes: int = 0,
) -> int:
    import torch

    sent = 0
    stream = torch.cuda.current_stream()
    for i in range(len(dtype_names)):
        name, tensor = next(named_tensors)
        if list(tensor.shape) != list(shapes[i]) or str(tensor.dtype).removeprefix("torch.") != dtype_names[i]:
            raise ValueError(f"weight {i} ({name}) does not match the metadata sent to the engines")
        tensor = tensor.detach().to("cuda", non_blocking=True).contiguous()
        group.broadcast(tensor, src=0, stream=stream)
        sent += tensor.numel() * tensor.element_size()
    stream.synchronize()
    return sent
