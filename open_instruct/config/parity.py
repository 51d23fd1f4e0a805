"""The rest of open-instruct's grpo_fast flags, so that existing launch scripts parse unchanged.

Each flag has open-instruct's name, type and default, and is one of four kinds, said in its help:

* it works here (its help says what it does);
* `[Beaker only ...]`: Ai2 infrastructure (Beaker eval jobs, GCS, the Hub, Slack); accepted, no effect;
* `[no effect, as in open-instruct's grpo_fast: <reason>]`: OLMo-core-only knobs and the ones grpo_fast
  itself ignores; accepted, and a value other than the default is named in a warning at start-up;
* `[not supported yet: <reason>]`: a feature not built yet. The default value is accepted (scripts pass
  `--vllm_sync_backend nccl` or `--load_ref_policy True` all the time); any other value stops the run
  at parse time with that reason, instead of being silently ignored.

Flags move from the last kind to the first as their features land (`pending` metadata).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from open_instruct.config.derived import AUTO_DTYPE, DTYPES, state_dir
from open_instruct.config.fields import BEAKER_ONLY, NO_EFFECT, PENDING, arg

# LoRA and quantization flags are no-ops in open-instruct's grpo_fast; training the full model when a
# user asked for adapters would be a silent surprise, so they are refused instead.
NOT_IN_GRPO_FAST = "{} is not wired into open-instruct's grpo_fast either (its flags are ignored there)"


def pending(default: Any, reason: str, help: str = "", **kwargs) -> Any:
    """A flag whose feature is not built yet: its default parses, any other value is refused with `reason`.

    --help shows the reason before the help (`fields.rendered_help`)."""
    return arg(default, help, kind=PENDING, reason=reason, **kwargs)


# open-instruct's registry names of what our loader does (they run its rlvr_tokenize_v3 and
# rlvr_max_length_filter_v2); its SFT and preference transforms do not make RL prompts.
RLVR_TRANSFORMS = ("rlvr_tokenize_v1", "rlvr_max_length_filter_v1")
# Filters open-instruct's grpo_fast also runs in the second place: preference_filter_v1 given only the prompt
# limit drops the same prompts as rlvr_max_length_filter_v1 (its other limit is never passed there).
RLVR_FILTERS = ("rlvr_max_length_filter_v1", "preference_filter_v1")


def no_effect(default: Any, reason: str, **kwargs) -> Any:
    """A flag open-instruct's grpo_fast accepts and ignores (OLMo-core-only knobs): the same here, said aloud."""
    return arg(default, "", kind=NO_EFFECT, reason=reason, **kwargs)


@dataclass(frozen=True)
class LoggingConfig:
    _argument_group_name = "logging and run naming (open-instruct)"

    run_name: str | None = arg(None, "Name of the run (W&B run, summary); default: <exp_name>__<seed>.")
    wandb_project: str | None = arg(None, "W&B project; open-instruct's name for --wandb_project_name (wins if both).")
    wandb_group_name: str | None = arg(None, "W&B run group.")
    report_to: list[str] | None = arg(
        None, "Trackers: 'wandb' or 'all' turns on W&B (like --with_tracking); 'none' none."
    )
    verbose: bool = arg(False, "DEBUG logging, and a traceback with every error (by default only with our bugs).")
    data_loader_seed: int | None = arg(None, "Seed of the prompt order (shuffling per epoch); default: --seed.")
    logging_steps: int = arg(
        1, "Send metrics to W&B every N steps (averaged over those steps); metrics.jsonl keeps every step."
    )
    save_traces: bool = arg(False, "Write every trained rollout to JSONL in --rollouts_save_path (see traces.py).")
    rollouts_save_path: str = arg(
        "/weka/oe-adapt-default/allennlp/deletable_rollouts/", "Directory of --save_traces (an Ai2 path by default)."
    )


@dataclass(frozen=True)
class ScheduleConfig:
    _argument_group_name = "run length and schedule (open-instruct)"

    warmup_ratio: float = arg(0.0, "Warm-up as a fraction of all optimizer steps (used when --warm_up_steps is 0).")
    max_train_steps: int | None = arg(None, "Stop after this many training steps (fewer than --total_episodes gives).")
    checkpointing_steps: int = arg(
        500, "Given explicitly: save the resumable state (to --checkpoint_state_dir) every N steps."
    )
    ephemeral_save_interval: int | None = arg(
        None, "Also save the resumable state every N steps (pruned by --keep_last_n_checkpoints like the others)."
    )
    resume_from_checkpoint: str | None = arg(
        None, "Resume from this state (a --checkpoint_state_dir, or one of its step_<k> folders)."
    )
    world_size: int | None = arg(None, "[internal in open-instruct: derived from --num_learners_per_node; ignored]")
    num_training_steps: int | None = arg(None, "[internal in open-instruct: derived from --total_episodes; ignored]")


@dataclass(frozen=True)
class LossExtrasConfig:
    _argument_group_name = "loss, off-policy correction and reference policy (open-instruct)"

    loss_fn: Literal["dapo", "cispo"] = arg(
        "dapo", "dapo: clipped surrogate. cispo: REINFORCE with a stop-gradient weight min(ratio, 1 + clip_higher)."
    )
    record_entropy: bool = arg(False, "Log policy/entropy_avg: the policy's per-token entropy on trained tokens.")
    use_vllm_logprobs: bool = arg(
        False, "Anchor the PPO ratio at the engines' sampling logprobs instead of the learner's."
    )
    use_rho_correction: bool = arg(True, "Weight each token by its truncated importance ratio; False only logs it.")
    rho_clamp_lower_bound: float = arg(0.0, "Lower clamp on the importance weight (0 disables; else < 1).")
    rho_clamp_upper_bound: float = arg(
        2.0, "Cap of the importance ratio (TIS): the same as --truncated_importance_sampling_ratio_cap; 0 disables."
    )
    rho_mask_lower_bound: float = arg(0.0, "Drop tokens whose importance ratio is below this (0 disables; else < 1).")
    rho_mask_upper_bound: float = arg(0.0, "Drop tokens whose importance ratio is above this (0 disables; else > 1).")
    rho_mask_sequence_level: bool = arg(
        False, "Mask and clamp with each sample's geometric-mean ratio instead of each token's."
    )
    rho_mask_tv_divergence: bool = arg(
        False, "VACO: mask by each sample's mean |ratio - 1| against the mask bounds, only tokens that push it further."
    )
    load_ref_policy: bool = arg(True, "Keep a frozen reference policy for the KL term; False requires --beta 0.")
    ref_policy_update_freq: int | None = arg(
        None, "Every N training steps the reference moves toward the policy by --alpha (Polyak); None keeps it fixed."
    )
    alpha: float = arg(0.6, "Polyak weight of --ref_policy_update_freq: ref <- (1 - alpha) ref + alpha policy.")


@dataclass(frozen=True)
class InfraConfig:
    _argument_group_name = "Ai2 infrastructure (open-instruct)"

    hf_entity: str | None = arg(None, "Hub user/org for --push_to_hub.", kind=BEAKER_ONLY)
    hf_repo_id: str | None = arg(None, "Hub repo for --push_to_hub.", kind=BEAKER_ONLY)
    hf_repo_revision: str | None = arg(None, "Hub branch for --push_to_hub.", kind=BEAKER_ONLY)
    hf_repo_url: str | None = arg(None, "[internal] Set when pushing.", kind=BEAKER_ONLY)
    gs_bucket_path: str | None = arg(None, "GCS bucket for state checkpoints.", kind=BEAKER_ONLY)
    gs_checkpoint_state_dir: str | None = arg(None, "GCS copy of --checkpoint_state_dir.", kind=BEAKER_ONLY)
    try_auto_save_to_beaker: bool = arg(True, "Copy --output_dir into Beaker's result dataset.", kind=BEAKER_ONLY)
    oe_eval_beaker_image: str | None = arg(None, "Image of the oe-eval jobs.", kind=BEAKER_ONLY)
    oe_eval_gpu_multiplier: int | None = arg(None, "GPU multiplier of the oe-eval jobs.", kind=BEAKER_ONLY)
    eval_priority: Literal["low", "normal", "high", "urgent"] = arg("normal", "oe-eval job priority.", kind=BEAKER_ONLY)
    eval_workspace: str = arg("ai2/tulu-3-results", "Beaker workspace of the oe-eval jobs.", kind=BEAKER_ONLY)
    send_slack_alerts: bool = arg(False, "Slack messages on crashes (needs SLACK_WEBHOOK_URL).", kind=BEAKER_ONLY)


@dataclass(frozen=True)
class TokenizerModelConfig:
    _argument_group_name = "tokenizer and model loading (open-instruct)"

    tokenizer_name: str | None = arg(None, "Alias of --tokenizer_name_or_path (which wins when both are given).")
    trust_remote_code: bool = arg(False, "Let the tokenizer run its repository's code (tokenizer only, as there).")
    use_fast: bool = arg(True, "Load the fast (Rust) tokenizer; False asks for the Python one where it exists.")
    use_slow_tokenizer: bool = arg(False, "The same as --use_fast False (open-instruct ignores it).")
    get_tokenizer_fn: str = arg(
        "get_tokenizer_tulu_v2_2",
        "Pad-token rule: simple_v1 keeps the tokenizer as loaded; tulu_v1 adds <pad> when there is none; "
        "tulu_v2_1 and tulu_v2_2 also when the pad token is EOS.",
    )
    tokenizer_files_hash: list[str] | None = arg(None, "[internal in open-instruct; ignored]")
    dtype: str | None = arg(
        None,
        "Dtype of the policy, reference and engines (float32, bfloat16, float16); default (or auto): "
        "--model_dtype on GPU, float32 on CPU.",
    )
    attn_implementation: Literal["torch", "flash_2", "flash_3", "flash_4", "te"] | None = arg(
        None, "Learner attention: torch/te = SDPA, flash_N = FlashAttention N (needs flash-attn, -3, -4); None: SDPA."
    )
    use_cache: bool | None = arg(None, "The KV cache is always off in training (accepted for compatibility).")
    use_peft: bool = pending(False, NOT_IN_GRPO_FAST.format("LoRA"))
    lora_r: int | None = arg(16, "LoRA rank (with --use_peft).")
    lora_alpha: int | None = arg(32, "LoRA alpha (with --use_peft).")
    lora_dropout: float | None = arg(0.05, "LoRA dropout (with --use_peft).")
    lora_target_modules: list[str] | None = arg(None, "LoRA target modules (with --use_peft).")
    lora_modules_to_save: list[str] | None = arg(None, "Modules trained fully (with --use_peft).")
    lora_task_type: str = arg("CAUSAL_LM", "PEFT task type (with --use_peft).")
    load_in_8bit: bool = pending(False, NOT_IN_GRPO_FAST.format("quantized training"))
    load_in_4bit: bool = pending(False, NOT_IN_GRPO_FAST.format("quantized training"))
    bnb_4bit_quant_type: str | None = arg("nf4", "bitsandbytes 4-bit type (with --load_in_4bit).")
    use_bnb_nested_quant: bool = arg(False, "bitsandbytes nested quantization (with --load_in_4bit).")


@dataclass(frozen=True)
class DataExtrasConfig:
    _argument_group_name = "data loading and cache (open-instruct)"

    system_prompt_override_file: str | None = arg(
        None, "A text file (stripped) whose text replaces or adds the system message of every prompt."
    )
    dataset_skip_cache: bool = arg(False, "Always re-tokenize and never write the dataset cache.")
    dataset_cache_mode: Literal["hf", "local"] = pending(
        "local", "the Hub dataset cache needs Hub write access (Ai2 infrastructure); the local cache works"
    )
    dataset_transform_fn: list[str] = arg(
        list(RLVR_TRANSFORMS),
        "Row transforms, in order: chat template + tokenize (with --system_prompt_override and tool schemas), "
        "then drop prompts over --max_prompt_token_length. grpo_fast accepts exactly this pair (or "
        "preference_filter_v1 second, which drops the same prompts there).",
    )
    dataset_config_hash: str | None = arg(
        None, "Reuse the training cache entries stored under this key (printed in the data report) as they are."
    )
    dataset_config_eval_hash: str | None = arg(None, "The same for the eval mix.")
    cache_dataset_only: bool = arg(
        False, "Build (and cache) the tokenized datasets, report them, and exit without training."
    )


@dataclass(frozen=True)
class EvalExtrasConfig:
    _argument_group_name = "evaluation (open-instruct)"

    eval_pass_at_k: int = arg(
        1, "Samples per eval prompt; > 1 samples at the training temperature and logs unbiased eval/pass_at_{k}."
    )
    eval_top_p: float | None = arg(
        None, "Eval top_p; given, eval samples at the training temperature instead of greedily."
    )
    eval_response_length: int | None = arg(None, "Max new tokens of eval samples (default: --response_length).")


@dataclass(frozen=True)
class RewardExtrasConfig:
    _argument_group_name = "reward shaping and verifiers (open-instruct)"

    apply_r1_style_format_reward: bool = arg(
        False, "Reward responses that close </think> and then answer in <answer>...</answer>."
    )
    r1_style_format_reward: float = arg(1.0, "The format score given on a match.")
    additive_format_reward: bool = arg(
        False, "True: format score + verifier reward. False: the verifier reward counts only when the format matches."
    )
    max_possible_score: float = arg(1.0, "[internal in open-instruct: recomputed; ignored]")
    llm_judge_model: str = arg(
        "azure/gpt-4o-mini-standard",
        "Model of the general-* judge verifiers, on the OpenAI-compatible endpoint $LLM_JUDGE_BASE_URL (or "
        "$OPENAI_BASE_URL); a 'provider/' prefix is dropped.",
    )
    llm_judge_max_tokens: int = arg(2048, "Judge completion tokens (general-* verifiers).")
    llm_judge_max_context_length: int = arg(8192, "Judge context length (general-* verifiers).")
    llm_judge_temperature: float = arg(1.0, "Judge temperature (general-* verifiers).")
    llm_judge_timeout: int = arg(60, "Judge request timeout in seconds (general-* verifiers).")
    code_apply_perf_penalty: bool = arg(
        False, "code verifiers: weight each passed test by the unused share of its time limit."
    )
    max_length_verifier_max_length: int = arg(
        32768,
        "Given explicitly: the max_length verifiers divide the length deviation by this instead of by the "
        "target (see rewards/length.py).",
    )
    apply_evolving_rubric_reward: bool = arg(
        False,
        "After each step an LLM writes new rubrics from the responses of rows graded by the `rubric` verifier; "
        "their later requests are graded with them (see evolving_rubrics.py).",
    )
    max_active_rubrics: int = arg(5, "Active evolving rubrics per query; the oldest retire first.")
    cache_evolving_rubric_data_dir: str | None = arg(None, "Write each step's rubric generation (JSON) here.")


PARITY_GROUPS = (
    LoggingConfig,
    ScheduleConfig,
    LossExtrasConfig,
    InfraConfig,
    TokenizerModelConfig,
    DataExtrasConfig,
    EvalExtrasConfig,
    RewardExtrasConfig,
)


def _marked_non_defaults(groups: list[Any], kind: str) -> list[tuple[str, Any, str]]:
    """(flag, value, reason) of every flag of `kind` whose value is not its default."""
    found = []
    for group in groups:
        for f in fields(group):
            if f.metadata.get("kind") != kind:
                continue
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            value = getattr(group, f.name)
            if value != default:
                found.append((f.name, value, f.metadata["reason"]))
    return found


def pending_problems(groups: list[Any]) -> list[str]:
    """A flag whose feature is pending and whose value is not its default: one line each."""
    return [
        f"--{name} {_show(value)}: not supported yet: {reason}"
        for name, value, reason in _marked_non_defaults(groups, PENDING)
    ]


def ignored_values(groups: list[Any]) -> list[str]:
    """Warnings for no-effect flags given a value other than their default: one line each."""
    return [
        f"--{name} {_show(value)} has no effect: {reason}"
        for name, value, reason in _marked_non_defaults(groups, NO_EFFECT)
    ]


def _show(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


# The distribution each flash kernel comes in, as transformers checks it (FA2 and FA4 share the `flash_attn`
# module, so the module alone cannot tell them apart; FA3 is `flash_attn_interface` from flash-attn-3).
FLASH_ATTENTION_PACKAGES = {"flash_2": "flash-attn", "flash_3": "flash-attn-3", "flash_4": "flash-attn-4"}


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _saving_problems(cfg) -> list[tuple[bool, str]]:
    import os

    schedule = cfg.schedule
    explicit_steps = "checkpointing_steps" in cfg.explicit_flags
    checks = [
        (cfg.logging.logging_steps >= 1, f"--logging_steps {cfg.logging.logging_steps} must be >= 1"),
        (
            not explicit_steps or schedule.checkpointing_steps >= 1,
            f"--checkpointing_steps {schedule.checkpointing_steps} must be >= 1",
        ),
        (
            schedule.ephemeral_save_interval is None or schedule.ephemeral_save_interval >= 1,
            f"--ephemeral_save_interval {schedule.ephemeral_save_interval} must be >= 1",
        ),
    ]
    for flag, folder in (("output_dir", cfg.experiment.output_dir), ("checkpoint_state_dir", state_dir(cfg))):
        # a file where a folder goes would fail only when the first thing is written, minutes in
        checks.append((not folder or not os.path.isfile(folder), f"--{flag} {folder} is a file; give a directory"))
    path = schedule.resume_from_checkpoint
    if path is not None:
        found = os.path.isfile(os.path.join(path, "latest")) or os.path.isfile(os.path.join(path, "driver.pkl"))
        checks.append((found, f"--resume_from_checkpoint {path}: no resumable state there (no 'latest' or driver.pkl)"))
    return checks


def _model_problems(cfg) -> list[tuple[bool, str]]:
    from open_instruct.data.models import TOKENIZER_FNS

    tokenizer_model, resources = cfg.tokenizer_model, cfg.resources
    attention = tokenizer_model.attn_implementation or "torch"
    checks = [
        (
            tokenizer_model.get_tokenizer_fn in TOKENIZER_FNS,
            f"--get_tokenizer_fn {tokenizer_model.get_tokenizer_fn} is not one of {', '.join(TOKENIZER_FNS)}",
        ),
        (
            tokenizer_model.dtype in (None, AUTO_DTYPE, *DTYPES),
            f"--dtype {tokenizer_model.dtype} must be one of {', '.join(DTYPES)} (or {AUTO_DTYPE})",
        ),
        (resources.model_dtype in DTYPES, f"--model_dtype {resources.model_dtype} must be one of {', '.join(DTYPES)}"),
        (
            attention not in FLASH_ATTENTION_PACKAGES or _installed(FLASH_ATTENTION_PACKAGES[attention]),
            f"--attn_implementation {attention} needs the {FLASH_ATTENTION_PACKAGES.get(attention)} package "
            "(a GPU install); use torch (SDPA)",
        ),
    ]
    learners = cfg.world_size
    for flag in ("fsdp_shard_degree", "fsdp_num_replicas"):
        degree = getattr(resources, flag)
        checks.append(
            (
                degree is None or (degree >= 1 and learners % degree == 0),
                f"--{flag} {degree} must divide the {learners} learners",
            )
        )
    if resources.fsdp_shard_degree and resources.fsdp_num_replicas:
        checks.append(
            (
                resources.fsdp_shard_degree * resources.fsdp_num_replicas == learners,
                f"--fsdp_shard_degree x --fsdp_num_replicas must equal the {learners} learners",
            )
        )
    return checks


def _data_problems(cfg):
    data_extras = cfg.data_extras
    transforms = tuple(data_extras.dataset_transform_fn)
    yield (
        len(transforms) == 2 and transforms[0] == RLVR_TRANSFORMS[0] and transforms[1] in RLVR_FILTERS,
        f"--dataset_transform_fn {' '.join(transforms)}: grpo_fast runs exactly {' '.join(RLVR_TRANSFORMS)} "
        "(tokenize, then the prompt-length filter); SFT and preference transforms do not make RL prompts",
    )
    forced = [flag for flag in ("dataset_config_hash", "dataset_config_eval_hash") if getattr(data_extras, flag)]
    no_cache = data_extras.dataset_skip_cache or not cfg.data.dataset_local_cache_dir
    yield (
        not (forced and no_cache),
        f"--{forced[0] if forced else ''} reuses a cache entry, but the cache is off (--dataset_skip_cache or an "
        "empty --dataset_local_cache_dir)",
    )


def parity_problems(cfg) -> list[str]:
    """Contradictions among these flags (and with the core ones), each naming the flags and the fix."""
    import os

    loss_extras = cfg.loss_extras
    checks = [
        (
            loss_extras.load_ref_policy or cfg.algorithm.beta == 0,
            f"--load_ref_policy False leaves the KL term (--beta {cfg.algorithm.beta}) without a reference; "
            "pass --beta 0 or drop --load_ref_policy False",
        ),
        (0 <= loss_extras.alpha <= 1, f"--alpha {loss_extras.alpha} must be in [0, 1]"),
        (
            loss_extras.ref_policy_update_freq is None or loss_extras.ref_policy_update_freq >= 1,
            f"--ref_policy_update_freq {loss_extras.ref_policy_update_freq} must be >= 1",
        ),
        (
            not cfg.logging.save_traces or bool(cfg.logging.rollouts_save_path),
            "--save_traces needs a --rollouts_save_path",
        ),
        (0 <= cfg.schedule.warmup_ratio < 1, f"--warmup_ratio {cfg.schedule.warmup_ratio} must be in [0, 1)"),
        (
            cfg.schedule.max_train_steps is None or cfg.schedule.max_train_steps >= 1,
            f"--max_train_steps {cfg.schedule.max_train_steps} must be >= 1",
        ),
        *_reward_and_eval_checks(cfg),
        *_rho_checks(cfg),
        *_saving_problems(cfg),
        *_model_problems(cfg),
        *_data_problems(cfg),
    ]
    path = cfg.data_extras.system_prompt_override_file
    if path is not None:
        checks += [
            (os.path.isfile(path), f"--system_prompt_override_file {path}: no such file"),
            (
                cfg.model.system_prompt_override is None,
                "--system_prompt_override and --system_prompt_override_file both set the system prompt; give one",
            ),
        ]
    return [message for ok, message in checks if not ok]


def _reward_and_eval_checks(cfg) -> list[tuple[bool, str]]:
    import os

    eval_extras = cfg.eval_extras
    return [
        (eval_extras.eval_pass_at_k >= 1, f"--eval_pass_at_k {eval_extras.eval_pass_at_k} must be >= 1"),
        (
            cfg.reward_extras.max_active_rubrics >= 1,
            f"--max_active_rubrics {cfg.reward_extras.max_active_rubrics} must be >= 1",
        ),
        (
            not cfg.reward_extras.apply_evolving_rubric_reward
            or bool(os.environ.get("LLM_JUDGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")),
            "--apply_evolving_rubric_reward needs an OpenAI-compatible endpoint for the rubric writer: set "
            "LLM_JUDGE_BASE_URL (or OPENAI_BASE_URL)",
        ),
        (
            cfg.reward_extras.max_length_verifier_max_length >= 1,
            f"--max_length_verifier_max_length {cfg.reward_extras.max_length_verifier_max_length} must be >= 1",
        ),
        (
            eval_extras.eval_top_p is None or 0 < eval_extras.eval_top_p <= 1,
            f"--eval_top_p {eval_extras.eval_top_p} must be in (0, 1]",
        ),
        (
            eval_extras.eval_response_length is None or eval_extras.eval_response_length >= 1,
            f"--eval_response_length {eval_extras.eval_response_length} must be >= 1",
        ),
    ]


def _rho_checks(cfg) -> list[tuple[bool, str]]:
    """open-instruct's bounds on the --rho_* values (0 disables each), and the one cap given once."""
    loss_extras = cfg.loss_extras
    return [
        (
            loss_extras.rho_clamp_upper_bound == 0 or loss_extras.rho_clamp_upper_bound > 1,
            f"--rho_clamp_upper_bound {loss_extras.rho_clamp_upper_bound} must be 0 (off) or > 1",
        ),
        (
            loss_extras.rho_clamp_upper_bound == 2.0
            or cfg.algorithm.truncated_importance_sampling_ratio_cap in (2.0, loss_extras.rho_clamp_upper_bound),
            "--rho_clamp_upper_bound and --truncated_importance_sampling_ratio_cap are the same cap; give one",
        ),
        (
            loss_extras.rho_clamp_lower_bound == 0 or 0 < loss_extras.rho_clamp_lower_bound < 1,
            f"--rho_clamp_lower_bound {loss_extras.rho_clamp_lower_bound} must be 0 (off) or in (0, 1)",
        ),
        (
            loss_extras.rho_mask_lower_bound == 0 or 0 < loss_extras.rho_mask_lower_bound < 1,
            f"--rho_mask_lower_bound {loss_extras.rho_mask_lower_bound} must be 0 (off) or in (0, 1)",
        ),
        (
            loss_extras.rho_mask_upper_bound == 0 or loss_extras.rho_mask_upper_bound > 1,
            f"--rho_mask_upper_bound {loss_extras.rho_mask_upper_bound} must be 0 (off) or > 1",
        ),
    ]
