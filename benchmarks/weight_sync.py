"""Benchmark: in-flight weight-sync pause vs model size on this machine, per CPU transport.

For each model size a random tiny Qwen2 is built and served by a real AsyncLLM; while
`--running` long requests are decoding, new weights are synced `--syncs` times with the
in-flight protocol (pause keep → start → update ∥ broadcast → finish → resume; for `shm`: stage
while the engine generates, then pause → start → update(file) → finish → resume). Reported per
size and transport: bytes sent, how long the engine was frozen, the transfer alone, its bandwidth,
and the bound `bytes / memory bandwidth` (one memory copy of the weights at the bandwidth measured
here with a large tensor copy), so the overhead over the physical floor is visible. With both transports
(the default) each size also gets `shm_over_gloo_frozen`: the shared-memory file's frozen time over
the gloo group's, measured side by side in this run.

    python -m benchmarks.weight_sync --sizes 128x4 512x6 1024x8 --output output/bench/weight_sync.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.stamp import results_page, stamp
from open_instruct.learner.rendezvous import listening_socket


def memory_bandwidth_gb_s(megabytes: int = 512, repeats: int = 5) -> float:
    """Copy bandwidth (read + write counted once, as a transfer would see it)."""
    import torch

    src = torch.ones(megabytes << 18, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return src.numel() * 4 / best / 1e9


def parse_size(text: str) -> tuple[int, int]:
    hidden, _, layers = text.partition("x")
    if not layers or int(hidden) % 64:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected HIDDENxLAYERS with HIDDEN a multiple of 64")
    return int(hidden), int(layers)


def build_model(hidden: int, layers: int, workdir: Path):
    """A random tiny Qwen2 of the given size saved under `workdir`; returns (path, HF-named weights)."""
    from open_instruct.data.embedded_default import TinyModelSpec, build_tokenizer, build_untrained_model
    from open_instruct.weights import gloo as wt

    tokenizer = build_tokenizer()
    spec = TinyModelSpec(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        intermediate_size=4 * hidden,
    )
    model = build_untrained_model(tokenizer, spec)
    path = workdir / f"h{hidden}x{layers}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, wt.hf_named_weights(model)


async def sync_while_decoding(engine, weights, args, transport: str) -> tuple[list[dict], list[int]]:
    """`args.syncs` in-flight syncs while `args.running` requests decode; (timings, response lengths)."""
    import torch
    from vllm import SamplingParams

    from open_instruct.weights import gloo as wt
    from open_instruct.weights import shm

    if transport == "shm":
        stager = shm.Stager()

        def sync(version: int):
            return shm.sync_weights(engine, stager, weights, version, dtype=torch.float32)
    else:
        listener = listening_socket()
        port = listener.getsockname()[1]
        group = await wt.init_engine_transfer(engine, "127.0.0.1", port, 2, 300, listener)

        def sync(version: int):
            bucket_bytes = args.bucket_mb << 20
            return wt.sync_weights(engine, group, weights, version, dtype=torch.float32, bucket_bytes=bucket_bytes)

    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=1.0, seed=0)

    async def decode(i: int) -> int:
        final = None
        async for out in engine.generate({"prompt_token_ids": [5 + i % 50] * 16}, params, request_id=f"r{i}"):
            final = out
        return len(final.outputs[0].token_ids)

    running = [asyncio.create_task(decode(i)) for i in range(args.running)]
    await asyncio.sleep(args.warmup_s)
    timings = []
    for version in range(1, args.syncs + 1):
        for _, tensor in weights:  # new values each round, same shapes
            tensor.data.add_(1e-3)
        timings.append(await sync(version))
        await asyncio.sleep(0.2)
    return timings, list(await asyncio.gather(*running))


async def measure_size(hidden: int, layers: int, args, workdir: Path, transport: str = "gloo") -> dict:
    from vllm.v1.engine.async_llm import AsyncLLM

    from open_instruct.generation.engine_setup import engine_args, engine_settings

    path, weights = build_model(hidden, layers, workdir)
    engine = AsyncLLM.from_engine_args(
        engine_args(
            engine_settings(
                model_path=str(path),
                max_model_len=args.max_tokens + 64,
                vllm_kv_cache_gib=0.5,
                weight_transfer_backend=transport,
            )
        )
    )
    try:
        await engine.update_weight_version("0")
        timings, lengths = await sync_while_decoding(engine, weights, args, transport)
    finally:
        engine.shutdown()
    group_bytes = timings[-1]["bytes"]
    frozen = statistics.median(t["total_s"] for t in timings)
    transfer = statistics.median(t["transfer_s"] for t in timings)
    return {
        "transport": transport,
        "hidden_size": hidden,
        "layers": layers,
        "params_m": sum(t.numel() for _, t in weights) / 1e6,
        "weight_mb": sum(t.numel() * t.element_size() for _, t in weights) / 1e6,
        "sent_mb": group_bytes / 1e6,
        "pause_call_s": statistics.median(t["pause_s"] for t in timings),
        "frozen_s": frozen,
        "stage_s": statistics.median(t.get("stage_s", 0.0) for t in timings),  # shm: before the pause
        "transfer_s": transfer,
        "bandwidth_mb_s": group_bytes / transfer / 1e6 if transfer > 0 else 0.0,
        "requests_completed_full_length": sum(1 for n in lengths if n == args.max_tokens),
        "requests_running": args.running,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=parse_size,
        default=[(128, 4), (512, 6), (1024, 8)],
        help="model sizes as HIDDENxLAYERS",
    )
    parser.add_argument("--syncs", type=int, default=3, help="weight syncs per size (median reported)")
    parser.add_argument("--running", type=int, default=8, help="requests decoding during the syncs")
    parser.add_argument("--max_tokens", type=int, default=384)
    parser.add_argument("--warmup_s", type=float, default=0.5)
    parser.add_argument("--bucket_mb", type=int, default=64)
    parser.add_argument(
        "--transports",
        nargs="+",
        choices=["gloo", "shm"],
        default=["gloo", "shm"],
        help="gloo: the transfer group; shm: the shared-memory file of --single_gpu_mode on a CPU node",
    )
    parser.add_argument("--output", default="output/bench/weight_sync.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

    bandwidth = memory_bandwidth_gb_s()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden, layers in args.sizes:
            for transport in args.transports:
                row = asyncio.run(measure_size(hidden, layers, args, Path(tmp), transport))
                row["bound_s"] = row["sent_mb"] * 1e6 / (bandwidth * 1e9)
                row["frozen_over_bound"] = row["frozen_s"] / row["bound_s"] if row["bound_s"] > 0 else 0.0
                rows.append(row)
    result = {"stamp": stamp("weight_sync"), "memory_bandwidth_gb_s": bandwidth, "sizes": rows}  # (cores: stamp)
    by_size = {}
    for r in rows:
        by_size.setdefault(f"{r['hidden_size']}x{r['layers']}", {})[r["transport"]] = r["frozen_s"]
    result["shm_over_gloo_frozen"] = {k: v["shm"] / v["gloo"] for k, v in by_size.items() if {"shm", "gloo"} <= set(v)}
    out = Path(args.output)
    with results_page(out.with_suffix(".md"), "Weight-sync pause vs model size", result["stamp"]):
        print_table(result, args.running)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return result


def print_table(result: dict, running: int) -> None:
    rows, bandwidth = result["sizes"], result["memory_bandwidth_gb_s"]
    print(f"memory copy bandwidth: {bandwidth:.1f} GB/s; {running} requests decoding during each sync")
    print(
        f"{'model':>10} {'via':>5} {'params M':>9} {'MB sent':>8} {'frozen s':>9} {'transfer s':>10} {'MB/s':>8} "
        f"{'bound s':>8} {'frozen/bound':>12} {'kept ok':>8}"
    )
    for r in rows:
        print(
            f"{r['hidden_size']:>5}x{r['layers']:<4} {r['transport']:>5} {r['params_m']:>9.1f} {r['sent_mb']:>8.1f} "
            f"{r['frozen_s']:>9.3f} "
            f"{r['transfer_s']:>10.3f} {r['bandwidth_mb_s']:>8.0f} {r['bound_s']:>8.4f} "
            f"{r['frozen_over_bound']:>12.0f} {r['requests_completed_full_length']:>4}/{r['requests_running']}"
        )
    for size, ratio in result["shm_over_gloo_frozen"].items():
        print(f"{size}: engine frozen with the shared-memory file / with the gloo group = {ratio:.2f}")


if __name__ == "__main__":
    main()
