"""What the learner trains, chosen once at setup: the whole model (`FullWeights`) or, with --use_peft, a LoRA
adapter on a frozen base (`AdapterWeights`). The learner asks this object, never the flag: how the loaded model
is wrapped, whether its training forward drops out, the KL penalty's reference, what a weight sync sends and
under which names, how an HF save is written, and what a DeepSpeed checkpoint holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from open_instruct.learner.deepspeed_setup import initialize_engine, on_gpu, reference_config
from open_instruct.learner.reference import AdapterOffReference, ReferencePolicy
from open_instruct.weights.adapter_names import is_adapter_parameter, wire_name

if TYPE_CHECKING:
    from collections.abc import Callable

    from open_instruct.config.algorithm import AlgorithmConfig
    from open_instruct.config.learner import LearnerConfig
    from open_instruct.config.model import ModelConfig


class LearnerSettings(Protocol):
    """What the choice reads of the learner's settings (`learner.actor.LearnerSettings`, which holds this object:
    named here by shape, so that the two modules do not import each other)."""

    model: ModelConfig
    algorithm: AlgorithmConfig
    learner: LearnerConfig

    @property
    def zero3(self) -> bool: ...


class PolicyWeights(Protocol):
    # DeepSpeed's checkpoint flags, for `save_checkpoint` and `load_checkpoint`.
    exclude_frozen_parameters: bool
    load_module_strict: bool

    @property
    def drops_out(self) -> bool:
        """Whether a training-mode forward is random (then pi_old needs its own eval-mode pass)."""

    def wrap(self, model: Any) -> Any:
        """The loaded model as DeepSpeed trains it."""

    def load_reference(self, load: Callable[[], Any]) -> Any | None:
        """A copy the reference needs, loaded with `load` while the policy is (under ZeRO-3 partitioned), or None."""

    def reference(self, engine: Any, loaded: Any | None, ds_config: dict, mpu: Any) -> Any | None:
        """The KL penalty's reference (`learner.reference`) once `engine` is built, or None without one."""

    def synced(self, module: Any) -> list[tuple[str, Any]]:
        """What a weight sync sends, in order, named as the engines load it."""

    def checkpoint_names(self, module: Any) -> Any | None:
        """The checkpoint's names the sync sends under (`weights.checkpoint_names`), or None: the synced names."""

    def save(self, module: Any, path: str, rank: int) -> None:
        """HF-format files under `path` that transformers, peft and vLLM load; a collective under ZeRO-3."""


def policy_weights(settings: LearnerSettings) -> PolicyWeights:
    return AdapterWeights(settings) if settings.model.use_peft else FullWeights(settings)


class FullWeights:
    """Every parameter trains, syncs and is saved; the reference is a frozen copy of the initial policy."""

    exclude_frozen_parameters = False
    load_module_strict = True
    drops_out = False

    def __init__(self, settings: LearnerSettings):
        self.settings = settings

    def wrap(self, model):
        return model

    def load_reference(self, load):
        if self.settings.algorithm.beta <= 0:  # a model copy: only loaded when used
            return None
        reference = load().eval()
        reference.requires_grad_(False)
        return reference

    def reference(self, engine, loaded, ds_config, mpu):
        if loaded is None:
            return None
        if self.settings.zero3:
            # Its own ZeRO-3 engine without an optimizer: it stays partitioned, gathered layer by layer in forward.
            wrapped = initialize_engine(loaded, None, reference_config(ds_config), mpu=mpu)
            wrapped.eval()
            return ReferencePolicy(wrapped, partitioned=True)
        return ReferencePolicy(loaded.to(engine.device) if on_gpu() else loaded, False)

    def synced(self, module):
        return list(module.named_parameters())  # HF names

    def checkpoint_names(self, module):
        """A model that transformers converted at load (its MoE experts stacked) syncs under its checkpoint's
        names, as it is saved; None for the others."""
        from open_instruct.weights.checkpoint_names import CheckpointNames

        return CheckpointNames.of(module)

    def save(self, module, path, rank):
        from open_instruct.learner.gathered import save_hf_model

        save_hf_model(module, path, self.settings.zero3, write=rank == 0)  # one parameter at a time


class AdapterWeights:
    """--use_peft: only the adapter trains, syncs and is checkpointed; the base is the model the run started
    from, which is also the KL penalty's reference (the adapter switched off), so no copy is loaded."""

    # The frozen base is not state: a checkpoint keeps the adapter alone and loads it into the freshly loaded base.
    exclude_frozen_parameters = True
    load_module_strict = False

    def __init__(self, settings: LearnerSettings):
        self.settings = settings

    @property
    def drops_out(self) -> bool:
        return bool(self.settings.model.lora_dropout)

    def wrap(self, model):
        from open_instruct import adapters

        return adapters.wrap(model, self.settings.model, self.settings.learner.gradient_checkpointing)

    def load_reference(self, load):
        return None

    def reference(self, engine, loaded, ds_config, mpu):
        return AdapterOffReference(engine, engine.module) if self.settings.algorithm.beta > 0 else None

    def synced(self, module):
        """The adapter's parameters only, under peft's saved names."""
        return [(wire_name(name), param) for name, param in module.named_parameters() if is_adapter_parameter(name)]

    def checkpoint_names(self, module):
        return None  # the adapter's names are peft's whatever the base's conversion

    def save(self, module, path, rank):
        """The adapter in peft's format (adapter_config.json + adapter_model.safetensors, which peft and vLLM's
        LoRA loader read), and with --save_merged_lora_model base + adapter merged under `merged/`."""
        from pathlib import Path

        from open_instruct.learner.gathered import gathered_state, save_merged_lora

        zero3 = self.settings.zero3
        named = [(name, p) for name, p in module.named_parameters() if is_adapter_parameter(name)]
        state = gathered_state(named, zero3, rank == 0 or not zero3)
        if rank == 0:
            module.save_pretrained(path, state_dict=state, safe_serialization=True)
        if self.settings.model.save_merged_lora_model:  # one layer at a time, in the base's dtype (gathered.py)
            save_merged_lora(module, str(Path(path) / "merged"), zero3, write=rank == 0)
