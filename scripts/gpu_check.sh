#!/usr/bin/env bash
# GPU check: short real runs of the whole stack on this machine's GPU(s), each part printed PASS or FAIL
# with what it measured (the in-flight weight-sync pause and the learner step time). About 10 minutes.
# Hardware: 1+ NVIDIA GPUs. With one GPU only the parts that share it (--single_gpu_mode) run; the others
# say SKIP and how many GPUs they need.
# Usage: bash scripts/gpu_check.sh [--dry_run]   (OUT=dir keeps the runs' outputs; default: a temp dir)
# Runs with $PYTHON (default: the active environment's, $VIRTUAL_ENV/bin/python, else python3). Where that lacks
# the GPU stack (vllm 0.33 with its CUDA torch, ray, deepspeed, this package; a CPU torch on a machine with GPUs,
# such as the repository's CPU .venv, counts as lacking it) it installs the locked GPU stack once into .venv-gpu
# (GPU_VENV=dir), the only step that needs the network: python3 -m venv --system-site-packages .venv-gpu &&
# PYTHON=.venv-gpu/bin/python bash scripts/install_locked.sh gpu-cu13   (docs/install.md)
# Then it builds the embedded tiny model and dataset (trained on, in bf16) before the timed parts.
# --dry_run (or CHECK_ONLY=1): the parts that need no GPU only, the others SKIP with the GPUs they need and
# what each asserts. Every training part asserts offpolicy/rho_mean within 0.9-1.1 at every step (the
# engines generated with the learner's weights), not only its exit status.
# Timeouts: each part its own (below); the first part that starts an engine WARMUP_S (300) more, for vLLM's
# cold compile and CUDA-graph capture, cached for the later parts. Each is SIGTERM then, 30 s later, SIGKILL
# (SIGTERM only asks grpo_fast to finish its step, so a hung step would hang the check).
# Parts:
#   python       the interpreter and its version
#   driver       the GPU name and count, the driver and its CUDA version (nvidia-smi): NEEDS_CUDA (13.0,
#                vllm 0.33's torch) or newer
#   compiler     a C compiler (cc or gcc): Triton builds its launchers with it
#   install      vllm, ray, deepspeed and this checkout's open_instruct import as the trainer imports them
#                (`python -P`, from /; installed into .venv-gpu when they do not)
#   model        the embedded model and dataset are built (once; cached in ~/.cache/open_instruct)
#   env          CUDA visible to torch; vllm 0.33.0 and deepspeed 0.19.8 (asserted), ray; the versions
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
#   tensor_parallel  3 training steps: 1 engine with --vllm_tensor_parallel_size 2 (one 2-GPU bundle, vLLM's mp
#                workers inside the engine actor) + 1 learner, NCCL sync to both engine ranks (3+ GPUs)
#   default_stage    3 training steps with the default learner stage, ZeRO-0 (2+ GPUs)
#   reprefill    3 training steps with --inflight_update_kv reprefill (2+ GPUs)
#   two_engines  3 training steps with 2 engines (3+ GPUs)
#   save_resume  3 steps saving the resumable state; the same command again resumes from it (2+ GPUs)
#   weights_loaded  2 steps with in-flight syncs, then every engine's greedy tokens checked against a
#                transformers model holding the learner's weights (scripts/weights_loaded_check.py, float32;
#                1 GPU shared with --single_gpu_mode, NCCL with 2+)
#   engine_killed  8 steps with 2 engines; one engine's actor is SIGKILLed after 2 steps: replaced in the
#                background (its EngineCore confirmed gone first), the run finishes (3+ GPUs)
#   zero3_memory  ZeRO-2 against ZeRO-3 loads and sync gathers, one rank per GPU (up to 2), GPU memory per
#                rank (benchmarks/zero3_memory.py: torch, DeepSpeed and transformers only) (1+ GPUs)
set -euo pipefail  # each part runs under `if`, so a failing part is reported, not fatal

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
if [[ -n "${PYTHON:-}" ]]; then
  python_bin="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
  python_bin="$VIRTUAL_ENV/bin/python"
else
  python_bin=python3
fi
venv="${GPU_VENV:-$repo/.venv-gpu}"
needs_cuda="${NEEDS_CUDA:-13.0}"
warmup_s="${WARMUP_S:-300}"  # added to the first part that starts an engine (see `first_engine`)
check_only="${CHECK_ONLY:-0}"
for arg in "$@"; do
  case "$arg" in
    --dry_run) check_only=1 ;;
    *) echo "gpu_check: unknown argument $arg (usage: bash scripts/gpu_check.sh [--dry_run])" >&2; exit 2 ;;
  esac
done
[[ "$check_only" == "0" ]] && check_only=0 || check_only=1
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
failures=0
export TOKENIZERS_PARALLELISM=false

report() {  # name, status, detail
  printf '%-16s %-4s %s\n' "$1" "$2" "$3"
  [[ "$2" == "FAIL" ]] && failures=$((failures + 1))
  return 0
}

part_python() {
  local version
  if version="$("$python_bin" -c 'import sys; print(sys.version.split()[0])' 2>&1)"; then
    if ! printf '%s\n%s\n' 3.11 "$version" | sort -V -C; then
      report python FAIL "$python_bin is Python $version; the package needs 3.11+ (set PYTHON=python3.11)"
      return 1
    fi
    report python PASS "$python_bin: Python $version"
  else
    report python FAIL "no working $python_bin (set PYTHON=...): $(tail -1 <<<"$version")"
    return 1
  fi
}

part_driver() {
  local smi names cuda driver
  if ! command -v nvidia-smi >/dev/null || ! smi="$(nvidia-smi 2>&1)"; then
    if (( check_only )); then report driver SKIP "no working nvidia-smi: the GPU parts need 1+ GPUs"; return 0; fi
    report driver FAIL "no working nvidia-smi (no NVIDIA driver?): $(tail -1 <<<"${smi:-not on PATH}")"
    return 0
  fi
  names="$(nvidia-smi --query-gpu=name --format=csv,noheader)"
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  cuda="$(grep -o 'CUDA Version: *[0-9.]*' <<<"$smi" | grep -o '[0-9.]*$' || true)"
  local detail
  detail="$(wc -l <<<"$names" | tr -d ' ') x $(head -1 <<<"$names"); driver $driver, CUDA ${cuda:-unknown}"
  if [[ -n "$cuda" ]] && printf '%s
%s
' "$needs_cuda" "$cuda" | sort -V -C; then
    report driver PASS "$detail"
  else
    report driver FAIL "$detail: vllm 0.33's torch needs a driver for CUDA $needs_cuda or newer"
  fi
}

part_compiler() {
  local cc_bin
  if cc_bin="$(command -v cc || command -v gcc)"; then
    report compiler PASS "$cc_bin: $("$cc_bin" --version 2>&1 | head -1)"
  elif (( check_only )); then
    report compiler SKIP "no cc or gcc: the GPU parts need one (Triton compiles its launchers)"
  else
    report compiler FAIL "no cc or gcc: Triton compiles its launchers with one (e.g. apt-get install gcc)"
  fi
}

has_stack() {  # interpreter: true when the GPU parts' imports work with it, the way the trainer imports them
  # `python open_instruct/grpo_fast.py` puts open_instruct/ first on sys.path, not the checkout: the package
  # must come from the interpreter's installation. So: -P (no script or working directory on sys.path), run
  # from /, and the package found must be this checkout's.
  # A CPU torch where GPUs are visible (the repository's CPU .venv on a GPU machine) is no GPU stack either.
  (cd / && "$1" -P -c 'import sys, vllm, ray, deepspeed, open_instruct
from pathlib import Path
from open_instruct.launch.stack_check import installed_stack, this_machine
cpu_build_next_to_gpus = this_machine().gpus > 0 and installed_stack().torch_cuda is None
sys.exit(Path(open_instruct.__file__).resolve().parents[1] != Path(sys.argv[1]).resolve() or cpu_build_next_to_gpus)' "$repo") >/dev/null 2>&1
}

part_install() {  # sets python_bin to an interpreter with the stack; false when there is none
  local command="$python_bin -m venv --system-site-packages $venv && PYTHON=$venv/bin/python bash scripts/install_locked.sh gpu-cu13"
  if has_stack "$python_bin"; then
    report install PASS "$python_bin -P imports vllm, ray, deepspeed and this checkout's open_instruct"
  elif [[ -x "$venv/bin/python" ]] && has_stack "$venv/bin/python"; then
    python_bin="$venv/bin/python"
    report install PASS "$python_bin (installed earlier)"
  elif (( check_only )); then
    report install SKIP "$python_bin lacks the GPU stack; a full run installs it: $command"
    return 1
  elif { "$python_bin" -m venv --system-site-packages "$venv" && PYTHON="$venv/bin/python" bash scripts/install_locked.sh gpu-cu13; } \
      >"$out/install.log" 2>&1 && has_stack "$venv/bin/python"; then
    python_bin="$venv/bin/python"
    report install PASS "installed the GPU stack into $venv (log: $out/install.log)"
  else
    report install FAIL "could not install (log: $out/install.log; no venv module? apt-get install python3-venv); run: $command"
    return 1
  fi
}

part_model() {  # built here, untimed by the parts: every run after it finds it cached
  local detail
  if detail="$(timeout -k 30 900 "$python_bin" - 2>&1 <<'PY'
import time
from open_instruct.data.embedded_default import ensure_embedded_dataset, ensure_embedded_model
started = time.monotonic()
model, data = ensure_embedded_model(), ensure_embedded_dataset()
print(f"{model.name} and {data.name} ready in {time.monotonic() - started:.0f} s")
PY
)"; then report model PASS "$(tail -1 <<<"$detail")"; else report model FAIL "$(tail -1 <<<"$detail")"; return 1; fi
}

part_env() {
  local detail
  if detail="$(cd / && timeout -k 10 120 "$python_bin" -P - 2>&1 <<'PY'
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
import deepspeed, ray, vllm
wanted = {"vllm": (vllm.__version__, "0.33.0"), "deepspeed": (deepspeed.__version__, "0.19.8")}
wrong = [f"{name} {got} (pinned {pin})" for name, (got, pin) in wanted.items() if got != pin]
assert not wrong, "versions the package was not tested with: " + ", ".join(wrong)
print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
      f"vllm {vllm.__version__}, deepspeed {deepspeed.__version__}, ray {ray.__version__}")
PY
)"; then report env PASS "$(tail -1 <<<"$detail")"; else report env FAIL "$(tail -1 <<<"$detail")"; fi
}

part_optimizer() {
  local detail
  if detail="$(timeout -k 10 120 "$python_bin" - 2>&1 <<'PY'
import time, torch
from open_instruct.learner.deepspeed_setup import make_optimizer
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

# 3 steps of 16 samples each (later flags override these).
train_flags=(--dtype bfloat16 --total_episodes 48 --num_unique_prompts_rollout 4 --num_samples_per_prompt_rollout 4
  --response_length 64 --vllm_num_engines 1 --vllm_gpu_memory_utilization 0.3 --num_evals 0 --save_freq 0
  --inflight_updates True)

train() {  # name, timeout, extra flags...
  local name="$1" limit="$(( $2 + warmup_s ))"  # the first part that starts an engine pays its cold start
  warmup_s=0
  shift 2
  local dir="$out/$name"
  # SIGTERM only asks grpo_fast to finish its step: a hung step gets SIGKILL 30 s later.
  if timeout -k 30 "$limit" "$python_bin" open_instruct/grpo_fast.py --output_dir "$dir" --exp_name "$name" \
      "${train_flags[@]}" "$@" >"$dir.log" 2>&1; then
    local detail
    detail="$("$python_bin" - "$dir/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
pause = [r["time/weight_sync_pause_s"] for r in rows if "time/weight_sync_pause_s" in r]
step = [r["learner/step_s"] for r in rows if "learner/step_s" in r]
rho = [r["offpolicy/rho_mean"] for r in rows if "offpolicy/rho_mean" in r]
summary = f"{len(rows)} steps; weight-sync pause {statistics.median(pause):.3f} s; learner step {statistics.median(step):.3f} s"
# The engines generated with the learner's weights: their logprobs agree with the learner's (rho ~ 1).
off = [f"{x:.3f}" for x in rho if not 0.9 <= x <= 1.1]
if not rho or off:
    print(f"offpolicy/rho_mean outside 0.9-1.1 ({off or 'not logged'}): engine and learner weights differ; {summary}")
    sys.exit(1)
print(f"{summary}; rho_mean {min(rho):.3f}-{max(rho):.3f}")
PY
)" || { report "$name" FAIL "$(tail -1 <<<"$detail")"; return 0; }
    report "$name" PASS "$detail"
  else
    report "$name" FAIL "exit $? (log: $dir.log): $(grep -v '^\s*$' "$dir.log" | tail -1)"
  fi
}

part_transfer_failure() {  # extra flags...
  local log="$out/transfer_failure.log" limit="$(( 200 + warmup_s ))"
  warmup_s=0
  if timeout -k 30 "$limit" "$python_bin" scripts/transfer_failure_check.py --dtype bfloat16 --vllm_num_engines 1 \
      --num_learners_per_node 1 --vllm_gpu_memory_utilization 0.3 "$@" >"$log" 2>&1; then
    report transfer_failure PASS "$(grep -c '^PASS' "$log") checks passed ($*)"
  else
    report transfer_failure FAIL "exit $? (log: $log): $(grep -E '^(FAIL|PASS)' "$log" | grep -m1 '^FAIL' || tail -1 "$log")"
  fi
}

part_save_resume() {  # 3 steps saving the state after each; the same command again resumes from the last one
  local state="$out/save_resume/state" before="$failures"
  local flags=(--vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2 --checkpoint_state_freq 1
    --checkpoint_state_dir "$state")
  train save_resume 150 "${flags[@]}"
  (( failures == before )) || return 0  # (train reports a failure and returns 0: `set -e` must not end the check)
  local log="$out/save_resume_again.log"
  if timeout -k 30 150 "$python_bin" open_instruct/grpo_fast.py --output_dir "$out/save_resume" \
      --exp_name save_resume "${train_flags[@]}" "${flags[@]}" >"$log" 2>&1 \
      && grep -Eq "resumed from .*: step [1-9]" "$log"; then
    report resumed PASS "the same command again $(grep -Eo 'resumed from .*: step [0-9]+' "$log" | tail -1)"
  else
    report resumed FAIL "the same command again did not resume from the saved state (log: $log): $(tail -1 "$log")"
  fi
}

part_weights_loaded() {  # extra flags...
  local log="$out/weights_loaded.log" limit="$(( 300 + warmup_s ))"
  warmup_s=0
  if timeout -k 30 "$limit" "$python_bin" scripts/weights_loaded_check.py --dtype float32 \
      --vllm_gpu_memory_utilization 0.3 --num_learners_per_node 1 --output_dir "$out/weights_loaded" "$@" \
      >"$log" 2>&1; then
    report weights_loaded PASS "$(grep -Eo 'PASS engine .*' "$log" | head -1)"
  else
    report weights_loaded FAIL "exit $? (log: $log): $(grep -Eo 'FAIL engine .*' "$log" | head -1 || tail -1 "$log")"
  fi
}

part_engine_killed() {  # 2 engines; after 2 steps one engine actor is SIGKILLed; the run must finish
  local dir="$out/engine_killed" limit="$(( 400 + warmup_s ))" pid victim
  warmup_s=0
  mkdir -p "$dir"
  setsid timeout -k 30 "$limit" "$python_bin" open_instruct/grpo_fast.py --output_dir "$dir" --exp_name engine_killed \
    "${train_flags[@]}" --total_episodes 128 --vllm_num_engines 2 --max_engine_restarts 1 --vllm_sync_backend nccl \
    --num_learners_per_node 1 --deepspeed_stage 2 >"$dir.log" 2>&1 &
  pid=$!
  until [[ "$(wc -l <"$dir/metrics.jsonl" 2>/dev/null || echo 0)" -ge 2 ]] || ! kill -0 "$pid" 2>/dev/null; do
    sleep 1
  done
  victim="$(pgrep -s "$(ps -o sid= -p "$pid" | tr -d ' ')" -f 'GenerationActor' | head -1 || true)"
  if [[ -z "$victim" ]]; then
    wait "$pid" || true
    report engine_killed FAIL "no engine actor to kill after 2 steps (log: $dir.log): $(tail -1 "$dir.log")"
    return 0
  fi
  kill -9 "$victim"
  if wait "$pid"; then
    local detail
    detail="$("$python_bin" - "$dir/metrics.jsonl" "$dir.log" <<'PY'
import json, re, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
log = open(sys.argv[2]).read()
restarts = rows[-1].get("engines/restarts_total")
gone = re.search(r"old processes gone: exited \[[^]]*\], killed \[[^]]*\]", log)
rho = [r["offpolicy/rho_mean"] for r in rows if "offpolicy/rho_mean" in r]
if restarts != 1 or not gone or not rho or not all(0.9 <= x <= 1.1 for x in rho):
    print(f"engines/restarts_total {restarts}; old processes confirmed gone: {bool(gone)}; rho_mean {rho}")
    sys.exit(1)
joined = re.search(r"joined at weight version (\d+), ([\d.]+) s after the failure", log)
print(f"{len(rows)} steps; 1 engine replaced ({gone.group(0)}); "
      + (f"serving at version {joined.group(1)}, {joined.group(2)} s after the kill" if joined else "not yet serving at the end"))
PY
)" || { report engine_killed FAIL "$(tail -1 <<<"$detail") (log: $dir.log)"; return 0; }
    report engine_killed PASS "$detail"
  else
    report engine_killed FAIL "exit $? (log: $dir.log): $(grep -v '^\s*$' "$dir.log" | tail -1)"
  fi
}

part_zero3_memory() {  # ranks: one per GPU
  local log="$out/zero3_memory.log" detail
  if detail="$(timeout -k 30 600 "$python_bin" - "$1" 2>"$log" <<'PY'
import sys
from open_instruct.benchmarks.zero3_memory import main
world = int(sys.argv[1])
rows = main(["--device", "cuda", "--world_size", str(world), "--size", "1024x8"])
whole = rows[0]["whole_model_bytes"]
zero3 = [r for r in rows if r["stage"] == 3]
held = max(r["held_parameter_bytes"] for r in zero3) / whole  # policy + reference partitions
gather = max(r["sync, one parameter at a time_peak_bytes"] for r in zero3) / whole
if held > 2 / world + 0.1 or gather > 0.5:
    print(f"ZeRO-3 rank holds {held:.2f} copies (expected ~{2 / world:.2f}), per-parameter sync peak {gather:.2f}")
    sys.exit(1)
print(f"{world} GPU rank(s): ZeRO-3 holds {held:.2f} fp32 copies per GPU (policy + reference), "
      f"per-parameter sync peak {gather:.2f} copies")
PY
)"; then report zero3_memory PASS "$(tail -1 <<<"$detail")"; else report zero3_memory FAIL "$(tail -1 <<<"$detail") (log: $log)"; fi
}

part_tensor_parallel() {  # the engine actor holds 2 GPUs; vLLM's mp executor runs a worker on each
  train tensor_parallel 180 --vllm_tensor_parallel_size 2 --vllm_sync_backend nccl --num_learners_per_node 1 \
    --deepspeed_stage 2
}

# What each GPU part asserts beyond its exit status (a dry run lists them).
declare -A CHECKS=(
  [env]="CUDA visible to torch; vllm 0.33.0 and deepspeed 0.19.8, imported as the trainer imports them"
  [optimizer]="the weights move after 10 fused AdamW steps on the GPU"
  [single_gpu]="3 steps; offpolicy/rho_mean within 0.9-1.1 (the engine generated with the learner's weights)"
  [single_gpu_gloo]="3 steps; offpolicy/rho_mean within 0.9-1.1"
  [train_nccl]="3 steps; offpolicy/rho_mean within 0.9-1.1 after each in-flight NCCL sync"
  [train_gloo]="3 steps; offpolicy/rho_mean within 0.9-1.1"
  [transfer_failure]="the failure names its step, the engine keeps its weights, the next push loads"
  [two_learners]="3 steps with 2 ZeRO-3 ranks; offpolicy/rho_mean within 0.9-1.1"
  [tensor_parallel]="3 steps, both tensor-parallel ranks synced; offpolicy/rho_mean within 0.9-1.1"
  [default_stage]="3 steps with the default learner stage (ZeRO-0); offpolicy/rho_mean within 0.9-1.1"
  [reprefill]="3 steps with --inflight_update_kv reprefill (vLLM's abort pause); offpolicy/rho_mean within 0.9-1.1"
  [two_engines]="3 steps, 2 engines synced in flight; offpolicy/rho_mean within 0.9-1.1"
  [save_resume]="3 steps saving the state after each (rho_mean as above); the same command again resumes from the last saved state"
  [weights_loaded]="after an in-flight sync every engine's greedy token is the argmax of a model holding the learner's weights"
  [engine_killed]="an engine SIGKILLed after 2 steps: its old processes confirmed gone, engines/restarts_total 1, rho_mean within 0.9-1.1, the run finishes"
  [zero3_memory]="ZeRO-3 holds ~2/ranks fp32 copies per GPU (policy + reference) and a per-parameter sync peaks under 0.5 copies"
)

needs() {  # part, GPUs it needs: true when this machine has them (and this is no dry run), else reports SKIP
  if (( ! check_only && gpus >= $2 )); then return 0; fi
  local plural="s" why="this machine has $gpus"
  (( $2 == 1 )) && plural=""
  (( check_only )) && why="dry run (this machine has $gpus)"
  report "$1" SKIP "needs $2 GPU$plural; $why; checks: ${CHECKS[$1]}"
  return 1
}

echo "gpu_check: outputs in $out$( (( check_only )) && echo '; dry run: only the parts that need no GPU')"
part_python || { echo "gpu_check: no Python to run with"; exit 1; }
part_driver || true  # (`||`: a failing command inside reports, it does not end the script)
part_compiler || true
gpus=0
if part_install; then
  if ! part_model && (( ! check_only )); then echo "gpu_check: stopped: no embedded model to train"; exit 1; fi
  gpus="$("$python_bin" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
elif (( check_only )); then
  report model SKIP "needs the GPU stack (install)"
else
  echo "gpu_check: stopped: no GPU stack to run with"
  exit 1
fi
if needs env 1; then part_env; fi
if needs optimizer 1; then part_optimizer; fi
if needs single_gpu 1; then
  CUDA_VISIBLE_DEVICES=0 train single_gpu 150 --single_gpu_mode --num_learners_per_node 1 --deepspeed_stage 2
fi
if (( gpus < 2 )) && needs single_gpu_gloo 1; then
  CUDA_VISIBLE_DEVICES=0 train single_gpu_gloo 150 --single_gpu_mode --vllm_sync_backend gloo \
    --num_learners_per_node 1 --deepspeed_stage 2
fi
if needs train_nccl 2; then
  train train_nccl 150 --vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2
fi
if needs train_gloo 2; then
  train train_gloo 150 --vllm_sync_backend gloo --num_learners_per_node 1 --deepspeed_stage 2
fi
if (( gpus >= 2 && ! check_only )); then
  part_transfer_failure --vllm_sync_backend nccl
elif needs transfer_failure 1; then
  CUDA_VISIBLE_DEVICES=0 part_transfer_failure --single_gpu_mode
fi
if needs two_learners 3; then
  train two_learners 150 --vllm_sync_backend nccl --num_learners_per_node 2 --deepspeed_stage 3
fi
if needs tensor_parallel 3; then
  part_tensor_parallel
fi
if needs default_stage 2; then
  train default_stage 150 --vllm_sync_backend nccl --num_learners_per_node 1
fi
if needs reprefill 2; then
  train reprefill 150 --vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2 \
    --inflight_update_kv reprefill
fi
if needs two_engines 3; then
  train two_engines 150 --vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2 --vllm_num_engines 2
fi
if needs save_resume 2; then
  part_save_resume
fi
if (( gpus >= 2 && ! check_only )); then
  part_weights_loaded --vllm_sync_backend nccl --deepspeed_stage 2
elif needs weights_loaded 1; then
  CUDA_VISIBLE_DEVICES=0 part_weights_loaded --single_gpu_mode --deepspeed_stage 2
fi
if needs engine_killed 3; then
  part_engine_killed
fi
if needs zero3_memory 1; then
  part_zero3_memory "$(( gpus >= 2 ? 2 : 1 ))"
fi
echo "gpu_check: $failures part(s) failed"
exit $(( failures > 0 ))
