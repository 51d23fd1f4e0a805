"""The engine side of the CPU `gloo` weight transport: vLLM's `WeightTransferEngine` that receives the
trainer's broadcast, registered under "gloo" when this module is imported.

vLLM imports this module inside its worker process by the qualified name `weights.gloo.WORKER_EXTENSION`
(before the model is loaded, so the engine is registered when the worker creates it); nothing on the
trainer side imports it. The wire plan, the trainer calls and the init/update payloads are
`weights.gloo`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from open_instruct.weights.adapter_engine import AdapterWorkerExtension
from open_instruct.weights.gloo import BACKEND, GlooInitInfo, GlooUpdateInfo
from open_instruct.weights.reload import RestoringReload
from open_instruct.weights.transport import bucket_layout

logger = logging.getLogger(__name__)


@dataclass
class GlooWeightTransferInitInfo(GlooInitInfo, WeightTransferInitInfo):
    """`GlooInitInfo` as the vLLM type the engine parses it into."""


@dataclass
class GlooWeightTransferUpdateInfo(GlooUpdateInfo, WeightTransferUpdateInfo):
    """`GlooUpdateInfo` as the vLLM type the engine parses it into."""


class GlooWeightTransferEngine(
    RestoringReload, WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Receives checkpoint-format (HF-named) weights over gloo; loads via layerwise reload (`RestoringReload`:
    a failed update keeps the previous weights, tied heads are re-processed)."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        self.shutdown()  # joining a new group (an engine was replaced): leave the old one first
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        logger.info(
            "gloo weight transfer: joining %s:%s as rank %d/%d",
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
        )
        self.group = stateless_init_torch_distributed_process_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            backend="gloo",
            timeout=timedelta(seconds=init_info.timeout_s),
        )

    def apply_update(self, update_info: dict[str, Any]) -> None:
        # Not the base class's: it ends with torch.accelerator.synchronize(), and gloo is synchronous on CPU.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialized: call init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        u = update_info
        with disable_mtp_completeness_check():
            for total, items in bucket_layout(u.dtype_names, u.shapes, u.bucket_bytes):
                buf = torch.empty(total, dtype=torch.uint8)
                self.group.broadcast(buf, 0).wait()
                weights = [
                    (u.names[i], buf[off : off + nb].view(getattr(torch, u.dtype_names[i])).view(u.shapes[i]))
                    for i, off, nb in items
                ]
                self.model.load_weights(weights)

    def shutdown(self) -> None:
        if self.group is not None:
            from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

            try:
                stateless_destroy_torch_distributed_process_group(self.group)
            finally:
                self.group = None


def register() -> None:
    """Register the gloo engine (idempotent). Usable as a `vllm.general_plugins` entry point."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)


register()


class GlooWeightTransferWorkerExtension(AdapterWorkerExtension):
    """Worker extension that gets this module imported in the worker process (registering the engine), with
    the LoRA engine's methods (`AdapterWorkerExtension`). Pass `worker_extension_cls=WORKER_EXTENSION`."""
