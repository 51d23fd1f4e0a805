"""The run as a whole: its name and tracking, its length, when it evaluates, and what it saves and resumes from."""

from __future__ import annotations

import os
from dataclasses import dataclass

from open_instruct.config.fields import arg


@dataclass(frozen=True)
class RunConfig:
    _argument_group_name = "run: naming, tracking, length, evaluation schedule, checkpoints"

    exp_name: str = arg("grpo", "Experiment name; run names and output folders derive from it.")
    seed: int = arg(42, "Seed for data order, sampling seeds of every request, and initialisation.")
    output_dir: str = arg("output/", "Where metrics.jsonl, checkpoints and plots are written.")
    with_tracking: bool = arg(False, "Log to Weights & Biases (set WANDB_MODE=offline without network).")
    wandb_project_name: str | None = arg(
        None, "W&B project, by the name open-instruct's finetune.py gives it; given, it wins over --wandb_project."
    )
    wandb_entity: str | None = arg(None, "W&B entity (team); None uses your default.")
    num_evals: int | None = arg(
        None,
        "How many evaluations over the run, spread evenly over its steps (<= 0: none); given, it replaces "
        "--local_eval_every unless that is given too.",
    )
    local_eval_every: int = arg(
        100, "Evaluate the eval mix (--dataset_mixer_eval_list) every N steps and after the last one (<= 0: never)."
    )
    eval_on_step_0: bool = arg(False, "Also evaluate before the first training step.")
    save_freq: int = arg(200, "Save an HF-format model + tokenizer every N training steps (0 disables).")
    keep_last_n_checkpoints: int = arg(
        3, "Keep the newest N HF checkpoints and N resumable states (-1 keeps all; 0 keeps the newest state only)."
    )
    checkpoint_state_freq: int = arg(
        200,
        "Save the full resumable state every N steps (<= 0: never) to --checkpoint_state_dir; given without it, to "
        "<output_dir>/checkpoint_state.",
    )
    checkpoint_state_dir: str | None = arg(None, "Directory for resumable state; resuming reads it.")
    save_admitted_prompts: str | None = arg(None, "Append every admitted prompt to this JSONL (for benchmarks.replay).")
    preflight: bool = arg(
        False, "Check everything a launch checks before it starts Ray (data, template, tools, endpoints, GPUs), exit."
    )
    total_episodes: int = arg(100_000, "Samples to train on; steps = episodes / (prompts x samples).")
    run_name: str | None = arg(None, "Name of the run (W&B run, summary); default: <exp_name>__<seed>.")
    wandb_project: str = arg("open_instruct_internal", "W&B project.")
    wandb_group_name: str | None = arg(None, "W&B run group.")
    report_to: list[str] | None = arg(
        None, "Trackers: 'wandb' or 'all' turns on W&B (like --with_tracking); 'none' none."
    )
    verbose: bool = arg(False, "DEBUG logging, and a traceback with every error (by default only with our bugs).")
    extension_modules: list[str] = arg(
        [],
        "Python modules every process of the run imports before it looks names up: they register their own "
        "verifiers, tools and environments (open_instruct.extensions, docs/extending.md). They must be importable "
        "there (installed, or on PYTHONPATH); installed packages may declare theirs under the entry-point group "
        "open_instruct.extensions instead.",
    )
    logging_steps: int = arg(
        1,
        "Send metrics to W&B every N steps (averaged over those steps); metrics.jsonl keeps every step.",
        bounds=">= 1",
    )
    save_traces: bool = arg(False, "Write every trained rollout to JSONL in --rollouts_save_path (see traces.py).")
    rollouts_save_path: str = arg(
        "/weka/oe-adapt-default/allennlp/deletable_rollouts/", "Directory of --save_traces (an Ai2 path by default)."
    )
    max_train_steps: int | None = arg(
        None, "Stop after this many training steps (fewer than --total_episodes gives).", bounds=">= 1"
    )
    checkpointing_steps: int = arg(
        500, "Given explicitly: save the resumable state (to --checkpoint_state_dir) every N steps."
    )
    ephemeral_save_interval: int | None = arg(
        None,
        "Also save the resumable state every N steps (pruned by --keep_last_n_checkpoints like the others).",
        bounds=">= 1",
    )
    resume_from_checkpoint: str | None = arg(
        None, "Resume from this state (a --checkpoint_state_dir, or one of its step_<k> folders)."
    )

    def problems(self) -> list[str]:
        checks = [
            (not self.save_traces or bool(self.rollouts_save_path), "--save_traces needs a --rollouts_save_path"),
        ]
        path = self.resume_from_checkpoint
        if path is not None:
            found = os.path.isfile(os.path.join(path, "latest")) or os.path.isfile(os.path.join(path, "driver.pkl"))
            checks.append(
                (found, f"--resume_from_checkpoint {path}: no resumable state there (no 'latest' or driver.pkl)")
            )
        return [message for ok, message in checks if not ok]
