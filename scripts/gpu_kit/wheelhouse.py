"""The GPU kit's wheelhouse: which packages it holds, and which of its wheels this interpreter installs.

    python scripts/gpu_kit/wheelhouse.py requirements [LOCK]   # name==version;marker lines to download
    python scripts/gpu_kit/wheelhouse.py check DIR             # one line; exit 1 when unusable here
    python scripts/gpu_kit/wheelhouse.py files DIR             # the wheels this interpreter installs

The packages are the kit's roots (what the checks import beyond torch) and everything they need, read from the
GPU lock's `# via` comments, less torch and what torch brings (the borrowed machine has those). `check` and
`files` run with the borrowed machine's bare interpreter: the standard library only.
"""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

ROOTS = ("deepspeed", "peft", "transformers", "accelerate", "safetensors", "tokenizers", "huggingface-hub")
# Needed by nothing the checks import (tried in a torch-only venv): huggingface_hub's Xet client (downloads only,
# 4 MiB a wheel) and its command line (typer, click, rich, pygments, ...); pydantic's e-mail extra (other
# packages of the lock ask for it). Without them the wheelhouse fits 64 MiB with wheels for two Pythons.
LEFT_OUT = ("hf-xet", "email-validator", "dnspython", "typer", "click", "rich", "pygments", "markdown-it-py", "mdurl")
LEFT_OUT += ("shellingham", "annotated-doc")
LIMIT_BYTES = 64 * 2**20  # what a borrowed GPU machine takes beside the checkout
LOCK = Path(__file__).resolve().parents[2] / "locks" / "gpu-cu13.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> list[tuple[str, str, str, set[str]]]:
    """(name, version, marker, the packages it is there for) of each pinned line."""
    rows = []
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;#]+)\s*(?:;\s*([^#]*?))?\s*(?:#\s*via\s+(.*))?$", line)
        if match:
            name, version, marker, via = match.groups()
            parents = {canonical(p.split(" (")[0].strip()) for p in (via or "").split(",") if p.strip()}
            rows.append((canonical(name), version, (marker or "").strip(), parents))
    return rows


def closure(rows, roots) -> set[str]:
    """The roots and every package that some package in the set is there for, to a fixed point."""
    needed = {canonical(r) for r in roots}
    grown = True
    while grown:
        grown = False
        for name, _, _, parents in rows:
            if name not in needed and parents & needed:
                needed.add(name)
                grown = True
    return needed


def kit_packages(text: str) -> list[tuple[str, str, str]]:
    """(name, version, marker) of the wheelhouse's packages, by name."""
    rows = parse_lock(text)
    kit = closure(rows, ROOTS) - closure(rows, ["torch"]) - set(LEFT_OUT)
    return sorted((name, version, marker) for name, version, marker, _ in rows if name in kit)


def wheel_fits(filename: str, version_info=sys.version_info, machine: str = platform.machine()) -> bool:
    """Whether this interpreter installs the wheel: its Python and ABI tags, and its platform (x86_64 Linux)."""
    parts = filename[: -len(".whl")].split("-")
    python_tags, abi_tags, platform_tags = (set(tag.split(".")) for tag in parts[-3:])
    cp = f"cp{version_info[0]}{version_info[1]}"
    abi_ok = "none" in abi_tags or cp in abi_tags
    abi_ok |= "abi3" in abi_tags and any(t.startswith("cp3") and int(t[3:]) <= version_info[1] for t in python_tags)
    python_ok = cp in python_tags or "py3" in python_tags or "abi3" in abi_tags
    linux = any(t.startswith("manylinux") and t.endswith(machine) for t in platform_tags)
    platform_ok = "any" in platform_tags or linux
    return abi_ok and python_ok and platform_ok


def installable(directory: Path) -> tuple[list[Path], list[str]]:
    """The wheel of each package that fits this interpreter, and the packages that have none."""
    chosen, names = {}, set()
    for wheel in sorted(directory.glob("*.whl")):
        name = canonical(wheel.name.split("-")[0])
        names.add(name)
        if wheel_fits(wheel.name):
            chosen.setdefault(name, wheel)
    return list(chosen.values()), sorted(names - chosen.keys())


def main(argv: list[str]) -> int:
    if argv[:1] == ["requirements"]:
        lock = Path(argv[1]) if len(argv) > 1 else LOCK
        for name, version, marker in kit_packages(lock.read_text()):
            print(f"{name}=={version}" + (f";{marker}" if marker else ""))
        return 0
    if len(argv) != 2 or argv[0] not in ("check", "files"):
        print("wheelhouse.py: usage: requirements [LOCK] | check DIR | files DIR", file=sys.stderr)
        return 2
    directory = Path(argv[1])
    wheels, missing = installable(directory) if directory.is_dir() else ([], [])
    if argv[0] == "files":
        print("\n".join(str(w) for w in wheels))
        return 0
    size = sum(w.stat().st_size for w in directory.glob("*")) if directory.is_dir() else 0
    here = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
    if not wheels:
        print(
            f"gpu_kit: no wheelhouse in {directory}: build it where there is a network: "
            "bash scripts/gpu_kit/build_wheelhouse.sh",
            file=sys.stderr,
        )
        return 1
    if missing or size > LIMIT_BYTES:
        problems = [f"no wheel for {here} of {', '.join(missing)}"] if missing else []
        problems += [f"{size / 2**20:.1f} MiB, over 64 MiB"] if size > LIMIT_BYTES else []
        problem = "; ".join(problems)
        print(f"gpu_kit: wheelhouse {directory}: {problem}", file=sys.stderr)
        return 1
    print(f"gpu_kit: wheelhouse {directory}: {size / 2**20:.1f} MiB (limit 64), {len(wheels)} packages for {here}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
