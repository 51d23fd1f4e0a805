"""Benchmark: LoRA (`--use_peft`) against full fine-tuning on the same model and batch, side by side in one run.

For each mode, the real stack: one vLLM engine (a Ray actor) and one DeepSpeed learner rank (ZeRO-2, gradient
checkpointing) training on the same heavy-tailed batch; after each step `--running` long requests start
decoding and, once every one has tokens, the new weights go into the engine in flight over gloo (requests keep
their KV cache). Reported per mode: the learner's step time (median after the first step) and peak memory
(the learner process's peak RSS on CPU), the bytes a sync moves, how long the engine was paused, and the
ratios LoRA / full.

Then the arithmetic for a 7B model (Qwen2.5-7B's shape, built on the meta device: no download) of what its
adapter weighs against the model, and the simulator's projection at the long-reasoning shape with two
costs changed for LoRA: the learner's step scaled by the LoRA / full step time measured here, and the sync
pause scaled by the adapter's share of the 7B's bytes (never below the LoRA pause measured here, which is
mostly the pause and resume themselves). Against full fine-tuning's projection, on the same assumed H100
costs otherwise.

    python -m benchmarks.lora --size 512x6 --output output/bench/lora.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.simulation_projection import GPU_H100_COST, LONG_REASONING_WORKLOAD, project_long_reasoning
from benchmarks.stamp import results_page, stamp

MODES = ("full", "lora")
# The long-reasoning shape's model size (simulation_projection's costs assume it): Qwen2.5-7B's dimensions.
SEVEN_B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


def lora_flags(args) -> dict:
    return {"use_peft": True, "lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r, "lora_dropout": 0.0}


def decoding_requests(count: int, max_tokens: int, round_index: int) -> list:
    from open_instruct.messages import PromptRequest, SamplingSettings

    rng = random.Random(round_index)
    return [
        PromptRequest(
            prompt_id=f"bench{round_index}_{i}",
            prompt_token_ids=tuple(rng.randrange(3, 250) for _ in range(16)),
            ground_truths=(),
            verifier_names=(),
            sampling=SamplingSettings(max_tokens=max_tokens, temperature=1.0, ignore_eos=True),
            num_samples=1,
            seed=i,
            admitted_version=0,
        )
        for i in range(count)
    ]


def wait_for_tokens(pool, count: int, min_tokens: int, timeout_s: float = 300) -> None:
    """Until the engine runs `count` requests with `min_tokens` each (the sync must find them decoding)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [progress] = pool.call_all("running_tokens")
        if len(progress) == count and min(progress.values()) >= min_tokens:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the benchmark's requests did not reach {min_tokens} tokens in {timeout_s:.0f} s")


def collect(pool, count: int, timeout_s: float = 600) -> list:
    """The next `count` completions from the result queue."""
    deadline, done = time.monotonic() + timeout_s, []
    while len(done) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(done)} of the benchmark's {count} requests finished in {timeout_s:.0f} s")
        done += pool.poll(timeout_s=1.0)
    return done


def measure(mode: str, model_path: str, groups, args) -> dict:
    """`args.steps` steps of one mode on the real stack: train, start `args.running` requests through the prompt
    queue, sync into the engine while they decode. Each step's learner and sync metrics, and their medians."""
    from open_instruct import cluster
    from open_instruct.config.generation import GenerationConfig
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.generation.pool import EnginePool
    from open_instruct.weights.sync import SyncSettings, WeightSync

    flags = lora_flags(args) if mode == "lora" else {}
    engine_side = engine_settings(model_path, args.max_tokens + 64, vllm_kv_cache_gib=0.5, **flags)
    pool = EnginePool(cluster.create_generation_actors(engine_side, 1), prompt_capacity=args.running)
    steps = []
    try:
        pool.start(timeout_s=600)
        with learners_for(mode, model_path, args, flags) as learners:
            learners.setup()
            sync = WeightSync(learners, pool, SyncSettings("gloo", "float32", GenerationConfig(), timeout_s=300))
            sync.connect()
            for step in range(args.steps):
                trained = learners.train_step(groups, step).metrics
                pool.submit(decoding_requests(args.running, args.max_tokens, step))
                wait_for_tokens(pool, args.running, min_tokens=8)
                synced = sync.sync(step + 1)
                collect(pool, args.running)
                steps.append(
                    {
                        "step_s": trained["learner/step_s"],
                        "peak_memory_gib": trained["learner/peak_memory_gib"],
                        "sync_bytes": synced["weight_sync/bytes"],
                        "pause_s": synced["time/weight_sync_pause_s"],
                        "transfer_s": synced["time/weight_sync_transfer_s"],
                        "kept_requests": synced["weight_sync/kept_requests"],
                    }
                )
    finally:
        pool.shutdown()
    later = steps[1:] or steps
    return {
        "steps": steps,
        "step_s": statistics.median(s["step_s"] for s in later),
        "peak_memory_gib": max(s["peak_memory_gib"] for s in steps),
        "sync_mb": steps[-1]["sync_bytes"] / 1e6,
        "pause_s": statistics.median(s["pause_s"] for s in steps),
        "transfer_s": statistics.median(s["transfer_s"] for s in steps),
        "kept_requests": min(s["kept_requests"] for s in steps),
    }


def learners_for(mode: str, model_path: str, args, flags: dict):
    """One learner rank (ZeRO-2, gradient checkpointing) for `mode`, as a context that releases it. LoRA's
    learning rate is 10x full fine-tuning's, as "LoRA Without Regret" finds optimal (the step time does not
    depend on it)."""
    from open_instruct import batching, cluster
    from open_instruct.learner.actor import learner_settings

    learner_side = learner_settings(
        model_path,
        total_steps=args.steps,
        deepspeed_stage=2,
        learning_rate=1e-5 if mode == "full" else 1e-4,
        lr_scheduler_type="constant",
        gradient_checkpointing=True,
        beta=0.0,
        **flags,
    )
    batch_settings = batching.batch_settings(
        1, pack_length=args.pack_length, num_learners_per_node=[1], per_device_train_batch_size=1
    )
    return cluster.learner_group_for_a_while(learner_side, batch_settings, 1)


def model_parameters(model_path: str) -> int:
    from open_instruct import adapters
    from open_instruct.config.model import ModelConfig

    _, parameters = adapters.layout(model_path, ModelConfig(use_peft=True))
    return parameters


def seven_b_adapter(lora_r: int) -> dict:
    """What an all-linear adapter of rank `lora_r` weighs against a 7B model (exact counts from its shape)."""
    from transformers import Qwen2Config

    from open_instruct import adapters
    from open_instruct.config.model import ModelConfig

    shapes, base = adapters.layout_of(Qwen2Config(**SEVEN_B), ModelConfig(use_peft=True, lora_r=lora_r), "a 7B")
    parameters = adapters.parameter_count(shapes)
    return {
        "model_parameters": base,
        "adapter_parameters": parameters,
        "fraction": parameters / base,
        "model_gb_bf16": 2 * base / 1e9,
        "adapter_mb_bf16": 2 * parameters / 1e6,
    }


def project(measured: dict, seven_b: dict, num_steps: int, sweep_steps: list[int]) -> dict:
    """Full fine-tuning's projection and LoRA's, same workload and cluster, with LoRA's learner and sync costs."""
    from benchmarks.simulation_reports import format_projection

    learner_ratio = measured["lora"]["step_s"] / measured["full"]["step_s"]
    pause_s = max(GPU_H100_COST.weight_sync_pause_s * seven_b["fraction"], measured["lora"]["pause_s"])
    lora_cost = dataclasses.replace(
        GPU_H100_COST,
        weight_sync_pause_s=pause_s,
        learner_base_s=GPU_H100_COST.learner_base_s * learner_ratio,
        learner_per_token_s=GPU_H100_COST.learner_per_token_s * learner_ratio,
    )
    out = {"learner_ratio": learner_ratio, "lora_sync_pause_s": pause_s}
    for mode, cost in (("full", GPU_H100_COST), ("lora", lora_cost)):
        print(f"-- {mode} --")
        entry, sweep = project_long_reasoning(num_steps, sweep_steps, cost)
        print(format_projection(entry, sweep))
        out[mode] = {
            key: entry[key]
            for key in ("speedup_streaming_vs_sync", "streaming_async_steps", "learner_bound_speedup", "cost_model")
        }
        out[mode]["synchronous_samples_per_s"] = entry["synchronous"]["steady_trained_samples_per_s"]
        out[mode]["streaming_samples_per_s"] = entry["streaming"]["steady_trained_samples_per_s"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="512x6", help="'embedded' or HIDDENxLAYERS (a random Qwen2).")
    parser.add_argument("--lora_r", type=int, default=16, help="rank of the all-linear adapter (alpha = 2 r)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--pack_length", type=int, default=1024)
    parser.add_argument("--running", type=int, default=8, help="requests decoding during each sync")
    parser.add_argument("--max_tokens", type=int, default=256)
    parser.add_argument("--projection_steps", type=int, default=LONG_REASONING_WORKLOAD.num_steps)
    parser.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--output", default="output/bench/lora.json")
    args = parser.parse_args(argv)

    from benchmarks.learner_step import build_model, heavy_tailed_groups
    from open_instruct import cluster

    groups = heavy_tailed_groups(args.prompts, args.samples, max_response=args.pack_length - 64)
    result: dict = {"stamp": stamp("lora"), "size": args.size, "lora_r": args.lora_r}
    result["samples"] = args.prompts * args.samples
    cluster.init_ray(min_logical_cpus=5)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            model_path = build_model(args.size, Path(workdir))
            result["model_parameters_m"] = model_parameters(model_path) / 1e6
            result["measured"] = {mode: measure(mode, model_path, groups, args) for mode in MODES}
    finally:
        cluster.shutdown_ray()
    full, lora = result["measured"]["full"], result["measured"]["lora"]
    result["lora_over_full"] = {
        key: lora[key] / full[key] for key in ("step_s", "peak_memory_gib", "sync_mb", "pause_s", "transfer_s")
    }
    result["seven_b"] = seven_b_adapter(args.lora_r)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    with results_page(out.with_suffix(".md"), "LoRA against full fine-tuning", result["stamp"]):
        print_measured(result, args)
        result["projection"] = project(result["measured"], result["seven_b"], args.projection_steps, args.sweep)
        print_projection(result)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return result


def print_measured(result: dict, args) -> None:
    measured, ratio = result["measured"], result["lora_over_full"]
    print(
        f"model {result['size']} ({'the embedded one' if result['size'] == 'embedded' else 'a random Qwen2'}, "
        f"{result['model_parameters_m']:.1f} M parameters), {result['samples']} heavy-tailed samples per step, "
        f"1 learner rank (ZeRO-2, gradient checkpointing), 1 engine with {args.running} requests decoding at each "
        f"sync; LoRA r={result['lora_r']} alpha {2 * result['lora_r']} on every linear layer"
    )
    print(f"{'':>14} {'step s':>8} {'peak GiB':>9} {'sync MB':>9} {'pause s':>8} {'transfer s':>10} {'kept':>5}")
    for mode in MODES:
        m = measured[mode]
        print(
            f"{mode:>14} {m['step_s']:>8.2f} {m['peak_memory_gib']:>9.2f} {m['sync_mb']:>9.2f} {m['pause_s']:>8.3f} "
            f"{m['transfer_s']:>10.3f} {m['kept_requests']:>5.0f}"
        )
    print(
        f"{'lora / full':>14} {ratio['step_s']:>8.2f} {ratio['peak_memory_gib']:>9.2f} {ratio['sync_mb']:>9.3f} "
        f"{ratio['pause_s']:>8.2f} {ratio['transfer_s']:>10.3f}"
    )
    b = result["seven_b"]
    print(
        f"7B arithmetic (Qwen2.5-7B's shape): r={result['lora_r']} all-linear adapter {b['adapter_parameters']:,} "
        f"parameters of {b['model_parameters']:,} = {100 * b['fraction']:.2f}%: {b['adapter_mb_bf16']:.0f} MB "
        f"per sync in bf16 instead of {b['model_gb_bf16']:.1f} GB"
    )


def print_projection(result: dict) -> None:
    p = result["projection"]
    print(
        f"projection (assumed H100 costs; LoRA: learner x {p['learner_ratio']:.2f} as measured above, sync pause "
        f"{p['lora_sync_pause_s']:.3f} s instead of {p['full']['cost_model']['weight_sync_pause_s']:.1f} s):"
    )
    print(f"{'':>6} {'sync samples/s':>15} {'streaming samples/s':>20} {'streaming/sync':>15} {'ceiling':>8}")
    for mode in MODES:
        m = p[mode]
        print(
            f"{mode:>6} {m['synchronous_samples_per_s']:>15.2f} {m['streaming_samples_per_s']:>20.2f} "
            f"{m['speedup_streaming_vs_sync']:>14.2f}x {m['learner_bound_speedup']:>7.2f}x"
        )


if __name__ == "__main__":
    main()
