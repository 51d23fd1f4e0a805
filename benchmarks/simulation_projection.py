"""Projections at a cluster we do not have: the long-reasoning shape (`LONG_REASONING_CLUSTER`,
`LONG_REASONING_WORKLOAD`: 32 engines, 16 learners, 16k-token answers) on assumed H100 costs, streaming at each
lookahead against synchronous, and KV kept against re-prefill.

The numbers only; `simulation_reports` turns them into tables (`format_projection`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.simulated_world import Cluster, CostModel, Workload
from benchmarks.simulation import SimResult, needed, simulate

# The long-reasoning shape, the launch this project was built for and the one the docs project to
# (scripts/long_generations_experiment.sh; docs/index.md defines it): 6 nodes x 8 GPUs = 48, 32 single-GPU vLLM
# engines and 16 learner ranks, 256 prompts x 16 samples a step, responses lognormal around a 4,000-token median
# (sigma 0.8) capped at 16,384 tokens, a 7B model (the costs below).
# Every benchmark and test that means this shape imports these rather than restating their numbers.
LONG_REASONING_CLUSTER = Cluster(num_engines=32, num_learners=16)
LONG_REASONING_WORKLOAD = Workload(
    prompts_per_step=256,
    samples_per_prompt=16,
    num_steps=40,
    prompt_tokens=512,
    median_tokens=4000,
    sigma=0.8,
    max_tokens=16384,
    seed=0,
)
LONG_REASONING_GPUS = LONG_REASONING_CLUSTER.num_engines + LONG_REASONING_CLUSTER.num_learners  # 48


# A 7B model, one H100 per engine and per learner rank. Assumptions, not measurements:
# * decode: ~12 ms per step at small batch (weights streamed from HBM once per step), +0.12 ms per
#   running sample (KV reads grow with the batch); 256 running -> ~43 ms/step, ~6k tokens/s.
# * prefill ~20k tokens/s; max_running 256 (vLLM's default max_num_seqs; KV for 256 x 16.9k tokens
#   of a GQA 7B fits an 80 GB card only partly, so this is optimistic for the longest samples).
# * learner: 6 x 7e9 FLOPs per trained token at 40% of 989 TFLOP/s bf16 -> 1.06e-4 s per token per
#   rank; 1 s per step for the optimizer and ZeRO collectives.
# * weight sync: 1.5 s to broadcast 15 GB of bf16 weights over NCCL and reload them.
# * the learner figures above are for open-instruct's step: a separate no-grad pass for pi_old and rows
#   padded to --pack_length. The one measured change, not an assumption: the learner cost is scaled by
#   LEARNER_STEP_RATIO, new / old learner step time at the long-reasoning launch's settings (ZeRO-2, one mini-batch,
#   one row per micro-batch, gradient checkpointing; new = pi_old from the training forward and the token budget
#   that setting now defaults to), measured side by side by `python -m benchmarks.learner_step
#   --parts request_settings` on the 2-core CPU machine (a random 512x4 Qwen2, 2 ranks, 64 heavy-tailed samples:
#   14.07 s vs 18.73 s per step). A stamped rerun at 1295c96 measured 0.775 (docs/results/learner.md); the
#   constant stays, so that the published projections stay reproducible from it.
LEARNER_STEP_RATIO = 0.751


GPU_H100_COST = CostModel(
    decode_base_s=0.012,
    decode_per_seq_s=0.00012,
    prefill_per_token_s=1 / 20_000,
    max_running=256,
    weight_sync_pause_s=1.5,
    learner_base_s=1.0 * LEARNER_STEP_RATIO,
    learner_per_token_s=6 * 7e9 / (0.40 * 989e12) * LEARNER_STEP_RATIO,
)


@dataclass(frozen=True)
class AsyncSweep:
    """Synchronous and one-step-async once, streaming at several async_steps, on one workload.

    Rates are steady-state (`steady_trained_samples_per_s`): a long-reasoning run is thousands of steps,
    and streaming's pipeline fill is paid once. `learner_bound_samples_per_s` is the ceiling any
    schedule can reach (the learner never waits: train + sync back to back)."""

    synchronous: SimResult
    one_step_async: SimResult
    streaming: dict[int, SimResult]
    auto: SimResult | None = None  # streaming with --async_steps auto

    @property
    def learner_bound_samples_per_s(self) -> float:
        r = self.synchronous
        busy = r.learner_step_s_avg + r.weight_sync_pause_s_avg
        return r.trained_samples / r.num_steps / busy

    def speedup(self, result: SimResult) -> float:
        return result.steady_trained_samples_per_s / self.synchronous.steady_trained_samples_per_s

    @property
    def chosen_async_steps(self) -> int:
        """The least lookahead (least staleness) within 5% of the best streaming rate."""
        best = max(self.speedup(r) for r in self.streaming.values())
        return min(a for a, r in self.streaming.items() if self.speedup(r) >= 0.95 * best)

    def as_json(self) -> dict[str, Any]:
        chosen = self.streaming[self.chosen_async_steps]
        return {
            "synchronous": self.synchronous.as_json(),
            "one_step_async": self.one_step_async.as_json(),
            "streaming": chosen.as_json(),  # the contract's streaming mode: the chosen async_steps
            "streaming_async_steps": self.chosen_async_steps,
            "speedup_streaming_vs_sync": self.speedup(chosen),
            "speedup_one_step_async_vs_sync": self.speedup(self.one_step_async),
            "learner_bound_speedup": self.learner_bound_samples_per_s / self.synchronous.steady_trained_samples_per_s,
            "streaming_by_async_steps": {str(a): r.as_json() for a, r in self.streaming.items()},
            "speedup_streaming_vs_sync_by_async_steps": {str(a): self.speedup(r) for a, r in self.streaming.items()},
            "async_steps_needed_by_async_steps": {str(a): needed(r) for a, r in self.streaming.items()},
            **(
                {}
                if self.auto is None
                else {
                    "streaming_auto": self.auto.as_json(),
                    "speedup_streaming_auto_vs_sync": self.speedup(self.auto),
                    "streaming_auto_of_ceiling": self.auto.steady_trained_samples_per_s
                    / self.learner_bound_samples_per_s,
                }
            ),
        }


def sweep_async_steps(
    workload: Workload, cost: CostModel, cluster: Cluster, async_steps: list[int], auto: bool = True
) -> AsyncSweep:
    return AsyncSweep(
        synchronous=simulate("synchronous", workload, cost, cluster),
        one_step_async=simulate("one_step_async", workload, cost, cluster),
        streaming={a: simulate("streaming", workload, cost, cluster, a) for a in async_steps},
        auto=simulate("streaming", workload, cost, cluster, "auto") if auto else None,
    )


def project_long_reasoning(
    num_steps: int, sweep_steps: list[int], cost: CostModel = GPU_H100_COST
) -> tuple[dict[str, Any], AsyncSweep]:
    """The sweep at the long-reasoning shape on `cost` (the assumed H100 costs; the LoRA benchmark passes
    them with its measured learner and sync costs)."""
    workload = dataclasses.replace(LONG_REASONING_WORKLOAD, num_steps=num_steps)
    started = time.monotonic()
    sweep = sweep_async_steps(workload, cost, LONG_REASONING_CLUSTER, sweep_steps)
    chosen = sweep.chosen_async_steps
    reprefill = simulate("streaming_reprefill", workload, cost, LONG_REASONING_CLUSTER, chosen)
    comparison = kv_kept_vs_reprefill(sweep.streaming[chosen], reprefill, sweep.synchronous)
    entry = {
        "cost_model": asdict(cost),
        "workload": asdict(workload),
        "cluster": asdict(LONG_REASONING_CLUSTER),
        "learner_step_ratio_measured": LEARNER_STEP_RATIO,
        **sweep.as_json(),
        "kv_kept_vs_reprefill": {"async_steps": chosen, **comparison},
        "sim_s": time.monotonic() - started,
    }
    return entry, sweep


# What the KV comparison records of each run (SimResult fields).
KV_COMPARED = (
    "steady_trained_samples_per_s",
    "generation_idle_frac",
    "learner_wait_frac",
    "weight_sync_pause_s_avg",
    "token_lag_avg",
    "version_lag_max",
    "reprefilled_samples",
    "reprefill_tokens",
)


def kv_kept_vs_reprefill(kept: SimResult, reprefill: SimResult, synchronous: SimResult) -> dict[str, Any]:
    """An in-flight update that keeps running samples' KV cache against one that aborts them and re-prefills
    prompt + tokens (verl, AReaL, slime), same lookahead, same workload."""
    rows = {"kv_kept": kept, "reprefill": reprefill}
    sync_rate = synchronous.steady_trained_samples_per_s
    return {
        **{name: {key: getattr(r, key) for key in KV_COMPARED} for name, r in rows.items()},
        "speedup_vs_sync": {name: r.steady_trained_samples_per_s / sync_rate for name, r in rows.items()},
        "kv_kept_over_reprefill": kept.steady_trained_samples_per_s / reprefill.steady_trained_samples_per_s,
    }
