#!/usr/bin/env bash
# GPU check: short real runs of the whole stack on this machine's GPU(s), each part printed PASS or FAIL
# with what it measured (the in-flight weight-sync pause and the learner step time). Under 8 minutes.
# Hardware: 1+ NVIDIA GPUs. With one GPU only the parts that share it (--single_gpu_mode) run; the others
# say SKIP and how many GPUs they need.
# Needs the GPU stack (`pip install -e ".[gpu,dev]"`: vllm 0.33 with its CUDA torch, ray, deepspeed) and
# nothing from the network: it trains the embedded tiny model on the embedded dataset, in bf16.
# Usage: bash scripts/gpu_check.sh        (OUT=dir keeps the runs' outputs; default: a temp dir)
# Parts:
#   env          CUDA visible to torch; vllm, ray, deepspeed import; the versions
#   optimizer    torch's fused AdamW steps on the GPU (--fused_optimizer; no DeepSpeed JIT build)
#   single_gpu   3 training steps with --single_gpu_mode on GPU 0: engine and learner share it, weights by CUDA
#                IPC (no group; the engine profiles its memory before the learner starts)
#   single_gpu_gloo  the same with --vllm_sync_backend gloo, the fallback over a group (1 GPU; with 2+,
#                train_gloo covers gloo)
#   train_nccl   3 training steps: 1 vLLM engine, 1 DeepSpeed learner (ZeRO-2), NCCL in-flight sync, bf16 (2+ GPUs)
#   train_gloo   the same with --vllm_sync_backend gloo (2+ GPUs)
#   transfer_failure  one forced failed weight push (scripts/transfer_failure_check.py): the error names its
#                step, the engine keeps serving its previous weights, the next push loads; over NCCL with
#                2+ GPUs, else on the shared GPU over CUDA IPC
#   two_learners 2 learner ranks (ZeRO-3) in one STRICT_PACK placement group (3+ GPUs)
set -euo pipefail  # each part runs under `if`, so a failing part is reported, not fatal

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python_bin="${PYTHON:-python}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
failures=0
export TOKENIZERS_PARALLELISM=false

report() {  # name, status, detail
  printf '%-16s %-4s %s\n' "$1" "$2" "$3"
  [[ "$2" == "FAIL" ]] && failures=$((failures + 1))
  return 0
}

part_env() {
  local detail
  if detail="$(timeout 120 "$python_bin" - 2>&1 <<'PY'
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
import deepspeed, ray, vllm
print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
      f"vllm {vllm.__version__}, deepspeed {deepspeed.__version__}, ray {ray.__version__}")
PY
)"; then report env PASS "$(tail -1 <<<"$detail")"; else report env FAIL "$(tail -1 <<<"$detail")"; fi
}

part_optimizer() {
  local detail
  if detail="$(timeout 120 "$python_bin" - 2>&1 <<'PY'
import time, torch
from open_instruct.deepspeed_setup import make_optimizer
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.LayerNorm(1024)).cuda().bfloat16()
optimizer = make_optimizer(model, learning_rate=1e-3, weight_decay=0.1, fused=True)
before = model[0].weight.detach().clone()
started = time.perf_counter()
for _ in range(10):
    model(torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)).float().pow(2).mean().backward()
    optimizer.step(); optimizer.zero_grad()
torch.cuda.synchronize()
assert not torch.equal(before, model[0].weight), "the weights did not move"
print(f"10 fused AdamW steps in {time.perf_counter() - started:.3f} s")
PY
)"; then report optimizer PASS "$(tail -1 <<<"$detail")"; else report optimizer FAIL "$(tail -1 <<<"$detail")"; fi
}

train() {  # name, timeout, extra flags...
  local name="$1" limit="$2"
  shift 2
  local dir="$out/$name"
  if timeout "$limit" "$python_bin" open_instruct/grpo_fast.py --output_dir "$dir" --exp_name "$name" \
      --dtype bfloat16 --total_episodes 48 --num_unique_prompts_rollout 4 --num_samples_per_prompt_rollout 4 \
      --response_length 64 --vllm_num_engines 1 --vllm_gpu_memory_utilization 0.3 --num_evals 0 --save_freq 0 \
      --inflight_updates True "$@" >"$dir.log" 2>&1; then
    local detail
    detail="$("$python_bin" - "$dir/metrics.jsonl" <<'PY' || echo "finished, but its metrics.jsonl is unreadable"
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
pause = [r["time/weight_sync_pause_s"] for r in rows if "time/weight_sync_pause_s" in r]
step = [r["learner/step_s"] for r in rows if "learner/step_s" in r]
print(f"{len(rows)} steps; weight-sync pause {statistics.median(pause):.3f} s; learner step {statistics.median(step):.3f} s")
PY
)"
    report "$name" PASS "$detail"
  else
    report "$name" FAIL "exit $? (log: $dir.log): $(grep -v '^\s*$' "$dir.log" | tail -1)"
  fi
}

part_transfer_failure() {  # extra flags...
  local log="$out/transfer_failure.log"
  if timeout 200 "$python_bin" scripts/transfer_failure_check.py --dtype bfloat16 --vllm_num_engines 1 \
      --num_learners_per_node 1 --vllm_gpu_memory_utilization 0.3 "$@" >"$log" 2>&1; then
    report transfer_failure PASS "$(grep -c '^PASS' "$log") checks passed ($*)"
  else
    report transfer_failure FAIL "exit $? (log: $log): $(grep -E '^(FAIL|PASS)' "$log" | grep -m1 '^FAIL' || tail -1 "$log")"
  fi
}

needs() {  # part, GPUs it needs: true when this machine has them, else reports SKIP
  if (( gpus >= $2 )); then return 0; fi
  report "$1" SKIP "needs $2 GPUs; this machine has $gpus"
  return 1
}

echo "gpu_check: outputs in $out"
gpus="$("$python_bin" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
part_env
part_optimizer
CUDA_VISIBLE_DEVICES=0 train single_gpu 150 --single_gpu_mode --num_learners_per_node 1 --deepspeed_stage 2
if (( gpus < 2 )); then
  CUDA_VISIBLE_DEVICES=0 train single_gpu_gloo 150 --single_gpu_mode --vllm_sync_backend gloo \
    --num_learners_per_node 1 --deepspeed_stage 2
fi
if needs train_nccl 2; then
  train train_nccl 150 --vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2
fi
if needs train_gloo 2; then
  train train_gloo 150 --vllm_sync_backend gloo --num_learners_per_node 1 --deepspeed_stage 2
fi
if (( gpus >= 2 )); then
  part_transfer_failure --vllm_sync_backend nccl
else
  CUDA_VISIBLE_DEVICES=0 part_transfer_failure --single_gpu_mode
fi
if needs two_learners 3; then
  train two_learners 150 --vllm_sync_backend nccl --num_learners_per_node 2 --deepspeed_stage 3
fi
echo "gpu_check: $failures part(s) failed"
exit $(( failures > 0 ))
