"""The LoRA adapter of `--use_peft` as the learner and the engines both name it: the id and name every engine
serves it under, the file an engine reads it from, and the names its tensors travel under.

A weight sync sends the adapter's tensors only (`is_adapter_parameter`), under peft's saved names
(`wire_name`: `...q_proj.lora_A.weight`, what `adapter_model.safetensors` holds), and the engine writes them
into ADAPTER_FILE (`weights.adapter_engine`). The learner's side (`open_instruct.adapters`, the learner's
`AdapterWeights`) and the engine's side both import these from here, below both: nothing here imports.
"""

from __future__ import annotations

# The one adapter every engine serves and every request names (vLLM ids start at 1).
ADAPTER_ID = 1
ADAPTER_NAME = "open_instruct_policy"
# peft's name for the one adapter of a model it wraps, in parameter names (`lora_A.default.weight`) but not in
# saved files (`lora_A.weight`).
PEFT_ADAPTER_NAME = "default"
ADAPTER_FILE = "adapter_model.safetensors"  # peft's file name, which vLLM's LoRA loader reads


def is_adapter_parameter(name: str) -> bool:
    """A parameter of the LoRA adapter (peft names its matrices lora_A / lora_B)."""
    return ".lora_A." in name or ".lora_B." in name


def wire_name(parameter_name: str) -> str:
    """The name an adapter tensor is sent under: peft's parameter name without the adapter's own name, as peft
    saves it and vLLM reads it (`...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`)."""
    for matrix in ("lora_A", "lora_B"):
        parameter_name = parameter_name.replace(f".{matrix}.{PEFT_ADAPTER_NAME}.", f".{matrix}.")
    return parameter_name
