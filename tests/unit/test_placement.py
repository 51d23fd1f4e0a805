"""Placement and the one transport decision, as pure functions over cluster shapes (no GPU needed). A real
--single_gpu_mode run on a CPU node is in tests/nightly/test_single_gpu_mode_run.py."""

from __future__ import annotations

import dataclasses
import os

import pytest

from open_instruct.placement import (
    ClusterShape,
    PlacementError,
    engine_bundles,
    learner_bundles,
    plan_placement,
    rank_bundle,
    split_cores,
)

CPU_BOX = ClusterShape(gpus_per_node=(0,), node_cores=(0, 1))
ONE_GPU = ClusterShape(gpus_per_node=(1,), node_cores=tuple(range(16)))
TWO_8GPU_NODES = ClusterShape(gpus_per_node=(8, 8), node_cores=tuple(range(128)))


def test_cpu_cluster_uses_gloo_whatever_the_flag_says():
    # open-instruct's default --vllm_sync_backend is nccl, so scripts pass it on every machine.
    for backend in ("nccl", "gloo"):
        placement = plan_placement(CPU_BOX, 2, 1, [2], sync_backend=backend)
        assert placement.transport == "gloo"
        assert (placement.gpus_per_engine, placement.gpus_per_learner) == (0, 0)
        assert not placement.engine_placement_group and not placement.engines_start_first
    assert learner_bundles(plan_placement(CPU_BOX, 2, 1, [2])) == [[{"CPU": 1}, {"CPU": 1}]]


def test_single_gpu_mode_on_cpu_splits_one_nodes_cores():
    placement = plan_placement(CPU_BOX, 1, 1, [1], single_gpu_mode=True)
    assert placement.transport == "shm"  # one machine: a shared-memory file, no group
    assert placement.engines_in_learner_bundles
    assert (placement.engine_cores, placement.learner_cores) == ((0,), (1,))
    assert learner_bundles(placement) == [[{"CPU": 2}]]  # room for the learner and its engine
    assert split_cores(tuple(range(16))) == (tuple(range(8)), tuple(range(8, 16)))
    assert split_cores((9, 3, 5, 4, 7)) == ((3, 4, 5), (7, 9))  # real core ids; the engine gets the odd one
    assert split_cores((6,)) == ((6,), (6,))


def test_single_gpu_mode_passes_weights_without_a_group_where_it_can():
    # open-instruct's meaning: CUDA IPC on the shared GPU (NCCL refuses two ranks on one GPU anyway) ...
    assert plan_placement(ONE_GPU, 1, 1, [1], single_gpu_mode=True, sync_backend="nccl").transport == "ipc"
    assert plan_placement(ClusterShape((2, 2)), 2, 1, [1, 1], single_gpu_mode=True).transport == "ipc"
    # ... and its CPU counterpart, a shared-memory file, when every learner (with its engine) is on one node.
    assert plan_placement(ClusterShape((0,), tuple(range(8))), 2, 1, [2], single_gpu_mode=True).transport == "shm"
    assert plan_placement(ClusterShape((0, 0)), 2, 1, [1, 1], single_gpu_mode=True).transport == "gloo"
    # An explicit --vllm_sync_backend gloo keeps the gloo group.
    for shape in (CPU_BOX, ONE_GPU):
        assert plan_placement(shape, 1, 1, [1], single_gpu_mode=True, sync_backend="gloo").transport == "gloo"
    # Without --single_gpu_mode every transport is a group, as before.
    assert plan_placement(CPU_BOX, 1, 1, [1]).transport == "gloo"


def test_single_gpu_mode_on_a_gpu_shares_it_and_starts_engines_first():
    placement = plan_placement(ONE_GPU, 1, 1, [1], single_gpu_mode=True, sync_backend="nccl")
    assert (placement.gpus_per_engine, placement.gpus_per_learner) == (0.5, 0.5)
    # vLLM aborts if another process frees GPU memory while it profiles.
    assert placement.engines_start_first and placement.engines_in_learner_bundles
    # Each learner reserves a whole GPU: two learners never share one, the engine joins its bundle.
    assert learner_bundles(placement) == [[{"CPU": 2, "GPU": 1}]]
    two = plan_placement(ClusterShape((2,)), 2, 1, [2], single_gpu_mode=True)
    assert learner_bundles(two) == [[{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_engines": 1, "tensor_parallel_size": 2, "num_learners_per_node": [1]}, "tensor_parallel_size 1"),
        ({"num_engines": 2, "tensor_parallel_size": 1, "num_learners_per_node": [1]}, "at most one engine"),
    ],
)
def test_single_gpu_mode_refuses_what_cannot_share(kwargs, message):
    for shape in (CPU_BOX, ONE_GPU):
        with pytest.raises(PlacementError, match=message):
            plan_placement(shape, single_gpu_mode=True, **kwargs)


def test_too_few_gpus_names_the_fix_instead_of_splitting_gpus_silently():
    with pytest.raises(PlacementError, match=r"needs 2 GPUs .* has 1.*--single_gpu_mode"):
        plan_placement(ONE_GPU, 1, 1, [1])


def test_multi_node_learners_pack_per_node_and_engines_get_their_own_group():
    placement = plan_placement(TWO_8GPU_NODES, 4, 2, [4, 4], sync_backend="nccl")
    assert placement.transport == "nccl"
    assert placement.learner_groups == (4, 4)  # one STRICT_PACK group per node entry
    assert learner_bundles(placement) == [[{"CPU": 1, "GPU": 1}] * 4] * 2
    assert placement.engine_placement_group
    assert engine_bundles(placement, 4) == [{"CPU": 1, "GPU": 2}] * 4  # a TP engine's GPUs on one node
    assert [rank_bundle(placement.learner_groups, rank) for rank in (0, 3, 4, 7)] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    with pytest.raises(IndexError):
        rank_bundle(placement.learner_groups, 8)
    # gloo stays available on GPUs when asked for.
    assert plan_placement(TWO_8GPU_NODES, 4, 1, [8], sync_backend="gloo").transport == "gloo"


def test_learners_of_one_node_entry_must_fit_a_node():
    with pytest.raises(PlacementError, match="8 learners on node 0, but the largest node has 4 GPUs"):
        plan_placement(ClusterShape((4, 4, 4, 4)), 2, 1, [8])
    with pytest.raises(PlacementError, match="tensor_parallel_size 8 is more GPUs than any node has"):
        plan_placement(ClusterShape((4, 4, 4, 4)), 1, 8, [4])


def test_single_gpu_mode_flag_checks_at_parse_time():
    from open_instruct.config.core import ConfigError, parse_config

    cfg = parse_config(["--single_gpu_mode"])
    assert cfg.learner.single_gpu_mode
    with pytest.raises(ConfigError, match="at most one engine"):
        parse_config(["--single_gpu_mode", "--vllm_num_engines", "2"])


def gpu_engine_args(tensor_parallel_size: int, backend: str = "nccl"):
    from open_instruct.generation.engine_setup import engine_args, engine_settings

    settings = engine_settings(
        model_path="not/loaded",
        max_model_len=512,
        vllm_tensor_parallel_size=tensor_parallel_size,
        weight_transfer_backend=backend,
    )
    return engine_args(settings, on_gpu=True)


def test_a_tensor_parallel_engine_holds_its_gpus_and_runs_vllms_mp_workers_inside():
    # 3 GPUs: one tp-2 engine holds both GPUs of its one bundle, the learner the third.
    placement = plan_placement(ClusterShape((3,)), 1, 2, [1])
    assert (placement.transport, placement.gpus_per_engine) == ("nccl", 2)
    assert engine_bundles(placement, 1) == [{"CPU": 1, "GPU": 2}]
    args = gpu_engine_args(2)
    assert (args.tensor_parallel_size, args.distributed_executor_backend) == (2, "mp")
    # From the flags of gpu_check.sh's part tensor_parallel to the settings the engine actor gets.
    from open_instruct.config.core import parse_config
    from open_instruct.generation.engine_setup import EngineSettings

    cfg = parse_config(["--vllm_tensor_parallel_size", "2", "--vllm_num_engines", "1", "--num_learners_per_node", "1"])
    assert EngineSettings.from_config(cfg, "m").generation.vllm_tensor_parallel_size == 2
    assert args.gpu_memory_utilization == 0.9 and args.dtype == "bfloat16"
    # One rank: vLLM's default, the in-process executor.
    assert gpu_engine_args(1).distributed_executor_backend is None


def test_vllm_would_pick_ray_in_the_actors_placement_group_unless_told_mp():
    """What `engine_setup.executor_backend` guards against, in vLLM's own config: inside an engine actor
    vLLM copies the current placement group into its parallel config, and then picks its Ray executor
    (which refuses a bundle of more than one GPU); an explicit "mp" stays "mp"."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup
    from vllm.config import ParallelConfig

    group = PlacementGroup(PlacementGroupID(os.urandom(18)), bundle_cache=[{"CPU": 1, "GPU": 2}])
    chosen = {
        backend: ParallelConfig(
            tensor_parallel_size=2, placement_group=group, distributed_executor_backend=backend
        ).distributed_executor_backend
        for backend in (None, "mp")
    }
    assert chosen == {None: "ray", "mp": "mp"}


def test_single_gpu_mode_gives_the_engine_a_safe_share_of_the_gpu_unless_told():
    from open_instruct.config.core import parse_config
    from open_instruct.config.learner import SHARED_GPU_DEFAULT_SHARE
    from open_instruct.generation.engine_setup import EngineSettings

    shared = parse_config(["--single_gpu_mode"])
    assert shared.generation.vllm_gpu_memory_utilization == 0.9  # the flag itself is left as parsed
    assert shared.engine_gpu_share == SHARED_GPU_DEFAULT_SHARE == 0.3
    assert EngineSettings.from_config(shared, "m").gpu_memory_utilization == 0.3
    # Given explicitly (open-instruct's single-GPU scripts pass 0.3 or 0.4), the value is used as is.
    for share in (0.3, 0.4, 0.6):
        cfg = parse_config(["--single_gpu_mode", "--vllm_gpu_memory_utilization", str(share)])
        assert cfg.engine_gpu_share == share
    # Without --single_gpu_mode the engine has its GPUs to itself: the flag, default 0.9.
    assert parse_config([]).engine_gpu_share == 0.9
    assert parse_config(["--vllm_gpu_memory_utilization", "0.95"]).engine_gpu_share == 0.95


def test_single_gpu_mode_refuses_a_share_that_leaves_the_learner_too_little():
    from open_instruct.config.core import ConfigError, parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config(["--single_gpu_mode", "--vllm_gpu_memory_utilization", "0.9"])
    (line,) = [line for line in str(caught.value).splitlines() if "vllm_gpu_memory_utilization" in line]
    assert "leaves the learner 10% of the shared GPU" in line and "at most 0.6" in line
    parse_config(["--vllm_gpu_memory_utilization", "0.9"])  # fine on a GPU of its own


def test_single_gpu_mode_help_names_the_transport_placement_picks():
    from open_instruct.config.learner import LearnerConfig

    help_text = " ".join(f.metadata.get("help", "") for f in dataclasses.fields(LearnerConfig))
    assert "CUDA IPC" in help_text and "shared-memory file" in help_text
    assert "weights move over gloo" not in help_text
