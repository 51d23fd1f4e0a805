"""Benchmark: what a fault costs a long-generation run, measured on the real stack.

Each scenario is a real training run (`cluster.Stack` + `orchestrator.TrainingLoop`, 2 vLLM engines, 1
DeepSpeed learner) of a heavy-tailed long workload (`workloads.ShapedWorkload`, the same prompts and lengths
in every scenario), with a fault at step `--fault_step`:

* sigkill_continue  an engine with running samples is SIGKILLed; its samples continue on another engine from
                    the tokens they last reported (`--partial_report_tokens`, here `--report_tokens`);
* sigkill_restart   the same kill with `--partial_report_tokens 0`: its samples start over from the prompt;
* sigterm_resume    the run is told to stop (what SIGTERM does), saves its state with the running samples'
                    tokens, every actor goes; a new stack, as the restarted job would build, resumes from it.

Per scenario: the tokens the victim's samples held at the fault, the tokens continuation saved and those
generated again; the time from the fault to the failure noticed and to a replacement serving (for the stop:
to the state saved, and to the first step trained after the resume); and the throughput dip: trained
samples/s of each step against the median before the fault, the deepest step, how long until a step runs at
90% of that rate again, and the samples that took. Writes `faults.json` and `faults.md` (stamped).

    python -m benchmarks.faults --output output/bench/faults
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import statistics
import threading
import time
from pathlib import Path

from benchmarks.stamp import page_text, stamp
from benchmarks.workloads import ShapedGenerationActor, ShapedWorkload, run_config

logger = logging.getLogger(__name__)

SCENARIOS = ("sigkill_continue", "sigkill_restart", "sigterm_resume")
RECOVERED_FRAC = 0.9  # a step at this share of the rate before the fault ends the dip


def throughput_dip(started_at: float, step_ends: list[float], samples_per_step: int, fault_at: float) -> dict:
    """Trained samples/s per step around a fault at `fault_at` (wall-clock seconds, as the step ends).

    The baseline is the median rate of the steps that ended before the fault, the first left out (it
    includes start-up and the pipeline filling). The dip lasts until the first step that starts after the
    fault and runs at `RECOVERED_FRAC` of the baseline; the samples it cost are those the baseline rate
    would have trained in that time, less those trained."""
    starts = [started_at, *step_ends[:-1]]
    steps = [(s, e, samples_per_step / (e - s)) for s, e in zip(starts, step_ends)]
    before = [rate for i, (_, end, rate) in enumerate(steps) if end <= fault_at and i > 0]
    if not before:
        raise ValueError("no step (after the first) ended before the fault: nothing to compare with")
    baseline = statistics.median(before)
    after = [(s, e, rate) for s, e, rate in steps if e > fault_at]
    recovered = next((s for s, _, rate in after if s >= fault_at and rate >= RECOVERED_FRAC * baseline), None)
    dip_end = recovered if recovered is not None else (after[-1][1] if after else fault_at)
    in_dip = [(s, e, rate) for s, e, rate in after if e <= dip_end]
    trained = samples_per_step * len(in_dip)
    return {
        "baseline_samples_per_s": baseline,
        "deepest_samples_per_s": min((rate for _, _, rate in in_dip), default=baseline),
        "recovered": recovered is not None,
        "dip_s": dip_end - fault_at,
        "samples_lost": max(0.0, baseline * (dip_end - fault_at) - trained),
        "rates": [{"end_s": e - started_at, "samples_per_s": rate} for _, e, rate in steps],
    }


class StepTimes:
    """The learner group, recording when each train step ended (wall clock)."""

    def __init__(self, learners):
        self.learners, self.ends = learners, []

    def train_step(self, groups, step: int):
        report = self.learners.train_step(groups, step)
        self.ends.append(report.finished_at)
        return report

    def __getattr__(self, name: str):
        return getattr(self.learners, name)


class FaultAt(threading.Thread):
    """Waits until the loop has trained `step` steps, then acts: SIGKILLs the engine holding the most running
    tokens, or asks the loop to stop (what SIGTERM does). Records when and what the victim held."""

    def __init__(self, loop, pool, step: int, kind: str, stop=None):
        super().__init__(daemon=True, name=f"fault-{kind}")
        self.loop, self.pool, self.step, self.kind, self.stop_request = loop, pool, step, kind, stop
        self.at: float | None = None
        self.engine_id: int | None = None
        self.tokens_held = 0
        self.samples_held = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            if self.loop.step >= self.step:
                engine_ids = self.pool.member_ids()
                held = dict(zip(engine_ids, self.pool.call_all("running_tokens"), strict=True))
                if any(held.values()):  # a fault with nothing running measures nothing: wait for samples
                    self._act(held)
                    return
            self._done.wait(0.1)

    def _act(self, held: dict[int, dict[str, int]]) -> None:
        if self.kind == "sigterm":  # the stop keeps every engine's running samples
            counted = list(held.values())
        else:
            self.engine_id = max(held, key=lambda i: sum(held[i].values()))
            counted = [held[self.engine_id]]
        self.tokens_held = sum(sum(h.values()) for h in counted)
        self.samples_held = sum(len(h) for h in counted)
        self.at = time.time()
        if self.kind == "sigterm":
            self.stop_request.reason = "SIGTERM"
        else:
            os.kill(self.pool.start_info[self.engine_id].pid, signal.SIGKILL)
        logger.info(
            "%s at step %d: %d samples held %d tokens", self.kind, self.loop.step, self.samples_held, self.tokens_held
        )

    def cancel(self) -> None:
        self._done.set()


def scenario_config(args, out: Path, scenario: str):
    """The grpo_fast flags of one scenario: the same workload, its own output and state directories."""
    flags = {
        "vllm_num_engines": 2,
        "async_steps": args.async_steps,
        "max_engine_restarts": 1,
        "partial_report_tokens": 0 if scenario == "sigkill_restart" else args.report_tokens,
        "checkpoint_state_dir": out / scenario / "state",
        "checkpoint_state_freq": 10_000,  # only the stop saves state
        "output_dir": out / scenario,
    }
    return run_config(args, args.max_tokens + 8, flags)


def run_scenario(args, out: Path, scenario: str, workload: ShapedWorkload, tokenizer, rows) -> dict:
    """One training run with its fault; for the stop, the resumed run too (on a new stack)."""
    from open_instruct.orchestrator import StopRequest

    cfg = scenario_config(args, out, scenario)
    kind = "sigterm" if scenario == "sigterm_resume" else "sigkill"
    stop = StopRequest() if kind == "sigterm" else None  # set by the fault, never installed as a handler
    started, ends, loop, stack, fault = _train(cfg, workload, tokenizer, rows, stop, args.fault_step, kind)
    result = {
        "scenario": scenario,
        "fault_step": args.fault_step,
        "samples_held": fault.samples_held,
        "tokens_held": fault.tokens_held,
        "partial_report_tokens": cfg.generation.partial_report_tokens,
    }
    if kind == "sigkill":
        history = loop.log.history
        saved = history[-1]["engines/continued_tokens_saved_total"]
        replacements = stack.pool.replacements
        stack.close()
        if not replacements:
            raise RuntimeError(f"{scenario}: engine {fault.engine_id} was killed but never replaced")
        replaced = replacements[0]
        result |= {
            "engine_killed": replaced.engine_id,
            "tokens_saved": saved,
            # About: the victim ran on for the instant between counting its tokens and the kill.
            "tokens_generated_again": max(0.0, fault.tokens_held - saved),
            "noticed_s": replaced.noticed_at - fault.at,
            "old_processes": replaced.reaped,
            # Built in the background while the other engine and the learner went on; serving from the next sync.
            "replacement_ready_s": replaced.ready_at - fault.at if replaced.ready_at else None,
            "replacement_serving_s": replaced.serving_at - fault.at if replaced.serving_at else None,
            "steps": len(ends),
            **throughput_dip(started, ends, cfg.rollout_batch_size, fault.at),
        }
        return result
    stopped_at = time.time()  # the loop returned: state saved, the stop is done
    stack.close()
    resumed_started, resumed_ends, resumed, stack, _ = _train(cfg, workload, tokenizer, rows, None, None, kind)
    stack.close()
    saved = resumed.log.history[-1]["engines/continued_tokens_saved_total"]
    return result | {
        "stop_to_state_saved_s": stopped_at - fault.at,
        "restart_to_first_step_s": resumed_ends[0] - resumed_started,
        "stop_to_first_step_after_resume_s": resumed_ends[0] - fault.at,
        "steps_before_stop": len(ends),
        "steps_after_resume": len(resumed_ends),
        "tokens_saved": saved,
        "tokens_generated_again": max(0.0, fault.tokens_held - saved),
    }


def _train(cfg, workload, tokenizer, rows, stop, fault_step: int | None, kind: str):
    """A new stack and one TrainingLoop run on it (with a fault at `fault_step`, if given); the stack stays up."""
    from open_instruct.cluster import Stack
    from open_instruct.data.models import resolve_model_path
    from open_instruct.orchestrator import SystemClock, TrainingLoop
    from open_instruct.tracking import RunLog

    started = time.time()
    stack = Stack(cfg, resolve_model_path(None), tokenizer.pad_token_id, ShapedGenerationActor, (workload,))
    learners = StepTimes(stack.learners)
    loop = TrainingLoop(
        cfg,
        engines=stack.pool,
        learners=learners,
        weights=stack.sync,
        clock=SystemClock(),
        log=RunLog(cfg),
        train_rows=rows,
        tokenizer=tokenizer,
        stop=stop,
    )
    fault = FaultAt(loop, stack.pool, fault_step, kind, stop) if fault_step is not None else None
    if fault is not None:
        fault.start()
    try:
        loop.run()
    except BaseException:
        stack.close()
        raise
    finally:
        if fault is not None:
            fault.cancel()
    if fault is not None and fault.at is None:
        stack.close()
        raise RuntimeError(f"the run ended before step {fault_step} had samples running: no fault happened")
    return started, learners.ends, loop, stack, fault


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 16: the replacement (built in about 10 s here) joins and serves within the run, after the fault at step 4.
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--fault_step", type=int, default=4, help="the fault comes once this many steps trained")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--median_tokens", type=int, default=160)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max_tokens", type=int, default=1024)
    parser.add_argument("--report_tokens", type=int, default=16, help="--partial_report_tokens when continuing")
    parser.add_argument(
        "--async_steps", type=int, default=2, help="the lookahead (a deeper one hides a fault in buffered groups)"
    )
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--output", default="output/bench/faults")
    args = parser.parse_args(argv)
    if not 2 <= args.fault_step < args.steps:
        parser.error("--fault_step must be in [2, --steps): a baseline needs a step after the first before it")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from open_instruct.data import dataset as data
    from open_instruct.data.models import load_tokenizer

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    workload = ShapedWorkload("long_tail", args.median_tokens, args.sigma, args.max_tokens)
    base = scenario_config(args, out, "sigkill_continue")
    tokenizer = load_tokenizer(base.model)
    rows = data.load_prompt_dataset(base.train_data, base.model, tokenizer, "train", {}, seed=1).prompts
    results = {
        "stamp": stamp("faults", base.staleness_policy.describe()),
        "workload": dataclasses.asdict(workload),
        "steps": args.steps,
        "samples_per_step": args.prompts * args.samples,
        "scenarios": {name: run_scenario(args, out, name, workload, tokenizer, rows) for name in args.scenarios},
    }
    (out / "faults.json").write_text(json.dumps(results, indent=1))
    report = format_report(results)
    (out / "faults.md").write_text(page_text("What a fault costs: measured tables", results["stamp"], report))
    print(report)
    return results


def format_report(results: dict) -> str:
    w = results["workload"]
    lines = [
        f"2 engines, 1 learner; {results['steps']} steps x {results['samples_per_step']} samples; responses "
        f"lognormal(median {w['median_tokens']}, sigma {w['sigma']}) capped at {w['max_tokens']} (exact lengths)"
    ]
    for name, r in results["scenarios"].items():
        lines.append("")
        lines.append(
            f"{name} at step {r['fault_step']}: {r['samples_held']} running samples held {r['tokens_held']} tokens; "
            f"continuation saved {r['tokens_saved']:.0f}, {r['tokens_generated_again']:.0f} generated again "
            f"(--partial_report_tokens {r['partial_report_tokens']})"
        )
        if "engine_killed" in r:
            ready, serving = r["replacement_ready_s"], r["replacement_serving_s"]
            lines.append(
                f"  engine {r['engine_killed']} killed: noticed after {r['noticed_s']:.1f} s; its replacement, "
                f"built in the background, was ready after {_seconds(ready)} and serving (from the next weight "
                f"sync) after {_seconds(serving)}"
            )
            recovered = f"{r['dip_s']:.1f} s" if r["recovered"] else f"not within the run ({r['dip_s']:.1f} s)"
            lines.append(
                f"  trained samples/s: {r['baseline_samples_per_s']:.2f} before, deepest step "
                f"{r['deepest_samples_per_s']:.2f}; back to {RECOVERED_FRAC:.0%} after {recovered}, "
                f"{r['samples_lost']:.0f} samples behind"
            )
        else:
            lines.append(
                f"  state saved {r['stop_to_state_saved_s']:.1f} s after the stop; the resumed run (new stack) "
                f"trained its first step {r['restart_to_first_step_s']:.1f} s after it started, "
                f"{r['stop_to_first_step_after_resume_s']:.1f} s after the stop"
            )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "never within the run"


if __name__ == "__main__":
    main()
