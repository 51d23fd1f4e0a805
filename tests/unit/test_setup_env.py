"""scripts/setup_env.sh on a machine whose pip reaches only what it is told to: where the locked CPU torch
comes from, a failure that is one line naming the index it tried, and a GPU environment it never replaces.

What: a copy of the script (with pyproject.toml, locks/cpu.txt and scripts/install_locked.sh) in a tmp repo
runs with pip's local configuration ignored (PIP_CONFIG_FILE=/dev/null, no PIP_* variables of the caller) and
its index on a closed local port, so nothing is reachable unless a test serves it: a tiny stand-in wheel named
torch 2.13.0+cpu, from a local wheel dir (pip's configured sources) or a local PEP 503 index
(OPEN_INSTRUCT_TORCH_INDEX, the fallback).
The script creates a real venv; every run stops at the first step that needs the network it lacks (the lock's
build tools, through install_locked.sh). A .venv holding a CUDA torch (a stand-in dist-info and torch/version.py)
is refused before anything is installed.
Run: `.venv/bin/pytest tests/unit/test_setup_env.py` (about 50 s on the 2-core machine, no network).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0+cpu"
# The first step after torch: install_locked.sh installs the lock's build tools, which no source here serves.
NEXT_STEP_FAILS = "setup_env.sh: FAILED during: install locks/cpu.txt (scripts/install_locked.sh)"
WHEEL = "torch-2.13.0+cpu-py3-none-any.whl"


def _closed_port_url(path: str) -> str:
    with socket.socket() as s:  # a port that was free a moment ago: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/{path}"


def _stand_in_torch_wheel(folder: Path) -> Path:
    """A pure-Python wheel with the pinned name and version: pip installs it in a second."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = "torch-2.13.0+cpu.dist-info"
    files = {
        "torch/__init__.py": '__version__ = "2.13.0+cpu"\n',
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / WHEEL, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return folder / WHEEL


def _local_index(root: Path) -> str:
    """A PEP 503 index serving only the stand-in torch, as a file:// URL."""
    _stand_in_torch_wheel(root / "torch")
    link = WHEEL.replace("+", "%2B")
    (root / "torch" / "index.html").write_text(f'<html><body><a href="{link}">{WHEEL}</a></body></html>\n')
    return root.as_uri()


def _repo_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "locks").mkdir()
    for name in ("scripts/setup_env.sh", "scripts/install_locked.sh", "pyproject.toml", "locks/cpu.txt"):
        shutil.copy2(REPO / name, repo / name)
    return repo


def run_setup(repo: Path, torch_index: str, **pip_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "OPEN_INSTRUCT_TORCH_INDEX"}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=_closed_port_url("simple"),
        PIP_RETRIES="0",
        PIP_TIMEOUT="2",
        PIP_NO_CACHE_DIR="1",
        PYTHON=sys.executable,
        OPEN_INSTRUCT_TORCH_INDEX=torch_index,
        **pip_env,
    )
    return subprocess.run(
        ["bash", str(repo / "scripts" / "setup_env.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _installed_torch(repo: Path) -> str:
    probe = [str(repo / ".venv" / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('torch'))"]
    return subprocess.run(probe, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_torch_from_pip_configured_sources_says_so_and_does_not_fall_back(tmp_path):
    repo = _repo_copy(tmp_path)
    wheels = _stand_in_torch_wheel(tmp_path / "wheels").parent
    result = run_setup(repo, _closed_port_url("whl/cpu"), PIP_FIND_LINKS=str(wheels))
    assert f"setup_env.sh: {TORCH} installed from pip's configured sources" in result.stdout
    assert "falling back" not in result.stdout + result.stderr
    assert _installed_torch(repo) == "2.13.0+cpu"
    # Nothing else is reachable: the next step fails, named.
    assert result.returncode != 0
    assert NEXT_STEP_FAILS in result.stderr


def test_torch_missing_from_configured_sources_comes_from_the_pytorch_cpu_index(tmp_path):
    repo = _repo_copy(tmp_path)
    index = _local_index(tmp_path / "pytorch_cpu_index")
    result = run_setup(repo, index)
    lines = result.stdout.splitlines()
    fallback = (
        f"setup_env.sh: {TORCH} is not available from pip's configured sources; "
        f"falling back to the PyTorch CPU index {index}"
    )
    assert fallback in lines
    assert lines[lines.index(fallback) + 1] == f"setup_env.sh: {TORCH} installed from the PyTorch CPU index {index}"
    assert _installed_torch(repo) == "2.13.0+cpu"
    assert result.returncode != 0 and NEXT_STEP_FAILS in result.stderr

    # Run again: the torch already in .venv is kept, no source is asked.
    again = run_setup(repo, _closed_port_url("whl/cpu"))
    assert f"setup_env.sh: {TORCH} already in .venv" in again.stdout
    assert "falling back" not in again.stdout


def test_nothing_reachable_fails_in_one_line_naming_the_pytorch_index(tmp_path):
    repo = _repo_copy(tmp_path)
    index = _closed_port_url("whl/cpu")
    result = run_setup(repo, index)
    assert result.returncode != 0
    assert f"falling back to the PyTorch CPU index {index}" in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"setup_env.sh: cannot install {TORCH}: ")
    assert f"the PyTorch CPU index {index} serves it" in last and "OPEN_INSTRUCT_TORCH_INDEX" in last
    assert "Traceback" not in result.stderr
    assert "FAILED during" not in result.stderr  # the one line is the last word, not the generic trap
    assert not (repo / ".venv" / ".open_instruct_setup").exists()


def test_a_venv_holding_a_cuda_torch_is_refused_in_one_line_and_left_as_it_is(tmp_path):
    repo = _repo_copy(tmp_path)
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "torch").mkdir()
    version_py = "__version__ = '2.14.0'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
    (site / "torch" / "version.py").write_text(version_py)
    (site / "torch-2.14.0.dist-info").mkdir()
    (site / "torch-2.14.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.14.0\n")
    before = sorted(path.relative_to(venv) for path in venv.rglob("*"))

    result = run_setup(repo, _closed_port_url("whl/cpu"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"setup_env.sh: {venv} holds a GPU build of torch (torch 2.14.0, CUDA 13.0): this script builds the CPU "
        "stack and would replace it; use that environment as it is (its bin/python, or activate it), or move it "
        "aside first (mv .venv .venv-gpu) to build the CPU stack here"
    ]
    assert sorted(path.relative_to(venv) for path in venv.rglob("*")) == before
    assert (site / "torch" / "version.py").read_text() == version_py
