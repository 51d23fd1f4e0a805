"""scripts/train/build_image_and_launch.sh, the entry of open-instruct's Beaker launch scripts: its checks,
its one-line refusals, its dry run, and a real run against stand-in docker and beaker CLIs.

What: the script is copied into a fresh git repository under tmp_path (one commit, on a branch whose name
needs sanitizing) next to a tiny launch script that prints its arguments and calls `uv run python mason.py`
as open-instruct's do. The docker and beaker CLIs are stand-ins that record their argv, or absent (the
caller's PATH minus any folder holding a real one). Nothing is built, pushed or submitted.
Run: `.venv/bin/pytest tests/unit/test_build_image_and_launch.py` (a few seconds, no network).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import fake_clis

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train" / "build_image_and_launch.sh"
BRANCH = "Feature/Long_Gens"
IMAGE = "open-instruct-integration-test-feature-long_gens-cuda13"
ME = "build_image_and_launch.sh: "

LAUNCH = """#!/usr/bin/env bash
echo "image=$1"
shift
echo "args=$*"
uv run python mason.py "$@"
"""
# Stands in for .venv/bin/python: `uv run python ...` in a launch script must reach it.
VENV_PYTHON = """#!/usr/bin/env bash
echo "venv-python $*"
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=30).stdout


def _env(tmp_path: Path, clis: tuple[str, ...]) -> dict[str, str]:
    """The caller's environment with only the stand-in CLIs named in `clis` on PATH."""
    real = ("docker", "beaker")
    folders = [d for d in os.environ["PATH"].split(os.pathsep) if not any((Path(d) / c).exists() for c in real)]
    fake_bin = fake_clis.install(tmp_path / "bin", clis)
    drop = ("BEAKER_USER", "BEAKER_WORKSPACE", "DOCKER_CACHE_REPO", "FAKE_IMAGE_DESCRIPTION", "VIRTUAL_ENV", "DRY_RUN")
    drop += ("IMAGE",)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PATH=os.pathsep.join([str(fake_bin), *folders]),
        CLI_LOG=str(tmp_path / "cli_log.jsonl"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    return env


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository with the script, a launch script, a Dockerfile and a stand-in .venv, all committed."""
    root = tmp_path / "repo"
    (root / "scripts" / "train").mkdir(parents=True)
    shutil.copy2(SCRIPT, root / "scripts" / "train" / SCRIPT.name)
    (root / "launch.sh").write_text(LAUNCH)
    (root / "Dockerfile").write_text("FROM scratch\n")
    (root / "locks").mkdir()
    (root / "locks" / "gpu-cu13.txt").write_text("torch==2.14.0\n")
    (root / ".gitignore").write_text(".venv\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").write_text(VENV_PYTHON)
    (root / ".venv" / "bin" / "python").chmod(0o755)
    _git(root, "init", "-q", "-b", BRANCH)
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init")
    return root


def launch(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    script = cwd / "scripts" / "train" / SCRIPT.name
    return subprocess.run(
        ["bash", str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def cli_calls(tmp_path: Path) -> list[list[str]]:
    return fake_clis.calls(tmp_path / "cli_log.jsonl")


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_uncommitted_or_untracked_changes_stop_it_with_exit_1_naming_them(repo, tmp_path):
    (repo / "launch.sh").write_text(LAUNCH + "# edited\n")
    (repo / "notes.txt").write_text("not committed\n")
    result = launch(repo, _env(tmp_path, ("docker", "beaker")), "launch.sh")
    assert result.returncode == 1
    assert " M launch.sh" in result.stderr and "?? notes.txt" in result.stderr
    assert last_line(result.stderr).startswith("build_image_and_launch.sh: check the working tree: uncommitted")
    assert cli_calls(tmp_path) == [] and "image=" not in result.stdout


def test_outside_a_git_repository_it_stops_with_exit_1(tmp_path):
    plain = tmp_path / "plain"
    (plain / "scripts" / "train").mkdir(parents=True)
    shutil.copy2(SCRIPT, plain / "scripts" / "train" / SCRIPT.name)
    (plain / "launch.sh").write_text(LAUNCH)
    env = _env(tmp_path, ("docker", "beaker"))
    env["GIT_CEILING_DIRECTORIES"] = str(tmp_path)  # tmp_path may itself sit inside a repository
    result = launch(plain, env, "launch.sh")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"build_image_and_launch.sh: check the git repository: {plain} is not inside a git repository "
        "(the image is built from a commit)"
    )
    assert cli_calls(tmp_path) == []


def test_without_docker_it_names_the_build_step_in_one_line(repo, tmp_path):
    result = launch(repo, _env(tmp_path, ("beaker",)), "launch.sh")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "build_image_and_launch.sh: build the image (docker buildx build): docker is not on PATH"
    )
    assert [call[:3] for call in cli_calls(tmp_path)] == [
        ["beaker", "account", "whoami"],
        ["beaker", "image", "get"],
    ]
    assert "image=" not in result.stdout


def test_bad_cuda_version_and_missing_script_are_one_line_refusals(repo, tmp_path):
    env = _env(tmp_path, ("docker", "beaker"))
    bad = launch(repo, env, "--cuda-version", "11", "launch.sh")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "build_image_and_launch.sh: --cuda-version must be 12 or 13, not '11'"
    missing = launch(repo, env, "--dry_run", "nope.sh")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "build_image_and_launch.sh: no such launch script: nope.sh"


def test_dry_run_prints_every_step_and_the_final_command_and_runs_nothing(repo, tmp_path):
    commit = _git(repo, "rev-parse", "--short", "HEAD").strip()
    image = IMAGE.replace("cuda13", "cuda12")
    # No docker, no beaker: each missing CLI is reported at its step and the dry run still completes.
    result = launch(repo, _env(tmp_path, ()), "--cuda-version", "12", "--dry_run", "launch.sh", "--seed", "7", "a b")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(line.startswith(ME) for line in lines), lines
    assert [line.removeprefix(ME) for line in lines] == [
        "dry run: nothing is built, pushed or run",
        f"git repository: {repo}; working tree: clean",
        f"commit {commit} on branch {BRANCH}; image name: {image}",
        "look up the Beaker user (beaker account whoami): the beaker CLI is not on PATH (a real run stops here)",
        "beaker user: <beaker user>",
        f"building the CUDA 12 image for commit {commit}",
        "build the image (docker buildx build): docker is not on PATH (a real run stops here)",
        "build the image (docker buildx build): no lock for CUDA 12 (locks/gpu-cu12.txt): only the CUDA 13 stack "
        "is locked (docs/install.md says why); use --cuda-version 13 (a real run stops here)",
        f"would run: docker buildx build --platform=linux/amd64 --build-arg GIT_COMMIT={commit} "
        f"--build-arg GIT_BRANCH={BRANCH} --build-arg CUDA_VERSION=12 --load . -t {image}",
        "upload the image (beaker image create): the beaker CLI is not on PATH (a real run stops here)",
        f"would run: beaker image rename '<beaker user>/{image}' ''",
        f"would run: beaker image create {image} -n {image} -w 'ai2/<beaker user>' "
        f"--description 'Git commit: {commit}; CUDA: 12'",
        f"launch scripts run with {repo}/.venv/bin/python ('uv run' included)",
        f"would run: IMAGE='<beaker user>/{image}' bash launch.sh '<beaker user>/{image}' --seed 7 'a b'",
        "dry run done; a real run could not: look up the Beaker user (beaker account whoami); "
        "build the image (docker buildx build); upload the image (beaker image create)",
    ]
    assert "image=" not in result.stdout and cli_calls(tmp_path) == []


def test_dry_run_with_the_clis_asks_beaker_who_but_builds_and_pushes_nothing(repo, tmp_path):
    env = {**_env(tmp_path, ("docker", "beaker")), "BEAKER_USER": "ignored-when-beaker-answers"}
    result = launch(repo, env, "--dry_run", "launch.sh", "--seed", "7")
    assert result.returncode == 0, result.stderr
    assert f"would run: IMAGE=alice/{IMAGE} bash launch.sh alice/{IMAGE} --seed 7" in result.stdout
    assert last_line(result.stdout) == "build_image_and_launch.sh: dry run done"
    assert [call[:3] for call in cli_calls(tmp_path)] == [["beaker", "account", "whoami"], ["beaker", "image", "get"]]


def test_a_real_run_builds_uploads_then_runs_the_script_with_the_image_as_its_first_argument(repo, tmp_path):
    commit = _git(repo, "rev-parse", "--short", "HEAD").strip()
    result = launch(repo, _env(tmp_path, ("docker", "beaker")), "launch.sh", "--seed", "7", "two words")
    assert result.returncode == 0, result.stderr
    calls = cli_calls(tmp_path)
    assert [call[:3] for call in calls] == [
        ["beaker", "account", "whoami"],
        ["beaker", "image", "get"],
        ["docker", "buildx", "build"],
        ["beaker", "image", "rename"],
        ["beaker", "image", "create"],
    ]
    build = calls[2]
    assert f"GIT_COMMIT={commit}" in build and "CUDA_VERSION=13" in build and build[-3:] == [".", "-t", IMAGE]
    assert calls[3] == ["beaker", "image", "rename", f"alice/{IMAGE}", ""]
    create = ["beaker", "image", "create", IMAGE, "-n", IMAGE, "-w", "ai2/alice"]
    assert calls[4] == [*create, "--description", f"Git commit: {commit}; CUDA: 13"]
    # The launch script ran last, the image as $1, the remaining arguments as given, `uv run` on .venv.
    out = result.stdout.splitlines()
    assert out[-3:] == [f"image=alice/{IMAGE}", "args=--seed 7 two words", "venv-python mason.py --seed 7 two words"]


def test_an_image_that_already_holds_the_commit_is_not_built_again(repo, tmp_path):
    commit = _git(repo, "rev-parse", "--short", "HEAD").strip()
    env = {**_env(tmp_path, ("docker", "beaker")), "FAKE_IMAGE_DESCRIPTION": f"Git commit: {commit}; CUDA: 13"}
    result = launch(repo, env, "launch.sh")
    assert result.returncode == 0, result.stderr
    assert f"already holds commit {commit}: no build, no upload" in result.stdout
    assert [call[:3] for call in cli_calls(tmp_path)] == [["beaker", "account", "whoami"], ["beaker", "image", "get"]]
    assert f"image=alice/{IMAGE}" in result.stdout


# ----------------------------------------------------------------------------- the environment and the image


def test_the_launched_script_also_finds_the_image_in_IMAGE(repo, tmp_path):
    (repo / "launch.sh").write_text('#!/usr/bin/env bash\necho "IMAGE=$IMAGE first=$1"\n')
    _git(repo, "commit", "-qam", "print IMAGE")
    result = launch(repo, _env(tmp_path, ("docker", "beaker")), "launch.sh")
    assert result.returncode == 0, result.stderr
    assert last_line(result.stdout) == f"IMAGE=alice/{IMAGE} first=alice/{IMAGE}"


def test_dry_run_in_the_environment_is_the_same_as_the_flag(repo, tmp_path):
    env = {**_env(tmp_path, ("docker", "beaker")), "DRY_RUN": "1"}
    result = launch(repo, env, "launch.sh")
    assert result.returncode == 0, result.stderr
    assert last_line(result.stdout) == "build_image_and_launch.sh: dry run done" and "image=" not in result.stdout
    assert [call[:3] for call in cli_calls(tmp_path)] == [["beaker", "account", "whoami"], ["beaker", "image", "get"]]


def test_the_active_environment_runs_the_launch_script(repo, tmp_path):
    active = tmp_path / "active"
    (active / "bin").mkdir(parents=True)
    (active / "bin" / "python").write_text('#!/usr/bin/env bash\necho "active-python $*"\n')
    (active / "bin" / "python").chmod(0o755)
    env = {**_env(tmp_path, ("docker", "beaker")), "VIRTUAL_ENV": str(active)}
    result = launch(repo, env, "launch.sh", "--seed", "7")
    assert result.returncode == 0, result.stderr
    assert f"launch scripts run with {active}/bin/python, the active environment" in result.stdout
    assert last_line(result.stdout) == "active-python mason.py --seed 7"


def test_on_a_machine_with_gpus_the_cpu_venv_is_not_put_on_path(repo, tmp_path):
    from helpers import fake_nvidia_smi

    smi = fake_nvidia_smi.install(tmp_path / "smi")
    env = _env(tmp_path, ("docker", "beaker"))
    env["PATH"] = f"{smi}{os.pathsep}{env['PATH']}"
    result = launch(repo, env, "--dry_run", "launch.sh")
    assert result.returncode == 0, result.stderr
    assert (
        f"{ME}this machine has NVIDIA GPUs: {repo}/.venv (the CPU stack) is not used; "
        "launch scripts run with the python on PATH"
    ) in result.stdout
    assert f"{repo}/.venv/bin/python ('uv run' included)" not in result.stdout


def test_its_dry_run_of_multi_node_shows_the_spec_with_the_image_it_builds_and_this_repos_trainer(tmp_path):
    """`build_image_and_launch.sh --dry_run scripts/multi_node.sh` in this checkout, with stand-in CLIs: the launch
    script honours DRY_RUN, so it runs and mason.py prints the spec it would submit, on the image just named."""
    import yaml

    env = _env(tmp_path, ("docker", "beaker"))
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), "/usr/bin", "/bin"])  # .venv from the checkout
    result = launch(REPO, env, "--dry_run", "scripts/multi_node.sh", "--seed", "3")
    assert result.returncode == 0, result.stderr
    image = "alice/" + result.stdout.split("; image name: ", 1)[1].split()[0]
    assert image.endswith("-cuda13")
    assert f"running (its own dry run: the spec, nothing submitted): DRY_RUN=1 IMAGE={image}" in result.stdout
    after = result.stdout[result.stdout.index("# beaker experiment create") :]
    spec = yaml.safe_load(after[: after.index(f"\n{ME}")])
    (task,) = spec["tasks"]
    assert task["image"] == {"beaker": image} and task["replicas"] == 2
    (command,) = task["arguments"]
    assert "&& python open_instruct/grpo_fast.py " in command and command.endswith("--seed 3")
    assert "hamishivi/open_instruct" not in result.stdout  # open-instruct's image is named nowhere
    assert "not submitting (--dry_run)" in result.stderr
    assert [call[:3] for call in cli_calls(tmp_path)][:2] == [
        ["beaker", "account", "whoami"],
        ["beaker", "image", "get"],
    ]
    assert not [call for call in cli_calls(tmp_path) if call[:3] == ["beaker", "experiment", "create"]]
