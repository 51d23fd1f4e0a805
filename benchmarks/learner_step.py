"""Benchmark: learner step time and batch shape, measured side by side in one run on this machine.

Three parts, each on the same heavy-tailed batch (lognormal response lengths, a few near the limit):

* `old_logprobs`: 2 DeepSpeed ranks at the long-reasoning launch's training settings (one mini-batch, one epoch, no KL,
  gradient checkpointing) on ZeRO-2 and ZeRO-3, with pi_old from a separate no-grad pass (old) and from
  the first training forward (new). Reported: step time (median after the first step), new / old, and
  the largest loss difference between the two on the same batches (should be float noise).
* `micro_batches`: fixed rows (--per_device_train_batch_size 1 of --pack_length) against token-budget
  micro-batches (--micro_batch_token_budget = pack length): padding fraction and rank imbalance at 2
  and 8 ranks, and the measured 2-rank step time of each.
* `request_settings`: the whole change at the long-reasoning launch's settings (ZeRO-2, one mini-batch, one
  epoch, one row per micro-batch, gradient checkpointing), 2 ranks: open-instruct's step (a separate no-grad
  pass for pi_old, rows padded to --pack_length) against ours by default (pi_old from the training forward,
  the token budget that --per_device_train_batch_size 1 now defaults to). `new_over_old` is the simulator's
  LEARNER_STEP_RATIO.
* `checkpointing`: --gradient_checkpointing on and off on ZeRO-2 and ZeRO-3: each rank's peak memory
  (process peak RSS on CPU) and the step time.
* `--calibrate`: forward + backward seconds of rows of several lengths and document mixes on one
  process, fitted to `COST_QUADRATIC * L^2 + COST_LINEAR * L` (the constants in packing.py).

    python -m benchmarks.learner_step --output output/bench/learner_step.json
    python -m benchmarks.learner_step --parts checkpointing --steps 2
    python -m benchmarks.learner_step --calibrate
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.stamp import stamp


def heavy_tailed_groups(prompts: int, samples: int, max_response: int, seed: int = 0, prompt_len: int = 32):
    """Replay-buffer groups of random tokens: lognormal response lengths (median max/8, sigma 1), capped."""
    from open_instruct.messages import Completion, VersionSpan
    from open_instruct.replay_buffer import ReplayBuffer

    rng = random.Random(seed)
    buffer = ReplayBuffer(samples_per_prompt=samples, max_samples=prompts * samples)
    for p in range(prompts):
        prompt = tuple(rng.randrange(3, 250) for _ in range(prompt_len))
        for j in range(samples):
            length = min(max_response, max(1, int(rng.lognormvariate(0, 1.0) * max_response / 8)))
            response = tuple(rng.randrange(3, 250) for _ in range(length))
            buffer.add(
                Completion(
                    prompt_id=f"p{p}@0",
                    sample_index=j,
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    behaviour_logprobs=(-5.0,) * length,
                    finish_reason="stop",
                    version_spans=(VersionSpan(0, 0, length),),
                    admitted_version=0,
                    engine_id=0,
                    reward=float(j % 2),
                )
            )
    return buffer.take(prompts, learner_version=0)


def build_model(size: str, workdir: Path) -> str:
    """'embedded' (the tiny default) or HIDDENxLAYERS: a random Qwen2 of that size (the embedded tokenizer)."""
    from open_instruct.data.models import resolve_model_path

    if size == "embedded":
        return resolve_model_path(None)
    from benchmarks.weight_sync import build_model as build_sized
    from benchmarks.weight_sync import parse_size

    path, _ = build_sized(*parse_size(size), workdir)
    return str(path)


# Runs already measured in this process, by configuration: parts that share one (request_settings' token-budget
# run is micro_batches' ZeRO-2 token-budget run) start its learners once.
_MEASURED: dict[tuple, list[dict]] = {}


def train_steps(
    model_path: str, groups, batch_settings, steps: int, stage: int, gradient_checkpointing: bool = True, **options
) -> list[dict]:
    """`steps` training steps of a fresh 2-rank learner group on the same `groups`; each step's metrics."""
    # the settings by their repr: the flag groups they carry hold lists, so they do not hash
    options_key = tuple(sorted(options.items()))
    key = (model_path, id(groups), repr(batch_settings), steps, stage, gradient_checkpointing, options_key)
    if key not in _MEASURED:
        _MEASURED[key] = _train_fresh(model_path, groups, batch_settings, steps, stage, gradient_checkpointing, options)
    return _MEASURED[key]


def _train_fresh(model_path, groups, batch_settings, steps, stage, gradient_checkpointing, options) -> list[dict]:
    from open_instruct import cluster
    from open_instruct.learner.actor import learner_settings

    settings = learner_settings(
        model_path,
        total_steps=steps,
        deepspeed_stage=stage,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        gradient_checkpointing=gradient_checkpointing,
        beta=0.0,
        **options,
    )
    cluster.init_ray(min_logical_cpus=3)  # once per process: each configuration gets fresh learners on it
    with cluster.learner_group_for_a_while(settings, batch_settings, 2) as learners:
        learners.setup()
        return [learners.train_step(groups, step).metrics for step in range(steps)]


def _summary(history: list[dict]) -> dict:
    times = [h["learner/step_s"] for h in history]
    return {"step_s": statistics.median(times[1:] or times), "step_s_all": times}


def with_learner_flags(settings, **flags):
    """Batch settings with some learner flags changed (the token budget, the number of learners)."""
    return replace(settings, learner=replace(settings.learner, **flags))


def old_logprobs(model_path, groups, batch_settings, steps: int) -> dict:
    out = {}
    for stage in (2, 3):
        old = train_steps(model_path, groups, batch_settings, steps, stage, separate_old_logprob_pass=True)
        new = train_steps(model_path, groups, batch_settings, steps, stage)
        loss_diff = max(abs(a["loss/policy_avg"] - b["loss/policy_avg"]) for a, b in zip(old, new))
        out[f"zero{stage}"] = {
            "old": _summary(old),
            "new": _summary(new),
            "new_over_old": _summary(new)["step_s"] / _summary(old)["step_s"],
            "max_loss_diff": loss_diff,
            "losses_old": [h["loss/policy_avg"] for h in old],
            "losses_new": [h["loss/policy_avg"] for h in new],
        }
    return out


def micro_batches(model_path, groups, batch_settings, steps: int) -> dict:
    from open_instruct.batching import assemble

    budget = with_learner_flags(batch_settings, micro_batch_token_budget=batch_settings.learner.pack_length)
    shape = {}
    for world in (2, 8):
        for name, settings in (("fixed_rows", batch_settings), ("token_budget", budget)):
            _, stats = assemble(groups, 0, with_learner_flags(settings, num_learners_per_node=[world]))
            shape[f"{name}_ranks{world}"] = stats.balance
    timed = {
        name: _summary(train_steps(model_path, groups, settings, steps, stage=2))
        for name, settings in (("fixed_rows", batch_settings), ("token_budget", budget))
    }
    return {
        "shape": shape,
        "step": timed,
        "budget_over_fixed": timed["token_budget"]["step_s"] / timed["fixed_rows"]["step_s"],
    }


def request_settings(model_path, groups, batch_settings, steps: int) -> dict:
    old = train_steps(model_path, groups, batch_settings, steps, stage=2, separate_old_logprob_pass=True)
    budget = with_learner_flags(batch_settings, micro_batch_token_budget=batch_settings.learner.pack_length)
    new = train_steps(model_path, groups, budget, steps, stage=2)
    return {
        "old": _summary(old),
        "new": _summary(new),
        "new_over_old": _summary(new)["step_s"] / _summary(old)["step_s"],
        # The same update (tests/integration/test_learner.py checks it) and the same logged loss (a token mean
        # over ranks).
        "losses_old": [h["loss/policy_avg"] for h in old],
        "losses_new": [h["loss/policy_avg"] for h in new],
        "max_loss_diff": max(abs(a["loss/policy_avg"] - b["loss/policy_avg"]) for a, b in zip(old, new)),
    }


def checkpointing(model_path, groups, batch_settings, steps: int) -> dict:
    """--gradient_checkpointing on and off, ZeRO-2 and ZeRO-3: each rank's peak memory and the step time."""
    out = {}
    for stage in (2, 3):
        for enabled in (True, False):
            history = train_steps(model_path, groups, batch_settings, steps, stage, gradient_checkpointing=enabled)
            out[f"zero{stage}_{'on' if enabled else 'off'}"] = {
                **_summary(history),
                "peak_memory_gib": max(h["learner/peak_memory_gib"] for h in history),
            }
    return out


def calibrate(model_path: str, repeats: int = 3) -> dict:
    """Forward + backward seconds per row length on this process; least-squares fit of a L^2 + b L."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.config.use_cache = False
    model.gradient_checkpointing_enable()
    points = []
    for length in (128, 256, 512, 768, 1024, 1536, 2048):
        ids = torch.randint(3, 250, (1, length))
        positions = torch.arange(length)[None]
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            logits = model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False).logits
            logits.float().logsumexp(-1).mean().backward()
            best = min(best, time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
        points.append((length, best))
    return {"points": points, **fit_row_cost(points)}


def fit_row_cost(points: list[tuple[int, float]]) -> dict[str, float]:
    """Least-squares a L^2 + b L through (row length, seconds) points: the packing cost model's constants."""
    import torch

    xs = torch.tensor([[length * length, length] for length, _ in points], dtype=torch.float64)
    ys = torch.tensor([s for _, s in points], dtype=torch.float64)
    quadratic, linear = torch.linalg.lstsq(xs, ys[:, None]).solution.flatten().tolist()
    return {"COST_QUADRATIC": quadratic, "COST_LINEAR": linear}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="512x4", help="'embedded' or HIDDENxLAYERS (a random Qwen2).")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--pack_length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--calibrate", action="store_true", help="Only fit the row cost model.")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["request_settings", "old_logprobs", "micro_batches", "checkpointing"],
        help="Which parts to run.",
    )
    parser.add_argument("--output", default="")
    args = parser.parse_args(argv)

    from open_instruct.batching import batch_settings

    with tempfile.TemporaryDirectory() as workdir:
        model_path = build_model(args.size, Path(workdir))
        if args.calibrate:
            result = {"calibration": calibrate(model_path)}
        else:
            groups = heavy_tailed_groups(args.prompts, args.samples, max_response=args.pack_length - 64)
            settings = batch_settings(  # fixed rows: the baseline the token-budget benchmarks compare with
                1,
                pack_length=args.pack_length,
                num_learners_per_node=[2],
                per_device_train_batch_size=1,
                micro_batch_token_budget=0,
            )
            result = {
                "size": args.size,
                "samples": args.prompts * args.samples,
                "tokens": sum(
                    len(c.prompt_token_ids) + len(c.response_token_ids) for g in groups for c in g.completions
                ),
            }
            parts = {
                "request_settings": request_settings,
                "old_logprobs": old_logprobs,
                "micro_batches": micro_batches,
                "checkpointing": checkpointing,
            }
            try:
                for name in args.parts:
                    result[name] = parts[name](model_path, groups, settings, args.steps)
            finally:
                from open_instruct import cluster

                cluster.shutdown_ray()
    result["stamp"] = stamp("learner_step")
    print(json.dumps(result, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
