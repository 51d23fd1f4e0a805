#!/usr/bin/env bash
# Runs the lint gate (ruff check + ruff format --check) and the whole test suite (unit + slow integration
# tests with real vLLM, Ray and DeepSpeed) on CPU.
# Hardware: a 2-core x86_64 Linux machine is enough. Sets up .venv first when needed.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast subset.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup_env.sh
# The lint gate (rules in pyproject.toml): fails before any test runs.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
export RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false
# Two test files at a time (TEST_WORKERS=1: one): a real-stack test spends most of its time on one core
# (imports, process starts, waits), so the second core runs another file. Whole files per worker keep a
# module's shared engines and runs in one process.
workers="${TEST_WORKERS:-2}"
parallel=()
# --no-loadscope-reorder: keep tests/conftest.py's longest-first order (xdist would start the files with the
# most tests first, which leaves the few-but-long fault and training files for the end).
if [[ "$workers" != "1" ]]; then parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
exec .venv/bin/python -m pytest tests -p no:cacheprovider --durations=15 "${parallel[@]}" "$@"
