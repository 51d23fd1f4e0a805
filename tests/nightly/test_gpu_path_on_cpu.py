"""The GPU path's pieces run for real on the CPU stack: DeepSpeed takes one bf16 step with the ZeRO stage-0
config (fp32 accumulation), gpu_check.sh's forced transfer failure passes over gloo and over the
shared-memory file, and its weights-loaded check finds the engines decoding with the learner's weights.
(What can be checked without running them is in tests/unit/test_gpu_path.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_deepspeed_accepts_the_stage_0_bf16_config_and_trains_with_fp32_accumulation(model_path):
    helper = REPO / "tests" / "helpers" / "deepspeed_one_step.py"
    result = subprocess.run(
        [sys.executable, str(helper), "0", model_path, "bfloat16"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["optimizer"] == "BF16_Optimizer"  # fp32 master weights and gradient accumulation
    assert report["max_param_change"] > 0
    assert report["losses"][1] < report["losses"][0]


@pytest.mark.parametrize("flags", [[], ["--single_gpu_mode"]], ids=["gloo", "shm"])
def test_the_transfer_failure_check_passes_on_the_cpu_stack(flags):
    """scripts/transfer_failure_check.py is gpu_check.sh's forced-failure part; on CPU it runs over gloo,
    and with --single_gpu_mode through the shared-memory file (the staged sequence the GPU's CUDA IPC path
    takes), both through the same restoring reload the NCCL and IPC engines use."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "transfer_failure_check.py"), *flags],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    # Anywhere in a line: Ray's log thread prints the actors' output into the same stdout and can cut into a
    # check line (a full run once found four of the five at a line start while the script passed).
    checks = re.findall(r"(?:PASS|FAIL) [^\n]*", result.stdout)
    assert result.returncode == 0, "\n".join(checks) + result.stderr[-2000:]
    assert len(checks) == 5 and all(line.startswith("PASS") for line in checks), checks
    assert "0 check(s) failed" in result.stdout


def test_the_weights_loaded_check_finds_every_engine_token_to_be_the_learners_argmax(tmp_path):
    """scripts/weights_loaded_check.py is gpu_check.sh's proof that weights loaded: 2 training steps with
    in-flight syncs on the CPU stack, one more sync, then each of two engines' greedy tokens checked against
    a transformers model holding the learner's weights."""
    flags = ["--vllm_num_engines", "2", "--output_dir", str(tmp_path / "out"), "--learning_rate", "1e-3"]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "weights_loaded_check.py"), *flags],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    checks = re.findall(r"(?:PASS|FAIL) engine \d+: [^\n]*", result.stdout)
    assert result.returncode == 0, "\n".join(checks) + result.stderr[-3000:]
    assert len(checks) == 2 and all(line.startswith("PASS") for line in checks), checks
    assert all(f"{4 * 24} greedy tokens after 2 steps" in line for line in checks), checks


def test_the_gpu_kit_runs_its_cpu_checks_and_prints_its_table():
    """scripts/gpu_kit/run.sh on the CPU stack, its fast parts: the CUDA IPC check says SKIP, and the LoRA
    learner trains in bf16 through DeepSpeed's BF16_Optimizer with the frozen base untouched."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_kit" / "run.sh"), "--only", "cuda_ipc,lora_bf16"],
        env={**{k: v for k, v in os.environ.items() if k != "KIT_VENV"}, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = {line.split()[0]: line.split(None, 3) for line in result.stdout.splitlines() if line[:1].islower()}
    assert rows["check"][1:3] == ["status", "time"]
    assert rows["cuda_ipc"][1] == "SKIP" and "no CUDA device" in rows["cuda_ipc"][3]
    assert rows["lora_bf16"][1] == "PASS" and rows["lora_bf16"][3].startswith("BF16_Optimizer on cpu")
    assert "0 check(s) failed" in result.stdout
