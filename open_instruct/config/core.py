"""Typed, grouped configuration for grpo_fast, parsed once from open-instruct-compatible flags.

Each field documents itself once, in `help` (what `--help` prints). Groups are frozen
dataclasses: nothing writes back into a parsed config; derived values (world size, number
of training steps, ...) are properties. Cross-field contradictions fail at parse time with
a message that names the flags and the fix, before any actor starts.

Flags that only mean something on Ai2's Beaker cluster are accepted so launch scripts work
unchanged, and say so in their help.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from open_instruct.agents.settings import ToolsConfig, tool_problems
from open_instruct.agents.tools import config_problems
from open_instruct.config.fields import (
    BEAKER_ONLY,
    ConfigError,
    arg,
    help_for_argparse,
    mixer_problems,
    unknown_flags_message,
)
from open_instruct.config.parity import (
    PARITY_GROUPS,
    DataExtrasConfig,
    EvalExtrasConfig,
    InfraConfig,
    LoggingConfig,
    LossExtrasConfig,
    RewardExtrasConfig,
    ScheduleConfig,
    TokenizerModelConfig,
    parity_problems,
    pending,
    pending_problems,
)
from open_instruct.config.resources import LR_SCHEDULERS, ResourceConfig, lr_scheduler_check, resource_problems
from open_instruct.scheduling import sync_interval_check

# ----------------------------------------------------------------------------- groups


def _default_code_api_url() -> str:
    """code_api_setup.sh exports CODE_API_URL (the service's base URL) for the job it starts."""
    base = os.environ.get("CODE_API_URL", "http://localhost:1234").rstrip("/")
    return base if base.endswith("/test_program") else base + "/test_program"


@dataclass(frozen=True)
class ExperimentConfig:
    _argument_group_name = "experiment"

    exp_name: str = arg("grpo", "Experiment name; run names and output folders derive from it.")
    seed: int = arg(1, "Seed for data order, sampling seeds of every request, and initialisation.")
    output_dir: str = arg("output", "Where metrics.jsonl, checkpoints and plots are written.")
    with_tracking: bool = arg(False, "Log to Weights & Biases (set WANDB_MODE=offline without network).")
    wandb_project_name: str = arg("open_instruct_internal", "W&B project.")
    wandb_entity: str | None = arg(None, "W&B entity (team); None uses your default.")
    num_evals: int = arg(10, "How many evaluations over the run (spread evenly over training steps).")
    local_eval_every: int = arg(-1, "Evaluate every N steps; overrides --num_evals when > 0.")
    eval_on_step_0: bool = arg(False, "Also evaluate before the first training step.")
    save_freq: int = arg(200, "Save an HF-format model + tokenizer every N training steps (0 disables).")
    keep_last_n_checkpoints: int = arg(
        3, "Keep the newest N HF checkpoints and N resumable states (-1 keeps all; 0 keeps the newest state only)."
    )
    checkpoint_state_freq: int = arg(-1, "Save full resumable state every N steps (-1 disables).")
    checkpoint_state_dir: str | None = arg(None, "Directory for resumable state; resuming reads it.")
    try_launch_beaker_eval_jobs_on_weka: bool = arg(False, "Launch oe-eval jobs per save.", kind=BEAKER_ONLY)
    oe_eval_tasks: str | None = arg(None, "Comma-separated oe-eval tasks for those jobs.", kind=BEAKER_ONLY)
    oe_eval_max_length: int = arg(4096, "Max length for the oe-eval jobs.", kind=BEAKER_ONLY)
    hf_metadata_dataset: str | None = arg(None, "HF dataset recording run metadata.", kind=BEAKER_ONLY)
    push_to_hub: bool = pending(
        False,
        "uploading needs the Hub's network and write access; --save_freq checkpoints stay in --output_dir",
        "Push checkpoints to the HF hub. Off by default here (open-instruct's default is on, so its scripts pass "
        "--push_to_hub false, which works).",
    )
    save_admitted_prompts: str | None = arg(None, "Append every admitted prompt to this JSONL (for benchmarks.replay).")
    preflight: bool = arg(
        False, "Check everything a launch checks before it starts Ray (data, template, tools, endpoints, GPUs), exit."
    )


@dataclass(frozen=True)
class ModelConfig:
    _argument_group_name = "model and tokenizer"

    model_name_or_path: str | None = arg(None, "HF hub name or local path; unset: the embedded tiny model.")
    model_revision: str | None = arg(None, "Hub revision of the model.")
    tokenizer_name_or_path: str | None = arg(None, "Tokenizer; defaults to the model's.")
    tokenizer_revision: str | None = arg(None, "Hub revision of the tokenizer.")
    chat_template_name: str | None = arg(
        None, "Any open-instruct chat template name, or 'tokenizer'; unset: the tokenizer's own (as open-instruct)."
    )
    add_bos: bool = arg(False, "Prepend the tokenizer's BOS token to every prompt (OLMo-style models).")
    system_prompt_override: str | None = arg(None, "Replace (or add) the system message of every prompt.")
    gradient_checkpointing: bool = arg(False, "Recompute activations in the backward pass to save memory.")


@dataclass(frozen=True)
class DataConfig:
    _argument_group_name = "data"

    dataset_mixer_list: list[str] = arg(
        [],
        "Training mix as NAME WEIGHT pairs; NAME is a hub dataset, a JSON/JSONL/parquet file or a "
        "directory; WEIGHT <= 1 is a fraction of the dataset, > 1 an absolute row count.",
    )
    dataset_mixer_list_splits: list[str] = arg(["train"], "Split per training dataset (one value = all).")
    dataset_mixer_eval_list: list[str] = arg([], "Evaluation mix, same NAME WEIGHT format.")
    dataset_mixer_eval_list_splits: list[str] = arg(["test"], "Split per eval dataset (one value = all).")
    sft_messages_key: str = arg("messages", "Column holding the chat messages of the prompt.")
    ground_truths_key: str = arg("ground_truth", "Column holding the label handed to the verifier.")
    max_token_length: int = arg(
        512, "Kept for open-instruct scripts; see --max_prompt_token_length, --response_length."
    )
    max_prompt_token_length: int = arg(256, "Prompts longer than this are filtered (counted and reported).")
    dataset_skip_bad_rows: bool = arg(False, "Skip malformed rows (counted and reported) instead of failing.")
    dataset_local_cache_dir: str = arg("local_dataset_cache", "Where tokenized datasets are cached.")


@dataclass(frozen=True)
class GenerationConfig:
    _argument_group_name = "generation (vLLM engines)"

    num_unique_prompts_rollout: int = arg(16, "Prompts per training step (groups per batch).")
    num_samples_per_prompt_rollout: int = arg(4, "Samples per prompt (GRPO group size).")
    response_length: int = arg(256, "Maximum generated tokens per sample.")
    temperature: float = arg(1.0, "Sampling temperature.")
    vllm_top_p: float = arg(1.0, "Nucleus sampling p.")
    stop_strings: list[str] = arg([], "Strings that end a sample (e.g. '</answer>').")
    include_stop_str_in_output: bool = arg(True, "Keep the stop string in the response (and train on it).")
    async_steps: str = arg(
        "8",
        "How many optimizer steps generation may run ahead of the learner: an integer (0 = synchronous), or "
        "'auto' to follow the measured group latency and learner step time within [1, --max_off_policy_steps].",
    )
    max_off_policy_steps: int | None = arg(
        None,
        "Staleness bound: a group whose oldest token is more than K learner versions behind at training time "
        "gets --off_policy_action. Default: --async_steps (open-instruct's bound); 8 with --async_steps auto.",
    )
    off_policy_action: Literal["requeue", "drop", "downweight"] = arg(
        "requeue",
        "For groups over --max_off_policy_steps: admit the prompt again, fresh (requeue); drop it and admit "
        "another (drop); or train it at weight 0.5^(lag - K) (downweight). Requeue and drop also abort running "
        "samples that can no longer finish within the bound.",
    )
    inflight_updates: bool = arg(
        True,
        "Push new weights into running engines mid-generation (KV cache kept); False waits for running "
        "requests to finish before each update (the conservative baseline).",
    )
    weight_sync_every_steps: int = arg(1, "Push the learner's weights to the engines every N optimizer steps.")
    vllm_num_engines: int = arg(1, "Number of vLLM engine actors.")
    vllm_tensor_parallel_size: int = arg(1, "GPUs per engine (tensor parallel, vLLM's mp workers in the actor).")
    vllm_gpu_memory_utilization: float = arg(0.9, "Fraction of GPU memory vLLM may use (see --single_gpu_mode).")
    vllm_enable_prefix_caching: bool = arg(False, "Reuse KV blocks of shared prefixes (salted per weight version).")
    vllm_enforce_eager: bool = arg(False, "Disable CUDA graphs (always eager on CPU).")
    vllm_kv_cache_gib: float = arg(1.0, "KV-cache size per engine in GiB on CPU machines.")


@dataclass(frozen=True)
class AlgorithmConfig:
    _argument_group_name = "algorithm (GRPO loss)"

    beta: float = arg(0.05, "KL penalty coefficient; > 0 loads a reference policy.")
    kl_estimator: str = arg("kl3", "KL estimator: kl1, kl2, kl3, kl4 (or the numeric forms 0-3).")
    clip_lower: float = arg(0.2, "Lower PPO clip: ratio >= 1 - clip_lower.")
    clip_higher: float = arg(0.2, "Upper PPO clip (DAPO clip-higher): ratio <= 1 + clip_higher.")
    loss_denominator: str = arg("token", "'token' (mean over tokens) or a positive constant (Dr. GRPO).")
    num_epochs: int = arg(1, "Passes over each batch.")
    num_mini_batches: int = arg(1, "Optimizer steps per batch and epoch.")
    mask_truncated_completions: bool = arg(False, "Exclude samples cut at --response_length from the loss.")
    advantage_normalization_type: Literal["centered", "standard"] = arg(
        "centered", "Group advantages: reward minus group mean, or also divided by the group std."
    )
    filter_zero_std_samples: bool = arg(True, "Drop groups whose rewards are all equal (no signal; counted).")
    active_sampling: bool = arg(
        False,
        "Every step trains exactly --num_unique_prompts_rollout groups with reward spread: groups the filters drop "
        "(zero std, over --max_off_policy_steps) are replaced by admitting more prompts.",
    )
    no_resampling_pass_rate: float | None = arg(
        None,
        "Prompts whose group mean reward / max possible reward reached this rate are not admitted again in later "
        "epochs (kept in the resume state).",
    )
    truncated_importance_sampling_ratio_cap: float = arg(
        2.0, "Cap of the learner/behaviour importance ratio for streamed, off-policy samples (0 disables)."
    )
    importance_sampling_mode: Literal["truncate", "mask_token", "mask_sequence"] = arg(
        "truncate",
        "Beyond the cap: truncate the ratio (TIS), or also drop tokens / whole samples whose ratio "
        "is outside [1/cap, cap].",
    )


@dataclass(frozen=True)
class RewardConfig:
    _argument_group_name = "rewards"

    apply_verifiable_reward: bool = arg(True, "Score responses with the verifier named by each row.")
    verification_reward: float = arg(10.0, "Reward for a fully correct response (scaled by the score).")
    non_stop_penalty: bool = arg(False, "Responses that did not stop get --non_stop_penalty_value instead.")
    non_stop_penalty_value: float = arg(0.0, "Reward for responses cut at --response_length.")
    format_reward: float = arg(
        0.0, "Added to the reward when the response closes its think block and then answers in <answer> tags."
    )
    ifeval_reward_mode: Literal["fraction", "all"] = arg(
        "fraction", "ifeval: score = fraction of constraints satisfied, or 1 only when all are."
    )
    remap_verifier: str | None = arg(None, "Point one verifier name at another: OLD=NEW.")
    code_api_url: str = field(
        default_factory=lambda: _default_code_api_url(),
        metadata={"help": "Code-execution API for the code verifier (default: $CODE_API_URL/test_program)."},
    )
    code_max_execution_time: float = arg(1.0, "Seconds per test in the code verifier.")
    code_pass_rate_reward_threshold: float = arg(0.0, "Code pass rates below this score 0.")


@dataclass(frozen=True)
class LearnerConfig:
    _argument_group_name = "learners (DeepSpeed)"

    num_learners_per_node: list[int] = arg([1], "Learner processes per node, one entry per node (e.g. 8 8).")
    deepspeed_stage: int = arg(0, "ZeRO stage: 0, 1, 2 or 3.")
    per_device_train_batch_size: int = arg(1, "Packed rows per forward pass on each learner.")
    learning_rate: float = arg(2e-5, "Peak learning rate.")
    lr_scheduler_type: str = arg(
        "linear",
        "Learning-rate schedule, by its transformers name (get_scheduler): " + ", ".join(LR_SCHEDULERS) + ".",
    )
    warm_up_steps: int = arg(0, "Warm-up in optimizer steps (num_epochs x num_mini_batches per training step).")
    weight_decay: float = arg(0.0, "AdamW weight decay.")
    max_grad_norm: float = arg(1.0, "Gradient clipping norm.")
    pack_length: int = arg(512, "Tokens per packed training row; must fit prompt + response.")
    total_episodes: int = arg(100_000, "Samples to train on; steps = episodes / (prompts x samples).")


GROUPS = (
    ExperimentConfig,
    ModelConfig,
    DataConfig,
    GenerationConfig,
    AlgorithmConfig,
    RewardConfig,
    LearnerConfig,
    ToolsConfig,
    ResourceConfig,
    *PARITY_GROUPS,
)

# The staleness bound of `--async_steps auto` when --max_off_policy_steps is not given: open-instruct's
# default lookahead, so `auto` never runs further ahead than an unchanged open-instruct script would.
DEFAULT_AUTO_BOUND = 8

_KL_ESTIMATORS = {
    "kl1": "kl1",
    "kl2": "kl2",
    "kl3": "kl3",
    "kl4": "kl4",
    "0": "kl1",
    "1": "kl2",
    "2": "kl3",
    "3": "kl4",
}


@dataclass(frozen=True)
class Config:
    """The whole parsed configuration; validated on construction, never mutated."""

    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss_extras: LossExtrasConfig = field(default_factory=LossExtrasConfig)
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    infra: InfraConfig = field(default_factory=InfraConfig)
    tokenizer_model: TokenizerModelConfig = field(default_factory=TokenizerModelConfig)
    data_extras: DataExtrasConfig = field(default_factory=DataExtrasConfig)
    eval_extras: EvalExtrasConfig = field(default_factory=EvalExtrasConfig)
    reward_extras: RewardExtrasConfig = field(default_factory=RewardExtrasConfig)
    # Flags the user wrote on the command line (defaults excluded), to refuse ones not built yet.
    explicit_flags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))

    # -- derived values (computed, never stored back) --

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name != "explicit_flags")

    @property
    def uses_embedded_default(self) -> bool:
        return self.model.model_name_or_path is None and not self.data.dataset_mixer_list

    @property
    def world_size(self) -> int:
        return sum(self.learner.num_learners_per_node)

    @property
    def rollout_batch_size(self) -> int:
        """Samples per training step."""
        return self.generation.num_unique_prompts_rollout * self.generation.num_samples_per_prompt_rollout

    @property
    def num_training_steps(self) -> int:
        steps = self.learner.total_episodes // self.rollout_batch_size
        return min(steps, self.schedule.max_train_steps) if self.schedule.max_train_steps else steps

    @property
    def kl_estimator(self) -> str:
        return _KL_ESTIMATORS[str(self.algorithm.kl_estimator).lower()]

    @property
    def loss_denominator(self) -> float | None:
        """None means token mean; a float is the constant (Dr. GRPO) denominator."""
        value = self.algorithm.loss_denominator
        return None if value == "token" else float(value)

    @property
    def eval_every_steps(self) -> int:
        if self.experiment.local_eval_every > 0:
            return self.experiment.local_eval_every
        if self.experiment.num_evals <= 0:
            return 0
        return max(1, math.ceil(self.num_training_steps / self.experiment.num_evals))

    @property
    def remap_verifier(self) -> dict[str, str]:
        if not self.reward.remap_verifier:
            return {}
        old, new = self.reward.remap_verifier.split("=")
        return {old.strip().lower(): new.strip().lower()}

    @property
    def eval_response_length(self) -> int:
        return self.eval_extras.eval_response_length or self.generation.response_length

    @property
    def tracking_enabled(self) -> bool:
        """--with_tracking, or open-instruct's --report_to naming wandb (or all)."""
        report_to = {name.lower() for name in self.logging.report_to or ()}
        return self.experiment.with_tracking or bool(report_to & {"wandb", "all"})

    @property
    def run_name(self) -> str:
        return self.logging.run_name or f"{self.experiment.exp_name}__{self.experiment.seed}"

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """--stop_strings, or the embedded dataset's answer terminator when running the embedded default."""
        from open_instruct.data.embedded_default import STOP_STRING

        return tuple(self.generation.stop_strings) or ((STOP_STRING,) if self.uses_embedded_default else ())

    @property
    def train_data(self) -> DataConfig:
        """The data config with the training mix resolved (the embedded dataset when none is given)."""
        from open_instruct.data.embedded_default import EMBEDDED_DATASET_NAME

        d = self.data
        if d.dataset_mixer_list:
            return d
        return replace(d, dataset_mixer_list=[EMBEDDED_DATASET_NAME, "1.0"], dataset_mixer_list_splits=["train"])

    @property
    def eval_data(self) -> DataConfig:
        """The eval mix, falling back to the training mix's test split (or the embedded eval split)."""
        from open_instruct.data.embedded_default import EMBEDDED_DATASET_NAME

        d = self.data
        if d.dataset_mixer_eval_list:
            return d
        return replace(
            d,
            dataset_mixer_eval_list=d.dataset_mixer_list or [EMBEDDED_DATASET_NAME, "1.0"],
            dataset_mixer_eval_list_splits=["test"],
        )

    # -- the lookahead and the staleness bound

    @property
    def async_steps_auto(self) -> bool:
        return self.generation.async_steps.strip().lower() == "auto"

    @property
    def max_off_policy_steps(self) -> int:
        """K: the largest version lag a trained group may have (see --off_policy_action)."""
        if self.generation.max_off_policy_steps is not None:
            return self.generation.max_off_policy_steps
        return DEFAULT_AUTO_BOUND if self.async_steps_auto else int(self.generation.async_steps)

    @property
    def lookahead_max(self) -> int:
        """The most steps generation can run ahead: --async_steps, or K when it adapts (`auto`)."""
        return self.max_off_policy_steps if self.async_steps_auto else int(self.generation.async_steps)

    @property
    def max_possible_reward(self) -> float:
        """A perfect sample's reward, the denominator of pass rates (--no_resampling_pass_rate)."""
        r = self.reward_extras
        format_score = r.r1_style_format_reward if r.apply_r1_style_format_reward and r.additive_format_reward else 0.0
        return self.reward.verification_reward + max(0.0, self.reward.format_reward) + max(0.0, format_score)

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


def _validate(cfg: Config) -> list[str]:
    """Every contradiction at once, each naming its flags and the fix."""
    problems: list[str] = []
    for group_problems in (_generation_problems, _algorithm_problems, _learner_problems, _other_problems):
        problems.extend(message for ok, message in group_problems(cfg) if not ok)
    problems.extend(tool_problems(cfg.tools) or config_problems(cfg.tools))
    problems.extend(parity_problems(cfg))
    problems.extend(resource_problems(cfg))
    data = cfg.data
    for flag, mix in (
        ("--dataset_mixer_list", data.dataset_mixer_list),
        ("--dataset_mixer_eval_list", data.dataset_mixer_eval_list),
    ):
        problems.extend(mixer_problems(flag, mix))
    if cfg.algorithm.loss_denominator != "token":
        try:
            if float(cfg.algorithm.loss_denominator) <= 0:
                problems.append("--loss_denominator must be 'token' or a positive number")
        except ValueError:
            problems.append(
                f"--loss_denominator {cfg.algorithm.loss_denominator!r} must be 'token' or a positive number"
            )
    return problems


def _generation_problems(cfg: Config) -> list[tuple[bool, str]]:
    generation, data = cfg.generation, cfg.data
    return [
        (data.max_prompt_token_length > 0, "--max_prompt_token_length must be > 0"),
        (generation.response_length > 0, "--response_length must be > 0"),
        (generation.num_unique_prompts_rollout >= 1, "--num_unique_prompts_rollout must be >= 1"),
        (
            generation.num_samples_per_prompt_rollout >= 2,
            "--num_samples_per_prompt_rollout must be >= 2: group-relative advantages need at least two samples",
        ),
        (
            0 <= generation.temperature <= 2,
            f"--temperature {generation.temperature} must be in [0, 2] (vLLM refuses others)",
        ),
        (0 < generation.vllm_top_p <= 1, "--vllm_top_p must be in (0, 1]"),
        (
            generation.async_steps.strip().lower() == "auto" or generation.async_steps.strip().isdigit(),
            f"--async_steps {generation.async_steps!r} must be an integer >= 0 (0 = synchronous) or 'auto'",
        ),
        (
            generation.max_off_policy_steps is None or generation.max_off_policy_steps >= 0,
            f"--max_off_policy_steps {generation.max_off_policy_steps} must be >= 0",
        ),
        (
            generation.max_off_policy_steps != 0 or generation.async_steps.strip().lower() != "auto",
            "--async_steps auto adapts the lookahead within [1, --max_off_policy_steps]; give a bound >= 1",
        ),
        (generation.vllm_num_engines >= 1, "--vllm_num_engines must be >= 1"),
        (generation.weight_sync_every_steps >= 1, "--weight_sync_every_steps must be >= 1"),
        sync_interval_check(cfg.max_off_policy_steps, generation.weight_sync_every_steps, generation.off_policy_action),
        (generation.vllm_tensor_parallel_size >= 1, "--vllm_tensor_parallel_size must be >= 1"),
        (0 < generation.vllm_gpu_memory_utilization <= 1, "--vllm_gpu_memory_utilization must be in (0, 1]"),
        (generation.vllm_kv_cache_gib > 0, "--vllm_kv_cache_gib must be > 0"),
    ]


def _algorithm_problems(cfg: Config) -> list[tuple[bool, str]]:
    algorithm = cfg.algorithm
    return [
        (algorithm.beta >= 0, "--beta must be >= 0"),
        (
            str(algorithm.kl_estimator).lower() in _KL_ESTIMATORS,
            f"--kl_estimator {algorithm.kl_estimator!r} is not one of kl1, kl2, kl3, kl4 (or 0, 1, 2, 3)",
        ),
        (algorithm.clip_lower >= 0 and algorithm.clip_higher >= 0, "--clip_lower and --clip_higher must be >= 0"),
        (
            algorithm.num_epochs >= 1 and algorithm.num_mini_batches >= 1,
            "--num_epochs and --num_mini_batches must be >= 1",
        ),
        (
            algorithm.truncated_importance_sampling_ratio_cap >= 0,
            "--truncated_importance_sampling_ratio_cap must be >= 0",
        ),
        (
            not algorithm.active_sampling or algorithm.filter_zero_std_samples,
            "--active_sampling replaces the groups --filter_zero_std_samples drops; it needs that filter on "
            "(drop --no_filter_zero_std_samples or --active_sampling)",
        ),
        (
            algorithm.no_resampling_pass_rate is None or 0 < algorithm.no_resampling_pass_rate <= 1,
            f"--no_resampling_pass_rate {algorithm.no_resampling_pass_rate} must be in (0, 1] "
            "(a fraction of the max reward)",
        ),
    ]


def _learner_problems(cfg: Config) -> list[tuple[bool, str]]:
    generation, data, learner = cfg.generation, cfg.data, cfg.learner
    batch = generation.num_unique_prompts_rollout * generation.num_samples_per_prompt_rollout
    return [
        (
            learner.pack_length >= data.max_prompt_token_length + generation.response_length,
            f"--pack_length {learner.pack_length} < --max_prompt_token_length {data.max_prompt_token_length} + "
            f"--response_length {generation.response_length}: a sample would not fit in a packed row; raise "
            f"--pack_length to at least {data.max_prompt_token_length + generation.response_length}",
        ),
        (learner.deepspeed_stage in (0, 1, 2, 3), f"--deepspeed_stage {learner.deepspeed_stage} must be 0, 1, 2 or 3"),
        lr_scheduler_check(learner.lr_scheduler_type),
        (
            bool(learner.num_learners_per_node) and all(n >= 1 for n in learner.num_learners_per_node),
            "--num_learners_per_node needs one positive count per node, e.g. '8 8'",
        ),
        (learner.per_device_train_batch_size >= 1, "--per_device_train_batch_size must be >= 1"),
        (learner.learning_rate >= 0, "--learning_rate must be >= 0"),
        (
            learner.total_episodes >= batch,
            f"--total_episodes {learner.total_episodes} is less than one step's batch ({batch} samples)",
        ),
    ]


def _other_problems(cfg: Config) -> list[tuple[bool, str]]:
    reward = cfg.reward
    return [
        (
            reward.remap_verifier is None or reward.remap_verifier.count("=") == 1,
            f"--remap_verifier {reward.remap_verifier!r} must look like OLD=NEW",
        ),
    ]


# ----------------------------------------------------------------------------- features not built yet


def unsupported_features(cfg: Config) -> list[str]:
    """A flag of a feature not built yet, given a value other than its default: one line each."""
    return pending_problems([getattr(cfg, name) for name in cfg.group_names])


# ----------------------------------------------------------------------------- parsing


def build_parser():
    from transformers import HfArgumentParser

    class FlagParser(HfArgumentParser):
        @staticmethod
        def _parse_dataclass_field(parser, field):
            HfArgumentParser._parse_dataclass_field(parser, help_for_argparse(field))

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
