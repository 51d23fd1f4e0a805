"""The Slurm job script (scripts/slurm.sh) and the node script under it (scripts/node_launch.sh) bring up a real
2-node Ray cluster on this machine's loopback, the way tests/nightly/test_ray_node_setup.py does for Beaker.

What: scripts/slurm.sh runs as sbatch would run it (on the first node, SLURM_* set) with stand-in `srun` and
`scontrol` (tests/helpers/fake_slurm.py): srun starts node_launch.sh twice, as tasks 0 and 1, each with its own
session, Ray directory and ports. node_launch.sh maps SLURM_PROCID / SLURM_NNODES / the node list
(`localhost,node02`: its first host, the head, resolves to 127.0.0.1) to ray_node_setup.sh's variables;
rank 0 starts the head, waits for both nodes and runs the job's command, rank 1 joins and blocks. The command
is the script's real grpo_fast.py command line with PYTHON set to a stand-in trainer, which connects to the
cluster, counts its nodes and records its argv and NCCL variables (the real trainer on a cluster formed by
ray_node_setup.sh is test_ray_node_setup.py's). Afterwards rank 0 stops its head, the worker sees it gone and
exits 0, and no Ray process of the job is left.
The mapping alone (plain nodes' explicit variables, Slurm's, the one-line refusals) is checked without Ray by
`node_launch.sh --print`.

Isolation on a shared machine: free ports for every Ray port with a fixed default, short per-node Ray
directories named by a job id of this test, Ray token authentication with this test's token, and cleanup by
those directories and the sessions started here (never `ray stop`).
Run: `.venv/bin/pytest tests/integration/test_node_launch.py` (about a minute on 2 CPU cores; no GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import fake_slurm
from helpers.processes import free_port, pids_mentioning

from open_instruct.config.core import parse_config
from open_instruct.preflight import _resources

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

# Stands in for the trainer: joins the cluster node_launch.sh brought up and reports what it got.
TRAINER = """
import json, os, sys
import ray
ray.init(logging_level="ERROR", log_to_driver=False)  # RAY_ADDRESS, exported by ray_node_setup.sh
print("NODES", sum(1 for node in ray.nodes() if node.get("Alive")))
print("ARGV", json.dumps(sys.argv[1:]))
print("NCCL", json.dumps({k: v for k, v in os.environ.items() if k.startswith("NCCL_")}))
print("AT", os.environ["RAY_ADDRESS"])
ray.shutdown()
"""


def kill_mentioning(markers: list[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in {pid for marker in markers for pid in pids_mentioning(marker)}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while any(pids_mentioning(m) for m in markers) and time.monotonic() < deadline:
            time.sleep(0.2)


def base_env() -> dict[str, str]:
    drop = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_HEAD_IP", "RAY_NODE_IP", "RAY_TEMP_DIR")
    drop += ("NUM_NODES", "NODE_RANK", "HEAD_HOST", "RAY_HEAD_HOSTNAME", "PYTHON", "OPEN_INSTRUCT_DIR", "SRUN_ARGS")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "BEAKER_", "NCCL_"))}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0"}


def test_a_slurm_job_brings_up_two_nodes_runs_its_command_on_rank_0_and_every_node_exits_0(tmp_path):
    job = f"t{os.getpid() % 100000}"
    markers = [f"/tmp/ray_oi_{job}_0", f"/tmp/ray_oi_{job}_1"]  # node_launch.sh's default Ray directories
    out = tmp_path / "srun"
    out.mkdir()
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    python = tmp_path / "python"  # called as `$PYTHON open_instruct/grpo_fast.py FLAGS...`
    python.write_text(f'#!/bin/bash\nshift\nexec {sys.executable} {trainer} "$@"\n')
    python.chmod(0o755)
    bin_dir = fake_slurm.install(tmp_path / "bin")
    node_args = "--num-cpus=1 --object-store-memory=100000000 --dashboard-agent-listen-port={}"
    env = {
        **base_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": job,
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "localhost,node02",
        "SLURM_SUBMIT_DIR": str(REPO),
        "FAKE_SRUN_OUT": str(out),
        "FAKE_SRUN_TASK_ENV": json.dumps(
            [
                {"RAY_START_EXTRA_ARGS": node_args.format(free_port()) + f" --ray-client-server-port={free_port()}"},
                {"RAY_START_EXTRA_ARGS": node_args.format(free_port())},
            ]
        ),
        "PYTHON": str(python),
        "RAY_PORT": str(port := free_port()),
        "RAY_NODE_WAIT_TIMEOUT": "90",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        # A worker's raylet notices the head is gone after this many seconds (Ray's default: 60).
        "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",  # a value of the user's wins over node_launch.sh's defaults
    }
    job_script = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "slurm.sh"), "--seed", "7"],
        cwd=tmp_path,  # sbatch's working directory need not be the repository: SLURM_SUBMIT_DIR is
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        try:
            output, _ = job_script.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(job_script.pid, signal.SIGKILL)
            output, _ = job_script.communicate()
        leader = (out / "task0.log").read_text() if (out / "task0.log").exists() else ""
        worker = (out / "task1.log").read_text() if (out / "task1.log").exists() else ""
        report = f"job:\n{output}\nrank 0:\n{leader}\nrank 1:\n{worker}"
        left = {marker: pids_mentioning(marker) for marker in markers}
    finally:
        kill_mentioning(markers)
        for marker in markers:
            shutil.rmtree(marker, ignore_errors=True)

    assert job_script.returncode == 0, report
    srun = json.loads((out / "srun.json").read_text())
    assert srun["options"] == {"nodes": "2", "ntasks-per-node": "1", "kill-on-bad-exit": "1"}
    assert srun["command"][:4] == ["bash", "scripts/node_launch.sh", "--", str(python)]
    # Rank 0: the head on the first host of the node list, both nodes in, the command on that cluster.
    assert "leader (rank 0 of 2): starting the Ray head on 127.0.0.1" in leader, report
    assert "2/2 Ray nodes joined" in leader and f"AT 127.0.0.1:{port}" in leader, report
    assert "NODES 2" in leader.splitlines(), report
    assert "the command finished (status 0); stopping the Ray head" in leader, report
    # Rank 1: joined, never ran the command, and left once the head was gone.
    assert "worker (rank 1 of 2)" in worker and "ARGV" not in worker, report
    assert "is gone (the leader finished); worker exiting 0" in worker, report
    assert left == {marker: [] for marker in markers}, f"Ray processes left running: {left}\n{report}"
    # The command was the script's grpo_fast command line, extra flags last; its layout fits 2 nodes of 8 GPUs.
    (argv_line,) = [line for line in leader.splitlines() if line.startswith("ARGV ")]
    argv = json.loads(argv_line.removeprefix("ARGV "))
    assert argv[-2:] == ["--seed", "7"]
    detail, _ = _resources(parse_config(argv))
    assert "16 GPUs on >= 2 node(s)" in detail, detail
    (nccl_line,) = [line for line in leader.splitlines() if line.startswith("NCCL ")]
    nccl = json.loads(nccl_line.removeprefix("NCCL "))
    assert nccl["NCCL_CUMEM_ENABLE"] == "0" and nccl["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"


# ----------------------------------------------------------------------------- the mapping alone (no Ray)


def print_mapping(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    bin_dir = fake_slurm.install(tmp_path / "bin")
    return subprocess.run(
        ["bash", "scripts/node_launch.sh", "--print"],
        cwd=REPO,
        env={**base_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_slurm_variables_map_to_rank_count_and_the_first_host_of_the_node_list(tmp_path):
    env = {"SLURM_PROCID": "2", "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "gpu[07-09,12]", "SLURM_JOB_ID": "99"}
    done = print_mapping(env, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "node rank 2 of 4; head gpu07 (port 6379); Ray temp dir /tmp/ray_oi_99_2"
    assert "NCCL_CUMEM_ENABLE=0" in lines and "NCCL_DEBUG=WARN" in lines


def test_plain_nodes_take_explicit_variables_which_win_over_slurms(tmp_path):
    env = {"NODE_RANK": "1", "NUM_NODES": "3", "HEAD_HOST": "10.0.0.5", "RAY_PORT": "7000", "NCCL_DEBUG": "INFO"}
    done = print_mapping({**env, "SLURM_PROCID": "0", "SLURM_NNODES": "9", "SLURM_JOB_NODELIST": "x[1-9]"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("node rank 1 of 3; head 10.0.0.5 (port 7000); Ray temp dir /tmp/ray_oi_")
    assert "NCCL_DEBUG=INFO" in done.stdout.splitlines()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no node rank: set NODE_RANK (plain nodes) or run under srun (SLURM_PROCID)"),
        ({"NODE_RANK": "0"}, "no node count: set NUM_NODES"),
        ({"NODE_RANK": "1", "NUM_NODES": "2"}, "no head host: set HEAD_HOST"),
        ({"NODE_RANK": "2", "NUM_NODES": "2", "HEAD_HOST": "h"}, "node rank 2 is not in [0, 2) (one task per node"),
        ({"NODE_RANK": "x", "NUM_NODES": "2", "HEAD_HOST": "h"}, "rank must be a non-negative integer, got 'x'"),
    ],
)
def test_missing_or_bad_variables_are_one_line(env, message, tmp_path):
    done = print_mapping(env, tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
