#!/usr/bin/env bash
# Async GRPO on one 8-GPU machine, no scheduler: a 7B reasoning model on ORZ math with 8k-token responses.
# What: python open_instruct/grpo_fast.py ... directly; it starts its own Ray on this machine (no
# ray_node_setup.sh, no mason.py, no Beaker) and checks its stack first (a CPU torch or an old driver is one line).
# Hardware: one machine with 8 NVIDIA GPUs of 80 GB (A100/H100), driver >= 580 for the CUDA 13 stack; the GPU
# environment active (docs/install.md; `bash scripts/gpu_check.sh` first on a new machine).
# Usage: bash scripts/single_node.sh [extra grpo_fast.py flags, which override the ones below...]
# The split: 4 DeepSpeed learners (ZeRO-2) + 4 vLLM engines of 1 GPU each (tensor parallel 1) = 8 GPUs.
#   Learners: a 7B's fp32 master weights and Adam moments (12 bytes a parameter, 84 GB) are sharded over the
#     ranks; over 4 ranks each holds 21 GB of them next to the bf16 weights (15 GB) and a 10k-token pack's
#     activations and logits, inside 80 GB. Fewer ranks leave too little room; more take GPUs from generation.
#   Engines: the 7B fits one GPU with room for the KV cache, so tensor parallel 1: four independent engines
#     generate about four times one engine's tokens, with no all-reduce per layer (tensor parallel 2 only
#     when the model or its KV cache does not fit one GPU). 8k-token answers make generation the larger cost;
#     streaming keeps the learners busy on finished samples meanwhile (docs/benchmarks.md).
#   A smaller model (1.5B: --model_name_or_path ... --num_learners_per_node 2 --vllm_num_engines 6) moves GPUs
#   to generation; a 14B+ wants --deepspeed_stage 3 and --vllm_tensor_parallel_size 2.
# Environment (all optional):
#   PYTHON      interpreter of the GPU environment (default: python, the active environment's)
#   MODEL       hub model or local path (default: hamishivi/qwen2_5_openthoughts2, a 7B); CHAT_TEMPLATE (tulu_thinker)
#   TRAIN_MIX   NAME WEIGHT pairs for --dataset_mixer_list (default: the ORZ math mix of multi_node.sh)
#   OUTPUT_DIR  metrics.jsonl and checkpoints (default: output/single_node)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python_bin="${PYTHON:-python}"
model="${MODEL:-hamishivi/qwen2_5_openthoughts2}"
chat_template="${CHAT_TEMPLATE:-tulu_thinker}"
train_mix="${TRAIN_MIX:-hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0}"
output_dir="${OUTPUT_DIR:-output/single_node}"

export TOKENIZERS_PARALLELISM=false VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
export NCCL_CUMEM_ENABLE="${NCCL_CUMEM_ENABLE:-0}"  # the learner -> vLLM broadcast is slow and can hang with cuMem
# ${train_mix} is unquoted on purpose: NAME WEIGHT pairs become separate arguments.
# shellcheck disable=SC2086
exec "$python_bin" open_instruct/grpo_fast.py \
  --exp_name single_node_8gpu \
  --output_dir "$output_dir" \
  --model_name_or_path "$model" \
  --chat_template_name "$chat_template" \
  --dataset_mixer_list $train_mix \
  --dataset_mixer_list_splits train \
  --dataset_mixer_eval_list hamishivi/tulu_3_rewritten_100k 32 \
  --dataset_mixer_eval_list_splits train \
  --max_prompt_token_length 2048 \
  --response_length 8192 \
  --pack_length 10240 \
  --stop_strings "</answer>" \
  --non_stop_penalty False \
  --temperature 1.0 \
  --ground_truths_key ground_truth \
  --sft_messages_key messages \
  --beta 0.0 \
  --num_samples_per_prompt_rollout 16 \
  --num_unique_prompts_rollout 32 \
  --num_mini_batches 1 \
  --num_epochs 1 \
  --learning_rate 5e-7 \
  --lr_scheduler_type constant \
  --per_device_train_batch_size 1 \
  --kl_estimator kl3 \
  --total_episodes 512000 \
  --deepspeed_stage 2 \
  --num_learners_per_node 4 \
  --vllm_num_engines 4 \
  --vllm_tensor_parallel_size 1 \
  --apply_verifiable_reward true \
  --seed 1 \
  --num_evals 5 \
  --save_freq 100 \
  --gradient_checkpointing \
  --vllm_enable_prefix_caching \
  --clip_higher 0.28 \
  --mask_truncated_completions True \
  "$@"
