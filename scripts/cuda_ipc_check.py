"""GPU check of what runs on a CUDA machine with torch alone (no vLLM, Ray or DeepSpeed installed):

  handoff   the `ipc` weight transport's trainer side (`weights.ipc`) stages a model's worth of weights and
            another process rebuilds them from the pickled handles exactly as vLLM's IPC engine does
            (base64 + pickle, args[6] overwritten with the receiver's device, `rebuild_cuda_tensor`), and
            every byte matches; after `trainer_release` the staged memory is freed
  mismatch  metadata that disagrees with a tensor fails the staging, naming the tensor, and a release
            frees what was staged before it
  unopened  (measured, not judged) what a release leaves held when no engine opened the handles
  loss      the loss and advantage math (`loss`, `advantages`) on CUDA equals the CPU's, values and grads

Usage: python scripts/cuda_ipc_check.py [--gib 1.0]
Prints one line per part, PASS or FAIL with what it measured; exit status 1 if any part failed.
`scripts/gpu_check.sh` covers the whole stack (engines, learners, in-flight sync) where vLLM is installed.
"""

from __future__ import annotations

import argparse
import base64
import os
import pickle
import queue
import sys
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from open_instruct import advantages, loss
from open_instruct.weights import ipc


def model_layout(gib: float) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of a Qwen2-shaped model of about `gib` GiB in bf16, with fp32 norms as a
    learner sends them under --fp32_lm_head-style mixed precision."""
    hidden, inter, vocab = 1024, 2816, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    layers = max(1, int((gib * 2**30 / 2 - 2 * vocab * hidden) // per_layer))
    out = [("model.embed_tokens.weight", "bfloat16", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{w}_proj.weight", "bfloat16", (hidden, hidden)) for w in "qkvo"]
        out += [(p + "self_attn.q_proj.bias", "bfloat16", (hidden,))]
        out += [(p + f"mlp.{w}_proj.weight", "bfloat16", (inter, hidden)) for w in ("gate", "up")]
        out += [(p + "mlp.down_proj.weight", "bfloat16", (hidden, inter))]
        out += [(p + f"{n}.weight", "float32", (hidden,)) for n in ("input_layernorm", "post_attention_layernorm")]
    return out + [("model.norm.weight", "float32", (hidden,)), ("lm_head.weight", "bfloat16", (vocab, hidden))]


def deterministic(index: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The same values in any process on this GPU (the receiver rebuilds its expectation from the seed)."""
    generator = torch.Generator(device="cuda").manual_seed(1000 + index)
    return torch.randn(shape, generator=generator, device="cuda", dtype=torch.float32).to(getattr(torch, dtype))


def receiver(info: dict, results) -> None:
    """Another process on the GPU, doing what vLLM's IPC engine does with the update info."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        device = torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        started = time.perf_counter()
        handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
        mismatched, loaded_bytes = [], 0
        for index, (name, dtype, shape, handle) in enumerate(
            zip(info["names"], info["dtype_names"], info["shapes"], handles)
        ):
            args = list(handle[uuid])
            args[6] = device  # vLLM overwrites the sender's device index with its own
            weight = rebuild_cuda_tensor(*args)
            loaded = weight.clone()  # the load copies into the model's parameter
            loaded_bytes += loaded.numel() * loaded.element_size()
            if list(loaded.shape) != list(shape) or not torch.equal(loaded, deterministic(index, dtype, tuple(shape))):
                mismatched.append(name)
        torch.cuda.synchronize()
        results.put(("ok", len(handles), mismatched, loaded_bytes, time.perf_counter() - started))
    except Exception as error:  # reported by the parent as this part's FAIL
        results.put(("error", f"{type(error).__name__}: {error}"))


def check_handoff(gib: float) -> tuple[bool, str]:
    layout = model_layout(gib)
    names, dtypes, shapes = [n for n, _, _ in layout], [d for _, d, _ in layout], [s for _, _, s in layout]
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    stager = ipc.trainer_init("", 0, 1, 0.0)
    started = time.perf_counter()
    tensors = ((name, deterministic(i, dtype, shape)) for i, (name, dtype, shape) in enumerate(layout))
    part, staged_bytes = ipc.trainer_stage(stager, tensors, names, dtypes, shapes)
    stage_s = time.perf_counter() - started
    info = ipc.merge_staged([part])
    context = mp.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=receiver, args=(info, results))
    child.start()
    outcome = None
    while outcome is None:
        try:
            outcome = results.get(timeout=5)
        except queue.Empty:
            if not child.is_alive():
                outcome = ("error", f"exited with code {child.exitcode} before reporting")
    child.join(timeout=60)
    held = torch.cuda.memory_allocated() - baseline
    ipc.trainer_release(stager)
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - baseline
    if outcome[0] == "error":
        return False, f"receiver failed: {outcome[1]}"
    _, count, mismatched, loaded_bytes, load_s = outcome
    detail = (
        f"{count} tensors, {staged_bytes / 2**30:.2f} GiB staged in {stage_s:.2f}s (incl. generating them), "
        f"received and copied in {load_s:.2f}s ({loaded_bytes / 2**30 / load_s:.1f} GiB/s); "
        f"held while staged {held / 2**20:.0f} MiB, after release {left / 2**20:.0f} MiB"
    )
    ok = count == len(layout) and not mismatched and loaded_bytes == staged_bytes and held >= staged_bytes and left == 0
    return ok, detail + (f"; mismatched: {mismatched[:3]}" if mismatched else "")


def check_mismatch() -> tuple[bool, str]:
    baseline = torch.cuda.memory_allocated()
    stager = ipc.trainer_init("", 0, 1, 0.0)
    good = deterministic(0, "bfloat16", (512, 512))
    pairs = iter([("a.weight", good), ("b.weight", deterministic(1, "bfloat16", (512, 256)))])
    try:
        ipc.trainer_stage(stager, pairs, ["a.weight", "b.weight"], ["bfloat16"] * 2, [(512, 512), (512, 512)])
        return False, "a tensor whose shape disagrees with the metadata was staged"
    except ValueError as error:
        message = str(error)
    finally:
        del pairs, good
    ipc.trainer_release(stager)
    left = torch.cuda.memory_allocated() - baseline
    return "b.weight" in message and left == 0, f"error: {message!r}; after release {left} bytes held"


def measure_unopened() -> tuple[bool | None, str]:
    """A staged sync no engine loads (one died between staging and loading): what release leaves held."""
    baseline = torch.cuda.memory_allocated()
    stager = ipc.trainer_init("", 0, 1, 0.0)
    pairs = iter([("a.weight", deterministic(0, "bfloat16", (4096, 4096)))])
    _, staged_bytes = ipc.trainer_stage(stager, pairs, ["a.weight"], ["bfloat16"], [(4096, 4096)])
    del pairs
    ipc.trainer_release(stager)
    left = torch.cuda.memory_allocated() - baseline
    return None, f"staged {staged_bytes / 2**20:.0f} MiB, never opened; after release {left / 2**20:.0f} MiB held"


def check_loss(reference: str = "cpu", device: str = "cuda") -> tuple[bool, str]:
    generator = torch.Generator().manual_seed(0)
    batch, length = 8, 512
    new = -torch.rand(batch, length, generator=generator) * 3
    old = new + torch.randn(batch, length, generator=generator) * 0.05
    behaviour = old + torch.randn(batch, length, generator=generator) * 0.1
    mask = torch.rand(batch, length, generator=generator) > 0.2
    sample_ids = torch.arange(length).div(64, rounding_mode="floor").expand(batch, length).contiguous()
    rewards = torch.randint(0, 2, (batch // 2, 2), generator=generator).float()

    def run(device: str) -> dict[str, torch.Tensor]:
        new_d = new.detach().to(device).clone().requires_grad_(True)
        adv = advantages.group_advantages(rewards.to(device), "standard").reshape(-1)
        weights = loss.importance_weights(
            old.to(device), behaviour.to(device), mask.to(device), 2.0, "mask_token", sample_ids.to(device)
        )
        out = loss.policy_loss(
            new_d,
            old.to(device),
            adv,
            weights.mask_BT,
            clip_lower=0.2,
            clip_higher=0.28,
            importance_weights_BT=weights.weights_BT,
        )
        out.loss.backward()
        values = {"loss": out.loss, "clipfrac": out.clipfrac, "ratio": out.ratio_avg, "grad": new_d.grad}
        return {k: v.detach().cpu() for k, v in values.items()} | {
            f"is/{k}": v.detach().cpu() for k, v in weights.stats.items()
        }

    expected, got = run(reference), run(device)
    worst = max((expected[k] - got[k]).abs().max().item() for k in expected)
    # float32 sums differ in their last bits with the order of a parallel reduction (seen: 2.7e-5 between two
    # CPU runs of one process under load), so the bound is relative, as torch.allclose's.
    ok = all(torch.allclose(got[k], expected[k], rtol=1e-4, atol=1e-5) for k in expected)
    return ok, f"{len(expected)} outputs, largest |{reference} - {device}| {worst:.2e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the staged model in GiB")
    gib = parser.parse_args().gib
    if not torch.cuda.is_available():
        print("cuda_ipc_check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    failed = 0
    parts = (
        ("handoff", lambda: check_handoff(gib)),
        ("mismatch", check_mismatch),
        ("unopened", measure_unopened),
        ("loss", check_loss),
    )
    for name, check in parts:
        try:
            ok, detail = check()
        except Exception as error:  # one part's failure is reported and the others still run
            ok, detail = False, f"{type(error).__name__}: {error}"
        failed += ok is False
        print(f"{name:<9} {'INFO' if ok is None else 'PASS' if ok else 'FAIL'} {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
