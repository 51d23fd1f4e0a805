#!/usr/bin/env bash
# A small real async GRPO run on one machine: a 0.5B hub model on a gsm8k-style mix (rows with `messages`,
# `ground_truth` and `dataset` = gsm8k, scored by the gsm8k verifier), 1 vLLM engine + 1 DeepSpeed learner.
# What: python open_instruct/grpo_fast.py ... directly (no mason.py, no Beaker, a private local Ray cluster).
# Hardware: one machine with 1 NVIDIA GPU (24 GB or more; engine and learner share it: --single_gpu_mode,
# and --vllm_gpu_memory_utilization 0.4 leaves the learner the rest). Needs the GPU stack active (docs/install.md;
# not scripts/setup_env.sh's .venv, the CPU stack: the trainer stops with one line if it finds a CPU build next to
# the GPU) and network access to the HF hub.
# Usage: bash scripts/single_gpu.sh [extra grpo_fast.py flags, which override the ones below...]
# Environment (all optional):
#   MODEL       hub model or local path (default: Qwen/Qwen2.5-0.5B)
#   DATASET     gsm8k-style hub dataset (default: ai2-adapt-dev/rlvr_gsm8k_zs; train split)
#   OUTPUT_DIR  where metrics.jsonl and checkpoints go (default: output/single_gpu)
#   PYTHON      interpreter of the GPU environment (default: python, the active environment's)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python_bin="${PYTHON:-python}"
model="${MODEL:-Qwen/Qwen2.5-0.5B}"
dataset="${DATASET:-ai2-adapt-dev/rlvr_gsm8k_zs}"
output_dir="${OUTPUT_DIR:-output/single_gpu}"

export TOKENIZERS_PARALLELISM=false
exec "$python_bin" open_instruct/grpo_fast.py \
  --exp_name single_gpu_gsm8k \
  --output_dir "$output_dir" \
  --model_name_or_path "$model" \
  --chat_template_name tulu_thinker \
  --dataset_mixer_list "$dataset" 1.0 \
  --dataset_mixer_list_splits train \
  --dataset_mixer_eval_list "$dataset" 32 \
  --dataset_mixer_eval_list_splits train \
  --max_prompt_token_length 512 \
  --response_length 1024 \
  --pack_length 2048 \
  --stop_strings "</answer>" \
  --temperature 1.0 \
  --num_unique_prompts_rollout 16 \
  --num_samples_per_prompt_rollout 8 \
  --total_episodes 12800 \
  --vllm_num_engines 1 \
  --vllm_tensor_parallel_size 1 \
  --vllm_gpu_memory_utilization 0.4 \
  --single_gpu_mode \
  --num_learners_per_node 1 \
  --deepspeed_stage 2 \
  --per_device_train_batch_size 1 \
  --gradient_checkpointing \
  --learning_rate 1e-6 \
  --lr_scheduler_type constant \
  --beta 0.0 \
  --clip_higher 0.28 \
  --apply_verifiable_reward true \
  --seed 1 \
  "$@"
