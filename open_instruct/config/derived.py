"""Values the runtime derives from several flags: the dtype each actor uses, where and when the resumable
state is saved, and how many samples --max_error_fraction judges at once."""

from __future__ import annotations

import os

DTYPES = ("float32", "bfloat16", "float16")
# --dtype auto (transformers' "the checkpoint's dtype") is what a script writes to leave the choice to the
# trainer; open-instruct's grpo_fast ignores --dtype, so here it means the default rule below.
AUTO_DTYPE = "auto"


def resolve_dtype(explicit: str | None, gpu_default: str, on_gpu: bool) -> str:
    """The dtype of the policy, the reference and the engines: --dtype, else --model_dtype on GPU, else fp32.

    Resolved inside each actor, where the device is known (the driver may have no GPU)."""
    if explicit and explicit != AUTO_DTYPE:
        return explicit
    return gpu_default if on_gpu else "float32"


def state_save_every(cfg) -> tuple[int, ...]:
    """Step intervals at which the resumable state is saved: --checkpoint_state_freq, --ephemeral_save_interval
    and --checkpointing_steps when given (open-instruct ignores the last; its default would save every 500)."""
    every = [cfg.run.checkpoint_state_freq, cfg.run.ephemeral_save_interval or 0]
    if "checkpointing_steps" in cfg.explicit_flags:
        every.append(cfg.run.checkpointing_steps)
    return tuple(sorted({n for n in every if n > 0}))


# Where the resumable state goes when a save interval is given without --checkpoint_state_dir.
DEFAULT_STATE_SUBDIR = "checkpoint_state"
INTERVAL_FLAGS = frozenset({"checkpoint_state_freq", "ephemeral_save_interval", "checkpointing_steps"})


def state_dir(cfg) -> str | None:
    """The directory of the resumable state: --checkpoint_state_dir; else <output_dir>/checkpoint_state when a
    save interval is given on the command line (open-instruct then saves nothing, and on Beaker mason fills
    the directory in: a script that asks for state should get it); else None: the default interval, as in
    open-instruct, saves only into a directory given."""
    if cfg.run.checkpoint_state_dir:
        return cfg.run.checkpoint_state_dir
    if cfg.explicit_flags & INTERVAL_FLAGS and state_save_every(cfg):
        return os.path.join(cfg.run.output_dir, DEFAULT_STATE_SUBDIR)
    return None


# The fewest finished samples --max_error_fraction judges in a run longer than that: with 20% of samples failing,
# more than half of 64 fail with a chance of 2e-8 per window (30%: 3e-4), so only a broken run reaches 0.5.
MIN_ERROR_WINDOW = 64


def error_window(cfg, steps_left: int) -> int:
    """How many of the latest finished training samples --max_error_fraction judges: every sample the lookahead
    admits at once, so that failures which arrive fast (an engine refusing a prompt) cannot fill the window
    before the healthy samples admitted with them finish; at least MIN_ERROR_WINDOW; at most the samples left
    to train, so that a short run is judged before it ends."""
    admitted_at_once = (cfg.lookahead_max + 1) * cfg.rollout_batch_size
    return max(1, min(max(MIN_ERROR_WINDOW, admitted_at_once), steps_left * cfg.rollout_batch_size))
