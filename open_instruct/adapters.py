"""The LoRA adapter of `--use_peft`, as both sides see it: the peft configuration the learner trains, the one
vLLM serves, its layout and size, and the folders engines serve it from.

The learner wraps the base model with peft (only the adapter is trainable); each engine serves the base with
one adapter that every request names, read from a folder of its own. The names both sides share (the served
id, the file, the names the tensors travel under) are `weights.adapter_names`'s. Nothing here imports vLLM.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any

from open_instruct.config.model import SERVED_LORA_RANKS
from open_instruct.weights.adapter_names import ADAPTER_FILE

ALL_LINEAR = "all-linear"
# An engine's adapter folder (--lora_adapter_dir): FOLDER_PREFIX + engine + random, holding LOCK_FILE locked
# for as long as the engine lives.
FOLDER_PREFIX = "open_instruct_adapter_"
LOCK_FILE = ".in_use"
# A folder younger than this is never swept: its engine may be between creating it and locking it.
SWEEP_MARGIN_S = 60.0

logger = logging.getLogger(__name__)


def served_rank(lora_r: int) -> int:
    """vLLM's `max_lora_rank` for an adapter of rank `lora_r`."""
    for rank in SERVED_LORA_RANKS:
        if rank >= lora_r:
            return rank
    raise ValueError(f"LoRA rank {lora_r} is above {SERVED_LORA_RANKS[-1]}, the largest rank vLLM serves")


def target_modules(model_cfg) -> list[str] | str:
    """--lora_target_modules, or every linear layer but the output head when unset."""
    return list(model_cfg.lora_target_modules) if model_cfg.lora_target_modules else ALL_LINEAR


def peft_config(model_cfg):
    """peft's LoraConfig for the ModelConfig's --lora_* flags."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=model_cfg.lora_r,
        lora_alpha=model_cfg.lora_alpha,
        lora_dropout=model_cfg.lora_dropout or 0.0,
        target_modules=target_modules(model_cfg),
        task_type=TaskType.CAUSAL_LM,
        bias="none",
    )


def served_config(model_cfg) -> dict[str, Any]:
    """What an engine needs to read the adapter's tensors (vLLM's PEFTHelper fields): rank and alpha set each
    module's scaling alpha / r; the modules come from the tensors' names."""
    return {"r": model_cfg.lora_r, "lora_alpha": model_cfg.lora_alpha, "target_modules": target_modules(model_cfg)}


def wrap(model, model_cfg, gradient_checkpointing: bool):
    """The base model wrapped with a fresh adapter: only the adapter's parameters train. With gradient
    checkpointing the embeddings' output must require grad, or the frozen base gives the recomputed blocks
    nothing to differentiate."""
    from peft import get_peft_model

    if gradient_checkpointing:
        model.enable_input_require_grads()
    return get_peft_model(model, peft_config(model_cfg))


def layout(model_path: str, model_cfg):
    """(each adapter tensor's saved name -> shape, the base model's parameter count) for the model at
    `model_path`, built on the meta device: nothing is read but its config. A --lora_target_modules name that no
    module of the model has is a ConfigError."""
    from transformers import AutoConfig

    return layout_of(AutoConfig.from_pretrained(model_path, revision=model_cfg.model_revision), model_cfg, model_path)


def layout_of(config, model_cfg, model_name: str = "the model"):
    """`layout` for an HF model config (e.g. a 7B's shape, for the arithmetic of what its adapter weighs)."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config)
    base_parameters = sum(p.numel() for p in base.parameters())
    model = get_peft_model(base, peft_config(model_cfg))
    shapes = {name: tuple(t.shape) for name, t in get_peft_model_state_dict(model).items()}
    adapted = {name.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for name in shapes}
    unmatched = sorted(set(model_cfg.lora_target_modules or ()) - adapted)
    if unmatched:
        from open_instruct.config.fields import ConfigError

        raise ConfigError(
            f"--lora_target_modules {' '.join(unmatched)}: no module of {model_name} has that name "
            f"(the others matched: {', '.join(sorted(adapted))})"
        )
    return shapes, base_parameters


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())


def write_zero_adapter(model_path: str, model_cfg, directory: str) -> int:
    """A peft adapter for the model at `model_path` in `directory` whose matrices are all zero: what the learner's
    fresh adapter generates (peft starts B at zero), so an engine serving it generates the base model's tokens.
    Returns the tensor count."""
    import json

    import torch
    from safetensors.torch import save_file

    shapes, _ = layout(model_path, model_cfg)
    save_file({name: torch.zeros(shape) for name, shape in shapes.items()}, f"{directory}/{ADAPTER_FILE}")
    with open(f"{directory}/adapter_config.json", "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none", **served_config(model_cfg)}, f)
    return len(shapes)


def describe(model_path: str, model_cfg, sync_dtype: str | None = None) -> str:
    """One line on the adapter a run would train: its rank, modules and size, and with `sync_dtype` (the engines'
    dtype) what a weight sync moves."""
    from open_instruct.weights.transport import nbytes

    shapes, base_parameters = layout(model_path, model_cfg)
    parameters = parameter_count(shapes)
    modules = len({name.rsplit(".lora_", 1)[0] for name in shapes})
    line = (
        f"r={model_cfg.lora_r}, alpha {model_cfg.lora_alpha}, {modules} modules ({target_modules(model_cfg)}): "
        f"{parameters:,} parameters ({100 * parameters / base_parameters:.2f}% of the model)"
    )
    if sync_dtype is None:
        return line
    return f"{line}, {nbytes(sync_dtype, (parameters,)) / 1e6:.2f} MB per weight sync in {sync_dtype}"


class AdapterFolder:
    """The folder an engine serves its adapter from, under `root` (--lora_adapter_dir, default the temp folder).

    The engine's process holds an flock on LOCK_FILE inside it for as long as it lives. The kernel drops the lock
    when the process dies, SIGKILL included, which is how `sweep_folders` tells a leftover from a live engine's
    folder, whatever PID namespace that engine runs in (the lock is on the file, not on a PID)."""

    def __init__(self, root: str | None, engine_id: int):
        root = root or tempfile.gettempdir()
        os.makedirs(root, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}e{engine_id}_", dir=root)
        self._lock = open(os.path.join(self.path, LOCK_FILE), "w")  # noqa: SIM115 -- held until close()
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def close(self) -> None:
        if self._lock is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()
        self._lock = None


def sweep_folders(root: str | None, margin_s: float = SWEEP_MARGIN_S, now: float | None = None) -> list[str]:
    """Removes the adapter folders under `root` that no live engine holds: this user's, older than `margin_s`,
    whose lock file is free (its engine was killed) or missing (a folder never locked). Returns what it removed;
    never raises: what it cannot read or remove stays."""
    root = root or tempfile.gettempdir()
    now = time.time() if now is None else now
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(FOLDER_PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid() or now - info.st_mtime < margin_s:
                continue
            if _unheld(os.path.join(entry.path, LOCK_FILE)):
                shutil.rmtree(entry.path)
                removed.append(entry.path)
    if removed:
        logger.warning("removed %d adapter folder(s) left by killed engines: %s", len(removed), removed)
    return removed


def _unheld(lock_path: str) -> bool:
    """Whether no process holds the lock file (True when it is missing)."""
    try:
        lock = open(lock_path)  # noqa: SIM115 -- closed below, which releases the lock taken
    except FileNotFoundError:
        return True
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
