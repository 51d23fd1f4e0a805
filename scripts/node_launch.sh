#!/usr/bin/env bash
# One node of a multi-node job outside Beaker (Slurm, or plain nodes started by hand, ssh or pdsh): maps the
# scheduler's variables to the node rank, node count and head that configs/beaker_configs/ray_node_setup.sh
# reads, sets NCCL's defaults, brings Ray up (the head on rank 0; the other ranks join it and block), and on
# rank 0 runs COMMAND on that cluster, then stops the head so that every other node exits 0.
# Hardware: every node of the job, one task per node (NVIDIA GPUs in production; CPU-only for a loopback test).
# Usage (docs/clusters.md):
#   Slurm (scripts/slurm.sh does this): srun --ntasks-per-node=1 bash scripts/node_launch.sh -- COMMAND...
#   plain nodes, on each: NODE_RANK=i NUM_NODES=n HEAD_HOST=<rank 0's host> bash scripts/node_launch.sh -- COMMAND...
#   bash scripts/node_launch.sh --print   # the rank, count, head and NCCL settings this node would use; starts nothing
# COMMAND (e.g. python open_instruct/grpo_fast.py ...) runs on rank 0 only, with RAY_ADDRESS set, in the
# environment ray_node_setup.sh picks (the active one; never the repository's CPU .venv on a GPU node). The
# exit status is COMMAND's on rank 0, and 0 on the other ranks once the head is gone. SIGTERM or SIGINT
# (scancel, a time limit) is passed on to COMMAND; grpo_fast saves its state and stops.
# Environment:
#   NODE_RANK NUM_NODES HEAD_HOST   explicit values (plain nodes); each wins over the scheduler's
#   SLURM_PROCID SLURM_NNODES SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST)   Slurm's: rank = task id (one task
#                  per node), head = the first host of the node list (`scontrol show hostnames`)
#   RAY_PORT RAY_START_EXTRA_ARGS RAY_NODE_WAIT_TIMEOUT RAY_AUTH_TOKEN   as in ray_node_setup.sh
#   RAY_TEMP_DIR   this node's Ray directory (default /tmp/ray_oi_<job id>_<rank>; how the head is found to stop it)
#   NCCL_*         yours win. Defaults: NCCL_CUMEM_ENABLE=0 (the learner -> vLLM weight broadcast is slow and can
#                  hang with NCCL's cuMem allocator), NCCL_DEBUG=WARN (NCCL says when it falls back from
#                  InfiniBand to sockets). NCCL finds the InfiniBand HCAs itself; NCCL_IB_HCA,
#                  NCCL_SOCKET_IFNAME and NCCL_IB_GID_INDEX are your cluster's (docs/clusters.md).
set -euo pipefail

me="node_launch.sh"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf '[%s] %s\n' "$me" "$*" >&2; }
fail() {
  log "error: $*"
  exit 2
}

print_only=0
command=()
if (($# > 0)); then
  case "$1" in
    --print) print_only=1 ;;
    --) shift; command=("$@") ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) fail "usage: $me [--print | -- COMMAND ARGS...]" ;;
  esac
fi

# ----------------------------------------------------------------------------- the scheduler's variables

if [[ -n "${NODE_RANK:-}" ]]; then
  rank="$NODE_RANK"
elif [[ -n "${SLURM_PROCID:-}" ]]; then
  rank="$SLURM_PROCID"
else
  fail "no node rank: set NODE_RANK (plain nodes) or run under srun (SLURM_PROCID)"
fi
count="${NUM_NODES:-${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-}}}"
[[ -n "$count" ]] || fail "no node count: set NUM_NODES (plain nodes) or run under srun (SLURM_NNODES)"
nodelist="${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:-}}"
if [[ -n "${HEAD_HOST:-}" ]]; then
  head="$HEAD_HOST"
elif [[ -n "$nodelist" ]]; then
  command -v scontrol >/dev/null 2>&1 || fail "no scontrol on PATH to expand the node list '$nodelist' (or set HEAD_HOST)"
  head="$(scontrol show hostnames "$nodelist" | awk 'NR == 1')"  # awk reads it all: no SIGPIPE under pipefail
  [[ -n "$head" ]] || fail "scontrol show hostnames '$nodelist' named no host (set HEAD_HOST)"
elif [[ "$count" == "1" ]]; then
  head="127.0.0.1"
else
  fail "no head host: set HEAD_HOST to rank 0's host name (plain nodes) or run under srun (SLURM_JOB_NODELIST)"
fi
for name in rank count; do
  [[ "${!name}" =~ ^[0-9]+$ ]] || fail "$name must be a non-negative integer, got '${!name}'"
done
((count >= 1 && rank < count)) || fail "node rank $rank is not in [0, $count) (one task per node: srun --ntasks-per-node=1)"

export NODE_RANK="$rank" NUM_NODES="$count" RAY_HEAD_HOSTNAME="$head"
export RAY_TEMP_DIR="${RAY_TEMP_DIR:-/tmp/ray_oi_${SLURM_JOB_ID:-$(date +%s)}_${rank}}"

# ----------------------------------------------------------------------------- NCCL

export NCCL_CUMEM_ENABLE="${NCCL_CUMEM_ENABLE:-0}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
hcas="$(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ' || true)"

if ((print_only)); then
  echo "node rank $rank of $count; head $head (port ${RAY_PORT:-6379}); Ray temp dir $RAY_TEMP_DIR"
  echo "InfiniBand devices: ${hcas:-none}"
  env | grep '^NCCL_' | sort
  exit 0
fi

if [[ -n "$hcas" ]]; then
  log "InfiniBand devices: ${hcas% } (NCCL uses them between nodes${NCCL_IB_HCA:+, NCCL_IB_HCA=$NCCL_IB_HCA})"
  if [[ "$(ulimit -l)" != "unlimited" ]]; then
    log "warning: the locked-memory limit is $(ulimit -l) KiB; NCCL over InfiniBand wants it unlimited" \
      "(Slurm: PropagateResourceLimits / ulimit -l in slurmd's unit; a container: --ulimit memlock=-1)"
  fi
elif ((count > 1)); then
  log "warning: no InfiniBand device (/sys/class/infiniband): NCCL goes over TCP sockets between nodes"
fi

# ----------------------------------------------------------------------------- Ray, then the command on rank 0

setup="$repo/configs/beaker_configs/ray_node_setup.sh"
if ((rank > 0)); then
  exec bash "$setup"  # joins the head and blocks; exits 0 once the head is gone
fi
((${#command[@]} > 0)) || fail "rank 0 needs a command to run: $me -- COMMAND ARGS..."

# The head's daemons are the processes that name this node's Ray directory on their command line: stopping
# exactly those (never `ray stop`, which stops every Ray of this user on the machine) ends the workers too.
head_pids() {  # the pattern comes from a file descriptor, so grep does not find itself
  grep -lsaF -f <(printf '%s\n' "$RAY_TEMP_DIR") /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 | grep -vx "$$" || true
}
stop_head() {
  local pids pid alive signal
  for signal in TERM KILL; do
    pids="$(head_pids)"
    [[ -n "$pids" ]] || return 0
    for pid in $pids; do kill -s "$signal" "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 20); do  # up to 10 s for them to exit
      alive=""
      for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive+=" $pid"; done
      [[ -n "$alive" ]] || return 0
      sleep 0.5
    done
  done
}

# Sourced, so RAY_ADDRESS (and the environment's PATH) reach the command.
# shellcheck source=../configs/beaker_configs/ray_node_setup.sh
if ! source "$setup"; then
  stop_head
  exit 1
fi
status=0
"${command[@]}" &
child=$!
trap 'kill -s TERM "$child" 2>/dev/null || true' TERM INT
# `wait` returns early when a trapped signal arrives; the command is then still finishing.
while true; do
  wait "$child" && status=0 || status=$?
  kill -0 "$child" 2>/dev/null || break
done
trap - TERM INT
log "the command finished (status $status); stopping the Ray head so that the other nodes exit"
stop_head
exit "$status"
