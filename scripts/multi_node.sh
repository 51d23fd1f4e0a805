#!/usr/bin/env bash
# A smaller multi-node async GRPO run than the long-generations experiment, launched through mason.py:
# 8 DeepSpeed learners on one node (--num_learners_per_node 8) and 8 single-GPU vLLM engines on the other,
# 8k-token responses, ORZ math data, verifiable rewards.
# What: `python mason.py ... -- source ray_node_setup.sh && source code_api_setup.sh
# && python open_instruct/grpo_fast.py ...` (one Beaker experiment).
# Hardware: Beaker, 2 nodes x 8 GPUs. The launching machine needs only Python with PyYAML (and the beaker CLI).
# Usage: bash scripts/multi_node.sh [IMAGE] [extra grpo_fast.py flags...]
#   bash scripts/train/build_image_and_launch.sh scripts/multi_node.sh   # builds the image, then launches with it
#   DRY_RUN=1 bash scripts/multi_node.sh USER/IMAGE   # print the Beaker spec (a YAML document after `---`), submit nothing
# Environment (all optional):
#   MODEL          hub model (default: hamishivi/qwen2_5_openthoughts2); CHAT_TEMPLATE (tulu_thinker); ADD_BOS (False)
#   TRAIN_MIX      NAME WEIGHT pairs for --dataset_mixer_list (default: the ORZ math mix of the long-reasoning launch)
#   EXP_NAME       experiment name (default: multi_node_<model>_<random>)
#   DRY_RUN        1 adds --dry_run to mason.py
#   PYTHON         interpreter that runs mason.py (default: python)
#   IMAGE          required unless given as $1: the Beaker image built from this repository's Dockerfile
#                  (docs/image.md); build_image_and_launch.sh builds it and passes it both ways
#   CLUSTER WORKSPACE BUDGET PRIORITY   Beaker placement (defaults: the long-reasoning launch's, priority normal)
#   WANDB_SECRET   name of a Beaker secret holding a W&B key: adds --secret WANDB_API_KEY=... and --with_tracking
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python_bin="${PYTHON:-python}"
model="${MODEL:-hamishivi/qwen2_5_openthoughts2}"
chat_template="${CHAT_TEMPLATE:-tulu_thinker}"
add_bos="${ADD_BOS:-False}"
train_mix="${TRAIN_MIX:-hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0}"
exp_name="${EXP_NAME:-multi_node_$(basename "$model")_${RANDOM}}"
# The image: the first argument when it is not a flag (how build_image_and_launch.sh and open-instruct's
# scripts pass it), else $IMAGE. Never a default: an image of another tree would run another trainer.
image="${IMAGE:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then
  image="$1"
  shift
fi
if [[ -z "$image" ]]; then
  echo "multi_node.sh: no image: give the Beaker image built from this repository as the first argument or IMAGE=..." \
    "(bash scripts/train/build_image_and_launch.sh scripts/multi_node.sh builds it and launches with it)" >&2
  exit 2
fi
cluster="${CLUSTER:-ai2/jupiter-cirrascale-2}"
workspace="${WORKSPACE:-ai2/tulu-thinker}"
budget="${BUDGET:-ai2/oe-adapt}"
priority="${PRIORITY:-normal}"

mason_extra=()
tracking=()
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  mason_extra+=(--dry_run)
  echo "---"  # the spec as one YAML document
fi
if [[ -n "${WANDB_SECRET:-}" ]]; then
  mason_extra+=(--secret "WANDB_API_KEY=${WANDB_SECRET}")
  tracking+=(--with_tracking)
fi

# ${train_mix} is unquoted on purpose: NAME WEIGHT pairs become separate arguments.
# shellcheck disable=SC2086
exec "$python_bin" mason.py \
  --cluster "$cluster" --image "$image" --description "$exp_name" \
  --pure_docker_mode \
  --workspace "$workspace" \
  --priority "$priority" \
  --preemptible \
  --num_nodes 2 \
  --max_retries 0 \
  --env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 \
  --budget "$budget" \
  --gpus 8 \
  ${mason_extra[@]+"${mason_extra[@]}"} \
  -- source configs/beaker_configs/ray_node_setup.sh \&\& source configs/beaker_configs/code_api_setup.sh \&\& python open_instruct/grpo_fast.py \
  --exp_name "$exp_name" \
  --beta 0.0 \
  --num_samples_per_prompt_rollout 16 \
  --num_unique_prompts_rollout 64 \
  --num_mini_batches 1 \
  --num_epochs 1 \
  --learning_rate 5e-7 \
  --per_device_train_batch_size 1 \
  --output_dir /output \
  --kl_estimator kl3 \
  --dataset_mixer_list $train_mix \
  --dataset_mixer_list_splits train \
  --dataset_mixer_eval_list hamishivi/tulu_3_rewritten_100k 32 \
  --dataset_mixer_eval_list_splits train \
  --add_bos "$add_bos" \
  --max_prompt_token_length 2048 \
  --response_length 8192 \
  --pack_length 10240 \
  --model_name_or_path "$model" \
  --chat_template_name "$chat_template" \
  --stop_strings "</answer>" \
  --non_stop_penalty False \
  --temperature 1.0 \
  --ground_truths_key ground_truth \
  --sft_messages_key messages \
  --total_episodes 1024000 \
  --deepspeed_stage 2 \
  --num_learners_per_node 8 \
  --vllm_num_engines 8 \
  --vllm_tensor_parallel_size 1 \
  --lr_scheduler_type constant \
  --apply_verifiable_reward true \
  --seed 1 \
  --num_evals 5 \
  --save_freq 100 \
  --gradient_checkpointing \
  --vllm_enable_prefix_caching \
  --clip_higher 0.28 \
  --mask_truncated_completions True \
  ${tracking[@]+"${tracking[@]}"} \
  "$@"
