#!/usr/bin/env bash
# Runs the lint gate (ruff check + ruff format --check) and the whole test suite (unit + slow integration
# tests with real vLLM, Ray and DeepSpeed) on CPU.
# Hardware: a 2-core x86_64 Linux machine is enough. Sets up .venv first when needed.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit` (or `-m "not slow"`) for the unit tier;
# a path among them replaces the default `tests/unit tests/integration` (CI's two tiers; `tests/nightly`, the
# benchmarks' smoke runs, is run by name, by scripts/nightly.sh).
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
# CI's tiers unless a path (tests/unit, a file, a node id) is among the arguments; an option's value is not
# one (--deselect tests/unit/test_loss.py::test_x still runs the rest of the suite).
paths=(tests/unit tests/integration)
previous=""
for arg in "$@"; do
  case "$previous" in
    --deselect | --ignore | --ignore-glob | --basetemp | --rootdir | --confcutdir | -c | --junitxml | --junit-xml) ;;
    *) if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then paths=(); fi ;;
  esac
  previous="$arg"
done
exec .venv/bin/python -m pytest "${paths[@]}" -p no:cacheprovider --durations=15 "${parallel[@]}" "$@"
