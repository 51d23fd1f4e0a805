#!/usr/bin/env bash
# Installs a locked stack into the environment of $PYTHON: exactly the packages and versions of locks/STACK.txt,
# then this repo (editable, --no-deps), then checks every locked version is the one installed.
# Hardware: x86_64 Linux. The cpu stack needs no GPU; gpu-cu13 installs anywhere but runs on NVIDIA GPUs with
# driver >= 580 (docs/install.md).
# Usage: bash scripts/install_locked.sh STACK [--exact]
#   STACK    cpu or gpu-cu13 (a file in locks/; scripts/lock.py regenerates them)
#   --exact  also uninstall what the lock does not name (pip and this repo aside): for an environment that only
#            this repo uses (setup_env.sh's .venv, the image's), never a shared one
# Environment: PYTHON (default python3) names the environment's interpreter (a venv's bin/python); pip's own
# configuration (pip.conf, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_CERT, ...) decides where
# packages come from, as for any pip install, so a mirror works. Fails in one line naming the step.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"

step="start"
trap 'echo "install_locked.sh: FAILED during: $step (see the pip output above)" >&2' ERR
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "install_locked.sh: $*" >&2
  exit 1
}

stacks="$(cd "$repo/locks" && ls -- *.txt 2>/dev/null | sed 's/\.txt$//' | paste -sd' ')"
usage="usage: bash scripts/install_locked.sh STACK [--exact]; the locked stacks are: $stacks"
stack=""
exact=0
for arg in "$@"; do
  case "$arg" in
    --exact) exact=1 ;;
    -*) fail "$usage" ;;
    *)
      [[ -z "$stack" ]] || fail "$usage"
      stack="$arg"
      ;;
  esac
done
[[ -n "$stack" ]] || fail "$usage"
lock="$repo/locks/$stack.txt"
[[ "$stack" != */* && -f "$lock" ]] || fail "no lock for stack '$stack': the locked stacks are: $stacks"

step="check $python and its pip"
command -v "$python" >/dev/null 2>&1 || fail "cannot run $python (PYTHON=/path/to/env/bin/python names the environment)"
"$python" -m pip --version >/dev/null 2>&1 ||
  fail "$python has no working pip: make an environment first (python3 -m venv ENV; PYTHON=ENV/bin/python)"
pip=("$python" -m pip --disable-pip-version-check)

# The lock read by the environment's own Python: which lines apply there (markers), what it names that is
# installed too ("extra"), whether every locked version is the installed one ("check").
lock_tool() {
  "$python" - "$1" "$lock" <<'PY'
import importlib.metadata, sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # an environment without it still has pip's copy (its pip was checked above)
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

mode, lock = sys.argv[1], sys.argv[2]
pins = {}
for line in open(lock):
    text = line.split("#", 1)[0].strip()
    if text:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate():
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
dists = importlib.metadata.distributions()
installed = {canonicalize_name(d.metadata["Name"]): d.version for d in dists if d.metadata["Name"]}
ours = {"pip", "open-instruct"}
if mode == "extra":
    print("\n".join(sorted(set(installed) - set(pins) - ours)))
elif mode == "check":
    wrong = [f"{n} {installed.get(n, 'missing')} (locked {v})" for n, v in sorted(pins.items())
             if n not in installed or Version(installed[n]) != Version(v)]
    if wrong:
        print(f"{len(wrong)} installed versions differ from {lock}: {', '.join(wrong[:5])}")
        sys.exit(1)
    extra = sorted(set(installed) - set(pins) - ours)
    note = f"; {len(extra)} packages not in the lock are installed too: {' '.join(extra)}" if extra else ""
    print(f"install_locked.sh: {len(pins)} packages at the locked versions{note}")
PY
}

# Build tools and torch first, alone: DeepSpeed ships only an sdist whose build imports torch, and everything is
# built with --no-build-isolation (an isolated build would fetch a second, unlocked torch just to build it).
step="install the build tools and torch of locks/$stack.txt"
if grep -E '^(setuptools|wheel|torch)==' "$lock" >"$tmp/first.txt"; then
  "${pip[@]}" install --quiet --no-compile --no-deps -r "$tmp/first.txt"
fi

step="install locks/$stack.txt ($(grep -cE '^[A-Za-z0-9]' "$lock") pins)"
"${pip[@]}" install --quiet --no-compile --no-deps --no-build-isolation -r "$lock"

# The bytecode pip would have written, on every core: pip compiles one file at a time (the CPU stack's 29k files:
# 53 s of CPU; on 2 cores this takes 33 s). As with pip, a file that does not compile (a template, another
# Python's code) is skipped.
step="compile the environment's bytecode"
"$python" - <<'PY'
import compileall, sysconfig

for folder in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
    compileall.compile_dir(folder, quiet=2, workers=0)
PY

step="install this repo (editable, --no-deps)"
"${pip[@]}" install --quiet --no-deps --no-build-isolation -e "$repo"

if [[ "$exact" == 1 ]]; then
  step="remove the packages locks/$stack.txt does not name"
  extra="$(lock_tool extra)"
  if [[ -n "$extra" ]]; then
    echo "install_locked.sh: removing what locks/$stack.txt does not name: $(echo "$extra" | paste -sd' ')"
    # shellcheck disable=SC2086  # one package name a word
    "${pip[@]}" uninstall --yes --quiet $extra
  fi
fi

step="check the installed versions against locks/$stack.txt"
report="$(lock_tool check)" || fail "$report"
echo "$report"
