"""A stand-in `nvidia-smi`: put its folder first on PATH and this machine "has" NVIDIA GPUs for the stack
check (open_instruct/stack_check.py) and the node scripts that look for GPUs.

Environment of a call: FAKE_GPUS (how many, default 8), FAKE_DRIVER (the driver version, default 580.65.06).
Answers `-L` (one `GPU i: ...` line per GPU), `--query-gpu=driver_version` or `--query-gpu=name` (one line per
GPU) and, for anything else, the banner line that names the driver and CUDA 13.0.
"""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_SMI = f"""#!{sys.executable}
import os, sys
gpus = int(os.environ.get("FAKE_GPUS", "8"))
driver = os.environ.get("FAKE_DRIVER", "580.65.06")
args = sys.argv[1:]
if args == ["-L"]:
    for i in range(gpus):
        print(f"GPU {{i}}: NVIDIA H100 80GB HBM3 (UUID: GPU-{{i:08d}})")
elif "--query-gpu=driver_version" in args:
    print("\\n".join([driver] * gpus))
elif "--query-gpu=name" in args:
    print("\\n".join(["NVIDIA H100 80GB HBM3"] * gpus))
else:
    print(f"| NVIDIA-SMI {{driver}}   Driver Version: {{driver}}   CUDA Version: 13.0 |")
"""


def install(directory: Path) -> Path:
    """`directory/nvidia-smi`, the stand-in; returns the folder to put first on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nvidia-smi").write_text(FAKE_SMI)
    (directory / "nvidia-smi").chmod(0o755)
    return directory
