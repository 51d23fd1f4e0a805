"""Learner and resource flags: open-instruct's (placement, DeepSpeed, optimizer, weight transport) and ours
for learner speed (token-budget micro-batches).

Kept apart from `config.parity` because these steer the learners and the placement, not the data or the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from open_instruct.config.fields import arg
from open_instruct.config.parity import no_effect
from open_instruct.placement import shared_mode_problems

# --lr_scheduler_type names that transformers' get_scheduler builds from the warm-up and the run length
# alone, as open-instruct calls it; the learner hands the name to it (learner.make_scheduler).
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)
# transformers names that open-instruct's call cannot run either, and why (refused here before any actor starts).
LR_SCHEDULERS_UNRUNNABLE = {
    "cosine_with_min_lr": "needs min_lr or min_lr_rate, which no flag passes",
    "cosine_warmup_with_min_lr": "needs min_lr or min_lr_rate, which no flag passes",
    "warmup_stable_decay": "needs num_decay_steps, which no flag passes",
    "reduce_lr_on_plateau": "steps on a metric; the optimizer steps it without one",
    "greedy": "steps on a metric; the optimizer steps it without one",
}


LEARNER_ISSUE = "learner and resource flags land with the learner-speed work"

# --single_gpu_mode on a GPU: the engines start first and take their share, the learner gets what is left and needs
# several times the engine's memory (weights, gradients, fp32 AdamW state, activations). open-instruct's own
# single-GPU scripts pass 0.3 or 0.4.
SHARED_GPU_DEFAULT_SHARE = 0.3  # when --vllm_gpu_memory_utilization is not given
SHARED_GPU_MAX_SHARE = 0.6  # an explicit value above this leaves the learner under 40% of the device


@dataclass(frozen=True)
class ResourceConfig:
    _argument_group_name = "resources, DeepSpeed and optimizer (open-instruct)"

    single_gpu_mode: bool = arg(
        False,
        "Each engine shares one learner's device. On a GPU the engine starts first and takes "
        f"--vllm_gpu_memory_utilization of it (default {SHARED_GPU_DEFAULT_SHARE} here, at most "
        f"{SHARED_GPU_MAX_SHARE}), the learner the rest; weights move by CUDA IPC handles (no group: NCCL refuses "
        "two ranks on one GPU). On CPU the node's cores split between them and weights move through a "
        "shared-memory file. --vllm_sync_backend gloo moves them over a gloo group instead. Needs "
        "--vllm_tensor_parallel_size 1 and no more engines than learners.",
    )
    max_engine_restarts: int = arg(
        3,
        "Generation engines that die (process killed, engine error) are replaced this many times in a run: "
        "their unfinished samples go back to the queue and the new engine gets the current weights. 0: a dead "
        "engine ends the run.",
    )
    partial_report_tokens: int = arg(
        256,
        "Every this many new tokens a running sample's tokens and logprobs go to the driver, so that a sample "
        "whose engine dies continues on another engine from there (one re-prefill) instead of starting over; "
        "samples running when the run stops are saved whole in the resume state. 0: dead engines' samples restart.",
    )
    engine_hang_timeout_s: float = arg(
        300.0,
        "An engine that neither answers nor produces a token for this long while it has samples running is "
        "taken for hung: killed and replaced like a dead one (within --max_engine_restarts). 0: never.",
    )
    num_nodes: int = arg(1, "Informational (open-instruct prints it); nodes come from --num_learners_per_node.")
    sequence_parallel_size: int = arg(
        1,
        "Ulysses sequence parallelism (DeepSpeed, ZeRO-3): groups of this many consecutive learner ranks train "
        "the same rows, each on a slice of every row, so a row may be longer than one rank's memory allows.",
    )
    deepspeed_zpg: int = arg(8, "ZeRO++ secondary partition size (ZeRO-3, when it splits the ranks into groups).")
    deepspeed_offload_param: bool = arg(False, "ZeRO-3: keep parameters in CPU memory between uses.")
    deepspeed_offload_optimizer: bool = arg(False, "ZeRO-1/2/3: keep optimizer state in CPU memory.")
    deepspeed_checkpoint_load_universal: bool = arg(
        False,
        "Resume from the universal copy of the learner state (built once by DeepSpeed's ds_to_universal), so a "
        "run may resume on a different number of learner ranks. Needs --deepspeed_stage 1, 2 or 3.",
    )
    gather_whole_model: bool = arg(
        True, "ZeRO-3 weight sync gathers every shard at once (fast); False: one parameter at a time (less memory)."
    )
    backend_timeout: int = arg(120, "Minutes a learner collective may wait for another rank before failing.")
    fused_optimizer: bool = arg(True, "torch's fused AdamW (one kernel per step) instead of the per-tensor one.")
    vllm_sync_backend: str = arg(
        "nccl",
        "Weight transport learner -> engines: nccl (on GPUs; gloo where there is no CUDA) or gloo. With "
        "--single_gpu_mode weights pass without a group (CUDA IPC on the shared GPU, a shared-memory file on a "
        "CPU node) unless this says gloo.",
    )
    vllm_attention_backend: str | None = arg(None, "vLLM attention backend of the engines; None lets vLLM choose.")
    model_dtype: str = arg("bfloat16", "Dtype of the policy, reference and engines on GPU (see --dtype).")
    gradient_accumulation_steps: int = no_effect(1, "gradients accumulate over every micro-batch of a mini-batch")
    max_seq_length: int = no_effect(4096, "lengths come from --max_prompt_token_length and --response_length")
    set_weight_decay_on_bias_and_norm: bool = arg(
        True,
        "True: --weight_decay for all parameters but biases and norms (which get none). False: --weight_decay "
        "for every parameter.",
    )
    fsdp_shard_degree: int | None = no_effect(None, "OLMo-core FSDP; still must divide the learner count")
    fsdp_num_replicas: int | None = no_effect(None, "OLMo-core FSDP; still must divide the learner count")
    compile_model: bool = no_effect(True, "OLMo-core only")
    activation_memory_budget: float = no_effect(1.0, "OLMo-core only")
    activation_checkpointing_mode: Literal["budget", "selected_modules"] = no_effect("budget", "OLMo-core only")
    activation_checkpointing_modules: list[str] = no_effect(
        [
            "blocks.*.attention_norm",
            "blocks.*.attention",
            "blocks.*.attention_residual_stream",
            "blocks.*.feed_forward_norm",
            "blocks.*.feed_forward",
            "blocks.*.feed_forward_residual_stream",
        ],
        "OLMo-core only",
    )
    cp_degree: int | None = no_effect(None, "OLMo-core context parallelism; see --sequence_parallel_size")
    cp_strategy: Literal["llama3", "zig_zag", "ulysses"] = no_effect("llama3", "OLMo-core only")
    micro_batch_token_budget: int | None = arg(
        None,
        "Token budget of one learner micro-batch: documents are packed into rows of at most this many tokens "
        "(no padding to --pack_length), one row per micro-batch, spread over ranks by estimated compute. "
        "Default: --pack_length when --per_device_train_batch_size is 1 (the same micro-batches without the "
        "padding, balanced by cost; the loss is the same exact token mean), else 0. "
        "0: --per_device_train_batch_size rows of --pack_length.",
    )
    enable_queue_dashboard: bool = arg(True, "open-instruct's FastAPI queue dashboard; here metrics.jsonl and W&B.")
    queue_dashboard_port: int | None = arg(None, "Port of that dashboard (unused here).")


def micro_batch_token_budget(cfg) -> int:
    """--micro_batch_token_budget as the learner uses it (0: fixed rows); see its help for the default."""
    budget = cfg.resources.micro_batch_token_budget
    if budget is not None:
        return budget
    return cfg.learner.pack_length if cfg.learner.per_device_train_batch_size == 1 else 0


def engine_gpu_share(cfg) -> float:
    """The fraction of its GPU each engine may use: --vllm_gpu_memory_utilization, or with --single_gpu_mode
    and the flag not given, SHARED_GPU_DEFAULT_SHARE (the flag's default 0.9 would starve the learner)."""
    if cfg.resources.single_gpu_mode and "vllm_gpu_memory_utilization" not in cfg.explicit_flags:
        return SHARED_GPU_DEFAULT_SHARE
    return cfg.generation.vllm_gpu_memory_utilization


def shared_gpu_share_problems(cfg) -> list[str]:
    share = cfg.generation.vllm_gpu_memory_utilization
    if not cfg.resources.single_gpu_mode or "vllm_gpu_memory_utilization" not in cfg.explicit_flags:
        return []
    if share <= SHARED_GPU_MAX_SHARE:
        return []
    return [
        f"--vllm_gpu_memory_utilization {share} with --single_gpu_mode leaves the learner {1 - share:.0%} of the "
        f"shared GPU, less than its weights, gradients and optimizer state need: give at most "
        f"{SHARED_GPU_MAX_SHARE} (unset: {SHARED_GPU_DEFAULT_SHARE})"
    ]


def resource_problems(cfg) -> list[str]:
    """Contradictions of the learner and resource flags, each naming the flag and the fix."""
    budget, pack_length = cfg.resources.micro_batch_token_budget or 0, cfg.learner.pack_length
    resources = cfg.resources
    checks = [
        (
            resources.vllm_sync_backend in ("nccl", "gloo"),
            f"--vllm_sync_backend {resources.vllm_sync_backend} must be nccl or gloo",
        ),
        (resources.max_engine_restarts >= 0, f"--max_engine_restarts {resources.max_engine_restarts} must be >= 0"),
        (
            resources.partial_report_tokens >= 0,
            f"--partial_report_tokens {resources.partial_report_tokens} must be >= 0",
        ),
        (
            resources.engine_hang_timeout_s >= 0,
            f"--engine_hang_timeout_s {resources.engine_hang_timeout_s} must be >= 0 (0: off)",
        ),
        (resources.backend_timeout >= 1, f"--backend_timeout {resources.backend_timeout} must be >= 1 (minutes)"),
        (resources.deepspeed_zpg >= 1, f"--deepspeed_zpg {resources.deepspeed_zpg} must be >= 1"),
        (
            not resources.deepspeed_offload_param or cfg.learner.deepspeed_stage == 3,
            "--deepspeed_offload_param needs --deepspeed_stage 3 (only ZeRO-3 partitions parameters)",
        ),
        (
            not resources.deepspeed_checkpoint_load_universal or cfg.learner.deepspeed_stage >= 1,
            "--deepspeed_checkpoint_load_universal needs --deepspeed_stage 1, 2 or 3 (DeepSpeed loads universal "
            "checkpoints into its ZeRO optimizers only)",
        ),
        (
            not resources.deepspeed_offload_optimizer or cfg.learner.deepspeed_stage >= 1,
            "--deepspeed_offload_optimizer needs --deepspeed_stage 1, 2 or 3",
        ),
        (
            budget >= pack_length or budget == 0,
            f"--micro_batch_token_budget {budget} must be 0 (off) or at least --pack_length {pack_length}, "
            "so that every sample fits one micro-batch",
        ),
    ]
    shared = shared_mode_problems(
        resources.single_gpu_mode,
        cfg.generation.vllm_num_engines,
        cfg.generation.vllm_tensor_parallel_size,
        cfg.world_size,
    )
    shared += shared_gpu_share_problems(cfg)
    return [message for ok, message in checks if not ok] + sequence_parallel_problems(cfg) + shared


def sequence_parallel_problems(cfg) -> list[str]:
    size = cfg.resources.sequence_parallel_size
    if size == 1:
        return []
    if size < 1:
        return [f"--sequence_parallel_size {size} must be >= 1"]
    flag = f"--sequence_parallel_size {size}"
    checks = [
        (cfg.learner.deepspeed_stage == 3, f"{flag} needs --deepspeed_stage 3 (DeepSpeed's Ulysses runs with ZeRO-3)"),
        (
            cfg.world_size % size == 0,
            f"{flag} must divide the {cfg.world_size} learner ranks of --num_learners_per_node",
        ),
        (
            micro_batch_token_budget(cfg) > 0,
            f"{flag} trains one row per micro-batch: leave --per_device_train_batch_size 1 and "
            "--micro_batch_token_budget unset (or > 0)",
        ),
        (
            cfg.algorithm.importance_sampling_mode != "mask_sequence",
            f"{flag} scores each rank's slice of a sample; --importance_sampling_mode mask_sequence needs the whole "
            "sample on one rank (use truncate or mask_token)",
        ),
    ]
    return [message for ok, message in checks if not ok]


def lr_scheduler_check(name: str) -> tuple[bool, str]:
    if name in LR_SCHEDULERS_UNRUNNABLE:
        return (
            False,
            f"--lr_scheduler_type {name} {LR_SCHEDULERS_UNRUNNABLE[name]} (use one of {', '.join(LR_SCHEDULERS)})",
        )
    return name in LR_SCHEDULERS, f"--lr_scheduler_type {name!r} is not one of {', '.join(LR_SCHEDULERS)}"
