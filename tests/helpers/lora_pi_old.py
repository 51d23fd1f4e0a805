"""Runs in its own process (DeepSpeed's process group is per process): one LoRA learner rank (ZeRO-0, the tiny
model, `--lora_dropout 0.05`) takes a step on rewarded groups whose behaviour logprobs are exactly what a
faithful engine serving the current policy reports: the policy's own eval-mode logprobs, so nothing is stale.

The adapter is made non-zero first (a zero adapter is the base, on which dropout changes nothing). Prints one
JSON line: the step's rho statistics, and whether a training-mode forward differs from the eval-mode one (the
dropout noise a training-mode pi_old would carry). Argument: model path.
"""

import json
import sys

import torch


def main(model_path: str) -> None:
    from transformers import AutoTokenizer

    from open_instruct import batching
    from open_instruct.learner.actor import LearnerActor, learner_settings, token_logprobs
    from open_instruct.weights import adapter_names

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from helpers.batches import rewarded_groups

    class FaithfulEngineLearner(LearnerActor):
        """Sets each micro-batch's behaviour logprobs to the current policy's, as an engine with these weights
        and exact arithmetic would have sampled them."""

        def _score_old_and_reference(self, micro, temperature):
            with torch.no_grad():
                self.engine.eval()
                for mb in micro:
                    mb["behaviour_logprobs"] = token_logprobs(self.engine, mb, temperature).clone()
                self.engine.train()
                noisy = [token_logprobs(self.engine, mb, temperature) for mb in micro]
            self.train_mode_differs = any(
                not torch.equal(n[mb["response_mask"].bool()], mb["behaviour_logprobs"][mb["response_mask"].bool()])
                for n, mb in zip(noisy, micro)
            )
            super()._score_old_and_reference(micro, temperature)

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    settings = learner_settings(
        model_path,
        use_peft=True,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.05,
        deepspeed_stage=0,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        beta=0.0,
    )
    learner = FaithfulEngineLearner(0, 1, settings)
    learner.setup("127.0.0.1", learner.held_port.hold())  # as rank 0 names its port to the group
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: peft starts B at zero
        for name, param in learner.engine.module.named_parameters():
            if adapter_names.is_adapter_parameter(name) and ".lora_B." in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    batch_settings = batching.batch_settings(
        tokenizer.pad_token_id, pack_length=128, num_learners_per_node=[1], per_device_train_batch_size=1
    )
    batches, _ = batching.assemble(rewarded_groups(tokenizer, 2), 0, batch_settings)
    metrics = learner.train_step(batches[0]).metrics
    report = {key: metrics[f"offpolicy/{key}"] for key in ("rho_mean", "rho_max", "rho_sq_mean")}
    print(json.dumps(report | {"train_mode_differs": learner.train_mode_differs}))


if __name__ == "__main__":
    main(sys.argv[1])
