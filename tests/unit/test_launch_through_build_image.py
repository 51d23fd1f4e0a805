"""The open-instruct scripts that start through scripts/train/build_image_and_launch.sh reach it here: its dry
run names each script with the image it would build, and a run with stand-in docker and beaker CLIs hands
that image to the script, whose recorded mason.py line (`uv run python mason.py ...`, as theirs) then
dry-runs with it through this repository's mason.py and .venv.

What: a fresh git repository under tmp_path holds mason.py, the launch package, the launcher, a Dockerfile
placeholder, .venv (a link, ignored) and, at each script's path, a stand-in that runs the script's recorded
mason.py line with its image argument replaced by `$1`. (The scripts themselves are open-instruct's; their
mason lines are data, tests/data/open_instruct_mason_launches.json.)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import fake_clis

REPO = Path(__file__).resolve().parents[2]
DATA = json.loads((REPO / "tests" / "data" / "open_instruct_mason_launches.json").read_text())
MASON_LINES = {launch["script"]: launch["argv"] for launch in DATA["launches"]}
# The eight scripts whose usage starts them through the launcher (olmo3_infra.sh names its `_dirty` twin,
# which takes the image the same way); evolving_rubric_mini_test.sh runs grpo_fast.py itself.
THROUGH_LAUNCHER = sorted(
    [launch["script"] for launch in DATA["launches"] if launch["via_launcher"]]
    + ["scripts/benchmarking/olmo3_infra.sh", "scripts/train/debug/evolving_rubric_mini_test.sh"]
)
BRANCH = "main"
IMAGE = f"alice/open-instruct-integration-test-{BRANCH}-cuda13"


def stand_in(script: str) -> str:
    """The script's recorded mason.py line with `$1` as its image (a dry run: nothing is submitted)."""
    if script not in MASON_LINES:
        return 'echo "launched with image $1"\n'
    argv = MASON_LINES[script]
    words = [shlex.quote(word) if word != DATA["image_argument"] else '"$1"' for word in argv]
    return f"uv run --no-sync python mason.py --dry_run {' '.join(words)}\n"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("checkout")
    for path in (
        "mason.py",
        "open_instruct/__init__.py",
        "scripts/train/build_image_and_launch.sh",
        "locks/gpu-cu13.txt",
    ):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, repo / path)
    shutil.copytree(REPO / "open_instruct" / "launch", repo / "open_instruct" / "launch")
    for script in THROUGH_LAUNCHER:
        (repo / script).parent.mkdir(parents=True, exist_ok=True)
        (repo / script).write_text(f"#!/bin/bash\n{stand_in(script)}")
    (repo / "Dockerfile").write_text("FROM scratch\n")
    (repo / ".gitignore").write_text(".venv\n__pycache__/\n")
    (repo / ".venv").symlink_to(REPO / ".venv")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q", "-b", BRANCH], ["add", "-A"], ["commit", "-qm", "scripts"]):
        subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True, timeout=60)
    return repo


def launch(checkout: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    bin_dir = fake_clis.install(tmp_path / "bin", ("docker", "beaker"))
    log = tmp_path / "cli.jsonl"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BEAKER", "WANDB_", "VIRTUAL_ENV", "DRY_RUN"))}
    env = {**base, "PATH": f"{bin_dir}:/usr/bin:/bin", "CLI_LOG": str(log), "HOME": str(tmp_path)}
    run = subprocess.run(
        ["bash", "scripts/train/build_image_and_launch.sh", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return run, fake_clis.calls(log)


@pytest.mark.parametrize("script", THROUGH_LAUNCHER)
def test_the_launchers_dry_run_names_the_script_and_its_image(script, checkout, tmp_path):
    run, calls = launch(checkout, tmp_path, "--dry_run", script)
    assert run.returncode == 0, run.stderr
    assert f"would run: IMAGE={IMAGE} bash {script} {IMAGE}" in run.stdout
    assert run.stdout.strip().endswith("dry run done")
    assert [call[:3] for call in calls] == [["beaker", "account", "whoami"], ["beaker", "image", "get"]]  # reads only


@pytest.mark.parametrize("script", THROUGH_LAUNCHER)
def test_a_run_builds_the_image_and_the_scripts_mason_line_launches_it(script, checkout, tmp_path):
    run, calls = launch(checkout, tmp_path, script)
    assert run.returncode == 0, run.stderr
    assert calls[2][:3] == ["docker", "buildx", "build"]
    assert calls[-1][:3] == ["beaker", "image", "create"]
    if script not in MASON_LINES:
        assert run.stdout.strip().endswith(f"launched with image {IMAGE}")
        return
    spec = yaml.safe_load(run.stdout[run.stdout.index("# beaker experiment create") :])
    assert [task["image"] for task in spec["tasks"]] == [{"beaker": IMAGE}]
    assert "not submitting (--dry_run)" in run.stderr
