#!/usr/bin/env bash
# Builds the Beaker image of the current commit from this repository's Dockerfile (docs/image.md), then
# starts a launch script with it:
#   scripts/train/build_image_and_launch.sh [--cuda-version 12|13] [--dry_run] SCRIPT [ARGS...]
# runs `IMAGE=<beaker user>/<image name> bash SCRIPT <beaker user>/<image name> ARGS...`: open-instruct's
# scripts take the image as $1, this repository's (scripts/multi_node.sh, long_generations_experiment.sh)
# read it from $1 or $IMAGE; as open-instruct's script of the same name does.
# Hardware: a workstation with git, docker (buildx) and the beaker CLI; the GPUs are Beaker's, none here.
# The image, open-instruct-integration-test-<branch>-cuda<12|13> (default 13: the locked GPU stack), is built
# only when no Beaker image of that name already names this commit in its description. Refuses a working
# tree with uncommitted or untracked changes: the image is the commit. --dry_run prints every step (the
# checks, the image name, the exact docker and beaker commands, the final bash line) and runs none of them;
# DRY_RUN=1 does the same. A launch script whose header documents `DRY_RUN  1 adds --dry_run to mason.py`
# (this repository's) is then run with DRY_RUN=1, so the dry run ends with the Beaker spec it would submit.
# Environment (optional): DOCKER_CACHE_REPO (registry cache for the build), BEAKER_WORKSPACE (default
# ai2/<beaker user>), BEAKER_USER (the user a dry run shows when the beaker CLI is missing).
# Unlike open-instruct's, this script installs nothing (no uv, no `uv sync`): the launched script runs with
# the active environment ($VIRTUAL_ENV), else, on a machine without NVIDIA GPUs, the CPU .venv of
# scripts/setup_env.sh, else the python on PATH (it runs only mason.py here; the job runs the image's).
set -euo pipefail

me="build_image_and_launch.sh"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage="usage: $me [--cuda-version 12|13] [--dry_run] SCRIPT [SCRIPT_ARGS...]"

fail() {
  echo "$me: $*" >&2
  exit 1
}

# ----------------------------------------------------------------------------- options (all before SCRIPT)

cuda_version=13
dry_run=0
[[ "${DRY_RUN:-0}" == "1" ]] && dry_run=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cuda-version)
      [[ $# -ge 2 ]] || fail "--cuda-version needs 12 or 13"
      cuda_version="$2"
      shift 2
      ;;
    --cuda-version=*)
      cuda_version="${1#*=}"
      shift
      ;;
    --dry_run | --dry-run)
      dry_run=1
      shift
      ;;
    --help | -h)
      echo "$usage"
      exit 0
      ;;
    -*) fail "unknown option $1 ($usage)" ;;
    *) break ;;
  esac
done
[[ "$cuda_version" == "12" || "$cuda_version" == "13" ]] || fail "--cuda-version must be 12 or 13, not '$cuda_version'"
[[ $# -ge 1 ]] || fail "no SCRIPT to launch ($usage)"
script="$1"
shift
[[ -f "$script" ]] || fail "no such launch script: $script"

# A dry run reports each step a real run could not do and goes on; a real run stops at the first.
blocked=()
say() { echo "$me: $*"; }
cannot() {
  if ((dry_run)); then
    say "$1: $2 (a real run stops here)"
    [[ " ${blocked[*]-} " == *" $1 "* ]] || blocked+=("$1")
  else
    fail "$1: $2"
  fi
}

# Commands as a shell would read them back, so a dry run's lines can be pasted.
quote() {
  local out=() arg
  for arg in "$@"; do
    if [[ -n "$arg" && "$arg" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=("$arg")
    else
      out+=("'${arg//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

# Runs a command, or under --dry_run prints it.
run() {
  if ((dry_run)); then
    say "would run: $(quote "$@")"
  else
    say "running: $(quote "$@")"
    "$@"
  fi
}

# run, and a failure is one line naming the step (the command's own output is above it).
must() {
  local what="$1"
  shift
  run "$@" || fail "$what: '$1 $2 $3' failed (its output is above)"
}

have() { command -v "$1" >/dev/null 2>&1; }

# Beaker prints JSON lists of objects; python3, not jq, reads them (one tool fewer to need).
json_field() {
  python3 -c '
import json, sys
data = json.load(sys.stdin)
item = data[0] if isinstance(data, list) and data else data
print((item or {}).get(sys.argv[1]) or "")
' "$1"
}

((dry_run)) && say "dry run: nothing is built, pushed or run"

# ----------------------------------------------------------------------------- checks: the image is the commit

if ! have git; then
  cannot "check the git repository" "git is not on PATH"
  git_hash="<commit>"
  git_branch="<branch>"
elif ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  cannot "check the git repository" "$PWD is not inside a git repository (the image is built from a commit)"
  git_hash="<commit>"
  git_branch="<branch>"
else
  changes="$(git status --porcelain)"
  if [[ -n "$changes" ]]; then
    git status --short >&2
    cannot "check the working tree" "uncommitted or untracked changes (listed above): commit or stash them, the image is built from the commit"
  else
    say "git repository: $(git rev-parse --show-toplevel); working tree: clean"
  fi
  git_hash="$(git rev-parse --short HEAD 2>/dev/null)" || fail "check the git repository: no commit yet to build the image from"
  git_branch="$(git rev-parse --abbrev-ref HEAD)"
fi

# Beaker names take letters, digits and -_. only and may not start with '-'.
sanitized_branch="$(printf '%s' "$git_branch" | tr -c 'A-Za-z0-9._-' '-' | tr '[:upper:]' '[:lower:]' | sed 's/^-*//')"
image_name="open-instruct-integration-test-${sanitized_branch}-cuda${cuda_version}"
say "commit $git_hash on branch $git_branch; image name: $image_name"

# ----------------------------------------------------------------------------- Beaker user and existing image

if ! have beaker; then
  cannot "look up the Beaker user (beaker account whoami)" "the beaker CLI is not on PATH"
  beaker_user="${BEAKER_USER:-<beaker user>}"
  existing_description=""
else
  whoami_json="$(beaker account whoami --format json)" || fail "look up the Beaker user: 'beaker account whoami' failed"
  beaker_user="$(json_field name <<<"$whoami_json")" || fail "look up the Beaker user: cannot read the JSON of 'beaker account whoami'"
  [[ -n "$beaker_user" ]] || fail "look up the Beaker user: 'beaker account whoami' names no user"
  # No image of that name yet is the usual case, not an error.
  existing_description="$(beaker image get "$beaker_user/$image_name" --format json 2>/dev/null | json_field description 2>/dev/null || true)"
fi
say "beaker user: $beaker_user"
workspace="${BEAKER_WORKSPACE:-ai2/$beaker_user}"

# ----------------------------------------------------------------------------- build and push the image

if [[ -n "$existing_description" && "$existing_description" == *"$git_hash"* ]]; then
  say "Beaker image $beaker_user/$image_name already holds commit $git_hash: no build, no upload"
else
  say "building the CUDA $cuda_version image for commit $git_hash"
  if ! have docker; then
    cannot "build the image (docker buildx build)" "docker is not on PATH"
  fi
  if [[ ! -f Dockerfile ]]; then
    cannot "build the image (docker buildx build)" \
      "no Dockerfile in $PWD to build the GPU image from (run this from the repository's root, or give an existing Beaker image to the launch script itself: bash $script <beaker image> ...)"
  fi
  # The Dockerfile installs locks/gpu-cu<N>.txt; without that lock the build would fail minutes in.
  if [[ -f Dockerfile && ! -f "locks/gpu-cu$cuda_version.txt" ]]; then
    cannot "build the image (docker buildx build)" \
      "no lock for CUDA $cuda_version (locks/gpu-cu$cuda_version.txt): only the CUDA 13 stack is locked (docs/install.md says why); use --cuda-version 13"
  fi
  build=(docker buildx build --platform=linux/amd64
    --build-arg "GIT_COMMIT=$git_hash" --build-arg "GIT_BRANCH=$git_branch" --build-arg "CUDA_VERSION=$cuda_version")
  if [[ -n "${DOCKER_CACHE_REPO:-}" ]]; then
    cache_from=(--cache-from "type=registry,ref=$DOCKER_CACHE_REPO")
    # Pushing to the cache needs write access to it; without that the build still reads from it.
    if ! run "${build[@]}" "${cache_from[@]}" --cache-to "type=registry,ref=$DOCKER_CACHE_REPO,mode=max" --load . -t "$image_name"; then
      say "the build with a cache push failed (no write access to $DOCKER_CACHE_REPO?): building again without pushing the cache"
      must "build the image" "${build[@]}" "${cache_from[@]}" --load . -t "$image_name"
    fi
  else
    must "build the image" "${build[@]}" --load . -t "$image_name"
  fi
  if ! have beaker; then
    cannot "upload the image (beaker image create)" "the beaker CLI is not on PATH"
  fi
  # Frees the name for the new image; there is nothing to rename the first time.
  run beaker image rename "$beaker_user/$image_name" "" || say "no earlier image $beaker_user/$image_name to rename"
  must "upload the image" beaker image create "$image_name" -n "$image_name" -w "$workspace" \
    --description "Git commit: $git_hash; CUDA: $cuda_version"
fi

# ----------------------------------------------------------------------------- launch

# open-instruct's launch scripts call `uv run python mason.py`; there uv runs the environment that
# `uv sync` just made. Here that environment is the one chosen below, and a real uv would re-sync .venv
# from PyPI (a CUDA torch over the CPU one), so `uv run CMD` runs CMD with that environment first on PATH.
uv() {
  if [[ "${1:-}" != "run" ]]; then
    echo "build_image_and_launch.sh: only 'uv run' is provided to launch scripts (it runs the chosen environment's python), not: uv $*" >&2
    return 2
  fi
  shift
  while [[ "${1:-}" == -* ]]; do shift; done # uv's own flags (--no-sync, --frozen): nothing to sync here
  if [[ "${1:-}" == *.py ]]; then set -- python "$@"; fi
  "$@"
}
export -f uv
# The CPU .venv never goes first on PATH of a machine with NVIDIA GPUs: there the GPU environment is the
# one to launch with, and the scripts' `python` must not silently become the CPU stack.
gpus_visible() {
  compgen -G '/dev/nvidia[0-9]*' >/dev/null && return 0
  have nvidia-smi && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null  # not -q: an early exit would SIGPIPE nvidia-smi under pipefail
}
if [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
  [[ ":$PATH:" == *":$VIRTUAL_ENV/bin:"* ]] || export PATH="$VIRTUAL_ENV/bin:$PATH"
  say "launch scripts run with $VIRTUAL_ENV/bin/python, the active environment ('uv run' included)"
elif [[ -x "$repo/.venv/bin/python" ]] && ! gpus_visible; then
  export PATH="$repo/.venv/bin:$PATH"
  say "launch scripts run with $repo/.venv/bin/python ('uv run' included)"
elif [[ -x "$repo/.venv/bin/python" ]]; then
  say "this machine has NVIDIA GPUs: $repo/.venv (the CPU stack) is not used; launch scripts run with the python on PATH"
else
  say "no active environment and no $repo/.venv (bash scripts/setup_env.sh makes it): launch scripts run with the python on PATH"
fi

image="$beaker_user/$image_name"
# open-instruct's scripts read the image from $1, this repository's from $1 or $IMAGE: both get it.
export IMAGE="$image"
if ((dry_run)); then
  # Only a script that documents DRY_RUN is run: any other would submit for real.
  if grep -Eq '^#[[:space:]]+DRY_RUN[[:space:]]+1 adds --dry_run to mason\.py' "$script"; then
    say "running (its own dry run: the spec, nothing submitted): DRY_RUN=1 IMAGE=$(quote "$image") $(quote bash "$script" "$image" "$@")"
    DRY_RUN=1 bash "$script" "$image" "$@" || fail "the dry run of $script failed (exit $?; its output is above)"
  else
    say "would run: IMAGE=$(quote "$image") $(quote bash "$script" "$image" "$@")"
  fi
  if ((${#blocked[@]})); then
    printf -v joined '%s; ' "${blocked[@]}"
    say "dry run done; a real run could not: ${joined%; }"
  else
    say "dry run done"
  fi
  exit 0
fi
say "running: IMAGE=$(quote "$image") $(quote bash "$script" "$image" "$@")"
exec bash "$script" "$image" "$@"
