"""The engine side of the CPU `shm` weight transport: vLLM's `WeightTransferEngine` that loads the weights
the learner staged in a shared-memory file, registered when this module is imported.

vLLM imports this module inside its worker process by the qualified name `weights.shm.WORKER_EXTENSION`;
nothing on the trainer side imports it. Staging, the file layout and the payloads are `weights.shm`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from open_instruct.weights.adapter_engine import AdapterWorkerExtension
from open_instruct.weights.reload import RestoringReload
from open_instruct.weights.shm import ENGINE_BACKEND, SharedMemoryInit, SharedMemoryUpdate, layout


@dataclass
class SharedMemoryInitInfo(SharedMemoryInit, WeightTransferInitInfo):
    """`SharedMemoryInit` as the vLLM type the engine parses it into."""


@dataclass
class SharedMemoryUpdateInfo(SharedMemoryUpdate, WeightTransferUpdateInfo):
    """`SharedMemoryUpdate` as the vLLM type the engine parses it into."""


class SharedMemoryWeightTransferEngine(
    RestoringReload, WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]
):
    """Loads checkpoint-format (HF-named) weights from the learner's staged file by layerwise reload."""

    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        del init_info

    def apply_update(self, update_info: dict[str, Any]) -> None:
        # Not the base class's: it ends with torch.accelerator.synchronize(), and there is nothing to wait for.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        u = update_info
        total, items = layout(u.dtype_names, u.shapes)
        if total != u.total_bytes:
            raise ValueError(
                f"staged weights {u.path}: the metadata describes {total} bytes, the learner wrote {u.total_bytes}"
            )
        if not os.path.exists(u.path):
            raise FileNotFoundError(
                f"staged weights {u.path} are not on this engine's node: the shm transport needs the engines on "
                "learner rank 0's machine (pass --vllm_sync_backend gloo otherwise)"
            )
        # A shared read-only mapping: the tensors below are views of the learner's pages, copied once into the model.
        mapped = torch.from_file(u.path, shared=False, size=total, dtype=torch.uint8)
        weights = [
            (u.names[i], mapped[off : off + nb].view(getattr(torch, u.dtype_names[i])).view(u.shapes[i]))
            for i, off, nb in items
        ]
        with disable_mtp_completeness_check():
            self.model.load_weights(weights)

    def shutdown(self) -> None:
        pass


def register() -> None:
    """Register the engine (idempotent); importing the worker extension runs it in the worker process."""
    if ENGINE_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(ENGINE_BACKEND, SharedMemoryWeightTransferEngine)


register()


class SharedMemoryWorkerExtension(AdapterWorkerExtension):
    """`worker_extension_cls=WORKER_EXTENSION` makes vLLM import this module in the worker before it builds
    the transfer engine."""
