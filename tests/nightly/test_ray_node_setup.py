"""configs/beaker_configs/ray_node_setup.sh forms a real 2-node Ray cluster on this machine's loopback.

What: the script runs twice, as Beaker would run it on two replicas: rank 0 (leader) sources it, checks
that a driver sees 2 nodes, then runs the real trainer (grpo_fast.py, two steps) on that cluster; rank 1
(worker) sources it and blocks in `ray start --block`. Both nodes must appear in `ray status`.

Why this way: it is the only check that the Beaker bring-up (head start, worker join, node-count wait,
RAY_ADDRESS export, workers never reaching the trainer) works with the real Ray CLI.

Isolation on a shared machine: the head is addressed as 127.0.0.1 only (Ray 2.60 itself still listens on
all interfaces and records the machine's own address for a loopback node; it has no loopback-only mode),
every Ray port with a fixed default (GCS, client server, dashboard agent) is a free port chosen here, each
node has its own short temp dir, Ray token authentication uses a token of this test's own (never
~/.ray/auth_token), and cleanup kills only the processes of the sessions this test started (by process
id), never `ray stop`, which would stop every Ray cluster of this user on the machine.

Run: `.venv/bin/pytest tests/nightly/test_ray_node_setup.py` (about 2 minutes on 2 CPU cores; no GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers.processes import free_port, pids_mentioning, session_pids

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "configs" / "beaker_configs" / "ray_node_setup.sh"
VENV_BIN = REPO / ".venv" / "bin"
RAY = VENV_BIN / "ray" if (VENV_BIN / "ray").exists() else Path(shutil.which("ray") or "ray")
STEP_TIMEOUT_S = 480  # node bring-up, then a 2-step training run
TINY_RUN = [
    "--num_unique_prompts_rollout",
    "4",
    "--num_samples_per_prompt_rollout",
    "4",
    "--total_episodes",
    "32",
    "--response_length",
    "16",
    "--max_prompt_token_length",
    "64",
    "--pack_length",
    "128",
    "--num_evals",
    "0",
    "--save_freq",
    "0",
    "--beta",
    "0",
    "--vllm_kv_cache_gib",
    "0.1",
]


def kill_ours(sids: list[int], markers: list[str]) -> list[int]:
    """SIGTERM, then SIGKILL, the processes we started; returns those still alive afterwards."""

    def ours() -> list[int]:
        found = {pid for sid in sids for pid in session_pids(sid)}
        found |= {pid for marker in markers for pid in pids_mentioning(marker)}
        return sorted(found)

    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in ours():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while ours() and time.monotonic() < deadline:
            time.sleep(0.2)
    return ours()


def clean_env() -> dict[str, str]:
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        # Token auth as in production with a Beaker secret; our own token, so ~/.ray/auth_token (shared with
        # other Ray users of this machine) is neither read nor written.
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    for name in (
        "RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_HEAD_IP",
        "RAY_NODE_IP",
        "NUM_NODES",
        "BEAKER_REPLICA_RANK",
        "BEAKER_REPLICA_COUNT",
        "BEAKER_LEADER_REPLICA_HOSTNAME",
    ):
        env.pop(name, None)
    return env


def isolated_ray_args(head: bool) -> str:
    # Ports with fixed defaults (52365 dashboard agent, 10001 client server) may be taken by other Ray
    # clusters on this machine; a small object store keeps /dev/shm use low on a shared box.
    args = f"--num-cpus=1 --object-store-memory=100000000 --dashboard-agent-listen-port={free_port()}"
    return args + (f" --ray-client-server-port={free_port()}" if head else "")


def test_two_replicas_form_one_ray_cluster_on_loopback():
    port = free_port()
    head_dir = tempfile.mkdtemp(prefix="rnsH", dir="/tmp")  # short: Ray socket paths must fit 107 bytes
    worker_dir = tempfile.mkdtemp(prefix="rnsW", dir="/tmp")
    common = {
        **clean_env(),
        "RAY_HEAD_IP": "127.0.0.1",
        "RAY_PORT": str(port),
        "BEAKER_REPLICA_COUNT": "2",
        "RAY_NODE_WAIT_TIMEOUT": "90",
    }
    leader_env = {
        **common,
        "BEAKER_REPLICA_RANK": "0",
        "RAY_TEMP_DIR": head_dir,
        "RAY_START_EXTRA_ARGS": isolated_ray_args(head=True),
    }
    worker_env = {
        **common,
        "BEAKER_REPLICA_RANK": "1",
        "RAY_TEMP_DIR": worker_dir,
        "RAY_START_EXTRA_ARGS": isolated_ray_args(head=False),
    }
    probe = f'{sys.executable} -c \'import ray; ray.init(address="auto"); print("NODES", len(ray.nodes()))\''
    # Then the real trainer joins the same cluster: its engine and its learner (1 CPU each) must land
    # on different nodes, and weights cross between them every step.
    out = Path(tempfile.mkdtemp(prefix="rnsT", dir="/tmp"))
    trainer = (
        f"{sys.executable} {REPO / 'open_instruct' / 'grpo_fast.py'} --output_dir {out} "
        + " ".join(TINY_RUN)
        + " && echo TRAINED"
    )
    leader_cmd = f"set -u; source {SCRIPT} && echo RAY_ADDRESS=$RAY_ADDRESS && {probe} && {trainer}"
    # The worker must never get past the script: "REACHED" would mean it ran the trainer.
    worker_cmd = f"set -u; source {SCRIPT} && echo REACHED"

    started: list[subprocess.Popen] = []
    worker_out = ""
    try:
        worker = subprocess.Popen(
            ["bash", "-c", worker_cmd],
            env=worker_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its session id = its pid: how cleanup finds every Ray daemon it spawns
        )
        started.append(worker)
        leader = subprocess.Popen(
            ["bash", "-c", leader_cmd],
            env=leader_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        started.append(leader)

        try:
            leader_out, _ = leader.communicate(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the leader did not finish its set-up + trainer stand-in within the timeout")
        assert leader.returncode == 0, leader_out
        assert "2/2 Ray nodes joined" in leader_out, leader_out
        assert f"RAY_ADDRESS=127.0.0.1:{port}" in leader_out, leader_out
        # The "trainer" (a driver started after the script returned) sees both nodes.
        assert re.search(r"^NODES 2$", leader_out, re.MULTILINE), leader_out
        assert "connecting to the Ray cluster at 127.0.0.1" in leader_out and "TRAINED" in leader_out, leader_out
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [m["policy/version"] for m in metrics] == [1, 2]
        # RAY_AUTH_TOKEN switched token authentication on, for the nodes and the driver alike.
        assert "Ray token authentication disabled" not in leader_out

        # The worker is still serving the cluster (blocked in `ray start --block`), not running the trainer.
        assert worker.poll() is None

        # `ray status` reports the autoscaler's view, refreshed every few seconds: poll it, bounded.
        active_nodes: list[str] = []
        deadline = time.monotonic() + 45
        while len(active_nodes) < 2 and time.monotonic() < deadline:
            status = subprocess.run(
                [str(RAY), "status", f"--address=127.0.0.1:{port}"],
                check=False,
                env={**common, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token"},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert status.returncode == 0, status.stdout + status.stderr
            active = status.stdout.split("Active:", 1)[1].split("Pending:", 1)[0]
            active_nodes = re.findall(r"^[ \t]*1 (node_[0-9a-f]+)$", active, re.MULTILINE)
            if len(active_nodes) < 2:
                time.sleep(2)
        assert len(set(active_nodes)) == 2, status.stdout
    finally:
        leftovers = kill_ours([p.pid for p in started], [head_dir, worker_dir])
        shutil.rmtree(out, ignore_errors=True)
        for p in started:
            if p.returncode is None:  # the leader was already reaped by communicate() above
                try:
                    out, _ = p.communicate(timeout=10)
                    worker_out += out if p is started[0] else ""
                except subprocess.TimeoutExpired:
                    pass
        shutil.rmtree(head_dir, ignore_errors=True)
        shutil.rmtree(worker_dir, ignore_errors=True)
    assert not leftovers, f"processes left running: {leftovers}"
    assert "REACHED" not in worker_out, worker_out
    assert "worker (rank 1 of 2)" in worker_out, worker_out


def test_local_mode_runs_a_command_after_a_single_node_head():
    """Executed with `-- COMMAND` and no Beaker variables: a 1-node head on loopback, then COMMAND."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="rnsL", dir="/tmp")
    env = {
        **clean_env(),
        "RAY_PORT": str(port),
        "RAY_TEMP_DIR": temp_dir,
        "RAY_START_EXTRA_ARGS": isolated_ray_args(head=True),
    }
    trainer = 'import os, ray; ray.init(); print("AT", os.environ["RAY_ADDRESS"], "NODES", len(ray.nodes()))'
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--", str(VENV_BIN / "python"), "-c", trainer],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    finally:
        leftovers = kill_ours([proc.pid], [temp_dir])
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert proc.returncode == 0, out
    assert "leader (rank 0 of 1)" in out
    assert f"AT 127.0.0.1:{port} NODES 1" in out, out  # the command joined the head, not a new cluster
    assert not leftovers, f"processes left running: {leftovers}"


def test_sourcing_leaves_the_callers_shell_clean_and_rejects_a_bad_rank():
    env = {**clean_env(), "BEAKER_REPLICA_RANK": "3", "BEAKER_REPLICA_COUNT": "2", "RAY_HEAD_IP": "127.0.0.1"}
    script = (
        "set -u; before=$(set -o); "
        f"source {SCRIPT} && echo CONTINUED; echo status=$?; "
        '[[ "$(set -o)" == "$before" ]] && echo OPTIONS_UNCHANGED; '
        "declare -F | grep -c _rns_ || true; compgen -v | grep -c '^_rns' || true"
    )
    result = subprocess.run(["bash", "-c", script], check=False, env=env, capture_output=True, text=True, timeout=30)
    lines = result.stdout.split()
    assert "CONTINUED" not in lines
    assert "status=1" in lines
    assert "rank 3 is not in [0, 2)" in result.stderr
    assert "OPTIONS_UNCHANGED" in lines
    assert lines[-2:] == ["0", "0"]  # no helper functions or variables left behind


def test_help_describes_the_script():
    result = subprocess.run(["bash", str(SCRIPT), "--help"], check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "BEAKER_REPLICA_RANK" in result.stdout and "--block" in result.stdout
