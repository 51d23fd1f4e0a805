"""The learners: optimizer and schedule, micro-batches, DeepSpeed, placement beside the engines, and the weight
transport to the engines."""

from __future__ import annotations

from dataclasses import dataclass

from open_instruct.config.fields import arg

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

# --single_gpu_mode on a GPU: the engines start first and take their share, the learner gets what is left and needs
# several times the engine's memory (weights, gradients, fp32 AdamW state, activations). open-instruct's own
# single-GPU scripts pass 0.3 or 0.4.
SHARED_GPU_DEFAULT_SHARE = 0.3  # when --vllm_gpu_memory_utilization is not given
SHARED_GPU_MAX_SHARE = 0.6  # an explicit value above this leaves the learner under 40% of the device


@dataclass(frozen=True)
class LearnerConfig:
    _argument_group_name = "learners: optimizer, DeepSpeed, placement, weight transport"

    gradient_checkpointing: bool = arg(False, "Recompute activations in the backward pass to save memory.")
    num_learners_per_node: list[int] = arg([1], "Learner processes per node, one entry per node (e.g. 8 8).")
    deepspeed_stage: int = arg(0, "ZeRO stage: 0, 1, 2 or 3.")
    per_device_train_batch_size: int = arg(1, "Packed rows per forward pass on each learner.", bounds=">= 1")
    learning_rate: float = arg(2e-5, "Peak learning rate.", bounds=">= 0")
    lr_scheduler_type: str = arg(
        "linear",
        "Learning-rate schedule, by its transformers name (get_scheduler): " + ", ".join(LR_SCHEDULERS) + ".",
    )
    warm_up_steps: int = arg(
        0, "Warm-up in optimizer steps (num_epochs x num_mini_batches per training step).", bounds=">= 0"
    )
    weight_decay: float = arg(0.0, "AdamW weight decay.", bounds=">= 0")
    max_grad_norm: float = arg(1.0, "Gradient clipping norm.")
    pack_length: int = arg(512, "Tokens per packed training row; must fit prompt + response.")
    warmup_ratio: float = arg(
        0.0, "Warm-up as a fraction of all optimizer steps (used when --warm_up_steps is 0).", bounds="[0, 1)"
    )
    single_gpu_mode: bool = arg(
        False,
        "Each engine shares one learner's device. On a GPU the engine starts first and takes "
        f"--vllm_gpu_memory_utilization of it (default {SHARED_GPU_DEFAULT_SHARE} here, at most "
        f"{SHARED_GPU_MAX_SHARE}), the learner the rest; weights move by CUDA IPC handles (no group: NCCL refuses "
        "two ranks on one GPU). On CPU the node's cores split between them and weights move through a "
        "shared-memory file. --vllm_sync_backend gloo moves them over a gloo group instead. Needs "
        "--vllm_tensor_parallel_size 1 and no more engines than learners.",
    )
    sequence_parallel_size: int = arg(
        1,
        "Ulysses sequence parallelism (DeepSpeed, ZeRO-3): groups of this many consecutive learner ranks train "
        "the same rows, each on a slice of every row, so a row may be longer than one rank's memory allows.",
        bounds=">= 1",
    )
    deepspeed_zpg: int = arg(
        8, "ZeRO++ secondary partition size (ZeRO-3, when it splits the ranks into groups).", bounds=">= 1"
    )
    deepspeed_offload_param: bool = arg(False, "ZeRO-3: keep parameters in CPU memory between uses.")
    deepspeed_offload_optimizer: bool = arg(False, "ZeRO-1/2/3: keep optimizer state in CPU memory.")
    deepspeed_checkpoint_load_universal: bool = arg(
        False,
        "Resume from the universal copy of the learner state (built once by DeepSpeed's ds_to_universal), so a "
        "run may resume on a different number of learner ranks. Needs --deepspeed_stage 1, 2 or 3.",
    )
    gather_whole_model: bool = arg(
        False,
        "ZeRO-3 weight sync gathers every shard at once (faster; a whole model of extra memory on every rank); "
        "False: one parameter at a time (extra memory: one parameter and one bucket).",
    )
    backend_timeout: int = arg(
        120, "Minutes a learner collective may wait for another rank before failing.", bounds=">= 1"
    )
    fused_optimizer: bool = arg(True, "torch's fused AdamW (one kernel per step) instead of the per-tensor one.")
    vllm_sync_backend: str = arg(
        "nccl",
        "Weight transport learner -> engines: nccl (on GPUs; gloo where there is no CUDA) or gloo. With "
        "--single_gpu_mode weights pass without a group (CUDA IPC on the shared GPU, a shared-memory file on a "
        "CPU node) unless this says gloo.",
    )
    set_weight_decay_on_bias_and_norm: bool = arg(
        True,
        "True: --weight_decay for all parameters but biases and norms (which get none). False: --weight_decay "
        "for every parameter.",
    )
    micro_batch_token_budget: int | None = arg(
        None,
        "Token budget of one learner micro-batch: documents are packed into rows of at most this many tokens "
        "(no padding to --pack_length), one row per micro-batch, spread over ranks by estimated compute. "
        "Default: --pack_length when --per_device_train_batch_size is 1 (the same micro-batches without the "
        "padding, balanced by cost; the loss is the same exact token mean), else 0. "
        "0: --per_device_train_batch_size rows of --pack_length.",
    )

    @property
    def world_size(self) -> int:
        return sum(self.num_learners_per_node)

    @property
    def token_budget(self) -> int:
        """--micro_batch_token_budget as the learner uses it (0: fixed rows); see its help for the default."""
        if self.micro_batch_token_budget is not None:
            return self.micro_batch_token_budget
        return self.pack_length if self.per_device_train_batch_size == 1 else 0

    def problems(self) -> list[str]:
        budget, stage = self.micro_batch_token_budget or 0, self.deepspeed_stage
        checks = [
            (stage in (0, 1, 2, 3), f"--deepspeed_stage {stage} must be 0, 1, 2 or 3"),
            _lr_scheduler_check(self.lr_scheduler_type),
            (
                bool(self.num_learners_per_node) and all(n >= 1 for n in self.num_learners_per_node),
                "--num_learners_per_node needs one positive count per node, e.g. '8 8'",
            ),
            (
                self.vllm_sync_backend in ("nccl", "gloo"),
                f"--vllm_sync_backend {self.vllm_sync_backend} must be nccl or gloo",
            ),
            (
                not self.deepspeed_offload_param or stage == 3,
                "--deepspeed_offload_param needs --deepspeed_stage 3 (only ZeRO-3 partitions parameters)",
            ),
            (
                not self.deepspeed_checkpoint_load_universal or stage >= 1,
                "--deepspeed_checkpoint_load_universal needs --deepspeed_stage 1, 2 or 3 (DeepSpeed loads universal "
                "checkpoints into its ZeRO optimizers only)",
            ),
            (
                not self.deepspeed_offload_optimizer or stage >= 1,
                "--deepspeed_offload_optimizer needs --deepspeed_stage 1, 2 or 3",
            ),
            (
                budget >= self.pack_length or budget == 0,
                f"--micro_batch_token_budget {budget} must be 0 (off) or at least --pack_length {self.pack_length}, "
                "so that every sample fits one micro-batch",
            ),
        ]
        return [message for ok, message in checks if not ok] + self._sequence_parallel_problems()

    def _sequence_parallel_problems(self) -> list[str]:
        size = self.sequence_parallel_size
        if size <= 1:  # below 1 is out of its bounds
            return []
        flag = f"--sequence_parallel_size {size}"
        checks = [
            (self.deepspeed_stage == 3, f"{flag} needs --deepspeed_stage 3 (DeepSpeed's Ulysses runs with ZeRO-3)"),
            (
                self.world_size % size == 0,
                f"{flag} must divide the {self.world_size} learner ranks of --num_learners_per_node",
            ),
            (
                self.token_budget > 0,
                f"{flag} trains one row per micro-batch: leave --per_device_train_batch_size 1 and "
                "--micro_batch_token_budget unset (or > 0)",
            ),
        ]
        return [message for ok, message in checks if not ok]


def _lr_scheduler_check(name: str) -> tuple[bool, str]:
    if name in LR_SCHEDULERS_UNRUNNABLE:
        return (
            False,
            f"--lr_scheduler_type {name} {LR_SCHEDULERS_UNRUNNABLE[name]} (use one of {', '.join(LR_SCHEDULERS)})",
        )
    return name in LR_SCHEDULERS, f"--lr_scheduler_type {name!r} is not one of {', '.join(LR_SCHEDULERS)}"


def shared_mode_problems(single_gpu_mode: bool, num_engines: int, tensor_parallel_size: int, world_size: int) -> list:
    """What --single_gpu_mode cannot do, whatever the cluster (checked when the flags are parsed, and by the
    placement, which may be handed other values)."""
    if not single_gpu_mode:
        return []
    problems = []
    if tensor_parallel_size != 1:
        problems.append(
            f"--single_gpu_mode needs --vllm_tensor_parallel_size 1 (got {tensor_parallel_size}): "
            "each engine shares one learner's device"
        )
    if num_engines > world_size:
        problems.append(
            f"--single_gpu_mode shares each learner's device with at most one engine: --vllm_num_engines "
            f"{num_engines} > {world_size} learners"
        )
    return problems
