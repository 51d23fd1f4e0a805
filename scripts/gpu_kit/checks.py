"""The GPU kit's checks: what the learner side does on a GPU, with torch, DeepSpeed, peft and transformers only
(no vLLM, no Ray, no network). One check per process (DeepSpeed's process group is per process):

    python scripts/gpu_kit/checks.py NAME     # prints one last line: PASS, FAIL or SKIP and what it measured
    python scripts/gpu_kit/checks.py --list   # NAME<TAB>where it runs<TAB>what it asserts, one a line

Run them all with `bash scripts/gpu_kit/run.sh` (installs the wheelhouse, time limits, a table).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's open_instruct, not an installed one

# name: (where it runs, what it asserts)
CHECKS = {
    "cuda_ipc": (
        "CUDA only",
        "scripts/cuda_ipc_check.py: weights staged by the ipc transport rebuild byte for byte in another process, "
        "a release frees them, the loss math on CUDA equals the CPU's",
    ),
    "lora_bf16": (
        "CUDA, CPU",
        "a LoRA learner (the learner's own adapters.wrap and deepspeed_config, default stage 0) in bf16 runs "
        "DeepSpeed's BF16_Optimizer: 3 steps, the loss finite, every adapter tensor moved, the frozen base "
        "bit-identical",
    ),
    "learner_step": (
        "CUDA, CPU",
        "full fine-tuning against LoRA on the same model and batch, bf16, default stage: median step time of each "
        "and the ratio (measured, not judged), peak GPU memory of each; both losses finite",
    ),
    "zero3_memory": (
        "CUDA (2 ranks with 2+ GPUs), CPU (2 gloo ranks)",
        "benchmarks/zero3_memory.py: a ZeRO-3 rank holds ~2/ranks fp32 copies (policy + reference) after loading "
        "and DeepSpeed's setup; on CUDA a per-parameter sync (and a save, where measured) peaks under 0.5 copies",
    ),
}


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def random_model(hidden: int, layers: int):
    """A random Qwen2 (no tokenizer, no download) in bf16."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        intermediate_size=4 * hidden,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).to(torch.bfloat16)


def learner_engine(model, lora: bool):
    """The model as the learner builds it at the default stage in bf16 (optionally wrapped with an adapter)."""
    from open_instruct import adapters
    from open_instruct.config.model import ModelConfig
    from open_instruct.learner import deepspeed_setup
    from open_instruct.learner.rendezvous import listening_socket

    listener = listening_socket()
    port = listener.getsockname()[1]
    deepspeed_setup.init_distributed(rank=0, world_size=1, master_port=port, listener=listener)
    if lora:
        model = adapters.wrap(model, ModelConfig(use_peft=True, lora_r=16, lora_alpha=32), gradient_checkpointing=False)
    optimizer = deepspeed_setup.make_optimizer(model, learning_rate=1e-3, weight_decay=0.0, fused=device() == "cuda")
    config = deepspeed_setup.deepspeed_config(stage=0, micro_batch_size=2, bf16=True)
    return deepspeed_setup.initialize_engine(model, optimizer, config)


def batch(engine, rows: int, length: int):
    import torch

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 4096, (rows, length), generator=generator).to(engine.device)
    return ids


def train_step(engine, ids) -> float:
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    return float(loss)


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def check_lora_bf16() -> tuple[str, str]:
    import math

    import torch

    hidden, layers = (1024, 8) if device() == "cuda" else (256, 2)
    engine = learner_engine(random_model(hidden, layers), lora=True)
    named = dict(engine.module.named_parameters())
    adapter = {n for n, p in named.items() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in named.items()}
    ids = batch(engine, 2, 128)
    losses = [train_step(engine, ids) for _ in range(3)]
    optimizer = type(engine.optimizer).__name__
    problems = [] if optimizer == "BF16_Optimizer" else [f"optimizer {optimizer}, not BF16_Optimizer"]
    problems += [] if adapter and all("lora_" in n for n in adapter) else ["trainable tensors other than the adapter"]
    problems += [] if all(math.isfinite(x) for x in losses) else [f"losses {losses}"]
    unmoved = [n for n in adapter if torch.equal(named[n].detach(), before[n])]
    # lora_B starts at zero and lora_A's gradient is zero until it moves: after 3 steps both have moved
    problems += [f"{len(unmoved)} adapter tensors did not move ({unmoved[:2]})"] if unmoved else []
    changed = [n for n in named if n not in adapter and not torch.equal(named[n].detach(), before[n])]
    problems += [f"{len(changed)} frozen base tensors changed ({changed[:2]})"] if changed else []
    dtypes = sorted({str(named[n].dtype).removeprefix("torch.") for n in adapter})
    detail = (
        f"{optimizer} on {device()}, {hidden}x{layers}: {len(adapter)} adapter tensors ({'/'.join(dtypes)}) moved, "
        f"{len(named) - len(adapter)} base tensors untouched; loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )
    return ("FAIL", "; ".join(problems) + f" ({detail})") if problems else ("PASS", detail)


def check_learner_step() -> tuple[str, str]:
    import math

    import torch

    on_gpu = device() == "cuda"
    hidden, layers, rows, length, steps = (2048, 16, 4, 1024, 6) if on_gpu else (256, 2, 2, 64, 2)
    results = {}
    for mode in ("full", "lora"):
        engine = learner_engine(random_model(hidden, layers), lora=mode == "lora")
        ids = batch(engine, rows, length)
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(steps + 1):  # the first step (allocations, kernel selection) is not counted
            synchronize()
            started = time.perf_counter()
            losses.append(train_step(engine, ids))
            synchronize()
            times.append(time.perf_counter() - started)
        peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
        results[mode] = (statistics.median(times[1:]), peak, losses)
        del engine
        if on_gpu:
            torch.cuda.empty_cache()
    full, lora = results["full"], results["lora"]
    memory = f", peak {full[1]:.2f} / {lora[1]:.2f} GiB" if on_gpu else ""
    detail = (
        f"{device()} {hidden}x{layers}, {rows}x{length} tokens: step full {full[0]:.3f} s, LoRA {lora[0]:.3f} s "
        f"(LoRA/full {lora[0] / full[0]:.2f}){memory}"
    )
    finite = all(math.isfinite(x) for x in full[2] + lora[2])
    return ("PASS", detail) if finite else ("FAIL", f"non-finite loss ({detail})")


def check_zero3_memory() -> tuple[str, str]:
    import torch

    from benchmarks.zero3_memory import main

    on_gpu = device() == "cuda"
    world = min(torch.cuda.device_count(), 2) if on_gpu else 2
    size = "1024x8" if on_gpu else "256x4"
    rows = main(["--device", device(), "--world_size", str(world), "--size", size])
    whole = rows[0]["whole_model_bytes"]
    zero3 = [r for r in rows if r["stage"] == 3]
    held = max(r["held_parameter_bytes"] for r in zero3) / whole
    peaks = {k: max(r[k] for r in zero3) / whole for k in zero3[0] if k.endswith("_peak_bytes")}
    # On CPU the peaks are sampled resident memory (allocator noise at this size): reported, not judged.
    judged = {k: v for k, v in peaks.items() if k.startswith(("sync, one parameter", "save"))} if on_gpu else {}
    bad = [f"{k} {v:.2f}" for k, v in judged.items() if v > 0.5]
    detail = f"{world} {device()} rank(s), {size}: ZeRO-3 holds {held:.2f} fp32 copies per rank; peaks " + ", ".join(
        f"{k.removesuffix('_peak_bytes')} {v:.2f}" for k, v in peaks.items()
    )
    if held > 2 / world + 0.1 or bad:
        return "FAIL", f"expected ~{2 / world:.2f} copies held and peaks under 0.5 ({bad}); {detail}"
    return "PASS", detail


def check_cuda_ipc() -> tuple[str, str]:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cuda_ipc_check.py"), "--gib", "0.5"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode == 2 and "no CUDA device" in result.stderr:
        return "SKIP", "no CUDA device visible to torch"
    lines = [line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    failed = [line for line in lines if line.startswith("FAIL")]
    if result.returncode != 0 or failed or not lines:
        return "FAIL", (failed or [result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no output"])[0]
    return "PASS", f"{len(lines)} parts: " + " | ".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        for name, (where, asserts) in CHECKS.items():
            print(f"{name}\t{where}\t{asserts}")
        return 0
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"checks.py: usage: checks.py NAME | --list (NAME: {', '.join(CHECKS)})", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    status, detail = globals()[f"check_{argv[0]}"]()
    print(f"{status} {detail}")
    return 1 if status == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
