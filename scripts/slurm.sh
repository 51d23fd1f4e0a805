#!/usr/bin/env bash
# Async GRPO on a Slurm cluster, submitted with sbatch: the 2-node layout of scripts/multi_node.sh (8 DeepSpeed
# learners on one node, 8 single-GPU vLLM engines on the other; 8k-token responses, ORZ math data).
# What: `srun --ntasks-per-node=1 bash scripts/node_launch.sh -- python open_instruct/grpo_fast.py ...`: on
# every node node_launch.sh maps SLURM_PROCID / SLURM_NNODES / the node list to the node rank, node count and
# head that configs/beaker_configs/ray_node_setup.sh reads and brings Ray up; rank 0 then runs the trainer.
# Hardware: Slurm, 2 nodes x 8 NVIDIA GPUs (the CUDA 13 stack needs driver >= 580), InfiniBand between them.
# Usage, from the repository's root (a filesystem every node mounts), with the GPU environment active:
#   sbatch scripts/slurm.sh [extra grpo_fast.py flags...]   # later flags win (e.g. --model_name_or_path)
#   sbatch --nodes 4 scripts/slurm.sh --num_learners_per_node 8 8 --vllm_num_engines 16   # more nodes
#SBATCH --job-name=open_instruct_grpo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=slurm-%j.out
# Environment (all optional; sbatch passes the submitting shell's environment to the job):
#   PYTHON         interpreter of the trainer on the nodes (default: python of the environment ray_node_setup.sh
#                  picks: the active one, $VIRTUAL_ENV, or the image's; never the repository's CPU .venv on GPUs)
#   OPEN_INSTRUCT_DIR  the repository on the nodes (default: $SLURM_SUBMIT_DIR, where sbatch ran)
#   SRUN_ARGS      more srun arguments, split on whitespace (a container: --container-image=... with pyxis)
#   MODEL          hub model (default: hamishivi/qwen2_5_openthoughts2); CHAT_TEMPLATE (tulu_thinker)
#   TRAIN_MIX      NAME WEIGHT pairs for --dataset_mixer_list (default: the ORZ math mix of multi_node.sh)
#   EXP_NAME       run name (default: slurm_<model>_<job id>); OUTPUT_DIR (default: output/<run name>)
#   NCCL_* RAY_*   as in scripts/node_launch.sh (NCCL over InfiniBand: docs/clusters.md)
set -euo pipefail

repo="${OPEN_INSTRUCT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"
if [[ ! -f "$repo/scripts/node_launch.sh" ]]; then
  echo "slurm.sh: $repo is not this repository (no scripts/node_launch.sh): sbatch from its root or set OPEN_INSTRUCT_DIR" >&2
  exit 2
fi
cd "$repo"
[[ -n "${SLURM_NNODES:-}" ]] || { echo "slurm.sh: not inside a Slurm job (no SLURM_NNODES): submit it with sbatch" >&2; exit 2; }

python_bin="${PYTHON:-python}"
model="${MODEL:-hamishivi/qwen2_5_openthoughts2}"
chat_template="${CHAT_TEMPLATE:-tulu_thinker}"
train_mix="${TRAIN_MIX:-hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0}"
exp_name="${EXP_NAME:-slurm_$(basename "$model")_${SLURM_JOB_ID:-0}}"
output_dir="${OUTPUT_DIR:-output/$exp_name}"
read -r -a srun_extra <<< "${SRUN_ARGS:-}"

export PYTHONUNBUFFERED=1 VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 TOKENIZERS_PARALLELISM=false

# ${train_mix} is unquoted on purpose: NAME WEIGHT pairs become separate arguments.
# shellcheck disable=SC2086
srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 ${srun_extra[@]+"${srun_extra[@]}"} \
  bash scripts/node_launch.sh -- "$python_bin" open_instruct/grpo_fast.py \
  --exp_name "$exp_name" \
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
  --num_unique_prompts_rollout 64 \
  --num_mini_batches 1 \
  --num_epochs 1 \
  --learning_rate 5e-7 \
  --lr_scheduler_type constant \
  --per_device_train_batch_size 1 \
  --kl_estimator kl3 \
  --total_episodes 1024000 \
  --deepspeed_stage 2 \
  --num_learners_per_node 8 \
  --vllm_num_engines 8 \
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
