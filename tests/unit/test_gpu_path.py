"""What the GPU path decides that can be checked without CUDA: the send watchdog around the weight broadcast,
the optimizer, and DeepSpeed's config for ZeRO stage 0 in bf16. (Placement and the one transport decision
are in test_placement; the engines' restore after a failed update in test_weight_reload; DeepSpeed taking
that config and the forced transfer failure, run for real on CPU, in tests/integration/test_gpu_path_on_cpu.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from open_instruct.weights.transport import WeightSyncError
from open_instruct.weights.watchdog import SendWatchdog


def test_the_watchdog_passes_a_send_through_and_its_errors_unchanged():
    watchdog = SendWatchdog()
    assert watchdog.run(lambda: 42, timeout_s=5, what="send") == 42

    def failing():
        raise ConnectionError("peer reset")

    with pytest.raises(ConnectionError, match="peer reset"):
        watchdog.run(failing, timeout_s=5, what="send")
    assert watchdog.broken is None  # a send that failed by itself left the collective: later sends may go


def test_a_send_blocked_in_a_collective_trips_the_watchdog_and_every_later_send_fails_at_once():
    released = threading.Event()
    calls = []

    def blocked_broadcast():  # what vLLM's NCCL broadcast does when an engine is gone: wait forever
        calls.append(1)
        released.wait()
        return 1

    watchdog = SendWatchdog()
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"'send' of version 3 on learner 0 did not finish within 1s"):
        watchdog.run(blocked_broadcast, timeout_s=1, what="weight sync step 'send' of version 3 on learner 0")
    assert 1 <= time.monotonic() - started < 5
    with pytest.raises(WeightSyncError, match="restart the run"):
        watchdog.run(blocked_broadcast, timeout_s=1, what="the next send")
    assert calls == [1]  # the second send never entered the broken group
    released.set()


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
        "import open_instruct.benchmarks.zero3_memory, open_instruct.benchmarks.weight_sync\n"
        "import open_instruct.learner.deepspeed_setup\n"
        "print(sorted({name.split('.')[0] for name in sys.modules} & {'vllm', 'ray'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
