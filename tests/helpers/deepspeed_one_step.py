"""Runs in its own process (DeepSpeed's process group is per process): one ZeRO step on the tiny model.

Prints one JSON line: the loss before and after, how far the parameters moved, and DeepSpeed's optimizer
wrapper. Arguments: stage, model path, and optionally the model dtype (bfloat16 runs DeepSpeed's bf16).
"""

import json
import sys

import torch


def main(stage: int, model_path: str, dtype: str = "float32") -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from open_instruct.learner import deepspeed_setup
    from open_instruct.learner.rendezvous import listening_socket

    listener = listening_socket()
    port = listener.getsockname()[1]
    deepspeed_setup.init_distributed(rank=0, world_size=1, master_port=port, listener=listener)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = deepspeed_setup.make_optimizer(model, learning_rate=1e-3, weight_decay=0.0)
    engine = deepspeed_setup.initialize_engine(
        model, optimizer, deepspeed_setup.deepspeed_config(stage=stage, micro_batch_size=2, bf16=dtype == "bfloat16")
    )
    batch = tokenizer(
        ["12</think><answer>12</answer>", "7</think><answer>7</answer>"], return_tensors="pt", padding=True
    )
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    losses = []
    for _ in range(2):
        loss = engine(**batch, labels=labels).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in engine.module.named_parameters())
    report = {"losses": losses, "max_param_change": moved, "zero_stage": engine.zero_optimization_stage()}
    print(json.dumps(report | {"optimizer": type(engine.optimizer).__name__}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:])
