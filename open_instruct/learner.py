"""DeepSpeed learner set-up: distributed init, ZeRO config and engine construction.

CPU runs use DeepSpeed's CPU accelerator with `gloo` and a plain torch AdamW, so nothing
depends on the `fused_adam` JIT build (75 s when it works, a crash when the compiler
environment is off). GPU runs use NCCL, bf16 and DeepSpeed's fused Adam.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# ZeRO settings per stage live in configs/ds_configs so cluster users can tune them without code.
DS_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "ds_configs"


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def deepspeed_config(
    *,
    stage: int,
    micro_batch_size: int,
    gradient_accumulation_steps: int = 1,
    max_grad_norm: float = 1.0,
    bf16: bool | None = None,
    world_size: int = 1,
) -> dict[str, Any]:
    bf16 = on_gpu() if bf16 is None else bf16
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * gradient_accumulation_steps * world_size,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": zero_settings(stage),
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # Our optimizer is torch AdamW on CPU; DeepSpeed only trusts its own with ZeRO otherwise.
        "zero_allow_untested_optimizer": True,
    }
    return config


def zero_settings(stage: int) -> dict[str, Any]:
    path = DS_CONFIG_DIR / f"zero{stage}.json"
    if stage == 0 or not path.exists():
        return {"stage": stage}
    settings = json.loads(path.read_text())["zero_optimization"]
    if settings["stage"] != stage:
        raise ValueError(f"{path} declares ZeRO stage {settings['stage']}, expected {stage}")
    return settings


def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500) -> None:
    """Join the learner process group: gloo on CPU, NCCL on GPU."""
    import deepspeed
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank if not on_gpu() else 0),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
    )
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu() else "gloo", auto_mpi_discovery=False)


def make_optimizer(model, *, learning_rate: float, weight_decay: float):
    import torch

    if on_gpu():
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)


def initialize_engine(model, optimizer, ds_config: dict[str, Any], lr_scheduler=None):
    """Wrap model + optimizer in a DeepSpeed engine; returns the engine."""
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_config, lr_scheduler=lr_scheduler, dist_init_required=False
    )
    return engine
