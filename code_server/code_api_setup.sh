#!/usr/bin/env bash
# code_server/code_api_setup.sh: start the code-execution service the `code` / `code_stdio` verifiers post to.
#
# Runs on: the node that runs the trainer (the Beaker leader, or any local machine); CPU only. What it
# runs, in the background and left running:
#     python -m code_server --host HOST --port 0
# (a free port; the server's first stdout line is `CODE_API_URL=http://HOST:PORT`).
#
# Usage (source it, after ray_node_setup.sh when that is used):
#     source configs/beaker_configs/ray_node_setup.sh && source code_server/code_api_setup.sh \
#         && python open_instruct/grpo_fast.py ...
# (`source configs/beaker_configs/code_api_setup.sh`, the path launch commands use, sources this file.)
# It waits until `GET /health` answers "healthy", then exports
#   CODE_API_URL  the service's base URL, e.g. http://127.0.0.1:41234. Same convention as open-instruct:
#                 clients append the endpoint, `/test_program` (code) or `/test_program_stdio` (code_stdio);
#                 open-instruct's `--code_api_url` defaults to "$CODE_API_URL/test_program", and
#                 open_instruct/rewards/code_tests.py accepts the base or either endpoint URL.
#   CODE_API_PID  the server's process id (`kill "$CODE_API_PID"` stops it)
#   CODE_API_LOG  its log file (stdout and stderr)
#   CODE_API_KEY  the shared secret every request must carry (`Authorization: Bearer ...`), when one is in use:
#                 the caller's, or a fresh random one when the service binds an address other than loopback
#                 (the server refuses to start there without a key). The verifiers, the python tool and
#                 generic_sandbox send it; the trainer passes it to its Ray actors on every node.
# and returns 0; on failure it stops the server, prints the log's tail and returns 1, so a following `&&`
# does not start training without its verifier. Any CODE_API_URL set before is replaced.
# Executed instead of sourced (`bash code_api_setup.sh`) it does the same and prints the assignments
# (CODE_API_KEY only when a key is in use) on stdout, leaving the server running.
#
# Environment (all optional):
#   CODE_API_HOST             address to bind. Default 127.0.0.1; in a multi-node job (BEAKER_REPLICA_COUNT
#                             or NUM_NODES > 1) the host of RAY_ADDRESS instead, because the verifiers run
#                             in generation actors that Ray may place on any node.
#   CODE_API_SERVER_ARGS      more server arguments, split on whitespace (e.g. --max_concurrency 64)
#   CODE_SANDBOX_ALLOW_WEAK   1 lets the server start without its kernel sandbox layers (not root, or a container
#                             without the capability), confined by its Python guard and rlimits only; unset, such
#                             a server refuses to start and the log's tail (printed here) names the missing layer
#   CODE_API_STARTUP_TIMEOUT  seconds to wait for the service to become healthy (60)
#   CODE_API_LOG              log file (default: a new file under ${TMPDIR:-/tmp})
# Python is the repository's .venv/bin/python when it exists, else python3 on PATH; the repository is put
# on the server's PYTHONPATH, so it works from any working directory.
# Safe to source from shells with `set -u`, `set -e` or pipefail: it changes no shell options and uses only
# locals and `_cas_`-prefixed functions (removed again).

_cas_log() { printf '[code_api_setup] %s\n' "$*" >&2; }

_cas_setup() {
    local script_dir repo py host timeout log pid url count rc key
    local -a extra=()
    script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || return 1
    repo="$(cd "$script_dir/.." && pwd)" || return 1
    if [[ -x "$repo/.venv/bin/python" ]]; then
        py="$repo/.venv/bin/python"
    else
        py="$(command -v python3 || command -v python)" || { _cas_log "error: no python on PATH"; return 1; }
    fi

    timeout="${CODE_API_STARTUP_TIMEOUT:-60}"
    if ! [[ "$timeout" =~ ^[0-9]+$ ]]; then
        _cas_log "error: CODE_API_STARTUP_TIMEOUT must be a whole number of seconds, got '$timeout'"
        return 1
    fi
    count="${NUM_NODES:-${BEAKER_REPLICA_COUNT:-1}}"
    if [[ -n "${CODE_API_HOST:-}" ]]; then
        host="$CODE_API_HOST"
    elif [[ "$count" =~ ^[0-9]+$ ]] && (( count > 1 )) && [[ -n "${RAY_ADDRESS:-}" ]]; then
        host="${RAY_ADDRESS%:*}"
        host="${host#*://}"
    else
        host="127.0.0.1"
    fi
    key="${CODE_API_KEY:-}"
    case "$host" in
        127.* | localhost | ::1) ;;
        *) [[ -n "$key" ]] || key="$("$py" -c 'import secrets; print(secrets.token_urlsafe(32))')" || return 1 ;;
    esac
    read -r -a extra <<< "${CODE_API_SERVER_ARGS:-}"
    log="${CODE_API_LOG:-}"
    if [[ -z "$log" ]]; then
        if ! log="$(mktemp "${TMPDIR:-/tmp}/code_api_server.XXXXXX")"; then
            _cas_log "error: cannot create a log file under ${TMPDIR:-/tmp}"
            return 1
        fi
    fi

    _cas_log "starting the code-execution service on $host (log: $log)"
    # The key travels in the environment, not the command line, so the process list does not show it.
    CODE_API_KEY="$key" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$py" -m code_server \
        --host "$host" --port 0 ${extra[@]+"${extra[@]}"} </dev/null >"$log" 2>&1 &
    pid=$!

    # One Python process waits for the URL line, then for a healthy /health, and gives up early if the
    # server dies. No proxies: an http_proxy in the environment must not intercept a local address.
    url="$(CODE_API_KEY="$key" "$py" - "$log" "$pid" "$timeout" <<'PY'
import json, os, re, sys, time, urllib.request
log, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
key = os.environ.get("CODE_API_KEY")
opener.addheaders += [("Authorization", f"Bearer {key}")] if key else []
deadline = time.monotonic() + timeout
url = None

def alive() -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"

while time.monotonic() < deadline:
    if url is None:
        with open(log, errors="replace") as f:
            match = re.search(r"^CODE_API_URL=(\S+)$", f.read(), re.M)
        url = match.group(1) if match else None
    if url is not None:
        try:
            with opener.open(url + "/health", timeout=5) as reply:
                if reply.status == 200 and json.load(reply).get("status") == "healthy":
                    print(url)
                    sys.exit(0)
        except (OSError, ValueError):
            pass
    if not alive():
        print("the server exited", file=sys.stderr)
        sys.exit(2)
    time.sleep(0.2)
print(f"not healthy within {timeout:.0f}s" + ("" if url else " (it never printed its URL)"), file=sys.stderr)
sys.exit(1)
PY
)"
    rc=$?
    if (( rc != 0 )) || [[ -z "$url" ]]; then
        _cas_log "error: the code-execution service did not come up; last lines of $log:"
        tail -n 20 "$log" >&2
        kill "$pid" 2>/dev/null
        return 1
    fi
    export CODE_API_URL="$url" CODE_API_PID="$pid" CODE_API_LOG="$log"
    if [[ -n "$key" ]]; then
        export CODE_API_KEY="$key"
    fi
    _cas_log "healthy: CODE_API_URL=$CODE_API_URL (pid $CODE_API_PID)"
    return 0
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    _cas_status=0
    _cas_setup || _cas_status=$?
    unset -f _cas_log _cas_setup
    eval "unset _cas_status; return $_cas_status"
else
    _cas_setup || exit $?
    printf 'CODE_API_URL=%s\nCODE_API_PID=%s\nCODE_API_LOG=%s\n' \
        "$CODE_API_URL" "$CODE_API_PID" "$CODE_API_LOG"
    if [[ -n "${CODE_API_KEY:-}" ]]; then
        printf 'CODE_API_KEY=%s\n' "$CODE_API_KEY"
    fi
    exit 0
fi
