#!/usr/bin/env bash
# Builds the GPU kit's wheelhouse, scripts/gpu_kit/wheelhouse/ (gitignored): every package the kit's checks
# need beyond torch, at the GPU lock's versions (scripts/gpu_kit/wheelhouse.py requirements), as manylinux
# x86_64 or pure-python wheels for each Python in KIT_PYTHONS, downloaded with `pip download --no-deps`;
# deepspeed, which PyPI has as a source archive only, is built here into a pure-python wheel (no compiled ops:
# the learner uses torch's AdamW). Fails when the result is over the 64 MiB a borrowed GPU machine takes.
# Hardware: any x86_64 Linux machine with the network to PyPI (not the GPU machine).
# Usage: bash scripts/gpu_kit/build_wheelhouse.sh
# Environment: PYTHON (default .venv/bin/python: it needs pip, setuptools and torch to build deepspeed's wheel);
# KIT_PYTHONS (default "3.11 3.12", the GPU machines' Pythons).
set -euo pipefail

kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$kit/../.." && pwd)"
python_bin="${PYTHON:-$repo/.venv/bin/python}"
pythons="${KIT_PYTHONS:-3.11 3.12}"
wheelhouse="$kit/wheelhouse"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

rm -rf "$wheelhouse"
mkdir -p "$wheelhouse"
mapfile -t requirements < <("$python_bin" "$kit/wheelhouse.py" requirements)
for version in $pythons; do
  wanted=()
  for requirement in "${requirements[@]}"; do
    name_version="${requirement%%;*}"
    [[ "${name_version%%==*}" == deepspeed ]] && continue
    # the lock's markers are python_full_version ones: keep the line that holds for this Python
    if [[ "$requirement" == *";"* ]] && ! "$python_bin" -c 'import sys; from packaging.markers import Marker
sys.exit(not Marker(sys.argv[1]).evaluate({"python_full_version": sys.argv[2] + ".0", "python_version": sys.argv[2]}))' \
        "${requirement#*;}" "$version"; then
      continue
    fi
    wanted+=("$name_version")
  done
  "$python_bin" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheelhouse" \
    --python-version "$version" --implementation cp --abi "cp${version/./}" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any "${wanted[@]}"
done
deepspeed="$(printf '%s\n' "${requirements[@]}" | grep '^deepspeed==')"
"$python_bin" -m pip download --quiet --no-deps --no-binary=:all: --dest "$work" "$deepspeed"
DS_BUILD_OPS=0 "$python_bin" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$wheelhouse" \
  "$work"/deepspeed-*.tar.gz
bytes="$(du -cb "$wheelhouse"/*.whl | tail -1 | cut -f1)"
echo "gpu_kit: $(ls "$wheelhouse" | wc -l) wheels in $wheelhouse, $(( bytes / 1048576 )) MiB ($bytes bytes; limit 64 MiB)"
(( bytes <= 64 * 1048576 )) || { echo "gpu_kit: over the 64 MiB a borrowed machine takes" >&2; exit 1; }
