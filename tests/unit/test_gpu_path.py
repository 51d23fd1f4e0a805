"""What the GPU path decides that can be checked without CUDA: the optimizer, DeepSpeed's config for ZeRO stage 0
in bf16, the ZeRO-3 memory check and the GPU check's parts. (The send watchdog around the weight broadcast is in
test_watchdog; placement and the one transport decision in test_placement; the engines' restore after a failed
update in test_weight_reload; DeepSpeed taking that config and the forced transfer failure, run for real on CPU,
in tests/nightly/test_gpu_path_on_cpu.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


@pytest.mark.parametrize("fused", [True, False])
def test_the_optimizer_is_torchs_adamw_fused_by_flag_never_a_jit_built_op(fused):
    import torch

    from open_instruct.learner.deepspeed_setup import make_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = make_optimizer(model, learning_rate=1e-3, weight_decay=0.1, fused=fused)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["fused"] is fused
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]  # biases and norms not decayed
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # the fused kernel exists for this device


def test_zero_stage_0_in_bf16_accumulates_gradients_in_fp32():
    from open_instruct.learner.deepspeed_setup import deepspeed_config

    bf16 = deepspeed_config(stage=0, micro_batch_size=1, gradient_accumulation_steps=4, bf16=True)
    assert bf16["data_types"] == {"grad_accum_dtype": "fp32"}
    assert bf16["zero_optimization"]["stage"] == 1  # where DeepSpeed 0.19 runs bf16 with fp32 accumulation
    fp32 = deepspeed_config(stage=0, micro_batch_size=1, bf16=False)
    assert fp32["zero_optimization"]["stage"] == 0 and "data_types" not in fp32
    assert "data_types" not in deepspeed_config(stage=2, micro_batch_size=1, bf16=True)
    stage1 = deepspeed_config(stage=1, micro_batch_size=1, bf16=True)  # ZeRO-1 asked for: the same fp32 path
    assert stage1["zero_optimization"]["stage"] == 1 and stage1["data_types"] == {"grad_accum_dtype": "fp32"}


def test_the_zero3_memory_check_runs_where_only_torch_and_deepspeed_are_installed():
    """gpu_check.sh's zero3_memory part is the learner side's torch-only check (GPU machines that cannot install
    vLLM): its module, the model builder and the learner's DeepSpeed setup import neither vLLM nor Ray."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import benchmarks.zero3_memory, benchmarks.weight_sync\n"
        "import open_instruct.learner.deepspeed_setup\n"
        "print(sorted({name.split('.')[0] for name in sys.modules} & {'vllm', 'ray'}))\n"
    )
    # From the repository root, as gpu_check.sh runs it: benchmarks/ is not installed.
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def gpu_check_plan(tmp_path) -> dict[str, str]:
    """`gpu_check.sh --dry_run` with an interpreter that lacks the GPU stack (fast: nothing to import): each
    GPU part's SKIP line, by name."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    python = Path(sys.base_prefix) / "bin" / "python3"
    env = {k: v for k, v in os.environ.items() if k not in ("CHECK_ONLY", "GPU_VENV", "WARMUP_S", "VIRTUAL_ENV")}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry_run"],
        cwd=repo,
        env={**env, "PYTHON": str(python), "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    parts = {}
    for line in result.stdout.splitlines():
        name, status, detail = line.split(None, 2)
        if status == "SKIP" and "GPU counts" in detail:
            parts[name] = detail
    return parts


def test_the_gpu_check_dry_run_says_which_gpu_counts_run_each_part_and_what_it_asserts(tmp_path):
    parts = gpu_check_plan(tmp_path)
    counts = r"GPU counts \(of 1, 2, 8\) that run it: (.*?); checks: "
    runs = {name: re.search(counts, detail).group(1) for name, detail in parts.items()}
    shared = "1 (shared, --single_gpu_mode), 2, 8"
    # One GPU checks ZeRO-3 with the reference, LoRA at the default stage, the default stage, reprefill and a
    # save + resume with a model saved, each on the shared GPU; more GPUs run them over NCCL.
    one_gpu = ("zero3_train", "lora", "default_stage", "reprefill", "save_resume", "weights_loaded", "transfer_failure")
    for name in one_gpu:
        assert runs[name] == shared, (name, runs[name])
    assert runs["single_gpu"] == "1, 2, 8" and runs["single_gpu_gloo"] == "1"
    assert runs["train_nccl"] == runs["train_gloo"] == "2, 8"
    for name in ("two_learners", "tensor_parallel", "two_engines", "engine_killed"):
        assert runs[name] == "8", (name, runs[name])
    assert runs["zero3_memory"] == "1 (1 rank), 2 (2 ranks), 8 (2 ranks)"
    checks = {name: d.split("; checks: ", 1)[1] for name, d in parts.items()}
    assert "joined at a trained version" in checks["engine_killed"]
    assert "replacement is ready" in checks["engine_killed"]
    assert "TF32 off" in checks["weights_loaded"] and "objective/kl_avg" in checks["zero3_train"]
    assert "BF16_Optimizer" in checks["lora"] and "loads whole in transformers" in checks["save_resume"]
    assert all("rho_mean within 0.9-1.1" in checks[n] for n in ("zero3_train", "lora", "reprefill", "save_resume"))


def test_the_engine_killed_part_holds_the_run_until_the_replacement_is_ready_and_asserts_the_join():
    """What gpu_check's engine_killed waits for and greps are what the trainer and the holding wrapper write
    (the CPU test, tests/integration/test_engine_faults.py, runs the same wrapper and handshake)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    script = (repo / "scripts" / "gpu_check.sh").read_text()
    part = script[script.index("part_engine_killed() {") : script.index("part_zero3_memory() {")]
    assert "tests/helpers/grpo_holding.py" in part and (repo / "tests" / "helpers" / "grpo_holding.py").exists()
    holding = (repo / "tests" / "helpers" / "grpo_holding.py").read_text()
    assert all(name in holding for name in ("HOLD_FROM_VERSION", "HOLD_MARK_DIR", "HOLD_RELEASE_FILE"))
    # the release comes after the replacement-ready line, which the replacement logs in these words
    assert part.index("'s replacement is ready") < part.index('touch "$release"\n  if wait')
    replacement = (repo / "open_instruct" / "generation" / "replacement.py").read_text()
    assert "'s replacement is ready" in replacement
    pool = (repo / "open_instruct" / "generation" / "pool.py").read_text()
    assert "replaced (%s); it joined at weight version %d, %.1f s after the failure" in pool
    assert r"it joined at weight version (\d+), ([\d.]+) s after the failure" in part
