#!/usr/bin/env bash
# GPU check: short real runs of the whole stack on this machine's GPU(s), each part printed PASS or FAIL
# with what it measured (the in-flight weight-sync pause and the learner step time). About 15 minutes on 1 GPU
# (an estimate: it has not run on a GPU yet).
# Hardware: 1+ NVIDIA GPUs. With one GPU the training parts share it (--single_gpu_mode: CUDA IPC); with 2+
# they take a GPU each (NCCL); parts that need more GPUs than there are say SKIP and how many.
# Usage: bash scripts/gpu_check.sh [--dry_run]   (OUT=dir keeps the runs' outputs; default: a temp dir)
# Runs with $PYTHON (default: the active environment's, $VIRTUAL_ENV/bin/python, else python3). Where that lacks
# the GPU stack (vllm 0.33 with its CUDA torch, ray, deepspeed, this package; a CPU torch on a machine with GPUs,
# such as the repository's CPU .venv, counts as lacking it) it installs the locked GPU stack once into .venv-gpu
# (GPU_VENV=dir), the only step that needs the network: python3 -m venv --system-site-packages .venv-gpu &&
# PYTHON=.venv-gpu/bin/python bash scripts/install_locked.sh gpu-cu13   (docs/install.md)
# Then it builds the embedded tiny model and dataset (trained on, in bf16) before the timed parts.
# --dry_run (or CHECK_ONLY=1): the parts that need no GPU only; every GPU part says SKIP with the GPUs it needs,
# which of a 1-, 2- and 8-GPU machine run it, and what it asserts. Every training part asserts
# offpolicy/rho_mean within 0.9-1.1 at every step (the engines generated with the learner's weights), not only
# its exit status.
# Timeouts: each part its own (below); the first part that starts an engine WARMUP_S (300) more, for vLLM's
# cold compile and CUDA-graph capture, cached for the later parts. Each is SIGTERM then, 30 s later, SIGKILL
# (SIGTERM only asks grpo_fast to finish its step, so a hung step would hang the check).
# Parts before the GPU ones: python (the interpreter), driver (nvidia-smi: NEEDS_CUDA, 13.0, or newer),
# compiler (cc or gcc, for Triton's launchers), install (vllm, ray, deepspeed and this checkout's open_instruct
# import as the trainer imports them, `python -P` from /), model (the embedded model and dataset, cached).
# GPU parts (PARTS, MIN_GPUS and CHECKS below say what each asserts; `--dry_run` prints them):
#   env, optimizer    CUDA and the pinned versions; torch's fused AdamW (no DeepSpeed JIT build)
#   single_gpu(_gloo) 3 steps sharing GPU 0 (CUDA IPC; gloo on a 1-GPU machine)
#   train_nccl/gloo   3 steps, an engine and a ZeRO-2 learner on a GPU each (2+ GPUs)
#   transfer_failure  a forced failed push (scripts/transfer_failure_check.py): NCCL with 2+ GPUs, else CUDA IPC
#   zero3_train, lora, default_stage, reprefill   ZeRO-3 with the reference; LoRA at the default stage
#                     (BF16_Optimizer, frozen base); ZeRO-0; --inflight_update_kv reprefill (1 GPU shared, 2+ NCCL)
#   save_resume       ZeRO-3 saving state and model each step; the model loads whole; the same command resumes
#   two_learners, tensor_parallel, two_engines   (3+ GPUs)
#   weights_loaded    engines' greedy tokens against a float32 transformers model holding the learner's weights,
#                     TF32 off on both sides (scripts/weights_loaded_check.py)
#   engine_killed     an engine SIGKILLed with samples held (tests/helpers/grpo_holding.py) until its replacement
#                     is ready; its join at the next sync asserted (3+ GPUs)
#   zero3_memory      benchmarks/zero3_memory.py (torch, DeepSpeed and transformers only): 2 ranks with 2+ GPUs
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
from open_instruct.stack_check import installed_stack, this_machine
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

train() {  # name, timeout, extra flags... ($require: metrics that every step must log, space-separated)
  local name="$1" limit="$(( $2 + warmup_s ))"  # the first part that starts an engine pays its cold start
  warmup_s=0
  shift 2
  local dir="$out/$name"
  # SIGTERM only asks grpo_fast to finish its step: a hung step gets SIGKILL 30 s later.
  if timeout -k 30 "$limit" "$python_bin" open_instruct/grpo_fast.py --output_dir "$dir" --exp_name "$name" \
      "${train_flags[@]}" "$@" >"$dir.log" 2>&1; then
    local detail
    detail="$("$python_bin" - "$dir/metrics.jsonl" ${require:-} <<'PY'
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
missing = [name for name in sys.argv[2:] if not all(name in r for r in rows)]
if missing:
    print(f"not logged at every step: {missing}; {summary}")
    sys.exit(1)
print(f"{summary}; rho_mean {min(rho):.3f}-{max(rho):.3f}" + "".join(
    f"; {name} {statistics.median(r[name] for r in rows):.4g}" for name in sys.argv[2:]))
PY
)" || { report "$name" FAIL "$(tail -1 <<<"$detail")"; return 0; }
    report "$name" PASS "$detail"
  else
    report "$name" FAIL "exit $? (log: $dir.log): $(grep -v '^\s*$' "$dir.log" | tail -1)"
  fi
}

placement() {  # the flags that place engine and learner: one shared GPU (CUDA IPC), or a GPU each (NCCL)
  if (( gpus < 2 )); then echo --single_gpu_mode; else echo --vllm_sync_backend nccl; fi
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

part_save_resume() {  # ZeRO-3 with the reference: 3 steps saving the state and the model after each; again: resumes
  local dir="$out/save_resume" state="$out/save_resume/state" before="$failures" detail
  local flags=($(placement) --num_learners_per_node 1 --deepspeed_stage 3 --checkpoint_state_freq 1
    --checkpoint_state_dir "$state" --save_freq 1)
  train save_resume 200 "${flags[@]}"
  (( failures == before )) || return 0  # (train reports a failure and returns 0: `set -e` must not end the check)
  # The saved model is whole (no empty ZeRO-3 partitions): it loads in transformers with every tensor of the
  # model it started from, in shape, and training moved it.
  if detail="$("$python_bin" - "$dir/checkpoints" 2>&1 <<'PY'
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
from open_instruct.data.models import resolve_model_path
steps = sorted(Path(sys.argv[1]).glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
assert steps, f"no model saved under {sys.argv[1]}"
saved = AutoModelForCausalLM.from_pretrained(steps[-1], dtype=torch.float32).state_dict()
start = AutoModelForCausalLM.from_pretrained(resolve_model_path(None), dtype=torch.float32).state_dict()
assert saved.keys() == start.keys(), f"tensors differ: {sorted(saved.keys() ^ start.keys())[:5]}"
shapes = [k for k in saved if saved[k].shape != start[k].shape]
assert not shapes, f"wrong shapes (partitions saved?): {shapes[:5]}"
moved = sum(not torch.equal(saved[k], start[k]) for k in saved)
assert moved, "the saved model equals the initial one"
print(f"{len(steps)} model saves; {steps[-1].name} loads whole in transformers, {moved}/{len(saved)} tensors trained")
PY
)"; then report saved_model PASS "$(tail -1 <<<"$detail")"; else report saved_model FAIL "$(tail -1 <<<"$detail")"; fi
  local log="$out/save_resume_again.log"
  if timeout -k 30 200 "$python_bin" open_instruct/grpo_fast.py --output_dir "$dir" \
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
  # float32 with TF32 off everywhere (scripts/weights_loaded_check.py sets NVIDIA_TF32_OVERRIDE=0 for cuBLAS
  # and TRITON_F32_DEFAULT=ieee for vLLM's Triton attention before any engine starts): its tie tolerance
  # is a float32 one, which TF32's 10-bit mantissa would exceed.
  if timeout -k 30 "$limit" "$python_bin" scripts/weights_loaded_check.py --dtype float32 \
      --vllm_gpu_memory_utilization 0.3 --num_learners_per_node 1 --output_dir "$out/weights_loaded" "$@" \
      >"$log" 2>&1; then
    report weights_loaded PASS "$(grep -Eo 'PASS engine .*' "$log" | head -1)"
  else
    report weights_loaded FAIL "exit $? (log: $log): $(grep -Eo 'FAIL engine .*' "$log" | head -1 || tail -1 "$log")"
  fi
}

part_engine_killed() {
  # 2 engines whose samples admitted from version 2 on wait after a few tokens until a release file exists
  # (tests/helpers/grpo_holding.py, as the CPU test does): the engine killed is one holding samples, no step
  # can finish before the release, and the release comes only once the replacement is ready. So the
  # replacement always joins at the next weight sync, and the join is asserted, never a race with the run's end.
  local dir="$out/engine_killed" limit="$(( 600 + warmup_s ))" pid victim deadline
  local held="$out/engine_killed_held" release="$out/engine_killed_release"
  warmup_s=0
  mkdir -p "$dir" "$held"
  rm -f "$release" "$held"/*
  HOLD_FROM_VERSION=2 HOLD_MARK_DIR="$held" HOLD_RELEASE_FILE="$release" setsid timeout -k 30 "$limit" \
    "$python_bin" tests/helpers/grpo_holding.py --output_dir "$dir" --exp_name engine_killed \
    "${train_flags[@]}" --total_episodes 128 --vllm_num_engines 2 --max_engine_restarts 1 --vllm_sync_backend nccl \
    --num_learners_per_node 1 --deepspeed_stage 2 >"$dir.log" 2>&1 &
  pid=$!
  deadline=$(( SECONDS + limit ))
  until [[ -n "$(ls "$held")" ]] || ! kill -0 "$pid" 2>/dev/null || (( SECONDS > deadline )); do sleep 1; done
  victim="$(ls "$held" | head -1)"
  if [[ -z "$victim" ]] || ! kill -9 "$victim" 2>/dev/null; then
    touch "$release"
    wait "$pid" || true
    report engine_killed FAIL "no engine held a sample to kill (log: $dir.log): $(tail -1 "$dir.log")"
    return 0
  fi
  until grep -q "'s replacement is ready" "$dir.log" || ! kill -0 "$pid" 2>/dev/null || (( SECONDS > deadline )); do
    sleep 1
  done
  touch "$release"
  if wait "$pid"; then
    local detail
    detail="$("$python_bin" - "$dir/metrics.jsonl" "$dir.log" "$victim" <<'PY'
import json, re, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
log = open(sys.argv[2]).read()
restarts = rows[-1].get("engines/restarts_total")
gone = re.search(r"old processes gone: exited \[([\d, ]*)\], killed \[([\d, ]*)\]", log)
victim_gone = bool(gone) and sys.argv[3] in re.findall(r"\d+", gone.group(1) + " " + gone.group(2))
joined = re.search(r"engine (\d) replaced \(.*\); it joined at weight version (\d+), ([\d.]+) s after the failure", log)
rho = [r["offpolicy/rho_mean"] for r in rows if "offpolicy/rho_mean" in r]
stopped = joined and re.search(rf"engine {joined.group(1)} stopped \(\w+\): .* at weight version (\d+)", log)
final = rows[-1].get("policy/version")
problems = [f"engines/restarts_total {restarts} (expected 1)"] if restarts != 1 else []
problems += [] if victim_gone else [f"the killed actor {sys.argv[3]} not confirmed gone"]
problems += [] if joined and int(joined.group(2)) >= 1 else ["the replacement did not join at a trained version"]
problems += [] if stopped and int(stopped.group(1)) == final else [f"the replacement did not serve to the end (version {final})"]
problems += [] if rho and all(0.9 <= x <= 1.1 for x in rho) else [f"rho_mean {rho}"]
if problems:
    print("; ".join(problems))
    sys.exit(1)
print(f"{len(rows)} steps; engine {joined.group(1)} replaced ({gone.group(0)}), joined at version "
      f"{joined.group(2)} {joined.group(3)} s after the kill and served to version {final}")
PY
)" || { report engine_killed FAIL "$(tail -1 <<<"$detail") (log: $dir.log)"; return 0; }
    report engine_killed PASS "$detail"
  else
    report engine_killed FAIL "exit $? (log: $dir.log): $(grep -v '^\s*$' "$dir.log" | tail -1)"
  fi
}

part_zero3_memory() {  # ranks: one per GPU, 2 where there are 2+ (with 1 rank nothing is partitioned to check)
  local log="$out/zero3_memory.log" detail world="$(( gpus >= 2 ? 2 : 1 ))"
  if detail="$(timeout -k 30 600 "$python_bin" - "$world" 2>"$log" <<'PY'
import sys
from benchmarks.zero3_memory import main
world = int(sys.argv[1])
rows = main(["--device", "cuda", "--world_size", str(world), "--size", "1024x8"])
whole = rows[0]["whole_model_bytes"]
zero3 = [r for r in rows if r["stage"] == 3]
held = max(r["held_parameter_bytes"] for r in zero3) / whole  # policy + reference partitions
gather = max(r["sync, one parameter at a time_peak_bytes"] for r in zero3) / whole
# A save, where the benchmark measures one: it gathers as the sync does, never a whole model per rank.
saves = {k: max(r[k] for r in zero3) / whole for k in zero3[0] if k.startswith("save") and k.endswith("_peak_bytes")}
bad = [f"{k} {v:.2f}" for k, v in saves.items() if v > 0.5]
if held > 2 / world + 0.1 or gather > 0.5 or bad:
    print(f"ZeRO-3 rank holds {held:.2f} copies (expected ~{2 / world:.2f}), per-parameter sync peak {gather:.2f}"
          + (f"; save peaks over 0.5 copies: {bad}" if bad else ""))
    sys.exit(1)
note = "" if world > 1 else " (1 rank: the partitioning itself needs 2 GPUs to check)"
print(f"{world} GPU rank(s): ZeRO-3 holds {held:.2f} fp32 copies per GPU (policy + reference), "
      f"per-parameter sync peak {gather:.2f} copies" + "".join(f", {k} {v:.2f}" for k, v in saves.items()) + note)
PY
)"; then report zero3_memory PASS "$(tail -1 <<<"$detail")"; else report zero3_memory FAIL "$(tail -1 <<<"$detail") (log: $log)"; fi
}

# Each GPU part: the fewest GPUs it needs, the most it runs on (0: any), and what it asserts beyond its exit
# status. The run and the dry run both read them (`runs_on`), so the dry run lists what a machine would check.
PARTS=(env optimizer single_gpu single_gpu_gloo train_nccl train_gloo transfer_failure zero3_train lora
  default_stage reprefill save_resume two_learners tensor_parallel two_engines weights_loaded engine_killed zero3_memory)
declare -A MIN_GPUS=([env]=1 [optimizer]=1 [single_gpu]=1 [single_gpu_gloo]=1 [train_nccl]=2 [train_gloo]=2
  [transfer_failure]=1 [zero3_train]=1 [lora]=1 [default_stage]=1 [reprefill]=1 [save_resume]=1 [two_learners]=3
  [tensor_parallel]=3 [two_engines]=3 [weights_loaded]=1 [engine_killed]=3 [zero3_memory]=1)
declare -A MAX_GPUS=([single_gpu_gloo]=1)  # with 2+, train_gloo covers gloo
rho="offpolicy/rho_mean within 0.9-1.1 at every step (the engines generated with the learner's weights)"
declare -A CHECKS=(
  [env]="CUDA visible to torch; vllm 0.33.0 and deepspeed 0.19.8, imported as the trainer imports them"
  [optimizer]="the weights move after 10 fused AdamW steps on the GPU"
  [single_gpu]="3 steps with --single_gpu_mode (CUDA IPC, ZeRO-2); $rho"
  [single_gpu_gloo]="3 steps with --single_gpu_mode --vllm_sync_backend gloo; $rho"
  [train_nccl]="3 steps, 1 engine + 1 ZeRO-2 learner, in-flight NCCL syncs; $rho"
  [train_gloo]="3 steps over --vllm_sync_backend gloo; $rho"
  [transfer_failure]="a forced failed push names its step, the engine keeps its weights, the next push loads"
  [zero3_train]="3 steps with ZeRO-3 and the reference (KL, --beta 0.05); $rho; objective/kl_avg logged every step"
  [lora]="3 steps with --use_peft at the default stage (ZeRO-0 in bf16: DeepSpeed's BF16_Optimizer, frozen base); $rho"
  [default_stage]="3 steps with the default learner stage (ZeRO-0, bf16); $rho"
  [reprefill]="3 steps with --inflight_update_kv reprefill (vLLM's abort pause); $rho"
  [save_resume]="3 ZeRO-3 steps (reference on) saving the state and the model after each, $rho; the last saved model loads whole in transformers, trained; the same command again resumes from the last state"
  [two_learners]="3 steps with 2 ZeRO-3 ranks in one STRICT_PACK placement group; $rho"
  [tensor_parallel]="3 steps, 1 engine with --vllm_tensor_parallel_size 2, both ranks synced; $rho"
  [two_engines]="3 steps, 2 engines synced in flight; $rho"
  [weights_loaded]="after in-flight syncs every engine's greedy token is the argmax (ties within 1e-3) of a float32 model holding the learner's weights, TF32 off in cuBLAS and Triton on both sides"
  [engine_killed]="an engine holding samples SIGKILLed after 2 steps, the run held until its replacement is ready: the old processes confirmed gone, engines/restarts_total 1, the replacement joined at a trained version and served to the end; $rho"
  [zero3_memory]="ZeRO-3 holds ~2/ranks fp32 copies per GPU (policy + reference), a per-parameter sync (and a save, where measured) peaks under 0.5 copies; 2 ranks where 2+ GPUs"
)

runs_on() {  # part, GPUs: true when a machine with that many GPUs runs the part
  (( $2 >= ${MIN_GPUS[$1]} )) && { [[ -z "${MAX_GPUS[$1]:-}" ]] || (( $2 <= ${MAX_GPUS[$1]} )); }
}

gpu_counts() {  # part: which of 1, 2 and 8 GPUs run it, and how where it differs
  local n counts=()
  for n in 1 2 8; do
    runs_on "$1" "$n" || continue
    case "$1:$n" in
      zero3_memory:1) counts+=("1 (1 rank)") ;;
      zero3_memory:*) counts+=("$n (2 ranks)") ;;
      single_gpu*:*) counts+=("$n") ;;
      transfer_failure:1 | zero3_train:1 | lora:1 | default_stage:1 | reprefill:1 | save_resume:1 | weights_loaded:1)
        counts+=("1 (shared, --single_gpu_mode)") ;;
      *) counts+=("$n") ;;
    esac
  done
  local joined="${counts[0]}" count
  for count in "${counts[@]:1}"; do joined+=", $count"; done
  echo "$joined"
}

gate() {  # part: true when this machine runs it (and this is no dry run), else reports SKIP
  if (( ! check_only )) && runs_on "$1" "$gpus"; then return 0; fi
  local need="${MIN_GPUS[$1]}" plural="s" why="this machine has $gpus"
  (( need == 1 )) && plural=""
  (( check_only )) && why="dry run (this machine has $gpus)"
  [[ -n "${MAX_GPUS[$1]:-}" ]] && why="at most ${MAX_GPUS[$1]}; $why"
  report "$1" SKIP "needs $need GPU$plural; $why; GPU counts (of 1, 2, 8) that run it: $(gpu_counts "$1"); checks: ${CHECKS[$1]}"
  return 1
}

run_part() {  # part: run it on this machine
  case "$1" in
    env) part_env ;;
    optimizer) part_optimizer ;;
    single_gpu) CUDA_VISIBLE_DEVICES=0 train single_gpu 150 --single_gpu_mode --num_learners_per_node 1 --deepspeed_stage 2 ;;
    single_gpu_gloo) CUDA_VISIBLE_DEVICES=0 train single_gpu_gloo 150 --single_gpu_mode --vllm_sync_backend gloo \
      --num_learners_per_node 1 --deepspeed_stage 2 ;;
    train_nccl) train train_nccl 150 --vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2 ;;
    train_gloo) train train_gloo 150 --vllm_sync_backend gloo --num_learners_per_node 1 --deepspeed_stage 2 ;;
    transfer_failure)
      if (( gpus >= 2 )); then part_transfer_failure --vllm_sync_backend nccl
      else CUDA_VISIBLE_DEVICES=0 part_transfer_failure --single_gpu_mode; fi ;;
    zero3_train) require="objective/kl_avg" train zero3_train 200 $(placement) --num_learners_per_node 1 \
      --deepspeed_stage 3 --beta 0.05 ;;
    lora) train lora 200 $(placement) --num_learners_per_node 1 --use_peft --lora_r 8 ;;
    default_stage) train default_stage 150 $(placement) --num_learners_per_node 1 ;;
    reprefill) train reprefill 150 $(placement) --num_learners_per_node 1 --deepspeed_stage 2 --inflight_update_kv reprefill ;;
    save_resume) part_save_resume ;;
    two_learners) train two_learners 150 --vllm_sync_backend nccl --num_learners_per_node 2 --deepspeed_stage 3 ;;
    tensor_parallel) part_tensor_parallel ;;
    two_engines) train two_engines 150 --vllm_sync_backend nccl --num_learners_per_node 1 --deepspeed_stage 2 \
      --vllm_num_engines 2 ;;
    weights_loaded)
      if (( gpus >= 2 )); then part_weights_loaded --vllm_sync_backend nccl --deepspeed_stage 2
      else CUDA_VISIBLE_DEVICES=0 part_weights_loaded --single_gpu_mode --deepspeed_stage 2; fi ;;
    engine_killed) part_engine_killed ;;
    zero3_memory) part_zero3_memory ;;
  esac
}

part_tensor_parallel() {  # the engine actor holds 2 GPUs; vLLM's mp executor runs a worker on each
  train tensor_parallel 180 --vllm_tensor_parallel_size 2 --vllm_sync_backend nccl --num_learners_per_node 1 \
    --deepspeed_stage 2
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
for part in "${PARTS[@]}"; do
  if gate "$part"; then run_part "$part"; fi
done
echo "gpu_check: $failures part(s) failed"
exit $(( failures > 0 ))
