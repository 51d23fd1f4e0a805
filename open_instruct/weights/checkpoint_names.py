"""The names and shapes a model's weights have in its checkpoint, for a weight sync.

transformers 5 converts some models' weights when it loads them (`transformers.conversion_mapping`): every
MoE architecture of the qwen2_moe family, Qwen3-MoE and OLMoE among them, stacks each layer's experts into
`mlp.experts.gate_up_proj` [experts, 2 x moe_intermediate, hidden] and `mlp.experts.down_proj`. Its
`named_parameters()` then carries names and shapes no checkpoint has. `save_pretrained` reverts the conversion
(`revert_weight_conversion`), so saved models hold the checkpoint's names (`mlp.experts.3.gate_proj.weight`).
A weight sync goes through the same reversal here, parameter by parameter after its gather: the engines receive
exactly the tensors a saved checkpoint holds, under its names, which vLLM's loader for the architecture reads
as it does at start-up. Models that transformers does not convert (Qwen2, Llama, OLMo 2) have no
`CheckpointNames`, and their sync is unchanged.
"""

from __future__ import annotations


class CheckpointNames:
    """A converted model's parameter -> checkpoint tensors, for the parameters whose names the conversion
    changes (the others pass through). Built from the parameters' shapes on the meta device: nothing is copied."""

    def __init__(self, model, converted: dict[str, list[tuple[str, tuple[int, ...]]]]):
        self.model = model
        self.converted = converted  # parameter name -> [(checkpoint name, shape)] in send order

    @classmethod
    def of(cls, model) -> CheckpointNames | None:
        """The model's checkpoint names, or None when its parameters are its checkpoint's (nothing converted)."""
        import torch

        converted = {}
        for name, param in model.named_parameters():
            shape = tuple(getattr(param, "ds_shape", param.shape))  # ZeRO-3 keeps the whole shape here
            entries = [(k, tuple(v.shape)) for k, v in _revert(model, name, torch.empty(shape, device="meta")).items()]
            if entries != [(name, shape)]:
                converted[name] = entries
        return cls(model, converted) if converted else None

    def entries(self, name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        """The checkpoint's (name, shape) pairs that parameter `name` of `shape` is sent as."""
        return self.converted.get(name, [(name, shape)])

    def tensors(self, name: str, tensor) -> list[tuple[str, object]]:
        """The checkpoint's tensors for parameter `name`, whose whole value is `tensor` (views where they can
        be, e.g. one expert of a stacked tensor)."""
        if name not in self.converted:
            return [(name, tensor)]
        return [(k, v.contiguous()) for k, v in _revert(self.model, name, tensor).items()]


def _revert(model, name: str, tensor) -> dict:
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, {name: tensor})
