"""The container image's recipe, checked without building it: the Dockerfile, .dockerignore, and
scripts/image_check.sh (which builds the CPU variant for real, in the nightly tier: docs/image.md).

What: the Dockerfile's build arguments and stages (CUDA 12.8 and 13.0 bases, a CPU base, one shared stage for
every variant so they differ only in base and lock), the repo at /stage, /opt/venv first on PATH, GIT_COMMIT
and GIT_BRANCH recorded; its install step, run as a shell command against a stand-in install_locked.sh and
python3, asks for the right lock per variant and refuses an unknown STACK in one line; the pip configuration
arrives as build secrets. .dockerignore keeps environments and outputs out and what the image runs in.
image_check.sh refuses an unknown argument in one line and its --dry-run prints the build and the three
checks (imports, --preflight, 2 training steps on the embedded default) without running anything.
Run: `.venv/bin/pytest tests/unit/test_image.py` (a few seconds, no network, no root).
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line of the Dockerfile, continuations joined, comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current.strip())
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def stages() -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """(FROM argument, stage name or None, instructions) per stage."""
    out = []
    for op, args in instructions():
        if op == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            out.append((parts[0], name, []))
        elif out:
            out[-1][2].append((op, args))
    return out


def global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    found = {}
    for op, args in instructions():
        if op == "FROM":
            break
        if op == "ARG":
            name, _, default = args.partition("=")
            found[name] = default.strip('"')
    return found


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)


def resolve_base(overrides: dict[str, str]) -> str:
    """The image the final stage starts from for these build arguments (stage aliases followed)."""
    values = {**global_args(), **overrides}
    named = {name: expand(base, values) for base, name, _ in stages() if name}
    base = expand(stages()[-1][0], values)
    while base in named:
        base = named[base]
    return base


def test_build_arguments_and_their_defaults():
    args = global_args()
    assert args["CUDA_VERSION"] == "13"  # the locked GPU stack is CUDA 13
    assert args["STACK"] == "gpu"
    assert "BASE_IMAGE" in args
    later = {args.split("=")[0] for op, args in instructions() if op == "ARG"}
    assert {"GIT_COMMIT", "GIT_BRANCH"} <= later


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, r"nvidia/cuda:13\.0\.\d+-cudnn-devel-ubuntu\d+\.\d+"),
        ({"CUDA_VERSION": "13"}, r"nvidia/cuda:13\.0\.\d+-cudnn-devel-ubuntu\d+\.\d+"),
        ({"CUDA_VERSION": "12"}, r"nvidia/cuda:12\.8\.\d+-cudnn-devel-ubuntu\d+\.\d+"),
        ({"STACK": "cpu"}, r"debian:bookworm"),
        ({"STACK": "cpu", "BASE_IMAGE": "localhost/mine:1"}, r"localhost/mine:1"),
        ({"STACK": "cpu", "CUDA_VERSION": "12", "BASE_IMAGE": "ubuntu:24.04"}, r"ubuntu:24\.04"),
    ],
)
def test_each_variant_starts_from_its_base(overrides, expected):
    assert re.fullmatch(expected, resolve_base(overrides))


def test_the_variants_share_every_step_after_the_base():
    *selectors, final = stages()
    # Every stage but the last is a bare FROM: nothing a variant runs can differ except the base and (below)
    # the lock its STACK and CUDA_VERSION name.
    assert all(not body for _, _, body in selectors), [name for _, name, body in selectors if body]
    assert final[1] is None and "${STACK}" in final[0] and "${CUDA_VERSION}" in final[0]


def test_repo_at_stage_and_the_environment_first_on_path():
    body = stages()[-1][2]
    assert ("WORKDIR", "/stage") in body
    assert ("COPY", ". /stage") in body
    env = " ".join(args for op, args in body if op == "ENV")
    assert "VIRTUAL_ENV=/opt/venv" in env
    assert re.search(r"PATH=/opt/venv/bin:\$PATH", env)
    assert "GIT_COMMIT=${GIT_COMMIT}" in env and "GIT_BRANCH=${GIT_BRANCH}" in env


def install_step() -> str:
    (run,) = [args for op, args in stages()[-1][2] if op == "RUN" and "install_locked.sh" in args]
    return run


def test_the_pip_configuration_arrives_as_build_secrets_not_layers():
    run = install_step()
    assert "--mount=type=secret,id=pip_conf,target=/etc/pip.conf" in run
    assert "--mount=type=secret,id=pip_ca" in run
    assert not [args for op, args in instructions() if op in ("COPY", "ADD") and "pip" in args]


def run_install_step(tmp_path: Path, stack: str, cuda: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The install RUN's shell command in a folder laid out as /stage, with stand-ins for python3 (records its
    argv) and scripts/install_locked.sh (records the lock and $PYTHON)."""
    shell = re.sub(r"--mount=\S+\s*", "", install_step()).strip()
    bin_dir, stage = tmp_path / "bin", tmp_path / "stage"
    (stage / "scripts").mkdir(parents=True)
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {log}\n')
    (stage / "scripts" / "install_locked.sh").write_text(f'echo "install_locked.sh $* PYTHON=$PYTHON" >> {log}\n')
    (bin_dir / "python3").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STACK": stack,
        "CUDA_VERSION": cuda,
        "VIRTUAL_ENV": "/opt/venv",
    }
    result = subprocess.run(["bash", "-c", shell], cwd=stage, env=env, capture_output=True, text=True)
    return result, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(
    ("stack", "cuda", "lock"), [("cpu", "13", "cpu"), ("gpu", "13", "gpu-cu13"), ("gpu", "12", "gpu-cu12")]
)
def test_the_install_step_installs_the_variants_lock_into_opt_venv(tmp_path, stack, cuda, lock):
    result, calls = run_install_step(tmp_path, stack, cuda)
    assert result.returncode == 0, result.stderr
    assert calls == ["python3 -m venv /opt/venv", f"install_locked.sh {lock} --exact PYTHON=/opt/venv/bin/python"]


def test_the_install_step_refuses_an_unknown_stack_in_one_line(tmp_path):
    result, calls = run_install_step(tmp_path, "tpu", "13")
    assert result.returncode != 0 and calls == []
    assert result.stderr.strip() == "Dockerfile: STACK must be gpu or cpu, not 'tpu'"


def test_the_locks_the_default_variants_install_exist():
    assert (REPO / "scripts" / "install_locked.sh").is_file()
    for lock in ("cpu", "gpu-cu13"):
        assert (REPO / "locks" / f"{lock}.txt").is_file(), lock


def dockerignored(path: str) -> bool:
    """Whether the build context leaves `path` out: .dockerignore's patterns, last match wins, a pattern
    matching a folder leaves out everything under it, `**/` matches at any depth."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate, pattern = pattern.startswith("!"), pattern.lstrip("!")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts) or any(
                fnmatch.fnmatchcase(prefix, pattern[3:]) for prefix in prefixes
            )
        else:
            hit = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)
        if hit:
            ignored = not negate
    return ignored


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".venv",
        "sub/.venv/lib/x.py",
        ".venv-gpu/bin/python",
        "output/image_check/storage/x",
        "open_instruct/__pycache__/x.pyc",
        ".git/HEAD",
        "wandb/run/x",
    ],
)
def test_dockerignore_keeps_environments_and_outputs_out(path):
    assert dockerignored(path)


@pytest.mark.parametrize(
    "path",
    [
        "open_instruct/grpo_fast.py",
        "open_instruct/ds_configs/zero2.json",
        "code_server/__init__.py",
        "pyproject.toml",
        "locks/cpu.txt",
        "scripts/install_locked.sh",
        "configs/beaker_configs/ray_node_setup.sh",
        "mason.py",
        "scripts/gpu_check.sh",
        "benchmarks/zero3_memory.py",  # gpu_check.sh runs it from the working directory: it is not installed
    ],
)
def test_dockerignore_keeps_what_the_image_runs(path):
    assert not dockerignored(path)


def image_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMAGE_CHECK")}
    env.update(IMAGE_CHECK_DIR=str(tmp_path / "work"), PYTHON=sys.executable)
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "image_check.sh"), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_image_check_refuses_an_unknown_argument_in_one_line(tmp_path):
    result = image_check(tmp_path, "--build-only")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "image_check.sh: unknown argument '--build-only' (usage: bash scripts/image_check.sh [--dry-run])"
    ]


def test_image_check_dry_run_prints_the_build_and_the_checks_and_runs_nothing(tmp_path):
    result = image_check(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    (build,) = [line for line in commands if " bud " in line]
    for part in ("--isolation chroot", "--storage-driver vfs", "--pull=never", "--build-arg STACK=cpu", "id=pip_conf"):
        assert part in build, part
    runs = [line for line in commands if " run " in line]
    assert len(runs) == 3
    assert "import grpo_fast" in runs[0]
    assert "open_instruct/grpo_fast.py --preflight" in runs[1].replace("\\ ", " ")
    train = runs[2].replace("\\ ", " ")
    assert "open_instruct/grpo_fast.py --max_train_steps 2" in train
    assert "--model_name_or_path" not in train and "--dataset_mixer_list" not in train  # the embedded default
    assert "image_check.sh: total" in result.stdout
    # Nothing was made: no base, no image store.
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []


def test_the_nightly_tier_runs_the_image_check():
    assert "bash scripts/image_check.sh" in (REPO / "scripts" / "nightly.sh").read_text()
