#!/usr/bin/env bash
# ray_node_setup.sh: bring up the job's Ray cluster, one node (Beaker replica) at a time.
#
# Runs on: every replica of a Beaker task (GPU nodes in production; Ray detects the GPUs itself), or on
# one CPU machine for local testing. What it runs: `ray start --head` on replica 0, the leader, and
# `ray start --address=HEAD:PORT --block` on every other replica.
#
# Usage on Beaker (mason.py --num_nodes N puts it first in the task's `bash -c` command):
#     source configs/beaker_configs/ray_node_setup.sh && python open_instruct/grpo_fast.py ...
#   * Leader (BEAKER_REPLICA_RANK=0): starts the Ray head, waits until all BEAKER_REPLICA_COUNT nodes have
#     joined (failing after RAY_NODE_WAIT_TIMEOUT seconds, naming how many came), exports
#     RAY_ADDRESS=HEAD_IP:PORT and returns 0, so the rest of the command (the trainer) runs and joins that
#     cluster (open_instruct/cluster.py connects to RAY_ADDRESS).
#   * Workers (rank > 0): wait for the head, join it with `ray start --block` and never return. When Ray
#     stops they EXIT THE CALLING SHELL, so the trainer only ever runs on the leader. Exit status 0 when
#     the head is gone (the leader finished; its status is the job's), otherwise Ray's failure status.
# Executed instead of sourced:
#     bash configs/beaker_configs/ray_node_setup.sh [-- COMMAND ARGS...]
#   Same set-up; the leader then execs COMMAND with RAY_ADDRESS set, or without one exits 0 and leaves Ray
#   running (`ray stop` stops it). When sourced, the caller's positional arguments are ignored.
# Local (non-Beaker) mode: without BEAKER_* variables this is rank 0 of 1, a single-node head on 127.0.0.1.
# Two shells on one machine can form a 2-node cluster with NUM_NODES=2, RAY_HEAD_IP=127.0.0.1,
# BEAKER_REPLICA_RANK=0/1 and a distinct RAY_TEMP_DIR each (see tests/nightly/test_ray_node_setup.py).
# Other schedulers (Slurm, plain nodes): scripts/node_launch.sh maps their variables to NODE_RANK,
# NUM_NODES and RAY_HEAD_HOSTNAME (docs/clusters.md).
#
# Environment (all optional):
#   BEAKER_REPLICA_RANK, BEAKER_REPLICA_COUNT, BEAKER_LEADER_REPLICA_HOSTNAME   set by Beaker (0, 1, unset)
#   NODE_RANK              overrides BEAKER_REPLICA_RANK
#   NUM_NODES              overrides BEAKER_REPLICA_COUNT
#   RAY_HEAD_HOSTNAME      overrides BEAKER_LEADER_REPLICA_HOSTNAME (the head's host name, resolved to IPv4)
#   RAY_HEAD_IP            head address (default: the head's host name resolved to IPv4, else 127.0.0.1
#                          for a single node)
#   RAY_PORT               the head's GCS port (default 6379)
#   RAY_NODE_IP            this node's address in Ray (default: RAY_HEAD_IP on the leader; 127.0.0.1 on
#                          workers of a loopback head; Ray's own detection otherwise)
#   RAY_TEMP_DIR           `--temp-dir` for this node; keep it short (Ray's socket paths must fit 107 bytes)
#   RAY_START_EXTRA_ARGS   more `ray start` arguments, split on whitespace (ports, --num-cpus, ...)
#   RAY_NODE_WAIT_TIMEOUT  seconds the leader waits for all nodes and workers wait for the head (600)
#   RAY_AUTH_TOKEN         Ray >= 2.52 token authentication: when set (same value on every replica, e.g.
#                          from a Beaker secret) RAY_AUTH_MODE=token is exported; without it, and without
#                          RAY_AUTH_MODE, RAY_AUTH_MODE=disabled is exported (an unauthenticated cluster, as
#                          with Ray < 2.52), so head, workers and the trainer always agree.
# Note on addresses: Ray's servers listen on all interfaces, and Ray replaces a loopback node address by
# the machine's own; RAY_HEAD_IP=127.0.0.1 only chooses the address this script and the trainer dial.
# Environment: Ray and the trainer's `python` come from the active environment ($VIRTUAL_ENV), else, on a
# machine without NVIDIA GPUs only, the repository's CPU .venv, else `ray` on PATH (an image's environment:
# /opt/venv/bin in the image built from this repository's Dockerfile). The one chosen is put first on PATH
# when it is not on it yet, so the trainer runs the same Ray as the cluster. The CPU .venv is never used on
# a machine with GPUs. Then `python -m open_instruct.stack_check` checks that environment against
# the machine: a CPU torch or vLLM next to GPUs, or a driver older than the torch build's CUDA, stops here
# in one line (OPEN_INSTRUCT_SKIP_STACK_CHECK=1 skips it).
#
# Safe to source from shells with `set -u`, `set -e` or pipefail: it changes no shell options, uses only
# locals and `_rns_`-prefixed functions (removed again), and leaves only RAY_ADDRESS, RAY_AUTH_MODE (and
# PATH) behind.

_rns_log() { printf '[ray_node_setup] %s\n' "$*" >&2; }

# Wait until HOST:PORT accepts TCP connections; timeout 0 means one attempt. Uses the caller's $py.
_rns_wait_tcp() {
    "$py" - "$1" "$2" "$3" <<'PY'
import socket, sys, time
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while True:
    try:
        socket.create_connection((host, port), timeout=2).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() >= deadline:
            sys.exit(1)
        time.sleep(1)
PY
}

# Print how many Ray nodes are alive once COUNT have joined or TIMEOUT seconds passed; status 1 on timeout.
_rns_wait_nodes() {
    RAY_ADDRESS="$1" "$py" - "$1" "$2" "$3" <<'PY'
import sys, time
import ray
address, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while True:
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    if alive >= want or time.monotonic() >= deadline:
        break
    time.sleep(1)
ray.shutdown()
print(alive)
sys.exit(0 if alive >= want else 1)
PY
}

# True when this machine has NVIDIA GPUs: device files (nvidia0, ...) or GPUs listed by nvidia-smi.
_rns_gpus_visible() {
    compgen -G '/dev/nvidia[0-9]*' >/dev/null && return 0
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null  # not -q: an early exit would SIGPIPE nvidia-smi under pipefail
}

# Sets the caller's ray_bin and py (see "Environment" above); status 1 with one line when there is none.
_rns_pick_environment() {
    local env_bin="" gpus=0
    _rns_gpus_visible && gpus=1
    if [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/ray" ]]; then
        env_bin="$VIRTUAL_ENV/bin"
    elif (( ! gpus )) && [[ -x "$repo/.venv/bin/ray" ]]; then
        env_bin="$repo/.venv/bin"
    elif ray_bin="$(command -v ray)"; then
        env_bin="$(dirname "$ray_bin")"
    elif (( gpus )) && [[ -x "$repo/.venv/bin/ray" ]]; then
        _rns_log "error: this machine has NVIDIA GPUs and no ray on PATH: $repo/.venv is the CPU stack and is" \
            "not used with GPUs; activate the GPU environment (docs/install.md)"
        return 1
    else
        _rns_log "error: no ray: activate the environment that holds it (or put its bin/ on PATH)"
        return 1
    fi
    ray_bin="$env_bin/ray"
    py="$env_bin/python"
    [[ -x "$py" ]] || py="$(command -v python3 || command -v python)" || { _rns_log "error: no python"; return 1; }
    case ":${PATH:-}:" in
        *":$env_bin:"*) ;;
        *) export PATH="$env_bin${PATH:+:$PATH}" ;;
    esac
}

_rns_setup() {
    local script_dir repo ray_bin py rank count head_ip head_host port node_ip timeout addr out alive rc
    local -a temp_args=() extra=()
    script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || return 1
    repo="$(cd "$script_dir/../.." && pwd)" || return 1

    _rns_pick_environment || return 1
    # From the repository, so the module is found even where the package is not installed.
    if ! out="$(cd "$repo" && "$py" -m open_instruct.stack_check)"; then
        return 1  # the module printed its one line
    fi
    _rns_log "${out#stack_check: } ($py)"

    rank="${NODE_RANK:-${BEAKER_REPLICA_RANK:-0}}"
    count="${NUM_NODES:-${BEAKER_REPLICA_COUNT:-1}}"
    port="${RAY_PORT:-6379}"
    timeout="${RAY_NODE_WAIT_TIMEOUT:-600}"
    local name value
    for name in rank count port timeout; do
        value="${!name}"
        if ! [[ "$value" =~ ^[0-9]+$ ]]; then
            _rns_log "error: $name must be a non-negative integer, got '$value'"
            return 1
        fi
    done
    if (( count < 1 || rank >= count )); then
        _rns_log "error: replica rank $rank is not in [0, $count)" \
            "(NODE_RANK or BEAKER_REPLICA_RANK; NUM_NODES or BEAKER_REPLICA_COUNT)"
        return 1
    fi

    head_host="${RAY_HEAD_HOSTNAME:-${BEAKER_LEADER_REPLICA_HOSTNAME:-}}"
    if [[ -n "${RAY_HEAD_IP:-}" ]]; then
        head_ip="$RAY_HEAD_IP"
    elif [[ -n "$head_host" ]]; then
        # IPv4 explicitly: the head registers under one address, and workers must dial that same one.
        head_ip="$(getent ahostsv4 "$head_host" 2>/dev/null | awk 'NR == 1 {print $1}')"
        if [[ -z "$head_ip" ]]; then
            head_ip="$("$py" -c 'import socket, sys; print(socket.gethostbyname(sys.argv[1]))' \
                "$head_host" 2>/dev/null)"
        fi
        if [[ -z "$head_ip" ]]; then
            _rns_log "error: cannot resolve the leader's hostname '$head_host'"
            return 1
        fi
    elif (( count == 1 )); then
        head_ip="127.0.0.1"
    else
        _rns_log "error: $count nodes but no head address: set RAY_HEAD_HOSTNAME" \
            "(BEAKER_LEADER_REPLICA_HOSTNAME on Beaker) or RAY_HEAD_IP"
        return 1
    fi
    addr="$head_ip:$port"

    if [[ -n "${RAY_NODE_IP:-}" ]]; then
        node_ip="$RAY_NODE_IP"
    elif (( rank == 0 )); then
        node_ip="$head_ip"  # the head registers under the very address the workers dial
    elif [[ "$head_ip" == 127.* ]]; then
        node_ip="127.0.0.1"  # local test cluster (Ray itself maps loopback to the machine's address)
    else
        node_ip=""  # Ray picks the interface that routes to the head
    fi
    # Ray >= 2.52 switches token authentication on by itself when it finds ~/.ray/auth_token, but a
    # driver connecting later does not, and each Beaker replica is a fresh container with its own (or no)
    # token file. Make the mode explicit and identical on every node and for the trainer instead.
    if [[ -z "${RAY_AUTH_MODE:-}" ]]; then
        if [[ -n "${RAY_AUTH_TOKEN:-}${RAY_AUTH_TOKEN_PATH:-}" ]]; then
            export RAY_AUTH_MODE=token
        else
            export RAY_AUTH_MODE=disabled
            _rns_log "no RAY_AUTH_TOKEN: Ray token authentication disabled (set it on every replica," \
                "e.g. mason.py --secret RAY_AUTH_TOKEN=<secret>, to enable it)"
        fi
    fi
    [[ -n "${RAY_TEMP_DIR:-}" ]] && temp_args=("--temp-dir=$RAY_TEMP_DIR")
    # Word splitting is the point here: the variable holds several arguments.
    read -r -a extra <<< "${RAY_START_EXTRA_ARGS:-}"

    if (( rank == 0 )); then
        _rns_log "leader (rank 0 of $count): starting the Ray head on $addr with $ray_bin"
        # A stale RAY_ADDRESS in the environment would make `ray start` look for another cluster.
        if ! env -u RAY_ADDRESS "$ray_bin" start --head --node-ip-address="$node_ip" --port="$port" \
            --include-dashboard=false --disable-usage-stats \
            ${temp_args[@]+"${temp_args[@]}"} ${extra[@]+"${extra[@]}"}; then
            _rns_log "error: could not start the Ray head on $addr (port in use? see the output above)"
            return 1
        fi
        if (( count > 1 )); then
            _rns_log "waiting up to ${timeout}s for $count Ray nodes to join"
            out="$(_rns_wait_nodes "$addr" "$count" "$timeout")"
            rc=$?
            alive="${out##*$'\n'}"
            if (( rc != 0 )); then
                _rns_log "error: only ${alive:-?} of $count Ray nodes joined $addr within ${timeout}s;" \
                    "check the logs of the other replicas (each must run this script)." \
                    "The head is left running."
                return 1
            fi
            _rns_log "$alive/$count Ray nodes joined"
        fi
        export RAY_ADDRESS="$addr"
        _rns_log "RAY_ADDRESS=$RAY_ADDRESS"
        return 0
    fi

    _rns_log "worker (rank $rank of $count): waiting up to ${timeout}s for the Ray head at $addr"
    if ! _rns_wait_tcp "$head_ip" "$port" "$timeout"; then
        _rns_log "error: the Ray head at $addr did not come up within ${timeout}s"
        exit 1
    fi
    # --block: this node serves the cluster until Ray stops; workers never run the rest of the command.
    RAY_ADDRESS="$addr" "$ray_bin" start --address="$addr" ${node_ip:+"--node-ip-address=$node_ip"} \
        --disable-usage-stats ${temp_args[@]+"${temp_args[@]}"} ${extra[@]+"${extra[@]}"} --block
    rc=$?
    if _rns_wait_tcp "$head_ip" "$port" 0; then
        _rns_log "error: Ray on this worker stopped (status $rc) while the head at $addr is still up"
        exit $(( rc == 0 ? 1 : rc ))
    fi
    _rns_log "the Ray head at $addr is gone (the leader finished); worker exiting 0"
    exit 0
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    # Sourced: set up, then hand the status to the caller's `&&` chain.
    _rns_status=0
    _rns_setup || _rns_status=$?
    unset -f _rns_log _rns_wait_tcp _rns_wait_nodes _rns_gpus_visible _rns_pick_environment _rns_setup
    eval "unset _rns_status; return $_rns_status"
else
    # Executed: ray_node_setup.sh [-- COMMAND ARGS...]
    if (( $# > 0 )); then
        if [[ "$1" == "-h" || "$1" == "--help" ]]; then
            sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
            exit 0
        fi
        if [[ "$1" != "--" ]]; then
            printf 'usage: %s [-- COMMAND ARGS...]   (or: source %s)\n' "$0" "$0" >&2
            exit 2
        fi
        shift
    fi
    _rns_setup || exit $?
    if (( $# > 0 )); then
        exec "$@"
    fi
    exit 0
fi
