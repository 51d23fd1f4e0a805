"""The reference policy of the KL penalty (`--beta > 0`): a frozen copy of the initial policy, moved toward it
by the Polyak rule with `--ref_policy_update_freq`; with `--use_peft`, the base model itself (`AdapterOffReference`).

Under ZeRO-3 it is partitioned like the policy (loaded inside deepspeed.zero.Init, then wrapped in a DeepSpeed
engine without an optimizer, which gathers each layer for its forward); otherwise it is a whole module on the
learner's device. Reading or writing its weights is then a collective: every rank calls at once.
"""

from __future__ import annotations

from typing import Any


class ReferencePolicy:
    def __init__(self, model: Any, partitioned: bool):
        self.model = model  # what scores: the DeepSpeed engine (ZeRO-3) or the module
        self.partitioned = partitioned

    @property
    def module(self):
        return self.model.module if self.partitioned else self.model

    def parameters(self):
        return self.model.parameters()

    def move_toward(self, policy_module, alpha: float) -> None:
        """ref <- (1 - alpha) ref + alpha policy, parameter by parameter (gathered one at a time; the policy is
        partitioned exactly when the reference is: both are ZeRO-3's or neither)."""
        import deepspeed
        import torch

        policy = dict(policy_module.named_parameters())
        with torch.no_grad():
            for name, ref_param in self.module.named_parameters():
                param = policy[name]
                # Every rank computes the same update from the same gathered tensors; rank 0's is kept.
                pair = [param, ref_param]
                with deepspeed.zero.GatheredParameters(pair, modifier_rank=0, enabled=self.partitioned):
                    ref_param.mul_(1.0 - alpha).add_(param.detach().to(ref_param.device, ref_param.dtype), alpha=alpha)

    def state_dict(self, keep: bool) -> dict:
        """Its weights on CPU in their dtype, gathered one at a time under ZeRO-3 (a collective); a rank whose
        `keep` is false only joins the gathers and gets {}."""
        from open_instruct.learner.gathered import gathered_state

        return gathered_state(list(self.module.named_parameters()), self.partitioned, keep)

    def save(self, directory: str, write: bool) -> None:
        """Its weights as safetensors under `directory`, one parameter at a time (a collective under ZeRO-3);
        the rank whose `write` is true writes."""
        from open_instruct.learner.gathered import save_parameters

        save_parameters(directory, list(self.module.named_parameters()), self.partitioned, write)

    def load(self, read) -> None:
        """Set its weights from `read` (name -> tensor, see `gathered.reader`), one parameter at a time. Under
        ZeRO-3 only rank 0 reads (the others pass None and get rank 0's values through the gather)."""
        import deepspeed
        import torch

        with torch.no_grad():
            for name, param in self.module.named_parameters():
                with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=self.partitioned):
                    if read is not None:
                        param.copy_(read(name).to(param.device, param.dtype))


class AdapterOffReference:
    """--use_peft: the reference policy is the policy's own base model, scored with the adapter switched off
    (peft's `disable_adapter`), so it costs no second copy of the model. It cannot move toward the policy (the
    configuration refuses --ref_policy_update_freq with --use_peft) and has no weights of its own to save."""

    def __init__(self, policy: Any, peft_model: Any):
        self.policy = policy  # what scores: the DeepSpeed engine or the module itself
        self.peft_model = peft_model  # the PeftModel inside it, whose adapter is switched off meanwhile

    @property
    def model(self):
        """What scores, as `ReferencePolicy.model` is: this object, which calls the policy with the adapter off."""
        return self

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.policy(*args, **kwargs)

    def parameters(self):
        return iter(())  # the policy's own: counted once, there
