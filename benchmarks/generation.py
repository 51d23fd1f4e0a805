"""Benchmark: streaming engines vs fixed batches on a heavy-tailed response-length workload.

Same engine, same prompts, same concurrency cap, one process, measured side by side:

* batched: submit `concurrency` samples, wait for the longest, submit the next batch
  (what synchronous GRPO does to its engines);
* streaming: the engine keeps `concurrency` samples running and pulls the next prompt the
  moment a sample finishes (this project's design).

Response lengths are drawn from a lognormal distribution (ignore_eos, so every sample has
exactly its drawn length). Prints a table and the ratio; writes JSON to --output.

    python -m benchmarks.generation --prompts 64 --samples 4 --median_tokens 48
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

from benchmarks.stamp import results_page, stamp

logger = logging.getLogger(__name__)


def build_requests(tokenizer, lengths: list[int], samples: int, tag: str):
    from open_instruct.data.embedded_default import arith_rows
    from open_instruct.messages import PromptRequest, SamplingSettings

    rows, _ = arith_rows()
    requests = []
    for i, length in enumerate(lengths):
        row = rows[i % len(rows)]
        ids = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)["input_ids"]
        requests.append(
            PromptRequest(
                prompt_id=f"{tag}:{i}@0",
                prompt_token_ids=tuple(ids),
                ground_truths=(row["ground_truth"],),
                verifier_names=(row["dataset"],),
                # One sample per request: each sample has its own drawn length.
                sampling=SamplingSettings(max_tokens=length, ignore_eos=True),
                num_samples=samples,
                seed=i,
                admitted_version=0,
            )
        )
    return requests


def run_batched(pool, requests, concurrency: int) -> dict:
    per_batch = max(1, concurrency // requests[0].num_samples)
    pool.call_all("reset_stats")
    started = time.monotonic()
    tokens = 0
    for i in range(0, len(requests), per_batch):
        completions = pool.generate(requests[i : i + per_batch])
        tokens += sum(len(c.response_token_ids) for c in completions)
    return _result("batched", tokens, time.monotonic() - started, pool.stats()[0])


def run_streaming(pool, requests) -> dict:
    pool.call_all("reset_stats")
    started = time.monotonic()
    pool.submit(requests)
    tokens = 0
    while pool.ledger.in_flight():
        tokens += sum(len(c.response_token_ids) for c in pool.poll(timeout_s=0.5))
    return _result("streaming", tokens, time.monotonic() - started, pool.stats()[0])


def _result(mode: str, tokens: int, elapsed: float, stats) -> dict:
    return {
        "mode": mode,
        "generated_tokens": tokens,
        "wall_s": elapsed,
        "generated_tokens_per_s": tokens / elapsed,
        "generation_idle_frac": stats.idle_s / stats.uptime_s,
        "generation_underfilled_frac": stats.underfilled_s / stats.uptime_s,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--concurrency", type=int, default=32, help="running samples per engine, both modes")
    parser.add_argument("--median_tokens", type=int, default=48)
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma: the tail's weight")
    parser.add_argument("--max_tokens", type=int, default=960)
    parser.add_argument("--kv_cache_gib", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="output/benchmarks/generation_streaming_vs_batched.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    from transformers import AutoTokenizer

    from benchmarks.workloads import lognormal_lengths
    from open_instruct import cluster
    from open_instruct.data.embedded_default import ensure_embedded_model
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.generation.pool import EnginePool

    model_path = str(ensure_embedded_model())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    lengths = lognormal_lengths(args.prompts, args.median_tokens, args.sigma, args.max_tokens, args.seed)
    settings = engine_settings(
        model_path, args.max_tokens + 64, vllm_kv_cache_gib=args.kv_cache_gib, max_concurrency=args.concurrency
    )
    cluster.init_ray(min_logical_cpus=2)
    pool = EnginePool(cluster.create_generation_actors(settings, 1), prompt_capacity=args.prompts + 1)
    try:
        [info] = pool.start()
        # Warm-up so neither mode pays one-time costs.
        run_batched(pool, build_requests(tokenizer, [8] * 4, 1, "warmup"), args.concurrency)
        batched = run_batched(pool, build_requests(tokenizer, lengths, args.samples, "batched"), args.concurrency)
        streaming = run_streaming(pool, build_requests(tokenizer, lengths, args.samples, "streaming"))
    finally:
        pool.shutdown()
    workload = {
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "concurrency": args.concurrency,
        "lengths_median": statistics.median(lengths),
        "lengths_mean": statistics.mean(lengths),
        "lengths_max": max(lengths),
        "sigma": args.sigma,
        "engine_target_concurrency": info.target_concurrency,
    }
    report = {
        "stamp": stamp("generation"),
        "workload": workload,
        "modes": [batched, streaming],
        "speedup_streaming_vs_batched": streaming["generated_tokens_per_s"] / batched["generated_tokens_per_s"],
    }
    out = Path(args.output)
    with results_page(out.with_suffix(".md"), "Streaming vs fixed batches, generation only", report["stamp"]):
        print_report(report)
    out.write_text(json.dumps(report, indent=1))
    return report


def print_report(report: dict) -> None:
    print(f"\n{'mode':<10} {'tokens/s':>10} {'idle':>7} {'underfilled':>12} {'wall s':>8}")
    for m in report["modes"]:
        print(
            f"{m['mode']:<10} {m['generated_tokens_per_s']:>10.0f} {m['generation_idle_frac']:>7.1%} "
            f"{m['generation_underfilled_frac']:>12.1%} {m['wall_s']:>8.1f}"
        )
    print(f"streaming / batched tokens/s: {report['speedup_streaming_vs_batched']:.2f}x")


if __name__ == "__main__":
    main()
