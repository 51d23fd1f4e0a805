"""--single_gpu_mode for real on a CPU node: grpo_fast.py trains with the node's cores split between the engine
and the learner, and the weights pass through the shared-memory file (no group)."""

from __future__ import annotations

import os

from open_instruct.placement import split_cores


def test_single_gpu_mode_trains_on_a_cpu_node_split_between_engine_and_learner(tmp_path):
    from helpers.runs import COMMON, run_grpo, steps_logged

    steps = 2
    args = list(COMMON)
    args[args.index("--total_episodes") + 1] = str(steps * 32)
    args.append("--single_gpu_mode")
    code, log = run_grpo(args, tmp_path / "run", timeout_s=600)
    assert code == 0, log[-4000:]
    assert steps_logged(tmp_path / "run") == list(range(steps))
    engine_cores, learner_cores = split_cores(tuple(os.sched_getaffinity(0)))
    assert f"engine_cores={engine_cores}, learner_cores={learner_cores}" in log
    assert "Placement(transport='shm'" in log  # weights passed through shared memory, no group
    assert f"cores={learner_cores})" in log  # the learner reported the affinity it actually runs with
    assert f"engine_process_cores={engine_cores}," in log  # and the engine's vLLM process its own
