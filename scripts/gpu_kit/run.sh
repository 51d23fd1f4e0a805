#!/usr/bin/env bash
# The GPU kit: the learner side's GPU checks on a machine with torch but no vLLM, no Ray and no network
# (scripts/gpu_kit/checks.py: the LoRA learner in bf16 through BF16_Optimizer, the learner step full against
# LoRA timed, ZeRO-3 load/sync/save memory, the CUDA IPC handoff), each under a time limit, then a table.
# Hardware: 1+ NVIDIA GPUs; on a CPU machine the checks that can run on a CPU do, the CUDA-only ones SKIP.
# Usage: bash scripts/gpu_kit/run.sh [--dry_run] [--only NAME,NAME]
# Environment: PYTHON (default python3) must import torch (the machine's CUDA torch). When it does not also
# import the kit's packages, they are installed offline from scripts/gpu_kit/wheelhouse (built beforehand, on a
# machine with the network, by scripts/gpu_kit/build_wheelhouse.sh) into KIT_VENV (default
# scripts/gpu_kit/.venv), a venv that sees PYTHON's packages (torch) through a .pth file. CHECK_TIMEOUT_S
# (default 600) limits each check. --dry_run: checks the interpreter and the wheelhouse (present, its size
# within the 64 MiB a borrowed machine takes, a wheel for this Python of each package) and lists each check,
# where it runs and what it asserts; it installs and runs nothing.
set -euo pipefail

kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_bin="${PYTHON:-python3}"
venv="${KIT_VENV:-$kit/.venv}"
wheelhouse="$kit/wheelhouse"
limit="${CHECK_TIMEOUT_S:-600}"
dry_run=0 only=""
while (( $# )); do
  case "$1" in
    --dry_run) dry_run=1 ;;
    --only) only="${2:?--only needs NAME,NAME}"; shift ;;
    *) echo "gpu_kit: unknown argument $1 (usage: bash scripts/gpu_kit/run.sh [--dry_run] [--only NAME,NAME])" >&2; exit 2 ;;
  esac
  shift
done

imports_kit() {  # interpreter: true when it finds what the checks import (found, not imported: deepspeed is slow)
  "$1" -c 'import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))' \
    torch deepspeed peft transformers accelerate safetensors tokenizers huggingface_hub >/dev/null 2>&1
}

if ! torch_line="$("$python_bin" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")' 2>/dev/null)"; then
  echo "gpu_kit: $python_bin does not import torch: set PYTHON to the interpreter that holds the machine's torch" >&2
  exit 2
fi
echo "gpu_kit: $python_bin: $torch_line"

wheel_plan() {  # checks the wheelhouse: one line of what it holds; false when it is absent or unusable here
  "$python_bin" "$kit/wheelhouse.py" check "$wheelhouse"
}

if imports_kit "$python_bin"; then
  run_python="$python_bin"
  echo "gpu_kit: $python_bin already imports deepspeed, peft, transformers and accelerate: no install"
  if (( dry_run )); then wheel_plan || true; fi
elif (( dry_run )); then
  wheel_plan || exit 1
  run_python="$venv/bin/python"
  echo "gpu_kit: a run installs the wheelhouse into $venv"
else
  wheel_plan || exit 1
  if ! imports_kit "$venv/bin/python" 2>/dev/null; then
    "$python_bin" -m venv --without-pip --system-site-packages "$venv"
    # PYTHON's own packages (torch and its dependencies), also when PYTHON is itself a venv's interpreter
    "$python_bin" -c 'import site, sysconfig; print("\n".join(dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]])))' \
      >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu_kit_base.pth"
    # pip comes from PYTHON (no download); offline, exact files, no resolver (the wheelhouse is the closure)
    "$python_bin" -m pip --python "$venv/bin/python" install --no-index --no-deps --quiet \
      $("$python_bin" "$kit/wheelhouse.py" files "$wheelhouse")
  fi
  imports_kit "$venv/bin/python" || { echo "gpu_kit: $venv does not import the kit's packages after the install" >&2; exit 1; }
  run_python="$venv/bin/python"
  echo "gpu_kit: installed the wheelhouse into $venv"
fi

mapfile -t checks < <("$python_bin" - "$kit/checks.py" <<'PY'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CHECKS":
        for key, value in zip(node.value.keys, node.value.values):
            where, asserts = (ast.literal_eval(v) for v in value.elts)
            print(f"{ast.literal_eval(key)}\t{where}\t{asserts}")
PY
)
failures=0
table=()
for line in "${checks[@]}"; do
  IFS=$'\t' read -r name where asserts <<<"$line"
  if [[ -n "$only" && ",$only," != *",$name,"* ]]; then continue; fi
  if (( dry_run )); then
    table+=("$(printf '%-13s %-5s %5s  runs on %s; asserts: %s' "$name" PLAN - "$where" "$asserts")")
    continue
  fi
  started=$SECONDS
  log="$(mktemp)"
  if timeout -k 10 "$limit" "$run_python" "$kit/checks.py" "$name" >"$log" 2>&1; then rc=0; else rc=$?; fi
  result="$(grep -E '^(PASS|FAIL|SKIP) ' "$log" | tail -1 || true)"
  if (( rc == 124 || rc == 137 )); then
    result="FAIL over the ${limit} s limit"
  elif [[ -z "$result" ]] || (( rc != 0 )) && [[ "$result" != FAIL* ]]; then
    result="FAIL exit $rc: $(grep -v '^\s*$' "$log" | tail -1)"
  fi
  [[ "$result" == FAIL* ]] && failures=$((failures + 1))
  table+=("$(printf '%-13s %-5s %4ss  %s' "$name" "${result%% *}" "$(( SECONDS - started ))" "${result#* }")")
  rm -f "$log"
done
printf '%-13s %-5s %5s  %s\n' check status time detail
printf '%s\n' "${table[@]}"
echo "gpu_kit: $failures check(s) failed"
exit $(( failures > 0 ))
