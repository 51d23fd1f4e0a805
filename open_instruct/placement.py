"""Where engines and learners go, and how weights travel between them: decided once, on the driver.

Pure functions over a description of the cluster, so every shape (CPU box, one shared GPU,
several 8-GPU nodes) is tested without the hardware. `cluster.py` turns a `Placement` into Ray
placement groups and passes `transport` down to the engines and the learners: the engines never
pick a backend from their own `torch.cuda.is_available()`, which on a CPU-only head node would
disagree with theirs and hang the first sync.
"""

from __future__ import annotations

from dataclasses import dataclass

from open_instruct.config.fields import ConfigError
from open_instruct.config.learner import shared_mode_problems


class PlacementError(ConfigError):
    """The requested engines and learners cannot be placed on this cluster; says what to change."""


@dataclass(frozen=True)
class ClusterShape:
    """What the Ray cluster offers: GPUs per alive node, and the core ids this (the driver's) node lets
    processes run on, which a shared CPU node splits (Ray's logical CPU count is raised to fit actors
    and says nothing about the real cores)."""

    gpus_per_node: tuple[int, ...]
    node_cores: tuple[int, ...] = (0,)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)


@dataclass(frozen=True)
class Placement:
    # The weight-transfer backend of every engine and learner: "nccl" | "gloo" over a transfer group, or, for
    # engines sharing the learners' machine or GPU, "shm" (CPU) | "ipc" (GPU): no group at all.
    transport: str
    gpus_per_engine: float
    gpus_per_learner: float
    # One placement group per entry of --num_learners_per_node, each STRICT_PACK: a node's learners
    # stay on that node, so DeepSpeed's intra-node collectives never cross the network.
    learner_groups: tuple[int, ...]
    # Shared device: engine i runs inside learner i's bundle (a GPU, or a slice of the cores).
    engines_in_learner_bundles: bool = False
    # vLLM aborts start-up if another process frees GPU memory while it profiles: on a shared
    # GPU the learners start only after the engines are up.
    engines_start_first: bool = False
    engine_cores: tuple[int, ...] = ()  # CPU single-device mode: cores the engine's OpenMP threads bind to
    learner_cores: tuple[int, ...] = ()

    @property
    def engine_placement_group(self) -> bool:
        """Engines reserve their own PACK group (after the learners'): only with whole GPUs to reserve."""
        return self.gpus_per_engine >= 1


def split_cores(cores: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Engine and learner halves of one node's cores; the engine gets the odd one (decoding the
    long tail is the part a learner waits on)."""
    cores = tuple(sorted(cores))
    if len(cores) < 2:
        return cores, cores
    engine = (len(cores) + 1) // 2
    return cores[:engine], cores[engine:]


def plan_placement(
    shape: ClusterShape,
    num_engines: int,
    tensor_parallel_size: int,
    num_learners_per_node: tuple[int, ...] | list[int],
    single_gpu_mode: bool = False,
    sync_backend: str = "nccl",
) -> Placement:
    """The placement and the one transport for this run, or a `PlacementError` naming the fix.

    `sync_backend` is --vllm_sync_backend. nccl needs every rank on its own GPU: on a CPU cluster
    it means gloo (open-instruct's default is nccl, so scripts pass it everywhere). With
    --single_gpu_mode weights need no group, as in open-instruct: CUDA IPC on a shared GPU (NCCL
    refuses two ranks on one device anyway), a shared-memory file on a CPU node whose learners all
    sit on one machine. An explicit `--vllm_sync_backend gloo` keeps the gloo group there.
    """
    learner_groups = tuple(int(n) for n in num_learners_per_node)
    world_size = sum(learner_groups)
    for problem in shared_mode_problems(single_gpu_mode, num_engines, tensor_parallel_size, world_size):
        raise PlacementError(problem)
    if shape.total_gpus == 0:
        engine_cores, learner_cores = split_cores(shape.node_cores)
        one_machine = len(learner_groups) == 1  # one STRICT_PACK group: every learner and engine on one node
        shared = single_gpu_mode and one_machine and sync_backend != "gloo"
        return Placement(
            transport="shm" if shared else "gloo",
            gpus_per_engine=0,
            gpus_per_learner=0,
            learner_groups=learner_groups,
            engines_in_learner_bundles=single_gpu_mode,
            engine_cores=engine_cores if single_gpu_mode else (),
            learner_cores=learner_cores if single_gpu_mode else (),
        )
    _check_gpu_capacity(shape, num_engines, tensor_parallel_size, learner_groups, single_gpu_mode)
    if single_gpu_mode:
        return Placement(
            transport="gloo" if sync_backend == "gloo" else "ipc",  # each engine maps its own GPU's learner
            gpus_per_engine=0.5,
            gpus_per_learner=0.5,
            learner_groups=learner_groups,
            engines_in_learner_bundles=True,
            engines_start_first=True,
        )
    return Placement(
        transport=sync_backend if sync_backend in ("nccl", "gloo") else "nccl",
        gpus_per_engine=tensor_parallel_size,
        gpus_per_learner=1,
        learner_groups=learner_groups,
    )


def _check_gpu_capacity(
    shape: ClusterShape, num_engines: int, tp: int, learner_groups: tuple[int, ...], single_gpu_mode: bool
) -> None:
    largest_node = max(shape.gpus_per_node)
    world_size = sum(learner_groups)
    for node, count in enumerate(learner_groups):
        if count > largest_node:
            raise PlacementError(
                f"--num_learners_per_node asks for {count} learners on node {node}, but the largest node has "
                f"{largest_node} GPUs (a node's learners are packed onto one node)"
            )
    if single_gpu_mode:
        if world_size > shape.total_gpus:
            raise PlacementError(f"{world_size} learners need {world_size} GPUs; the cluster has {shape.total_gpus}")
        return
    needed = num_engines * tp + world_size
    if needed > shape.total_gpus:
        hint = (
            "; or pass --single_gpu_mode to run each engine on a learner's GPU"
            if tp == 1 and num_engines <= world_size
            else ""
        )
        raise PlacementError(
            f"the run needs {needed} GPUs ({num_engines} engines x tp {tp} + {world_size} "
            f"learners) but the Ray cluster has {shape.total_gpus}: lower --vllm_num_engines or "
            f"--num_learners_per_node{hint}"
        )
    if tp > largest_node:
        raise PlacementError(f"--vllm_tensor_parallel_size {tp} is more GPUs than any node has ({largest_node})")


def learner_bundles(placement: Placement) -> list[list[dict[str, float]]]:
    """Ray bundles of each learner placement group: one per rank, with room for its engine when shared."""
    gpu = 1 if placement.gpus_per_learner else 0
    cpus = 2 if placement.engines_in_learner_bundles else 1
    bundle = {"CPU": cpus, "GPU": gpu} if gpu else {"CPU": cpus}
    return [[dict(bundle) for _ in range(count)] for count in placement.learner_groups]


def engine_bundles(placement: Placement, num_engines: int) -> list[dict[str, float]]:
    """One bundle per engine (all its tensor-parallel GPUs on one node), for the engines' own group.

    The engine actor holds the whole bundle and vLLM's multiprocessing workers use its GPUs inside it
    (`engine_setup.executor_backend`: vLLM's Ray executor refuses a bundle with more than one GPU)."""
    return [{"CPU": 1, "GPU": placement.gpus_per_engine} for _ in range(num_engines)]


def rank_bundle(learner_groups: tuple[int, ...], rank: int) -> tuple[int, int]:
    """(placement group index, bundle index) of a global learner rank: ranks fill the groups in order."""
    for group, count in enumerate(learner_groups):
        if rank < count:
            return group, rank
        rank -= count
    raise IndexError(f"rank beyond the {sum(learner_groups)} learners")
