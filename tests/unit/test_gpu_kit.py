"""The GPU kit (scripts/gpu_kit/) for a GPU machine with torch but no vLLM, Ray or network: what its wheelhouse
holds (from the GPU lock), which wheels an interpreter takes, and its dry run. Its CPU run is in
tests/nightly/test_gpu_path_on_cpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts.gpu_kit import wheelhouse

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "scripts" / "gpu_kit"


def test_the_wheelhouse_holds_what_the_checks_import_beyond_torch_at_the_gpu_locks_versions():
    lock = (REPO / "locks" / "gpu-cu13.txt").read_text()
    packages = {name: version for name, version, _ in wheelhouse.kit_packages(lock)}
    pinned = {name: version for name, version, _, _ in wheelhouse.parse_lock(lock)}
    for root in wheelhouse.ROOTS:
        assert packages[root] == pinned[root], root
    assert {"numpy", "pydantic", "pydantic-core", "regex", "pyyaml", "hjson", "py-cpuinfo"} <= set(packages)
    # torch and what it brings come with the machine; vLLM's and Ray's worlds are not needed
    assert not {"torch", "triton", "sympy", "networkx", "jinja2", "filelock", "fsspec"} & set(packages)
    assert not [n for n in packages if n.startswith(("nvidia-", "cuda-", "vllm", "ray"))]
    assert not set(wheelhouse.LEFT_OUT) & set(packages)


def test_an_interpreter_takes_the_wheels_of_its_python_abi3_and_pure_ones_on_x86_64_linux():
    def fits(name, version=(3, 12)):
        return wheelhouse.wheel_fits(name, version, "x86_64")

    assert fits("numpy-2.3.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
    assert not fits("numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
    assert fits("tokenizers-0.23.3-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert not fits("tokenizers-0.23.3-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", (3, 9))
    assert fits("transformers-5.19.0-py3-none-any.whl") and fits("shellingham-1.5.4-py2.py3-none-any.whl")
    assert not wheelhouse.wheel_fits("x-1-cp312-cp312-manylinux_2_28_aarch64.whl", (3, 12), "x86_64")


def test_the_wheelhouse_check_names_what_is_missing_for_this_python_and_the_size(tmp_path):
    mine = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    (tmp_path / "numpy-2.3.5-cp30-cp30-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    (tmp_path / f"regex-1-{mine}-{mine}-manylinux_2_28_x86_64.whl").write_bytes(b"x")

    def run(*args):
        return subprocess.run([sys.executable, str(KIT / "wheelhouse.py"), *args], capture_output=True, text=True)

    result = run("check", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip().endswith(f"no wheel for Python 3.{sys.version_info[1]} of numpy")
    (tmp_path / "numpy-2.3.5-cp30-cp30-manylinux_2_28_x86_64.whl").unlink()
    result = run("check", str(tmp_path))
    assert result.returncode == 0 and "0.0 MiB (limit 64), 1 packages" in result.stdout
    assert run("files", str(tmp_path)).stdout.strip().endswith("manylinux_2_28_x86_64.whl")
    missing = run("check", str(tmp_path / "none"))
    assert missing.returncode == 1 and "build_wheelhouse.sh" in missing.stderr


def kit(*args: str, python: str = sys.executable, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("KIT_VENV", "CHECK_TIMEOUT_S")}
    return subprocess.run(
        ["bash", str(KIT / "run.sh"), *args],
        env={**env, "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_kit_dry_run_lists_each_check_where_it_runs_and_what_it_asserts():
    """With an interpreter that already holds the packages (ours), nothing is installed; every check is listed."""
    result = kit("--dry_run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no install" in result.stdout and "0 check(s) failed" in result.stdout
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if " PLAN " in line}
    assert list(rows) == ["cuda_ipc", "lora_bf16", "learner_step", "zero3_memory"]
    assert "runs on CUDA only" in rows["cuda_ipc"] and "BF16_Optimizer" in rows["lora_bf16"]
    assert "full fine-tuning against LoRA" in rows["learner_step"] and "ZeRO-3" in rows["zero3_memory"]


def test_the_kit_refuses_an_interpreter_without_torch_in_one_line():
    base = Path(sys.base_prefix) / "bin" / "python3"
    result = kit("--dry_run", python=str(base))
    if "does not import torch" not in result.stderr:  # a base interpreter with torch: nothing to refuse here
        assert result.returncode == 0
        return
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert kit("--bogus").stderr.strip().startswith("gpu_kit: unknown argument --bogus")
