"""scripts/install_locked.sh: exactly a lock's packages into $PYTHON's environment, from where pip is told to look.

What: a copy of the script in a tmp repo with a tiny lock (locks/tiny.txt) and a tiny project, run against a real
venv with pip's local configuration ignored (PIP_CONFIG_FILE=/dev/null, its index on a closed local port) and
PIP_FIND_LINKS naming a folder of stand-in wheels: what pip's configuration names is where packages come from.
The locked version wins over a newer one, marker lines apply only where true, the repo goes in editable, --exact
removes what the lock does not name, and a failure is one line naming the step.
Run: `.venv/bin/pytest tests/unit/test_install_locked.py` (about 40 s on the 2-core machine, no network).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _closed_port_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/simple"


def _wheel(folder: Path, name: str, version: str) -> None:
    """A pure-Python wheel holding one module named after the package: pip installs it in a second."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f'VERSION = "{version}"\n',
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


# The tiny project's in-tree build backend: an editable wheel holding a .pth to the repo. The real repo builds with
# setuptools and wheel from its lock; a stand-in for those cannot build, and real ones would need the network.
BACKEND = """
import pathlib, zipfile

DIST = "open_instruct-0.0.1.dist-info"


def get_requires_for_build_editable(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = "open_instruct-0.0.1-py3-none-any.whl"
    files = {
        "open_instruct.pth": str(pathlib.Path.cwd()) + "\\n",
        DIST + "/METADATA": "Metadata-Version: 2.1\\nName: open_instruct\\nVersion: 0.0.1\\n",
        DIST + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    files[DIST + "/RECORD"] = "".join(path + ",,\\n" for path in [*files, DIST + "/RECORD"])
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / name, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return name
"""


def _repo(tmp_path: Path, lock: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "locks").mkdir()
    shutil.copy2(REPO / "scripts" / "install_locked.sh", repo / "scripts" / "install_locked.sh")
    (repo / "locks" / "tiny.txt").write_text(lock)
    (repo / "backend.py").write_text(BACKEND)
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "open_instruct"\nversion = "0.0.1"\n'
    )
    return repo


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """One venv for the module (making one with pip takes seconds): no test depends on what another left."""
    env = tmp_path_factory.mktemp("env")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    return env / "bin" / "python"


def _pip_env(wheels: Path, python: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=_closed_port_url(),
        PIP_FIND_LINKS=str(wheels),
        PIP_RETRIES="0",
        PIP_TIMEOUT="2",
        PIP_NO_CACHE_DIR="1",
        PYTHON=str(python),
    )
    return env


def install(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(repo / "scripts" / "install_locked.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def installed(python: Path) -> dict[str, str]:
    probe = "import importlib.metadata as m\nfor d in m.distributions(): print(d.metadata['Name'] + '==' + d.version)"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(line.split("==") for line in out.split())


def test_installs_the_locked_versions_from_pips_sources_then_the_repo_and_exact_removes_the_rest(tmp_path, python):
    lock = (
        "# a comment\nalpha==1.0  # via something\n"
        "beta==2.0 ; python_version < '3'\ngamma==3.0 ; sys_platform == 'linux'\n"
    )
    repo = _repo(tmp_path, lock)
    wheels = tmp_path / "wheels"
    for name, version in [("alpha", "1.0"), ("alpha", "2.0"), ("gamma", "3.0"), ("delta", "1.0")]:
        _wheel(wheels, name, version)
    env = _pip_env(wheels, python)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "delta==1.0"], env=env, check=True, timeout=120)

    result = install(repo, env, "tiny")
    assert result.returncode == 0, result.stderr
    have = installed(python)
    # the pin, not the newest; beta's marker is false here, so no source is asked for it
    assert have["alpha"] == "1.0" and have["gamma"] == "3.0" and "beta" not in have
    assert have["open_instruct"] == "0.0.1"  # the repo, editable, after the lock
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("install_locked.sh: 2 packages at the locked versions; ")
    assert "delta" in last  # a package the lock does not name stays, and is named

    exact = install(repo, env, "tiny", "--exact")
    assert exact.returncode == 0, exact.stderr
    assert "install_locked.sh: removing what locks/tiny.txt does not name: delta" in exact.stdout
    have = installed(python)
    assert "delta" not in have and have["alpha"] == "1.0" and "open_instruct" in have
    assert exact.stdout.strip().splitlines()[-1] == "install_locked.sh: 2 packages at the locked versions"


def test_the_installed_modules_are_compiled_as_pip_would(tmp_path, python):
    """pip installs without compiling and the script compiles the environment on every core: the bytecode is
    there before any import (PYTHONDONTWRITEBYTECODE, set on some machines, would keep an import from writing it)."""
    repo = _repo(tmp_path, "alpha==1.0\n")
    wheels = tmp_path / "wheels"
    _wheel(wheels, "alpha", "1.0")
    env = _pip_env(wheels, python)
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", "alpha"], env=env, timeout=120)
    for stale in (site / "__pycache__").glob("alpha.*.pyc"):
        stale.unlink()
    result = install(repo, {**env, "PYTHONDONTWRITEBYTECODE": "1"}, "tiny")
    assert result.returncode == 0, result.stderr
    assert list((site / "__pycache__").glob("alpha.*.pyc"))


def test_a_pin_no_source_serves_fails_in_one_line_naming_the_step(tmp_path, python):
    repo = _repo(tmp_path, "alpha==9.9\n")
    wheels = tmp_path / "wheels"
    _wheel(wheels, "alpha", "1.0")
    result = install(repo, _pip_env(wheels, python), "tiny")
    assert result.returncode != 0
    assert (
        result.stderr.strip().splitlines()[-1]
        == "install_locked.sh: FAILED during: install locks/tiny.txt (1 pins) (see the pip output above)"
    )
    assert "Traceback" not in result.stderr


def test_a_wrong_stack_or_python_is_one_line(tmp_path):
    repo = _repo(tmp_path, "alpha==1.0\n")
    env = _pip_env(tmp_path, Path(sys.executable))
    for args, message in [
        (("gpu-cu11",), "install_locked.sh: no lock for stack 'gpu-cu11': the locked stacks are: tiny"),
        ((), "install_locked.sh: usage: bash scripts/install_locked.sh STACK [--exact]; the locked stacks are: tiny"),
        (
            ("tiny", "--all"),
            "install_locked.sh: usage: bash scripts/install_locked.sh STACK [--exact]; the locked stacks are: tiny",
        ),
    ]:
        result = install(repo, env, *args)
        assert result.returncode != 0 and result.stderr.strip().splitlines() == [message]
    result = install(repo, {**env, "PYTHON": str(tmp_path / "nope" / "python")}, "tiny")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"install_locked.sh: cannot run {tmp_path}/nope/python (PYTHON=/path/to/env/bin/python names the environment)"
    ]
