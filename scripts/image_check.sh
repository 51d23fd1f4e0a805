#!/usr/bin/env bash
# Builds the Dockerfile's CPU variant for real and runs the trainer inside the image: imports the package,
# `grpo_fast.py --preflight`, and 2 training steps on the embedded default (the tiny model and data the
# package generates; no network at run time). No registry is needed: the base is a Debian bookworm made with
# debootstrap and imported into buildah (vfs storage, chroot isolation). The package index reaches the build
# as a user behind a corporate mirror passes it: this machine's pip configuration (index URLs, find-links, CA
# bundle) becomes a pip.conf and a CA file given as build secrets, and local index folders are mounted
# read-only for the build, none of it kept in a layer. Prints how long each phase took.
# Hardware: an x86_64 Linux machine, no GPU; root (buildah with chroot isolation, debootstrap); about 20 GB of
# free disk at its peak, 7 GB kept between runs (vfs keeps a full copy of the image per container). Needs the Debian mirror and the machine's pip
# sources. The nightly tier runs it (scripts/nightly.sh); docs/image.md has the times measured here.
# Usage: bash scripts/image_check.sh [--dry-run]   (--dry-run prints the phases' commands, builds nothing)
# Environment: IMAGE_CHECK_DIR (default output/image_check: the cached base and buildah's storage),
#   DEBIAN_MIRROR (default http://deb.debian.org/debian), PYTHON (the python whose pip configuration is
#   passed on; default python3), IMAGE_CHECK_TAG (default localhost/open_instruct:cpu-check).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h | --help)
      sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "image_check.sh: unknown argument '$arg' (usage: bash scripts/image_check.sh [--dry-run])" >&2
      exit 2
      ;;
  esac
done

work="${IMAGE_CHECK_DIR:-$repo/output/image_check}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
python_bin="${PYTHON:-python3}"
tag="${IMAGE_CHECK_TAG:-localhost/open_instruct:cpu-check}"
base_tar="$work/debian-bookworm-rootfs.tar"
base_image="localhost/open_instruct-base:bookworm"
# Our own storage: the check's images and containers stay out of the machine's default store and are removed
# by deleting $work.
bh=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot

step="start"
trap 'echo "image_check.sh: FAILED during: $step (output above)" >&2' ERR

run() {
  if ((dry_run)); then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

phases=()
phase_start=0
begin() {
  step="$1"
  phase_start=$SECONDS
  echo "image_check.sh: == $step"
}
end() {
  local took=$((SECONDS - phase_start))
  phases+=("$(printf '%6ss  %s' "$took" "$step")")
  echo "image_check.sh: $step took ${took}s"
}

if ((!dry_run)) && [[ "$(id -u)" != 0 ]]; then
  echo "image_check.sh: needs root (buildah with chroot isolation and debootstrap); run it as root or with sudo" >&2
  exit 1
fi
mkdir -p "$work"

begin "install buildah and debootstrap (apt-get)"
if command -v buildah >/dev/null && command -v debootstrap >/dev/null; then
  echo "image_check.sh: buildah and debootstrap already installed"
else
  run apt-get update
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends buildah debootstrap
fi
end

begin "make a Debian bookworm base (debootstrap; cached as $base_tar)"
if [[ -f "$base_tar" ]]; then
  echo "image_check.sh: reusing $base_tar"
else
  run rm -rf "$work/bookworm.partial"
  run debootstrap --variant=minbase bookworm "$work/bookworm.partial" "$mirror"
  run tar -C "$work/bookworm.partial" -cf "$base_tar.partial" .
  run mv "$base_tar.partial" "$base_tar"
  run rm -rf "$work/bookworm.partial"
fi
end

begin "import the base into buildah as $base_image"
if ((!dry_run)) && "${bh[@]}" inspect --type image "$base_image" >/dev/null 2>&1; then
  echo "image_check.sh: $base_image already in $work/storage"
else
  if ((dry_run)); then
    ctr='$ctr'
    run "${bh[@]}" from scratch
  else
    ctr="$("${bh[@]}" from scratch)"
  fi
  run "${bh[@]}" add "$ctr" "$base_tar" /
  run "${bh[@]}" config --cmd /bin/bash "$ctr"
  run "${bh[@]}" commit --rm "$ctr" "$base_image"
fi
end

begin "pass this machine's pip configuration to the build (secrets and read-only mounts)"
secrets="$(mktemp -d)"
trap 'rm -rf "$secrets"' EXIT
# pip's merged configuration (files, then PIP_* variables) as a pip.conf for the build; the CA bundle and
# any local folder it names (find-links, file:// indexes) come back as build arguments. Nothing of it is
# written into a layer: secrets and --volume mounts exist only while a RUN step runs.
mapfile -t pip_args < <("$python_bin" - "$secrets" <<'PY'
import configparser, os, subprocess, sys
from urllib.parse import urlparse

out = sys.argv[1]
listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
merged = {}
for rank in ("global", "install", ":env:"):  # later sections win, as in pip
    for line in listing.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section == rank:
            merged[name] = value.strip().strip("'\"")
conf = configparser.ConfigParser()
conf["global"] = {}
args, mounts = [], set()

def local_folder(location, is_index):
    path = urlparse(location).path if location.startswith("file://") else location
    if not path.startswith("/"):
        return None
    # A file:// simple index links its files relative to itself (../../files/x.whl): mount the folder above.
    if is_index and os.path.basename(path.rstrip("/")) == "simple":
        path = os.path.dirname(path.rstrip("/"))
    return path

for name in ("index-url", "extra-index-url", "find-links", "trusted-host", "timeout", "default-timeout"):
    if name in merged:
        conf["global"][name] = merged[name]
        if name in ("index-url", "extra-index-url", "find-links"):
            for location in merged[name].split():
                folder = local_folder(location, name != "find-links")
                if folder and os.path.isdir(folder):
                    mounts.add(folder)
cert = merged.get("cert") or os.environ.get("PIP_CERT")
if cert and os.path.isfile(cert):
    conf["global"]["cert"] = "/run/secrets/pip_ca"
    args += ["--secret", f"id=pip_ca,src={cert}"]
with open(os.path.join(out, "pip.conf"), "w") as f:
    conf.write(f)
args += ["--secret", f"id=pip_conf,src={os.path.join(out, 'pip.conf')}"]
for folder in sorted(mounts):
    args += ["--volume", f"{folder}:{folder}:ro"]
print("\n".join(args))
PY
)
echo "image_check.sh: pip.conf for the build:"
sed 's/^/    /' "$secrets/pip.conf"
echo "image_check.sh: build arguments: ${pip_args[*]}"
end

begin "build the CPU variant ($tag)"
commit="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
branch="$(git -C "$repo" rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)"
# A rebuild replaces the previous image; vfs would otherwise keep every build's full copy.
((dry_run)) || "${bh[@]}" rmi -f "$tag" >/dev/null 2>&1 || true
# --skip-unused-stages=false with the CUDA bases pointed at the local base: buildah 1.28 skips the stage an
# argument in the last FROM names (see the Dockerfile); nothing is pulled and nothing runs in those stages.
run "${bh[@]}" bud --isolation chroot --pull=never --layers=false --skip-unused-stages=false \
  --build-arg STACK=cpu --build-arg BASE_IMAGE="$base_image" \
  --build-arg CUDA12_IMAGE="$base_image" --build-arg CUDA13_IMAGE="$base_image" \
  --build-arg GIT_COMMIT="$commit" --build-arg GIT_BRANCH="$branch" \
  "${pip_args[@]}" -f "$repo/Dockerfile" -t "$tag" "$repo"
end

# Each check runs in a fresh container of the image, as a launcher would run it: the image's working
# directory, environment and PATH, nothing from this machine.
in_image() {
  local ctr
  if ((dry_run)); then
    run "${bh[@]}" from --pull=never "$tag"
    run "${bh[@]}" run '$ctr' -- bash -c "$1"
    return
  fi
  ctr="$("${bh[@]}" from --pull=never "$tag")"
  local rc=0
  "${bh[@]}" run --isolation chroot "$ctr" -- bash -c "$1" || rc=$?
  "${bh[@]}" rm "$ctr" >/dev/null
  return "$rc"
}

begin "inside the image: the environment and the package's imports"
in_image 'set -euo pipefail
echo "python: $(command -v python) (VIRTUAL_ENV=$VIRTUAL_ENV) in $PWD; GIT_COMMIT=$GIT_COMMIT GIT_BRANCH=$GIT_BRANCH"
[[ "$PWD" == /stage && "$(command -v python)" == /opt/venv/bin/python ]]
[[ ! -e /stage/.venv && ! -e /stage/output ]] || { echo "the build context leaked .venv or output/ into /stage" >&2; exit 1; }
[[ ! -e /etc/pip.conf && -z "$(ls -A /run/secrets 2>/dev/null)" ]] || { echo "the build'"'"'s pip configuration is in the image" >&2; exit 1; }
# ldd finds torch'"'"'s own libraries only after torch is imported; anything else missing is a system library.
missing="$(find /opt/venv/lib/python3*/site-packages/vllm -maxdepth 1 -name "_C*.so" -exec ldd {} + |
  grep "not found" | awk "{print \$1}" | grep -v -e libtorch -e libc10 | sort -u | paste -sd" " || true)"
[[ -z "$missing" ]] || { echo "vLLM'"'"'s compiled kernels link libraries the image lacks: $missing" >&2; exit 1; }
cd open_instruct && python -c "
import grpo_fast, open_instruct, torch, vllm, deepspeed, ray
assert open_instruct.__file__.startswith(\"/stage/\"), open_instruct.__file__
print(f\"open_instruct from {open_instruct.__file__}; torch {torch.__version__}, vllm {vllm.__version__}, deepspeed {deepspeed.__version__}, ray {ray.__version__}\")
"'
end

begin "inside the image: grpo_fast.py --preflight"
in_image 'python open_instruct/grpo_fast.py --preflight'
end

begin "inside the image: 2 training steps on the embedded default"
in_image 'set -euo pipefail
python open_instruct/grpo_fast.py --max_train_steps 2 --output_dir /tmp/image_check_run
python - <<EOF
import json
rows = [json.loads(line) for line in open("/tmp/image_check_run/metrics.jsonl")]
steps = sorted({row["training_step"] for row in rows})
assert len(steps) == 2, f"expected 2 training steps in metrics.jsonl, saw steps {steps}"
print(f"image_check: trained 2 steps ({steps}, counted from 0)")
EOF'
end

echo "image_check.sh: done; time per phase:"
printf '%s\n' "${phases[@]}"
echo "image_check.sh: total ${SECONDS}s"
