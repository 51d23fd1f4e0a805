"""`Config`: the flag groups of one run, parsed once from open-instruct-compatible flags and frozen.

Each group validates itself (`problems`); `Config` adds the rules that span groups and the values derived
from several flags (world size, training steps, the staleness bound, capacities). Nothing writes back into
a parsed config. Every contradiction fails at parse time, all at once, each naming its flags and the fix.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from open_instruct.config.algorithm import AlgorithmConfig
from open_instruct.config.compat import CompatConfig
from open_instruct.config.data import EMBEDDED_DATASET_NAME, EMBEDDED_STOP_STRING, DataConfig
from open_instruct.config.derived import state_dir
from open_instruct.config.fields import (
    ConfigError,
    help_for_argparse,
    out_of_bounds,
    refused_flags,
    unknown_flags_message,
)
from open_instruct.config.generation import GenerationConfig
from open_instruct.config.learner import (
    SHARED_GPU_DEFAULT_SHARE,
    SHARED_GPU_MAX_SHARE,
    LearnerConfig,
    shared_mode_problems,
)
from open_instruct.config.model import ModelConfig
from open_instruct.config.rewards import RewardConfig
from open_instruct.config.run import RunConfig
from open_instruct.config.staleness import WINDOW_FLAGS, StalenessConfig, StalenessPolicy
from open_instruct.config.tools import ToolsConfig


@dataclass(frozen=True)
class Config:
    """The whole parsed configuration; validated on construction, never mutated."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    compat: CompatConfig = field(default_factory=CompatConfig)
    # Flags the user wrote on the command line (defaults excluded): some defaults depend on whether a flag was given.
    explicit_flags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        groups = [getattr(self, name) for name in self.group_names]
        problems = [problem for group in groups for problem in out_of_bounds(group) + group.problems()]
        problems += [message for ok, message in _cross_group_checks(self) if not ok] + _placement_problems(self)
        if problems:
            raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name != "explicit_flags")

    # -- what runs

    @property
    def uses_embedded_default(self) -> bool:
        return self.model.model_name_or_path is None and not self.data.dataset_mixer_list

    @property
    def world_size(self) -> int:
        return self.learner.world_size

    @property
    def rollout_batch_size(self) -> int:
        """Samples per training step."""
        return self.generation.num_unique_prompts_rollout * self.generation.num_samples_per_prompt_rollout

    @property
    def num_training_steps(self) -> int:
        steps = self.run.total_episodes // self.rollout_batch_size
        return min(steps, self.run.max_train_steps) if self.run.max_train_steps else steps

    @property
    def eval_every_steps(self) -> int:
        """Steps between evaluations, 0 for none: --local_eval_every, or --num_evals spread over the run when it
        is given without --local_eval_every (open-instruct has only the first, so its scripts get its cadence)."""
        run = self.run
        if run.num_evals is None or "local_eval_every" in self.explicit_flags:
            return max(0, run.local_eval_every)
        if run.num_evals <= 0:
            return 0
        return max(1, math.ceil(self.num_training_steps / run.num_evals))

    @property
    def eval_response_length(self) -> int:
        return self.generation.eval_response_length or self.generation.response_length

    @property
    def max_model_len(self) -> int:
        """An engine's context: the longest prompt plus the longest response (training or eval)."""
        return self.data.max_prompt_token_length + max(self.generation.response_length, self.eval_response_length)

    @property
    def tracking_enabled(self) -> bool:
        """--with_tracking, or open-instruct's --report_to naming wandb (or all)."""
        report_to = {name.lower() for name in self.run.report_to or ()}
        return self.run.with_tracking or bool(report_to & {"wandb", "all"})

    @property
    def run_name(self) -> str:
        return self.run.run_name or f"{self.run.exp_name}__{self.run.seed}"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """--stop_strings, or the embedded dataset's answer terminator when running the embedded default."""
        return tuple(self.generation.stop_strings) or ((EMBEDDED_STOP_STRING,) if self.uses_embedded_default else ())

    @property
    def train_data(self) -> DataConfig:
        """The data config with the training mix resolved (the embedded dataset when none is given)."""
        if self.data.dataset_mixer_list:
            return self.data
        return replace(
            self.data, dataset_mixer_list=[EMBEDDED_DATASET_NAME, "1.0"], dataset_mixer_list_splits=["train"]
        )

    @property
    def eval_data(self) -> DataConfig | None:
        """The eval mix, or None: no evaluation. As in open-instruct, only --dataset_mixer_eval_list is evaluated;
        nothing is held out of the training mix. The embedded dataset brings its own eval split: with no
        dataset flag at all it is evaluated, as it is trained on, by default."""
        if self.data.dataset_mixer_eval_list:
            return self.data
        if self.data.dataset_mixer_list:
            return None
        return replace(
            self.data, dataset_mixer_eval_list=[EMBEDDED_DATASET_NAME, "1.0"], dataset_mixer_eval_list_splits=["test"]
        )

    @property
    def evaluation_line(self) -> str:
        """What is evaluated and when, in one line (start-up log and --preflight)."""
        if self.eval_data is None:
            return "evaluation: none (no --dataset_mixer_eval_list; nothing is held out of the training mix)"
        data = self.eval_data
        if data.dataset_mixer_eval_list == self.data.dataset_mixer_eval_list:
            splits = " ".join(data.dataset_mixer_eval_list_splits)
            mix = f"--dataset_mixer_eval_list {' '.join(data.dataset_mixer_eval_list)} [{splits}]"
        else:
            mix = f"the eval split of {EMBEDDED_DATASET_NAME} (the embedded default)"
        every = self.eval_every_steps
        times = (["before the first step"] if self.run.eval_on_step_0 else []) + (
            [f"every {every} steps and after the last"] if every > 0 else []
        )
        return f"evaluation: {mix}, {' and '.join(times) or 'never (--local_eval_every/--num_evals turn it off)'}"

    # -- the lookahead and the staleness bound

    @property
    def async_steps_auto(self) -> bool:
        return self.generation.async_steps_auto

    @cached_property
    def staleness_policy(self) -> StalenessPolicy:
        """K and the off-policy action, parsed once (the flags are valid by then)."""
        return StalenessPolicy.from_config(self)

    @property
    def lookahead_max(self) -> int:
        """The most steps generation can run ahead: --async_steps, or K when it adapts (`auto`)."""
        return self.staleness_policy.bound if self.async_steps_auto else int(self.generation.async_steps)

    # -- capacities derived from the lookahead: lookahead + 1 batches of live groups may be admitted
    # and untrained at once (refills only replace dropped ones), plus one batch of slack for the
    # groups completing while a step trains.

    @property
    def replay_buffer_max_samples(self) -> int:
        return (self.lookahead_max + 2) * self.rollout_batch_size

    @property
    def prompt_queue_capacity(self) -> int:
        """Admitted prompts never exceed this; an eval round (one prompt per eval row) shares the queue."""
        return (self.lookahead_max + 2) * self.generation.num_unique_prompts_rollout + 4096

    # -- placement

    @property
    def engine_gpu_share(self) -> float:
        """The fraction of its GPU each engine may use: --vllm_gpu_memory_utilization, or with --single_gpu_mode
        and the flag not given, SHARED_GPU_DEFAULT_SHARE (the flag's default 0.9 would starve the learner)."""
        if self.learner.single_gpu_mode and "vllm_gpu_memory_utilization" not in self.explicit_flags:
            return SHARED_GPU_DEFAULT_SHARE
        return self.generation.vllm_gpu_memory_utilization


def _cross_group_checks(cfg: Config) -> list[tuple[bool, str]]:
    generation, data, learner, run = cfg.generation, cfg.data, cfg.learner, cfg.run
    prompt_and_response = data.max_prompt_token_length + generation.response_length
    checks = [
        (
            learner.pack_length >= prompt_and_response,
            f"--pack_length {learner.pack_length} < --max_prompt_token_length {data.max_prompt_token_length} + "
            f"--response_length {generation.response_length}: a sample would not fit in a packed row; raise "
            f"--pack_length to at least {prompt_and_response}",
        ),
        (
            run.total_episodes >= cfg.rollout_batch_size,
            f"--total_episodes {run.total_episodes} is less than one step's batch ({cfg.rollout_batch_size} samples)",
        ),
        (
            learner.sequence_parallel_size == 1 or cfg.algorithm.importance_sampling_mode != "mask_sequence",
            f"--sequence_parallel_size {learner.sequence_parallel_size} scores each rank's slice of a sample; "
            "--importance_sampling_mode mask_sequence needs the whole sample on one rank (use truncate or mask_token)",
        ),
        (
            not (cfg.model.use_peft and cfg.algorithm.beta > 0 and cfg.algorithm.ref_policy_update_freq),
            f"--ref_policy_update_freq {cfg.algorithm.ref_policy_update_freq} with --use_peft: the reference is the "
            "base model with the adapter switched off, which cannot move toward the policy without a second copy of "
            "the model; leave --ref_policy_update_freq unset, or train without --use_peft",
        ),
        (
            "checkpointing_steps" not in cfg.explicit_flags or run.checkpointing_steps >= 1,
            f"--checkpointing_steps {run.checkpointing_steps} must be >= 1",
        ),
    ]
    checks += _staleness_checks(cfg)
    for flag, folder in (("output_dir", run.output_dir), ("checkpoint_state_dir", state_dir(cfg))):
        # a file where a folder goes would fail only when the first thing is written, minutes in
        checks.append((not folder or not os.path.isfile(folder), f"--{flag} {folder} is a file; give a directory"))
    compat = cfg.compat
    for flag in ("fsdp_shard_degree", "fsdp_num_replicas"):
        degree = getattr(compat, flag)
        checks.append(
            (
                degree is None or (degree >= 1 and cfg.world_size % degree == 0),
                f"--{flag} {degree} must divide the {cfg.world_size} learners",
            )
        )
    if compat.fsdp_shard_degree and compat.fsdp_num_replicas:
        checks.append(
            (
                compat.fsdp_shard_degree * compat.fsdp_num_replicas == cfg.world_size,
                f"--fsdp_shard_degree x --fsdp_num_replicas must equal the {cfg.world_size} learners",
            )
        )
    return checks


def _staleness_checks(cfg: Config) -> list[tuple[bool, str]]:
    """K against the lookahead and the weight syncs; only once both groups' own flags are valid."""
    if cfg.staleness.problems() or cfg.generation.problems():
        return []
    policy = cfg.staleness_policy  # parsed once: the cached property the runtime reads too
    window_flags = sorted(cfg.explicit_flags & WINDOW_FLAGS)
    checks = [
        (
            policy.auto or not window_flags,
            f"--{window_flags[0] if window_flags else ''} sets a limit of the self-tuning window, which needs "
            f"--max_off_policy_steps auto (it is {cfg.staleness.max_off_policy_steps})",
        ),
        (
            policy.bound >= 1 or not cfg.async_steps_auto,
            "--async_steps auto adapts the lookahead within [1, --max_off_policy_steps]; give a bound >= 1",
        ),
    ]
    return checks + [
        (False, problem) for problem in policy.sync_interval_problems(cfg.generation.weight_sync_every_steps)
    ]


def _placement_problems(cfg: Config) -> list[str]:
    generation, learner = cfg.generation, cfg.learner
    problems = shared_mode_problems(
        learner.single_gpu_mode, generation.vllm_num_engines, generation.vllm_tensor_parallel_size, cfg.world_size
    )
    share = generation.vllm_gpu_memory_utilization
    if learner.single_gpu_mode and "vllm_gpu_memory_utilization" in cfg.explicit_flags and share > SHARED_GPU_MAX_SHARE:
        problems.append(
            f"--vllm_gpu_memory_utilization {share} with --single_gpu_mode leaves the learner {1 - share:.0%} of the "
            f"shared GPU, less than its weights, gradients and optimizer state need: give at most "
            f"{SHARED_GPU_MAX_SHARE} (unset: {SHARED_GPU_DEFAULT_SHARE})"
        )
    return problems


# ----------------------------------------------------------------------------- parsing

GROUPS = tuple(f.default_factory for f in fields(Config) if f.name != "explicit_flags")


def unsupported_features(cfg: Config) -> list[str]:
    """A flag of a feature not built yet (its kind PENDING, in any group), given a value other than its default:
    one line each. The configuration page marks exactly these flags "not supported yet"."""
    return [line for name in cfg.group_names for line in refused_flags(getattr(cfg, name))]


def build_parser():
    from transformers import HfArgumentParser

    from open_instruct.config.compat import DEFAULTS_UNLIKE_OPEN_INSTRUCT

    class FlagParser(HfArgumentParser):
        @staticmethod
        def _parse_dataclass_field(parser, field):
            HfArgumentParser._parse_dataclass_field(parser, help_for_argparse(field))
            # A switch that defaults to True in open-instruct has its --no_ form there (scripts and docs use it);
            # where ours defaults to False, HfArgumentParser would not make one: keep it accepted.
            if field.type in (bool, "bool") and field.default is False and field.name in DEFAULTS_UNLIKE_OPEN_INSTRUCT:
                parser.add_argument(f"--no_{field.name}", action="store_false", dest=field.name, help="")

    return FlagParser(
        GROUPS,
        prog="grpo_fast.py",
        description="Async-streaming GRPO: vLLM engines stream completions to DeepSpeed learners.",
    )


def parse_config(argv: list[str] | None = None) -> Config:
    """Parse flags into a validated Config. Unknown flags raise ConfigError with suggestions."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    *groups, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        raise ConfigError(unknown_flags_message(parser, remaining))
    by_type = {type(group): group for group in groups}
    known = set(flag_names())
    explicit = {
        name.removeprefix("no_")
        for token in argv
        if token.startswith("--")
        for name in [token[2:].split("=")[0].replace("-", "_")]
        if name in known or name.removeprefix("no_") in known
    }
    # Each group field of Config defaults to its group class: that is how a parsed group finds its field.
    groups_by_field = {f.name: by_type[f.default_factory] for f in fields(Config) if f.name != "explicit_flags"}
    return Config(explicit_flags=frozenset(explicit), **groups_by_field)


def flag_names() -> list[str]:
    """Every accepted flag name, for tests and docs."""
    return [f.name for group in GROUPS for f in fields(group)]
