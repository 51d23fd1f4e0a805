"""The engine side of the GPU `nccl` weight transport: vLLM's NCCL engine with our restoring reload, registered
as "nccl_restoring" when this module is imported (vLLM imports it in its worker by `weights.nccl.WORKER_EXTENSION`)."""

from __future__ import annotations

from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

from open_instruct.weights.adapter_engine import AdapterWorkerExtension
from open_instruct.weights.nccl import ENGINE_BACKEND
from open_instruct.weights.reload import RestoringReload


class RestoringNCCLWeightTransferEngine(RestoringReload, NCCLWeightTransferEngine):
    """vLLM's NCCL engine; a failed update leaves the previous weights in place instead of meta tensors, and
    joining a new group leaves the old one first."""

    def init_transfer_engine(self, init_info) -> None:
        # vLLM's init overwrites `model_update_group`, and its communicator has no `__del__`: without this,
        # every re-form (each replacement forms the group twice) would leak an NCCL communicator per worker,
        # outside vLLM's memory budget. The driver asks for `shutdown_weight_transfer_engine` first anyway
        # (`generation.weight_receive`); this covers any other caller.
        self.shutdown()
        super().init_transfer_engine(init_info)


def register() -> None:
    """Register the engine (idempotent). Its own name, not "nccl": an engine built in a worker that never
    imported this module fails loudly instead of silently getting vLLM's non-restoring one."""
    if ENGINE_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(ENGINE_BACKEND, RestoringNCCLWeightTransferEngine)


register()


class RestoringNCCLWorkerExtension(AdapterWorkerExtension):
    """`worker_extension_cls=WORKER_EXTENSION` makes vLLM import this module in the worker process (before it
    builds the transfer engine), which registers the engine there."""
