#!/usr/bin/env bash
# The long-reasoning launch this project was built for (docs/index.md: the long-reasoning shape): async GRPO
# with 16k-token responses (reasoning models), one Beaker experiment per (model, data mix), each launched
# through mason.py.
# What: for each model in $MODELS and each mix in $MIXES, `python mason.py ... -- source ray_node_setup.sh
# && source code_api_setup.sh && python open_instruct/grpo_fast.py <the launch's flags>`.
# Hardware: Beaker, 6 nodes x 8 GPUs per run (16 learner GPUs: --num_learners_per_node 8 8, and 32
# single-GPU vLLM engines). The launching machine needs only Python with PyYAML (and the beaker CLI).
# Usage: bash scripts/long_generations_experiment.sh [IMAGE] [extra grpo_fast.py flags...]
#   bash scripts/train/build_image_and_launch.sh scripts/long_generations_experiment.sh   # build, then launch
#   The flags are the launch's as first run (tests/fixtures/seed_grpo_fast_command.txt), token for token.
#   With 16k-token tails a group outlasts ~3 learner steps; the default --async_steps 8 (open-instruct's) covers
#   that, and appending --async_steps auto lets the lookahead follow the measured need (about 3, so less
#   staleness; docs/benchmarks.md, "Cluster-scale simulator").
#   DRY_RUN=1 bash scripts/long_generations_experiment.sh USER/IMAGE   # print the Beaker specs, submit nothing
# Environment (all optional):
#   MODELS   space-separated, from: qwen2_5 qwen3 olmo2_lc          (default: qwen2_5)
#   MIXES    space-separated, from: integration_mix orz_only_mix    (default: orz_only_mix)
#   DRY_RUN  1 adds --dry_run to mason.py (each spec is printed as a YAML document, after a `---` line)
#   PYTHON   interpreter that runs mason.py (default: python)
#   IMAGE    required unless given as $1: the Beaker image built from this repository's Dockerfile
#            (docs/image.md); build_image_and_launch.sh builds it and passes it both ways
#   CLUSTER WORKSPACE BUDGET PRIORITY   Beaker placement (defaults: the launch's own)
#   WANDB_SECRET  name of a Beaker secret holding a W&B key; passed as --secret WANDB_API_KEY=...
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python_bin="${PYTHON:-python}"
models="${MODELS:-qwen2_5}"
mixes="${MIXES:-orz_only_mix}"
# The image: the first argument when it is not a flag (how build_image_and_launch.sh and open-instruct's
# scripts pass it), else $IMAGE. Never a default: an image of another tree would run another trainer.
image="${IMAGE:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then
  image="$1"
  shift
fi
if [[ -z "$image" ]]; then
  echo "long_generations_experiment.sh: no image: give the Beaker image built from this repository as the first argument or IMAGE=..." \
    "(bash scripts/train/build_image_and_launch.sh scripts/long_generations_experiment.sh builds it and launches with it)" >&2
  exit 2
fi
cluster="${CLUSTER:-ai2/jupiter-cirrascale-2}"
workspace="${WORKSPACE:-ai2/tulu-thinker}"
budget="${BUDGET:-ai2/oe-adapt}"
priority="${PRIORITY:-high}"

integration_mix="hamishivi/saurabh5_rlvr_acecoder_all_filtered_qwen2_5_openthoughts2 10000 hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 8500 hamishivi/tulu_3_rewritten_400k_string_f1_only_v2_all_filtered_qwen2_5_openthoughts2 10000 hamishivi/allenai_IF_multi_constraints_upto5_all_filtered_qwen2_5_openthoughts2 10000"
orz_only_mix="hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0"

oe_eval_tasks="minerva_math::hamish_zs_reasoning,gsm8k::zs_cot_latex,gsm8k::hamish_zs_reasoning,minerva_math_500::hamish_zs_reasoning,zebralogic::hamish_zs_reasoning,aime::hamish_zs_reasoning,agi_eval_english:0shot_cot::hamish_zs_reasoning,gpqa:0shot_cot::hamish_zs_reasoning,ifeval::hamish_zs_reasoning,popqa::hamish_zs_reasoning,mmlu:cot::hamish_zs_reasoning,alpaca_eval_v3::hamish_zs_reasoning,bbh:cot::hamish_zs_reasoning,mbppplus:0-shot-chat::tulu-thinker,codex_humanevalplus:0-shot-chat-v1::tulu-thinker"

mason_extra=()
if [[ "${DRY_RUN:-0}" == "1" ]]; then mason_extra+=(--dry_run); fi
if [[ -n "${WANDB_SECRET:-}" ]]; then mason_extra+=(--secret "WANDB_API_KEY=${WANDB_SECRET}"); fi

for model in $models; do
  case "$model" in
    qwen3)    model_name_or_path=hamishivi/qwen3_openthoughts2;  chat_template_name=tulu_thinker; add_bos=False ;;
    olmo2_lc) model_name_or_path=hamishivi/olmo2_lc_ot2;         chat_template_name=tulu_thinker; add_bos=True ;;
    qwen2_5)  model_name_or_path=hamishivi/qwen2_5_openthoughts2; chat_template_name=tulu_thinker; add_bos=False ;;
    *) echo "long_generations_experiment.sh: unknown model '$model' in MODELS (use qwen2_5, qwen3 or olmo2_lc)" >&2
       exit 2 ;;
  esac
  for split_var in $mixes; do
    case "$split_var" in
      integration_mix|orz_only_mix) split_value="${!split_var}" ;;
      *) echo "long_generations_experiment.sh: unknown mix '$split_var' in MIXES (use integration_mix or orz_only_mix)" >&2
         exit 2 ;;
    esac
    exp_name="2606rl_update_fil_dapo_pol_${model}_${split_var}_${RANDOM}"
    if [[ "${DRY_RUN:-0}" == "1" ]]; then echo "---"; fi  # one YAML document per run

    # ${split_value} is unquoted on purpose: NAME WEIGHT pairs become separate arguments.
    # shellcheck disable=SC2086
    "$python_bin" mason.py \
      --cluster "$cluster" --image "$image" --description "$exp_name" \
      --pure_docker_mode \
      --workspace "$workspace" \
      --priority "$priority" \
      --preemptible \
      --num_nodes 6 \
      --max_retries 0 \
      --env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 \
      --budget "$budget" \
      --gpus 8 \
      ${mason_extra[@]+"${mason_extra[@]}"} \
      -- source configs/beaker_configs/ray_node_setup.sh \&\& source configs/beaker_configs/code_api_setup.sh \&\& python open_instruct/grpo_fast.py \
      --exp_name "$exp_name" \
      --beta 0.0 \
      --num_samples_per_prompt_rollout 16 \
      --num_unique_prompts_rollout 256 \
      --num_mini_batches 1 \
      --num_epochs 1 \
      --learning_rate 5e-7 \
      --per_device_train_batch_size 1 \
      --output_dir /output \
      --kl_estimator kl3 \
      --dataset_mixer_list $split_value \
      --dataset_mixer_list_splits train \
      --dataset_mixer_eval_list hamishivi/tulu_3_rewritten_100k 32 \
      --dataset_mixer_eval_list_splits train \
      --max_token_length 10240 \
      --add_bos "$add_bos" \
      --max_prompt_token_length 2048 \
      --response_length 16384 \
      --pack_length 20480 \
      --model_name_or_path "$model_name_or_path" \
      --chat_template_name "$chat_template_name" \
      --stop_strings "</answer>" \
      --non_stop_penalty False \
      --temperature 1.0 \
      --ground_truths_key ground_truth \
      --sft_messages_key messages \
      --total_episodes 10000000 \
      --deepspeed_stage 2 \
      --num_learners_per_node 8 8 \
      --vllm_num_engines 32 \
      --vllm_tensor_parallel_size 1 \
      --lr_scheduler_type constant \
      --apply_verifiable_reward true \
      --seed 1 \
      --num_evals 5 \
      --save_freq 50 \
      --try_launch_beaker_eval_jobs_on_weka True \
      --gradient_checkpointing \
      --with_tracking \
      --vllm_enable_prefix_caching \
      --clip_higher 0.28 \
      --mask_truncated_completions True \
      --oe_eval_max_length 32768 \
      --oe_eval_tasks "$oe_eval_tasks" \
      "$@"
  done
done
