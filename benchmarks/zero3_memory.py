"""What a learner rank holds while it loads a model and while it gathers weights for a sync, ZeRO-2 against
ZeRO-3, on 2 CPU ranks (gloo) with the learners' own loading path (`deepspeed_config`, `zero3_loading`):

    .venv/bin/python -m benchmarks.zero3_memory --size 1024x8
    python -m benchmarks.zero3_memory --device cuda --world_size 2   # one rank per GPU (NCCL)

On GPUs (torch, DeepSpeed and transformers only: no vLLM, no Ray; gpu_check.sh's zero3_memory part) each
rank's GPU memory is measured instead: allocated tensor bytes, with torch's own peak counter.

For each stage every rank loads the policy and the reference as the learner does, then walks the sync's
gathers (one parameter at a time, and the whole model at once), then saves the policy as the learner does
(`learner/gathered.py`: one parameter at a time, rank 0 writes) and, for comparison, gathers it whole with an
fp32 CPU copy on every rank (what a save did before). A thread samples the rank's anonymous
resident memory (RssAnon, so the checkpoint's memory-mapped file pages do not count) every few milliseconds;
the table gives, in units of one whole fp32 copy of the model: the parameter bytes the rank keeps (its
partitions), the peak while both models load (`from_pretrained`) and what stays after, the peak while
DeepSpeed builds its engines (fp32 master partitions, gradient buffers: the optimizer's own state), and the
peak above that of each way of gathering for a sync or a save. Sampled peaks can miss a spike shorter
than the interval: read them as lower bounds. The save columns come from the kernel's high-water mark (VmHWM,
reset before each save), which misses nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from open_instruct.learner.rendezvous import listening_socket


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class GpuPeak:
    """The highest allocated GPU memory between start and stop (torch's own counter: no spike is missed)."""

    def __enter__(self) -> GpuPeak:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.cuda.synchronize()
        self.peak = torch.cuda.max_memory_allocated()


def gpu_allocated_bytes() -> int:
    import torch

    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


class HighWater:
    """The peak resident memory between start and stop, from the kernel's own high-water mark (VmHWM, reset at
    start through /proc/self/clear_refs): no spike is missed. It counts all resident pages, but between start
    and stop only anonymous memory grows here (the files a save writes are page cache, not the process's)."""

    def __enter__(self) -> HighWater:
        Path("/proc/self/clear_refs").write_text("5")
        self.start = _status("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.peak = rss_anon_bytes() + max(0, _status("VmHWM") - self.start)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def sync_peaks(params: list, stage: int, Peak) -> dict[str, int]:
    """Peak memory of a weight sync's gathers (absolute): one parameter at a time, and the whole model at once."""
    import deepspeed
    import torch

    peaks = {}
    for name, whole in (("sync, one parameter at a time", False), ("sync, whole model", True)):
        with Peak() as sync, deepspeed.zero.GatheredParameters(params, enabled=stage == 3 and whole):
            for param in params:
                with deepspeed.zero.GatheredParameters([param], enabled=stage == 3 and not whole):
                    param.detach().to(torch.float32).sum()  # what the transport reads
        peaks[name] = sync.peak
    return peaks


def save_peaks(engine, stage: int, rank: int, Peak, workdir: str) -> dict[str, int]:
    """Peak memory of a model save (absolute, as the other phases' peaks): the learner's
    (`gathered.save_hf_model`: one parameter gathered at a time, rank 0 copies and writes it) and, for
    comparison, one gather of the whole model with an fp32 CPU copy on every rank (what a save did before)."""
    import deepspeed
    import torch

    from open_instruct.learner.gathered import save_hf_model

    params = list(engine.module.named_parameters())
    with Peak() as streamed:
        save_hf_model(engine.module, Path(workdir) / f"saved_zero{stage}", stage == 3, write=rank == 0)
    torch.distributed.barrier()
    with Peak() as whole:
        with deepspeed.zero.GatheredParameters([p for _, p in params], enabled=stage == 3):
            copy = {n: p.detach().float().cpu().clone() for n, p in params}
        del copy
    return {"save, one parameter at a time": streamed.peak, "whole-gather save, fp32 copy per rank": whole.peak}


class PeakSampler:
    """The highest RssAnon seen between start and stop."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s, self.peak, self._stop = interval_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon_bytes())
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self.peak = rss_anon_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_bytes())


def measure_rank(
    rank: int, world_size: int, port: int, listener, model_path: str, stage: int, out: str, device: str
) -> None:
    """One rank: load policy + reference as the learner does, then the sync's gathers; writes its numbers."""
    if device == "cuda":  # one GPU per rank, as a learner actor sees it (before CUDA starts in this process)
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    import torch
    from transformers import AutoModelForCausalLM

    from open_instruct.learner.deepspeed_setup import (
        deepspeed_config,
        init_distributed,
        initialize_engine,
        make_optimizer,
        reference_config,
        zero3_loading,
    )

    torch.set_num_threads(1)
    init_distributed(rank, world_size, "127.0.0.1", port, listener=listener)
    config = deepspeed_config(stage=stage, micro_batch_size=1, world_size=world_size, param_persistence_threshold=0)
    now, Peak = (gpu_allocated_bytes, GpuPeak) if device == "cuda" else (rss_anon_bytes, PeakSampler)
    before = now()
    with Peak() as load:
        loading = zero3_loading(config, world_size)
        policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        del loading
    loaded = now()
    with Peak() as engines:  # DeepSpeed's own state: fp32 master partitions, gradient buffers
        optimizer = make_optimizer(policy, learning_rate=1e-6, weight_decay=0.0, decay_bias_and_norm=True, fused=True)
        engine = initialize_engine(policy, optimizer, config)
        if stage == 3:
            reference = initialize_engine(reference, None, reference_config(config))
    settled = now()
    params = list(engine.module.parameters())
    whole_bytes = sum(getattr(p, "ds_numel", p.numel()) * 4 for p in params)
    held = sum((p.ds_tensor if stage == 3 else p).numel() * 4 for p in (*params, *reference.parameters()))
    peaks = sync_peaks(params, stage, Peak)
    peaks.update(save_peaks(engine, stage, rank, GpuPeak if device == "cuda" else HighWater, str(Path(out).parent)))
    phases = {name: peak - settled for name, peak in peaks.items()}
    largest = max(getattr(p, "ds_numel", p.numel()) * 4 for p in params)
    result = {
        "device": device,
        "stage": stage,
        "rank": rank,
        "whole_model_bytes": whole_bytes,
        "held_parameter_bytes": held,
        "load_peak_bytes": load.peak - before,
        "after_load_bytes": loaded - before,
        "engine_init_peak_bytes": engines.peak - loaded,
        "largest_parameter_bytes": largest,
        **{f"{k}_peak_bytes": v for k, v in phases.items()},
    }
    Path(out).write_text(json.dumps(result))
    torch.distributed.barrier()


def run_stage(model_path: str, stage: int, world_size: int, workdir: Path, device: str = "cpu") -> list[dict]:
    import torch.multiprocessing as mp

    listener = listening_socket()
    port = listener.getsockname()[1]
    listeners = [listener] + [None] * (world_size - 1)  # rank 0's store adopts it
    outs = [str(workdir / f"stage{stage}_rank{rank}.json") for rank in range(world_size)]
    context = mp.get_context("spawn")
    ranks = [
        context.Process(
            target=measure_rank, args=(rank, world_size, port, listeners[rank], model_path, stage, outs[rank], device)
        )
        for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a ZeRO-{stage} rank failed with exit code {process.exitcode}")
    return [json.loads(Path(out).read_text()) for out in outs]


def main(argv: list[str] | None = None) -> list[dict]:
    from benchmarks.weight_sync import build_model, parse_size

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1024x8", help="HIDDENxLAYERS of a random Qwen2.")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one rank per GPU, NCCL")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # A fixed mmap threshold: glibc then returns every freed large block to the system at once, so RssAnon is
    # what is alive, not what its heap kept after a free (its dynamic threshold keeps freed tensors resident).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    results = []
    with tempfile.TemporaryDirectory(prefix="zero3-memory-") as tmp:
        model_path, _ = build_model(*parse_size(args.size), Path(tmp))
        for stage in (2, 3):
            results += run_stage(str(model_path), stage, args.world_size, Path(tmp), args.device)
    from benchmarks.stamp import describe, stamp

    whole = results[0]["whole_model_bytes"]
    print(describe(stamp("zero3_memory")))
    memory = "GPU memory allocated" if args.device == "cuda" else "anonymous resident memory"
    print(
        f"model {args.size}: one fp32 copy = {whole / 2**20:.0f} MiB; policy + reference; {args.world_size} "
        f"{args.device} ranks; {memory}"
    )
    columns = ["held_parameter_bytes", "load_peak_bytes", "after_load_bytes", "engine_init_peak_bytes"]
    columns += ["sync, one parameter at a time_peak_bytes", "sync, whole model_peak_bytes"]
    columns += ["save, one parameter at a time_peak_bytes", "whole-gather save, fp32 copy per rank_peak_bytes"]
    print("stage rank " + " | ".join(c.removesuffix("_bytes") for c in columns) + "   (whole copies)")
    for row in results:
        print(f"ZeRO-{row['stage']} {row['rank']}    " + " | ".join(f"{row[c] / whole:.2f}" for c in columns))
    return results


if __name__ == "__main__":
    main()
