"""The engine side of adapter-only weight syncs (`--use_peft`): vLLM serves the base model with one LoRA
adapter, read from a folder of this engine's, and an update replaces that adapter while the engine is paused,
its running requests keeping their KV cache.

vLLM's weight-transfer engines load what they receive with `self.model.load_weights`, and vLLM lets a session's
target be replaced (`set_weight_update_target`, reset by the worker after each session). For a LoRA engine
`RestoringReload` makes an `AdapterUpdate` the target of every session, so every transport (gloo, shm, nccl,
ipc) streams the adapter's tensors into it unchanged, and calls its `start` / `finish` / `discard` instead of the
layerwise reload of the base weights. `finish` writes the adapter into the served folder (one atomic rename).
The worker then drops its loaded adapters (vLLM's `finish_weight_update` always does: `reset_lora_state`) and
its next step loads the adapter again under the same id, so running requests continue under the new adapter
from their next token, with their KV cache. A failed update writes nothing: the previous adapter serves on.

`AdapterWorkerExtension` is in every transport's worker extension: `serve_adapter` (one collective RPC when
the engine starts) gives the weight-transfer engine its `AdapterUpdate`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from open_instruct.weights.adapter_names import ADAPTER_FILE


class AdapterUpdate:
    """The weight-update target of a LoRA engine: collects the adapter's tensors, then writes them where the
    engine reads its adapter. Only one worker of an engine writes (`writes`); every worker reads the file, so
    the others (tensor-parallel ranks > 0) only count what they receive and keep no copy of the adapter."""

    def __init__(self, directory: str, writes: bool):
        self.path = Path(directory) / ADAPTER_FILE
        self.writes = writes
        self.received: dict[str, torch.Tensor] = {}
        self.tensors = 0  # received in this update, by every worker (a non-writing one keeps none of them)

    def start(self) -> None:
        self.received, self.tensors = {}, 0

    def load_weights(self, weights) -> set[str]:
        """The writer keeps a copy of each tensor: a transport reuses its receive buffer for the next bucket."""
        names = set()
        for name, tensor in weights:
            if self.writes:
                self.received[name] = tensor.detach().to("cpu", copy=True).contiguous()
            names.add(name)
            self.tensors += 1
        return names

    def discard(self) -> None:
        self.received, self.tensors = {}, 0

    def finish(self) -> None:
        from safetensors.torch import save_file

        received, tensors = self.received, self.tensors
        self.received, self.tensors = {}, 0
        if not tensors:
            raise ValueError("the adapter update carried no tensors")
        if self.writes:
            partial = self.path.with_name(self.path.name + ".partial")
            save_file(received, str(partial))
            os.replace(partial, self.path)  # a reader sees the old adapter or the new one, never half of one


class AdapterWorkerExtension:
    """Worker methods of a LoRA engine; mixed into each transport's worker extension."""

    def serve_adapter(self, directory: str) -> None:
        """Weight updates of this worker replace the adapter in `directory` (worker rank 0 writes it)."""
        self.weight_transfer_engine.adapter = AdapterUpdate(directory, writes=self.rank == 0)
