"""The engine side of the GPU `ipc` weight transport: vLLM's CUDA-IPC engine with our restoring reload,
registered as "ipc_restoring" when this module is imported (vLLM imports it in its worker by
`weights.ipc.WORKER_EXTENSION`)."""

from __future__ import annotations

from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

from open_instruct.weights.adapter_engine import AdapterWorkerExtension
from open_instruct.weights.ipc import ENGINE_BACKEND
from open_instruct.weights.reload import RestoringReload


class RestoringIPCWeightTransferEngine(RestoringReload, IPCWeightTransferEngine):
    """vLLM's CUDA-IPC engine; a failed update leaves the previous weights in place instead of meta tensors."""


def register() -> None:
    if ENGINE_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(ENGINE_BACKEND, RestoringIPCWeightTransferEngine)


register()


class RestoringIPCWorkerExtension(AdapterWorkerExtension):
    """`worker_extension_cls=WORKER_EXTENSION` makes vLLM import this module in the worker process (before it
    builds the transfer engine), which registers the engine there."""
