"""Benchmark: synchronous vs one-step-ahead async vs streaming training, same machine, same prompts.

One set of actors (vLLM engine, DeepSpeed learner, weight sync) runs the real training loop
(`orchestrator.TrainingLoop`) in each mode:

* synchronous      `--async_steps 0 --inflight_updates False`: admit a batch, wait for its
                   longest sample, train, sync (engines idle while the learner trains);
* one_step_async   `--async_steps 1 --inflight_updates False`: the next batch generates while
                   the learner trains; each sync waits for running samples to finish;
* streaming        `--async_steps 1 --inflight_updates True`: this project's design; samples
                   keep running through syncs with their KV cache; groups over
                   `--max_off_policy_steps` are requeued (`--off_policy_action requeue`);
* streaming_auto   `--async_steps auto --inflight_updates True`: streaming whose lookahead grows
                   while the learner waits (up to `--max_off_policy_steps`): more samples in flight
                   when they spend their time parked on tools; a draining sync cannot do this, as
                   every extra step ahead is more to wait for at each sync;
* streaming_reprefill: streaming with `--inflight_update_kv reprefill`: each sync aborts the
                   running samples, which keep their tokens and logprobs and continue after one
                   fresh prefill of prompt + tokens under the new weights (the approach of verl,
                   AReaL and slime), against streaming's kept KV cache;
* streaming_drop, streaming_downweight, streaming_mask: the same with `--off_policy_action drop` /
                   `downweight` / `mask`, to show what each action costs and how it biases trained
                   lengths (mask trains late groups whole, their too-old tokens as context only).

Measured so that a reader can trust a ratio (`rounds.py`): engine and learner each get their own
cores (`--pin`, through the CPU split of `--single_gpu_mode`: vLLM's engine process on one half, the
learner on the other, the engine actor's event loop and this driver beside the learner, as separate
GPUs would be), the modes run interleaved (A B C A B C) for `--rounds` rounds, and every number is
reported as the median over rounds with its min-max spread; a ratio of two modes is taken per round.
Each workload also gets its learner-bound ceiling: the rate of a learner that never waits, at the step
and sync times streaming measured.

Three workloads, each with the same prompts in every mode (a sample's shape is a function of
its id): `heavy_tail`, response lengths drawn from a lognormal (exact, ignore_eos); `tool_latency`,
shorter responses with a real tool call halfway through each sample (the production multi-turn
path: parser, http tool, observation tokens, next turn; the tool server answers after an
exponentially distributed wait, as APIs do); and `env_turns`, samples that play guess_number for
`--env_calls` turns through the real environment.

Per mode: trained samples/s, generated tokens/s, generation idle fraction, learner wait
fraction, weight-sync pause, staleness (version lag mean/max), the trained/generated length ratio.
Also measured (on the same pinned stack): the engine's decode time on heavy-tail batches of several
sizes at the start of every round (`--calibrate`), prefill speed, and learner step time vs tokens,
written as `measured.json` with each mode's median rate and the runs' prompts and lengths: the input
`benchmarks.simulator` fits its cost model on and replays to validate it. Writes `e2e.json`
and `e2e.md` (the tables, stamped with date, commit and machine), `timeline_<workload>.png` (engine
occupancy and learner steps over time, synchronous vs streaming, last round) and prints the tables.

    python -m benchmarks.e2e --output output/bench/e2e
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from benchmarks import rounds as rounds_lib
from benchmarks.e2e_reports import write_report
from benchmarks.e2e_runs import (
    CALL_HEADROOM_TOKENS,
    MODES,
    PeakMemory,
    measure_prefill,
    measured_for_simulator,
    mode_config,
    run_rounds,
    summarize_workload,
    warm_up_engine,
)
from benchmarks.stamp import read_result, stamp
from benchmarks.workloads import LatencyToolServer, ShapedGenerationActor, ShapedWorkload, run_config
from open_instruct.data.embedded_default import LONG_CONTEXT_POSITIONS, ensure_long_context_model

logger = logging.getLogger(__name__)
LORA_R = 16  # --use_peft: the rank of the adapter every mode trains


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--median_tokens", type=int, default=48)
    parser.add_argument("--sigma", type=float, default=1.3)
    parser.add_argument("--max_tokens", type=int, default=1024)
    parser.add_argument("--tool_latency_s", type=float, default=1.5)
    parser.add_argument("--tool_median_tokens", type=int, default=32)
    parser.add_argument("--env_calls", type=int, default=2, help="guess_number turns per sample in env_turns")
    parser.add_argument("--workloads", nargs="+", default=["heavy_tail", "tool_latency", "env_turns"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=3, help="every mode runs once per round, interleaved")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engine and learner on their own cores (the CPU split of --single_gpu_mode)",
    )
    parser.add_argument("--max_off_policy_steps", type=int, default=2, help="the staleness bound of every mode")
    parser.add_argument(
        "--long_context",
        action="store_true",
        help=f"the embedded model with {LONG_CONTEXT_POSITIONS} positions (same weights): for --max_tokens over 8k",
    )
    parser.add_argument("--kv_cache_gib", type=float, default=0.5, help="--vllm_kv_cache_gib of the engine")
    parser.add_argument(
        "--running_per_engine",
        type=int,
        default=0,
        help="samples each engine runs at once (0: as many as fit in the KV cache at full length); more makes "
        "vLLM preempt when the long ones outgrow the cache",
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        nargs="*",
        default=[4, 8, 16, 32, 48, 64],
        help="sizes of the heavy-tail batches, run at the start of every round, that the simulator's decode cost "
        "is fitted on (none, or no heavy_tail workload: no measured.json)",
    )
    parser.add_argument(
        "--use_peft",
        action="store_true",
        help=f"every mode trains a LoRA adapter (--lora_r {LORA_R}, all linear layers, 10x the learning rate)",
    )
    parser.add_argument("--output", default="output/bench/e2e")
    parser.add_argument(
        "--summarize",
        metavar="E2E_JSON",
        help="measure nothing: summarize the runs of an earlier e2e.json again (its stamp kept) into --output",
    )
    args = parser.parse_args(argv)
    if not {"synchronous", "streaming"} <= set(args.modes):
        parser.error("--modes must include synchronous and streaming: the benchmark reports their ratio")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def base_config(args, out: Path, tool_flags: list[str]):
    """The grpo_fast flags every mode shares; modes differ only in the flags of `MODES` (mode_config)."""
    flags = {
        "max_off_policy_steps": args.max_off_policy_steps,
        "single_gpu_mode": args.pin,
        "output_dir": out,
        "vllm_kv_cache_gib": args.kv_cache_gib,
    }
    if args.long_context:
        flags["model_name_or_path"] = ensure_long_context_model()
    lora = (
        ("--use_peft", "--lora_r", str(LORA_R), "--lora_dropout", "0", "--learning_rate", "1e-4")
        if args.use_peft
        else ()
    )
    return run_config(args, args.max_tokens + CALL_HEADROOM_TOKENS, flags, (*tool_flags, *lora))


def workloads_from(args) -> dict[str, ShapedWorkload]:
    """The three workloads as the flags shape them (every one is built; `--workloads` picks which run)."""
    return {
        "heavy_tail": ShapedWorkload("heavy_tail", args.median_tokens, args.sigma, args.max_tokens),
        "tool_latency": ShapedWorkload(
            "tool_latency", args.tool_median_tokens, 0.5, args.max_tokens, args.tool_latency_s
        ),
        "env_turns": ShapedWorkload(
            "env_turns", args.tool_median_tokens, 0.5, args.max_tokens, env_calls=args.env_calls
        ),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.summarize:
        return summarize_again(Path(args.summarize), Path(args.output))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from open_instruct.cluster import Stack
    from open_instruct.data import dataset as data
    from open_instruct.data.models import load_tokenizer, resolve_model_path

    workloads = workloads_from(args)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    tool_server = LatencyToolServer(args.tool_latency_s)
    base = base_config(args, out, tool_server.tool_flags())
    tokenizer = load_tokenizer(base.model)
    rows = data.load_prompt_dataset(base.train_data, base.model, tokenizer, "train", {}, seed=1).prompts
    policies = {mode: mode_config(base, mode, out).staleness_policy.describe() for mode in args.modes}
    results: dict = {"stamp": stamp("e2e", policies), "rounds": args.rounds, "pinned": args.pin, "workloads": {}}
    results["lora_r"] = LORA_R if args.use_peft else 0  # the adapter every mode trains (0: the whole model)
    results["max_tokens"] = args.max_tokens
    results["running_per_engine"] = args.running_per_engine  # 0: as many as fit at full length (no preemption)
    with PeakMemory() as memory:
        model_path = resolve_model_path(base.model.model_name_or_path)
        engine_args = (None, args.running_per_engine)
        stack = Stack(base, model_path, tokenizer.pad_token_id, ShapedGenerationActor, engine_args)
        if args.pin and stack.placement.learner_cores:
            # The driver (the training loop and its Ray calls) beside the learner, off the engine's core.
            os.sched_setaffinity(0, stack.placement.learner_cores)
        try:
            warm_up_engine(stack, rows, workloads["heavy_tail"])
            calibration = None
            if args.calibrate and "heavy_tail" in args.workloads:
                calibration = {
                    "decode": [],
                    "queue_overhead": [],
                    "engine_steps": [],
                    "prefill_tokens_per_s": measure_prefill(stack, rows),
                    "kv_block_tokens": stack.pool.start_info[0].kv_block_tokens,
                }
            max_running = stack.pool.start_info[0].target_concurrency
            results["workloads"] = run_rounds(stack, base, workloads, tokenizer, rows, out, args, calibration)
        finally:
            stack.close()
            tool_server.close()
    results["peak_memory_gib"] = memory.peak / 2**30
    results["peak_memory_gib_by_role"] = {role: pss / 2**30 for role, pss in sorted(memory.peak_by_role.items())}
    (out / "e2e.json").write_text(json.dumps(results, indent=1))
    if calibration is not None:
        from benchmarks.simulation_replay import Replay

        replay = Replay.of_rows(base.run.seed, rows, workloads["heavy_tail"]).as_json()
        heavy_runs = results["workloads"]["heavy_tail"]
        measured = measured_for_simulator(args, calibration, heavy_runs, max_running, replay)
        (out / "measured.json").write_text(json.dumps({**measured, "stamp": results["stamp"]}, indent=1))
    write_report(results, out)
    print(f"peak memory (PSS, all processes): {results['peak_memory_gib']:.2f} GiB; wrote {out / 'e2e.json'}")
    return results


def summarize_again(path: Path, out: Path) -> dict:
    """The summaries of an e2e.json's runs recomputed by this code (a new ceiling or ratio needs no new run)."""
    results = read_result(path, "e2e")
    for name, workload in results["workloads"].items():
        runs = workload["runs"]
        for mode_runs in runs.values():
            for run in mode_runs:
                run["generation_bound_samples_per_s"] = rounds_lib.generation_bound_samples_per_s(run)
        results["workloads"][name] = summarize_workload(workload["workload"], runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps(results, indent=1))
    write_report(results, out)
    return results


if __name__ == "__main__":
    main()
