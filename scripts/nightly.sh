#!/usr/bin/env bash
# The long tier, which CI does not run: tests/nightly (every benchmark in smoke mode, its JSON contract and
# pages checked, and the real-stack runs CI leaves out: the launch scripts end to end, the rarer faults,
# variants of what CI checks on another path; docs/development.md lists them), a 3,000-step soak of the real
# stack (memory and queue gauges must level off), every benchmark at full size (docs/benchmarks.md), and the
# container image built from the Dockerfile's CPU variant and run (scripts/image_check.sh, docs/image.md).
# Hardware: the 2-core CPU machine is enough; about 12 minutes for the soak, 80 for the benchmarks (the sum of
# their parts measured on 2026-12-04; not timed as a whole) and 13 for the image (2026-12-06); the image check
# needs root. Sets up .venv first when needed.
# Usage: bash scripts/nightly.sh    (outputs under output/nightly/)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup_env.sh
bash scripts/test.sh tests/nightly
.venv/bin/python scripts/soak.py --steps 3000 --output_dir output/nightly/soak
OUT=output/nightly/bench bash scripts/cpu_benchmarks.sh
# Reuses its Debian base and image store under output/image_check/ between nights.
bash scripts/image_check.sh
