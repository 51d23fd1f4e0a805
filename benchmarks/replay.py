"""Benchmark: replay a run's recorded prompts through real engines only (no learners).

A training run started with `--save_admitted_prompts prompts.jsonl` records every admitted
prompt (ids, token ids, sampling settings). This benchmark streams those prompts through the
vLLM engine actors, exactly as training would, and measures generation alone: generated
tokens/s, per-engine busy / under-filled / idle time, KV-cache usage, queue wait,
time-to-first-token and completion-time distributions. `--response_lengths` sweeps the
response length: each prompt gets a heavy-tailed target length (lognormal, median a quarter
of the cap, generated with ignore_eos so it is exact) under each cap, so one can see how
utilization and latency move as generations get longer. Without `--prompts` it records a
prompt file from the embedded dataset first.

GPU runs also report MFU and MBU from the model's dimensions and the GPU's peak figures.

    python -m benchmarks.replay --response_lengths 256 512 1024 2048 4096 \
        --output output/bench/replay
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import statistics
import time
from pathlib import Path

from benchmarks.stamp import results_page, stamp

logger = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s and memory bandwidth (bytes/s) per GPU, from the vendors' data sheets.
GPU_PEAKS = {
    "H100": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "A100": (312e12, 2.0e12),
    "L40S": (362e12, 0.864e12),
}


def load_prompts(path: str) -> list:
    from open_instruct.messages import PromptRequest, SamplingSettings

    requests = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        known = {f.name for f in dataclasses.fields(SamplingSettings)}
        # Files recorded by older versions may carry fields SamplingSettings no longer has.
        sampling = {k: v for k, v in row["sampling"].items() if k in known}
        sampling["stop_strings"] = tuple(sampling.get("stop_strings", ()))
        requests.append(
            PromptRequest(
                prompt_id=row["prompt_id"],
                prompt_token_ids=tuple(row["prompt_token_ids"]),
                ground_truths=(),
                verifier_names=(),
                sampling=SamplingSettings(**sampling),
                num_samples=row["num_samples"],
                seed=row["seed"],
                admitted_version=0,
            )
        )
    return requests


def record_embedded_prompts(path: Path, count: int, samples: int) -> None:
    """A prompt file in the training run's format, from the embedded dataset (what a run would save)."""
    from transformers import AutoTokenizer

    from open_instruct.config.data import EMBEDDED_STOP_STRING
    from open_instruct.data.embedded_default import ensure_embedded_dataset, ensure_embedded_model
    from open_instruct.messages import SamplingSettings
    from open_instruct.prompt_feeder import make_request, record_prompts

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded_model())
    rows = [json.loads(line) for line in (ensure_embedded_dataset() / "train.jsonl").read_text().splitlines()][:count]
    sampling = SamplingSettings(max_tokens=32, stop_strings=(EMBEDDED_STOP_STRING,))
    path.unlink(missing_ok=True)

    @dataclasses.dataclass
    class Row:
        prompt_token_ids: tuple
        ground_truths: tuple = ()
        verifier_names: tuple = ()

    requests = []
    for i, row in enumerate(rows):
        ids = tuple(
            tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)["input_ids"]
        )
        requests.append(make_request(Row(ids), f"embedded:{i}@0", sampling, samples, 1, 0))
    record_prompts(str(path), requests)


def with_length_cap(requests: list, cap: int, seed: int) -> list:
    """Heavy-tailed exact lengths under `cap`: lognormal, median cap / 4, sigma 0.8."""
    from benchmarks.workloads import capped_lognormal

    rng = random.Random(seed)
    out = []
    for r in requests:
        length = capped_lognormal(rng, cap / 4, 0.8, cap)
        sampling = dataclasses.replace(r.sampling, max_tokens=length, ignore_eos=True, stop_strings=())
        out.append(
            dataclasses.replace(r, sampling=sampling, prompt_id=f"{r.prompt_id}/cap{cap}", queued_at=time.time())
        )
    return out


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "max": 0.0}
    ordered = sorted(values)
    return {
        "p50": ordered[len(ordered) // 2],
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def dense_params(hidden: int, layers: int, vocab: int) -> int:
    """Parameter count of a dense decoder (attention + 4x MLP ~ 12 h^2 per layer, plus embeddings)."""
    return layers * 12 * hidden * hidden + vocab * hidden


def utilization(
    params: int,
    tokens_per_s: float,
    decode_steps_per_s: float,
    peak_flops: float,
    peak_bytes_per_s: float,
    bytes_per_param: int = 2,
) -> dict[str, float]:
    """MFU: 2 FLOPs per parameter per generated token. MBU: every weight is read once per decode step
    (KV-cache reads ignored, so MBU is a lower bound)."""
    return {
        "mfu": 2 * params * tokens_per_s / peak_flops,
        "mbu": bytes_per_param * params * decode_steps_per_s / peak_bytes_per_s,
    }


def mfu_mbu(model_path: str, tokens_per_s: float, decode_steps_per_s: float) -> dict[str, float] | None:
    """MFU / MBU on the local GPU type (None on CPU or a GPU missing from GPU_PEAKS)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    peaks = next((v for k, v in GPU_PEAKS.items() if k in name), None)
    if peaks is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    params = dense_params(config.hidden_size, config.num_hidden_layers, config.vocab_size)
    return utilization(params, tokens_per_s, decode_steps_per_s, *peaks)


def replay_once(pool, requests: list, kv_sample_s: float = 0.5) -> dict:
    pool.call_all("reset_stats")
    started = time.monotonic()
    pool.submit(requests)
    completions, kv_samples = [], []
    next_kv = started
    while pool.ledger.in_flight():
        completions += pool.poll(timeout_s=0.2)
        if time.monotonic() >= next_kv:
            kv_samples.append(statistics.mean(s.kv_cache_usage for s in pool.stats()))
            next_kv += kv_sample_s
    wall = time.monotonic() - started
    stats = pool.stats()
    tokens = sum(len(c.response_token_ids) for c in completions)
    uptime = sum(s.uptime_s for s in stats)
    return {
        "samples": len(completions),
        # Average number of samples decoding at once (sample-seconds of decoding per second).
        "avg_running": sum(c.finished_at - (c.first_token_at or c.started_at) for c in completions) / wall,
        "wall_s": wall,
        "generated_tokens": tokens,
        "generated_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "engine_idle_frac": sum(s.idle_s for s in stats) / uptime,
        "engine_underfilled_frac": sum(s.underfilled_s for s in stats) / uptime,
        "engine_busy_frac": 1 - sum(s.idle_s for s in stats) / uptime,
        "kv_cache_usage_avg": statistics.mean(kv_samples) if kv_samples else 0.0,
        "kv_cache_usage_max": max(kv_samples, default=0.0),
        "queue_wait_s": _quantiles([c.started_at - c.queued_at for c in completions]),
        "ttft_s": _quantiles([c.first_token_at - c.started_at for c in completions if c.first_token_at]),
        "completion_s": _quantiles([c.finished_at - c.started_at for c in completions]),
        "response_tokens": _quantiles([float(len(c.response_token_ids)) for c in completions]),
        "per_engine": [
            {
                "engine_id": s.engine_id,
                "tokens_per_s": s.tokens_per_s,
                "idle_frac": s.idle_frac,
                "underfilled_frac": s.underfilled_s / s.uptime_s if s.uptime_s else 0.0,
            }
            for s in stats
        ],
    }


def plot_sweep(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = [r["response_length_cap"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(caps, [r["engine_busy_frac"] for r in rows], "o-", label="busy (>=1 sample running)")
    left.plot(
        caps,
        [1 - r["engine_underfilled_frac"] - r["engine_idle_frac"] for r in rows],
        "o-",
        label="full (running = target)",
    )
    left.plot(caps, [r["kv_cache_usage_avg"] for r in rows], "o-", label="KV cache used (avg)")
    left.set_xscale("log", base=2)
    left.set_xlabel("response length cap (tokens)")
    left.set_ylabel("fraction")
    left.set_ylim(0, 1.05)
    left.legend()
    right.plot(caps, [r["generated_tokens_per_s"] for r in rows], "o-", label="tokens/s")
    right.set_xscale("log", base=2)
    right.set_xlabel("response length cap (tokens)")
    right.set_ylabel("generated tokens/s")
    right2 = right.twinx()
    right2.plot(caps, [r["completion_s"]["p90"] for r in rows], "s--", color="tab:red", label="p90 completion s")
    right2.set_ylabel("p90 completion time (s)")
    fig.legend(loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default=None, help="JSONL written by --save_admitted_prompts")
    parser.add_argument("--model", default=None, help="model path (default: the embedded tiny model)")
    parser.add_argument("--response_lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--max_prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt when recording embedded prompts")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--max_concurrency", type=int, default=64)
    parser.add_argument("--kv_cache_gib", type=float, default=1.0)
    parser.add_argument("--output", default="output/bench/replay")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from open_instruct import cluster
    from open_instruct.data.embedded_default import ensure_embedded_model
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.generation.pool import EnginePool

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    prompt_file = Path(args.prompts) if args.prompts else out / "embedded_prompts.jsonl"
    if not args.prompts:
        record_embedded_prompts(prompt_file, args.max_prompts, args.samples)
    recorded = load_prompts(str(prompt_file))[: args.max_prompts]
    model = args.model or str(ensure_embedded_model())
    longest_prompt = max(len(r.prompt_token_ids) for r in recorded)
    settings = engine_settings(
        model_path=model,
        max_model_len=longest_prompt + max(args.response_lengths) + 8,
        vllm_kv_cache_gib=args.kv_cache_gib,
        max_concurrency=args.max_concurrency,
    )
    cluster.init_ray(min_logical_cpus=args.engines + 1)
    pool = EnginePool(cluster.create_generation_actors(settings, args.engines), prompt_capacity=len(recorded) + 8)
    try:
        rows = sweep_caps(pool, recorded, args.response_lengths, model)
    finally:
        pool.shutdown()
        cluster.shutdown_ray()
    result = {
        "stamp": stamp("replay"),
        "prompt_file": str(prompt_file),
        "prompts": len(recorded),
        "engines": args.engines,
        "max_concurrency": args.max_concurrency,
        "cpu_count": os.cpu_count(),
        "sweep": rows,
    }
    (out / "replay.json").write_text(json.dumps(result, indent=1))
    plot_sweep(rows, out / "utilization_vs_length.png")
    with results_page(out / "replay.md", "Replay and response-length sweep, engines only", result["stamp"]):
        print_sweep(result, prompt_file)
    print(f"wrote {out / 'replay.json'}, replay.md and {out / 'utilization_vs_length.png'}")
    return result


def sweep_caps(pool, recorded: list, caps: list[int], model: str) -> list[dict]:
    """The recorded prompts once per response-length cap, on engines started once."""
    from open_instruct.generation.ledger import DeliveryLedger

    pool.start()
    # The first requests after start pay one-off costs (kernel selection, allocator growth).
    replay_once(pool, with_length_cap(recorded[:2], 16, seed=0))
    rows = []
    for cap in caps:
        pool.ledger = DeliveryLedger()
        row = replay_once(pool, with_length_cap(recorded, cap, seed=cap))
        row["response_length_cap"] = cap
        row["gpu"] = mfu_mbu(
            model, row["generated_tokens_per_s"], row["generated_tokens_per_s"] / max(1.0, row["avg_running"])
        )
        rows.append(row)
        logger.info(
            "cap %d: %.0f tokens/s, busy %.0f%%", cap, row["generated_tokens_per_s"], 100 * row["engine_busy_frac"]
        )
    pool.stop("finish")
    return rows


def print_sweep(result: dict, prompt_file: Path) -> None:
    rows = result["sweep"]
    print(f"replay of {result['prompts']} prompts from {prompt_file} through {result['engines']} engine(s):")
    print(
        f"{'cap':>6} {'tokens/s':>9} {'busy':>6} {'full':>6} {'KV avg':>7} {'wait p90':>9} {'ttft p50':>9} "
        f"{'done p50':>9} {'done p90':>9}"
    )
    for r in rows:
        print(
            f"{r['response_length_cap']:>6} {r['generated_tokens_per_s']:>9.0f} {r['engine_busy_frac']:>6.0%} "
            f"{1 - r['engine_underfilled_frac'] - r['engine_idle_frac']:>6.0%} {r['kv_cache_usage_avg']:>7.1%} "
            f"{r['queue_wait_s']['p90']:>9.2f} {r['ttft_s']['p50']:>9.3f} {r['completion_s']['p50']:>9.2f} "
            f"{r['completion_s']['p90']:>9.2f}"
        )


if __name__ == "__main__":
    main()
