#!/usr/bin/env bash
# Every benchmark of the README on this machine, in order, writing JSON and PNGs under output/bench/:
#   weight_sync.json  pause vs model size      replay/     engines-only replay, response-length sweep
#   e2e/          sync vs one-step vs streaming (+ measured.json)    simulator/  fitted model + cluster projection
# Hardware: a 2-core x86_64 Linux machine, no GPU (about 25 minutes). Sets up .venv first when needed.
# Usage: bash scripts/cpu_benchmarks.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup_env.sh
export TOKENIZERS_PARALLELISM=false
py=.venv/bin/python
$py -m open_instruct.benchmark_weight_sync --output output/bench/weight_sync.json
$py -m open_instruct.benchmark_replay --output output/bench/replay
$py -m open_instruct.benchmark_e2e --steps 24 --output output/bench/e2e
$py -m open_instruct.simulator --measured output/bench/e2e/measured.json --output output/bench/simulator
