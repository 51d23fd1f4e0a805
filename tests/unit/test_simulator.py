"""The pipeline simulator: hand-computable schedules, heavy tails, tool latency, fitting, the CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time

import pytest

from benchmarks import simulation_reports
from benchmarks import simulator as sim
from benchmarks.calibration import fit_cost_model
from benchmarks.simulated_engines import SimEngines
from benchmarks.simulated_stack import SimLearners, SimWeightSync
from benchmarks.simulated_world import Cluster, CostModel, SimWorld, VirtualClock, Workload
from benchmarks.simulation import MODES, SimResult, compare, loop_config, simulate, warmup_steps
from benchmarks.simulation_projection import (
    GPU_H100_COST,
    LONG_REASONING_CLUSTER,
    LONG_REASONING_WORKLOAD,
    sweep_async_steps,
)
from benchmarks.simulation_replay import Replay, SimPrompt
from benchmarks.simulator_plots import plot_sweep
from benchmarks.stamp import stamp
from open_instruct.orchestrator import TrainingLoop
from open_instruct.tracking import MemoryLog

ONE = Cluster(num_engines=1, num_learners=1)
EXACT = {"rel": 1e-9, "abs": 1e-9}

# Fixed lengths, free prefill, decode time independent of the batch: a step of generation takes
# exactly L * decode_base_s.
L, BASE, SYNC_S = 100, 0.01, 0.2
FIXED = Workload(
    prompts_per_step=2, samples_per_prompt=4, num_steps=4, prompt_tokens=10, median_tokens=L, sigma=0.0, max_tokens=1000
)
BATCH = FIXED.prompts_per_step * FIXED.samples_per_prompt


def fixed_cost(learner_base_s: float, learner_per_token_s: float = 0.0) -> CostModel:
    return CostModel(
        decode_base_s=BASE,
        decode_per_seq_s=0.0,
        prefill_per_token_s=0.0,
        max_running=BATCH,
        weight_sync_pause_s=SYNC_S,
        learner_base_s=learner_base_s,
        learner_per_token_s=learner_per_token_s,
    )


def train_starts(result: SimResult) -> list[float]:
    return [s.start_s for s in result.timeline if s.actor == "learner" and s.kind == "train"]


# ----------------------------------------------------------------------------- hand-computed schedules


def test_synchronous_step_is_generation_then_training_then_sync():
    cost = fixed_cost(learner_base_s=0.5, learner_per_token_s=0.001)
    r = simulate("synchronous", FIXED, cost, ONE)
    gen = L * BASE
    train = 0.5 + 0.001 * BATCH * (FIXED.prompt_tokens + L)  # prompt + response tokens, one rank
    step = gen + train + SYNC_S
    assert r.wall_s == pytest.approx(FIXED.num_steps * step, **EXACT)
    assert r.step_ends() == pytest.approx([step * (i + 1) for i in range(FIXED.num_steps)], **EXACT)
    assert r.trained_samples_per_s == pytest.approx(BATCH / step, **EXACT)
    assert r.generated_tokens_per_s == pytest.approx(BATCH * L / step, **EXACT)
    assert r.generation_idle_frac == pytest.approx((train + SYNC_S) / step, **EXACT)
    assert r.learner_wait_frac == pytest.approx(gen / step, **EXACT)
    assert r.learner_step_s_avg == pytest.approx(train, **EXACT)
    assert r.weight_sync_pause_s_avg == pytest.approx(SYNC_S, **EXACT)
    assert (r.version_lag_avg, r.version_lag_max, r.multi_version_frac) == (0.0, 0.0, 0.0)
    assert r.token_lag_avg == 0.0
    assert r.group_latency_s_avg == pytest.approx(gen, **EXACT)  # admitted at the sync, done a generation later
    assert r.warmup_steps == 1 and r.steady_trained_samples_per_s == pytest.approx(BATCH / step, **EXACT)
    kinds = [s.kind for s in r.timeline if s.actor == "engine 0"][:3]
    assert kinds == ["generate", "idle", "sync"]


def test_the_drivers_cost_per_sample_lengthens_every_step_by_the_steps_samples():
    """The loop assembles a batch and takes in the next samples between the learners' steps: serial with them."""
    driver_s = 0.002
    cost = dataclasses.replace(fixed_cost(learner_base_s=0.5, learner_per_token_s=0.001), driver_per_sample_s=driver_s)
    r = simulate("synchronous", FIXED, cost, ONE)
    step = L * BASE + 0.5 + 0.001 * BATCH * (FIXED.prompt_tokens + L) + driver_s * BATCH + SYNC_S
    assert r.step_ends() == pytest.approx([step * (i + 1) for i in range(FIXED.num_steps)], **EXACT)


def test_an_admitted_prompt_reaches_the_engines_its_start_latency_later():
    cost = fixed_cost(learner_base_s=0.5)
    late = dataclasses.replace(cost, start_latency_s=0.3)
    on_time, delayed = simulate("synchronous", FIXED, cost, ONE), simulate("synchronous", FIXED, late, ONE)
    # Each step's prompts wait 0.3 s before the (idle) engine can start them.
    assert delayed.wall_s == pytest.approx(on_time.wall_s + FIXED.num_steps * 0.3, **EXACT)
    assert delayed.trained_samples == on_time.trained_samples


@pytest.mark.parametrize("learner_base_s", [1.38, 0.105], ids=["train-bound", "generation-bound"])
def test_streaming_overlaps_generation_and_training(learner_base_s):
    """One batch fills the engine. Each step costs max(generation, training) plus the sync pause:
    the sync blocks the learner, and an in-flight sync freezes the engine mid-generation."""
    cost = fixed_cost(learner_base_s)
    gen = L * BASE
    steady = max(gen, learner_base_s) + SYNC_S
    r = simulate("streaming", dataclasses.replace(FIXED, num_steps=6), cost, ONE)
    starts = train_starts(r)
    assert starts[0] == pytest.approx(gen, **EXACT)  # the first batch, then a pipeline
    assert [b - a for a, b in itertools.pairwise(starts)] == pytest.approx([steady] * 5, **EXACT)
    # The steady rate leaves out the pipeline fill (the first of 6 steps); the whole-run rate pays it.
    assert r.warmup_steps == 1 and r.steady_trained_samples_per_s == pytest.approx(BATCH / steady, **EXACT)
    assert r.trained_samples_per_s < r.steady_trained_samples_per_s
    sync = simulate("synchronous", dataclasses.replace(FIXED, num_steps=6), cost, ONE)
    assert sync.wall_s / 6 == pytest.approx(gen + learner_base_s + SYNC_S, **EXACT)
    if learner_base_s < gen:
        # The sync lands mid-generation: samples keep their KV cache and span two versions.
        assert r.multi_version_frac > 0 and r.version_lag_max == 1.0
        assert r.weight_sync_pause_s_avg == pytest.approx(SYNC_S, abs=BASE)  # plus the step in progress


def test_one_step_async_drains_before_the_transfer():
    cost = fixed_cost(learner_base_s=0.105)
    r = simulate("one_step_async", dataclasses.replace(FIXED, num_steps=6), cost, ONE)
    # The sync waits for the running batch (started when the previous one finished) to end.
    assert r.weight_sync_pause_s_avg == pytest.approx(L * BASE - 0.105 + SYNC_S, **EXACT)
    assert r.multi_version_frac == 0.0


def test_reprefill_costs_exactly_the_prefill_of_what_it_cut():
    """A reprefill sync takes the running samples out at a step boundary; after the resume each pays the
    prefill of prompt + its tokens. With free prefill the schedule is the KV-kept one, step for step."""
    workload = dataclasses.replace(FIXED, num_steps=6)
    free = fixed_cost(learner_base_s=0.3)  # the sync lands mid-generation
    kept, cut = (simulate(mode, workload, free, ONE) for mode in ("streaming", "streaming_reprefill"))
    assert kept.reprefilled_samples == kept.reprefill_tokens == 0
    assert cut.reprefilled_samples > 0 and cut.reprefill_tokens > cut.reprefilled_samples * FIXED.prompt_tokens
    assert cut.wall_s == pytest.approx(kept.wall_s, **EXACT) and cut.multi_version_frac == kept.multi_version_frac
    costly = dataclasses.replace(free, prefill_per_token_s=1e-4)
    kept, cut = (simulate(mode, workload, costly, ONE) for mode in ("streaming", "streaming_reprefill"))
    assert cut.wall_s > kept.wall_s and cut.trained_samples == kept.trained_samples


# ----------------------------------------------------------------------------- heavy tails and tools

# Seed-like shape scaled down: lognormal lengths capped at 4x the median.
TAILED = Workload(
    prompts_per_step=16,
    samples_per_prompt=8,
    num_steps=10,
    prompt_tokens=100,
    median_tokens=250,
    sigma=0.8,
    max_tokens=1000,
    seed=1,
)
SMALL_COST = CostModel(
    decode_base_s=0.01,
    decode_per_seq_s=0.0001,
    prefill_per_token_s=1e-5,
    max_running=64,
    weight_sync_pause_s=0.5,
    learner_base_s=1.0,
    learner_per_token_s=1e-5,
)
FOUR = Cluster(num_engines=4, num_learners=1)


def test_streaming_beats_synchronous_on_a_heavy_tail():
    report = compare(TAILED, SMALL_COST, FOUR)
    assert report["speedup_streaming_vs_sync"] > 1.5
    streaming, synchronous = report["streaming"], report["synchronous"]
    assert streaming["version_lag_max"] <= streaming["async_steps"] + 1
    assert streaming["multi_version_frac"] > 0
    assert synchronous["multi_version_frac"] == 0 and synchronous["version_lag_max"] == 0
    assert synchronous["generation_idle_frac"] > streaming["generation_idle_frac"]
    for mode in MODES:
        assert report[mode]["trained_samples"] == TAILED.num_steps * 16 * 8
        assert report[mode]["mode"] == mode


def test_mask_keeps_the_stragglers_that_requeue_regenerates_on_the_same_heavy_tail():
    heavier = dataclasses.replace(TAILED, sigma=1.3, max_tokens=2000)  # K = --async_steps = 1
    requeue = simulate("streaming", heavier, SMALL_COST, FOUR, off_policy_action="requeue")
    mask = simulate("streaming", heavier, SMALL_COST, FOUR, off_policy_action="mask")
    assert requeue.requeued_prompts > 0 and requeue.aborted_tokens > 0
    # every straggler has tokens young enough to train: none is regenerated, and lengths are not biased
    assert mask.requeued_prompts == mask.aborted_tokens == 0 and mask.trained_samples == requeue.trained_samples
    assert mask.trained_to_generated_length_ratio >= requeue.trained_to_generated_length_ratio + 0.05
    assert mask.trained_samples_per_s >= requeue.trained_samples_per_s


def test_tool_latency_costs_synchronous_more_than_streaming():
    cost = dataclasses.replace(SMALL_COST, max_running=16)
    with_tools = dataclasses.replace(TAILED, tool_latency_s=10.0)
    ratios, lost_s = {}, {}
    for mode in ("synchronous", "streaming"):
        base, tools = simulate(mode, TAILED, cost, FOUR), simulate(mode, with_tools, cost, FOUR)
        ratios[mode] = tools.trained_samples_per_s / base.trained_samples_per_s
        lost_s[mode] = (tools.wall_s - base.wall_s) / TAILED.num_steps
    assert ratios["synchronous"] < ratios["streaming"] < 1
    assert lost_s["synchronous"] > lost_s["streaming"] > 0


class RecordingLearners(SimLearners):
    def __init__(self, *args):
        super().__init__(*args)
        self.trained = []

    def train_step(self, groups, step):
        self.trained += [c for g in groups for c in g.completions]
        return super().train_step(groups, step)


def test_version_spans_cover_every_response_exactly():
    """The real loop on simulated collaborators, held by hand: every trained sample's spans tile its response."""
    workload = dataclasses.replace(TAILED, tool_latency_s=3.0)
    world = SimWorld()
    engines = SimEngines(world, workload, SMALL_COST, FOUR.num_engines)
    learners = RecordingLearners(world, SMALL_COST, FOUR.num_learners)
    rows = [SimPrompt(f"p{i}", (0,) * workload.prompt_tokens) for i in range(12 * 16)]
    loop = TrainingLoop(
        loop_config(workload, async_steps=1, pause_mode="keep"),
        engines=engines,
        learners=learners,
        weights=SimWeightSync(world, engines, SMALL_COST, pause_mode="keep"),
        clock=VirtualClock(world),
        log=MemoryLog(),
        train_rows=rows,
    )
    loop.run()
    taken = learners.trained
    assert len(taken) == TAILED.num_steps * 16 * 8
    # The admission bound, plus replacements for the groups over --max_off_policy_steps (= async_steps 1).
    refills = loop.outcomes.requeued
    assert refills > 0 and all(h["staleness/version_lag_max"] <= 1 for h in loop.log.history)
    assert (
        (TAILED.num_steps + 1) * 16
        <= engines.ledger.counts()["admitted_prompts"]
        <= (TAILED.num_steps + 1) * 16 + refills
    )
    for c in taken:
        spans = c.version_spans
        assert spans[0].start == 0 and spans[-1].end == len(c.response_token_ids)
        assert all(a.end == b.start and a.version < b.version for a, b in itertools.pairwise(spans))
        assert c.admitted_version <= c.min_version


def test_warmup_is_the_first_quarter():
    assert [warmup_steps(n) for n in (0, 1, 2, 7, 8, 40)] == [0, 0, 1, 1, 2, 10]


def test_async_sweep_picks_the_least_lookahead_near_the_best_rate(tmp_path):
    sweep = sweep_async_steps(TAILED, SMALL_COST, FOUR, [1, 2, 3])
    speedups = {a: sweep.speedup(r) for a, r in sweep.streaming.items()}
    best = max(speedups.values())
    chosen = sweep.chosen_async_steps
    assert speedups[chosen] >= 0.95 * best and all(speedups[a] < 0.95 * best for a in speedups if a < chosen)
    for a, r in sweep.streaming.items():
        assert r.async_steps == a and r.version_lag_max <= a + 2
        # No schedule beats a learner that never waits (5%: steps train slightly different token counts).
        assert r.steady_trained_samples_per_s <= 1.05 * sweep.learner_bound_samples_per_s
    report = sweep.as_json()
    assert report["streaming_async_steps"] == chosen
    assert report["speedup_streaming_vs_sync"] == pytest.approx(speedups[chosen])
    assert report["streaming"] == report["streaming_by_async_steps"][str(chosen)]
    assert set(report["async_steps_needed_by_async_steps"]) == {"1", "2", "3"}
    table = simulation_reports.format_sweep(sweep)
    assert "learner-bound ceiling" in table and len(table.splitlines()) == 1 + 6 + 2
    assert sweep.auto is not None and sweep.auto.async_steps == "auto" and 1 <= sweep.auto.lookahead_final <= 8
    assert "--async_steps auto" in table and report["streaming_auto"]["version_lag_max"] <= 8
    plot_sweep(sweep, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- fitting, projection, CLI


def synthetic_batch(truth: CostModel, lengths: list[int], prompt_tokens: int = 20) -> dict:
    """A calibration batch as the engine model runs it: every step the samples still short of their length,
    each attending to its prompt and the tokens before."""
    steps = [
        truth.step_s(sum(n > k for n in lengths), sum(prompt_tokens + k for n in lengths if n > k))
        for k in range(max(lengths))
    ]
    prefill = prompt_tokens * len(lengths) * truth.prefill_per_token_s
    return {"samples": [[prompt_tokens, n] for n in lengths], "elapsed_s": sum(steps) + prefill}


def synthetic_measurements(truth: CostModel, num_learners: int) -> dict:
    return {
        "decode": [synthetic_batch(truth, lengths) for lengths in ([64] * 8, [16, 40, 900], [300] * 64, [5] * 256)],
        "queue_overhead": [
            {"samples": n, "queue_s": direct + n * truth.per_sample_s, "direct_s": direct}
            for n, direct in ((32, 0.5), (128, 1.5), (64, 0.9))
        ],
        "prefill_tokens_per_s": 1 / truth.prefill_per_token_s,
        "learner": [{"tokens": t, "step_s": truth.learner_step_s(t, num_learners)} for t in (10_000, 50_000, 200_000)],
        "weight_sync_pause_s": truth.weight_sync_pause_s,
        "max_running": truth.max_running,
        "num_learners": num_learners,
    }


def test_fit_cost_model_recovers_linear_parameters():
    truth = dataclasses.replace(GPU_H100_COST, decode_per_context_token_s=2e-8, per_sample_s=0.004)
    fitted = fit_cost_model(synthetic_measurements(truth, num_learners=4))
    for field in dataclasses.fields(CostModel):
        assert getattr(fitted, field.name) == pytest.approx(getattr(truth, field.name), rel=1e-6)
    fitted = fit_cost_model(synthetic_measurements(GPU_H100_COST, num_learners=4))
    for field in dataclasses.fields(CostModel):
        assert getattr(fitted, field.name) == pytest.approx(getattr(GPU_H100_COST, field.name), rel=1e-9)


def test_decode_fit_keeps_every_cost_non_negative():
    # Per-sample cost alone (no per-step or context cost): an unconstrained fit would go below zero on noise.
    truth = dataclasses.replace(GPU_H100_COST, decode_base_s=0.0, decode_per_seq_s=0.001)
    batches = [synthetic_batch(truth, lengths) for lengths in ([100] * 4, [50, 400], [200] * 16, [7, 900, 30])]
    batches[0]["elapsed_s"] *= 0.9
    fitted = fit_cost_model({**synthetic_measurements(truth, 1), "decode": batches})
    costs = (fitted.decode_base_s, fitted.decode_per_seq_s, fitted.decode_per_context_token_s)
    assert min(costs) >= 0 and fitted.decode_per_seq_s == pytest.approx(0.001, rel=0.1)
    # One batch cannot tell the costs apart: all of it goes to one of them.
    one = fit_cost_model({**synthetic_measurements(truth, 1), "decode": batches[:1]})
    assert sorted((one.decode_base_s, one.decode_per_seq_s, one.decode_per_context_token_s))[:2] == [0.0, 0.0]


def test_decode_step_time_grows_with_the_context_the_running_samples_attend_to():
    # Two samples of 100 tokens after a 20-token prompt: their contexts sum to 2 * (20 + k) at step k.
    cost = dataclasses.replace(GPU_H100_COST, decode_base_s=0.0, decode_per_seq_s=0.0, prefill_per_token_s=0.0)
    cost = dataclasses.replace(cost, decode_per_context_token_s=1e-5, max_running=8)
    workload = Workload(1, 2, 1, prompt_tokens=20, median_tokens=100, sigma=0.0, max_tokens=100)
    result = simulate("synchronous", workload, cost, Cluster(1, 1))
    decode_s = sum(2 * (20 + k) for k in range(100)) * 1e-5
    learner_and_sync = cost.learner_step_s(2 * 120, 1) + cost.weight_sync_pause_s
    assert result.wall_s == pytest.approx(decode_s + learner_and_sync, rel=1e-6)
    # Held in whole KV blocks of 16 tokens, as the engine holds them: 20 + k tokens take ceil((20 + k) / 16).
    blocks = simulate("synchronous", workload, dataclasses.replace(cost, kv_block_tokens=16), Cluster(1, 1))
    decode_s = sum(2 * 16 * math.ceil((20 + k) / 16) for k in range(100)) * 1e-5
    assert blocks.wall_s == pytest.approx(decode_s + learner_and_sync, rel=1e-6)


def test_each_new_sample_pays_its_way_through_the_queues_once_in_its_first_step():
    cost = dataclasses.replace(GPU_H100_COST, decode_base_s=0.01, decode_per_seq_s=0.0, prefill_per_token_s=0.0)
    cost = dataclasses.replace(cost, per_sample_s=0.05, max_running=8)
    workload = Workload(1, 2, 1, prompt_tokens=20, median_tokens=100, sigma=0.0, max_tokens=100)
    result = simulate("synchronous", workload, cost, Cluster(1, 1))
    learner_and_sync = cost.learner_step_s(2 * 120, 1) + cost.weight_sync_pause_s
    assert result.wall_s == pytest.approx(100 * 0.01 + 2 * 0.05 + learner_and_sync, rel=1e-6)


def test_a_replay_admits_the_measured_runs_prompts_in_its_order_with_each_samples_length():
    import random

    from benchmarks.workloads import ShapedWorkload

    shape = ShapedWorkload("heavy_tail", median_tokens=30, sigma=1.0, max_tokens=200)
    replay = Replay(seed=7, prompts=tuple((f"row{i}", 10 + i) for i in range(20)), lengths=shape)
    assert Replay.from_json(json.loads(json.dumps(replay.as_json()))) == replay  # as measured.json carries it
    workload = Workload(2, 2, 3, prompt_tokens=1, median_tokens=5, sigma=0.0, max_tokens=200)
    cost = dataclasses.replace(GPU_H100_COST, max_running=8)
    result = simulate("synchronous", workload, cost, Cluster(1, 1), replay=replay)
    order = list(range(20))
    random.Random(7 * 1_000_003).shuffle(order)  # the feeder's first epoch under --seed 7
    admitted = [f"row{i}@0" for i in order[:6]]
    expected = sum(shape.length(f"{prompt_id}/{j}") for prompt_id in admitted for j in range(2))
    assert result.generated_tokens_per_s * result.wall_s == pytest.approx(expected)


def test_long_reasoning_projection_is_fast_and_reports_the_speedup():
    started = time.process_time()  # CPU time: the machine may be shared
    report = compare(dataclasses.replace(LONG_REASONING_WORKLOAD, num_steps=10), GPU_H100_COST, LONG_REASONING_CLUSTER)
    assert time.process_time() - started < 30
    assert report["speedup_streaming_vs_sync"] > 1
    assert report["streaming"]["trained_samples"] == 10 * 256 * 16
    keys = {
        "mode",
        "trained_samples_per_s",
        "generated_tokens_per_s",
        "generation_idle_frac",
        "learner_wait_frac",
        "weight_sync_pause_s_avg",
        "version_lag_avg",
        "version_lag_max",
    }
    assert keys <= report["streaming"].keys()


def test_cli_writes_json_and_timeline(tmp_path, capsys):
    measured = synthetic_measurements(SMALL_COST, num_learners=1)
    measured["workload"] = {k: v for k, v in dataclasses.asdict(TAILED).items() if k != "seed"}
    measured["cluster"] = {"num_engines": 4, "num_learners": 1}
    measured["measured_speedup_streaming_vs_sync"] = 1.7
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({**measured, "stamp": stamp("e2e")}))
    out = tmp_path / "out"
    assert (
        sim.main(["--measured", str(path), "--output", str(out), "--projection_steps", "2", "--async_sweep", "2,1"])
        == 0
    )
    report = json.loads((out / "simulator.json").read_text())
    assert report["measured"]["measured_speedup_streaming_vs_sync"] == 1.7
    predicted = report["measured"]["speedup_streaming_vs_sync"]
    assert report["measured"]["speedup_relative_error"] == pytest.approx(predicted / 1.7 - 1)
    projection = report["long_reasoning_projection"]
    assert projection["streaming"]["num_steps"] == 2
    assert set(projection["streaming_by_async_steps"]) == {"1", "2"}
    assert projection["streaming_async_steps"] in (1, 2) and projection["learner_bound_speedup"] > 1
    kv = projection["kv_kept_vs_reprefill"]
    assert kv["async_steps"] == projection["streaming_async_steps"] and kv["kv_kept"]["reprefill_tokens"] == 0
    assert kv["reprefill"]["reprefilled_samples"] > 0 and kv["kv_kept_over_reprefill"] > 0
    for name in ("simulator_timeline.png", "simulator_timeline_measured.png", "simulator_async_sweep.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "relative error" in printed and "speedup streaming vs synchronous" in printed
    assert "KV cache kept vs abort + re-prefill" in printed


def test_cli_rejects_a_sweep_without_lookahead(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sim.main(["--output", str(tmp_path), "--async_sweep", "0,1"])
    assert exit_info.value.code == 2 and "--async_sweep needs async_steps >= 1" in capsys.readouterr().err


def test_policy_drift_gives_the_health_a_lognormal_importance_weight_has():
    from benchmarks.simulated_world import PolicyDrift

    drift = PolicyDrift(per_version=0.1, cap=2.0)
    assert drift.metrics([(0, 100)]) == {"offpolicy/ess_frac": 1.0, "offpolicy/truncated_frac": 0.0}
    at_lag_3 = drift.metrics([(3, 10)])
    assert at_lag_3["offpolicy/ess_frac"] == pytest.approx(math.exp(-(0.3**2)))  # Kish: E[w]^2 / E[w^2]
    above_cap = 0.5 * math.erfc((math.log(2) + 0.045) / (0.3 * 2**0.5))  # P(log w > log 2), log w ~ N(-0.045, 0.09)
    assert at_lag_3["offpolicy/truncated_frac"] == pytest.approx(above_cap)
    mixed = drift.metrics([(0, 10), (3, 10)])  # token-weighted: the second moments average
    assert mixed["offpolicy/ess_frac"] == pytest.approx(2 / (1 + math.exp(0.09)))
    assert drift.metrics([]) == {}


def test_the_self_tuning_window_matches_the_best_fixed_bound_inside_the_limits_for_slow_and_fast_policies():
    """The window_sim benchmark's claim at a small shape: near the best fixed K that keeps health inside the
    default limits, never outside them itself, and narrower when the policy moves faster."""
    from benchmarks.window_sim import sweep

    workload = dataclasses.replace(TAILED, num_steps=40)
    slow = sweep(workload, SMALL_COST, FOUR, drift=0.05, fixed=[1, 2, 3, 4, 6])
    fast = sweep(workload, SMALL_COST, FOUR, drift=0.15, fixed=[1, 2, 3, 4, 6])
    for entry in (slow, fast):
        assert entry["auto"]["healthy"] and entry["auto_vs_best_within_limits"] >= 0.95
    assert fast["best_fixed_within_limits"] == "2" and fast["auto"]["window_final"] == 2
    assert slow["auto"]["window_avg"] > 2 * fast["auto"]["window_avg"]
    assert not all(r["healthy"] for r in fast["fixed"])  # the wide fixed bounds break the limits there


def test_an_older_or_foreign_measurements_file_is_refused_in_one_line(tmp_path, capsys):
    """A measured.json written before results carried a schema (or another benchmark's file) is named, with the
    command that measures it again, instead of failing on a missing key with a traceback."""
    old = tmp_path / "old_measured.json"
    old.write_text(json.dumps({"workload": {}, "cluster": {}}))
    foreign = tmp_path / "faults.json"
    foreign.write_text(json.dumps({"stamp": stamp("faults")}))
    for path, found in ((old, "no schema (older)"), (foreign, "faults v2")):
        assert sim.main(["--measured", str(path), "--output", str(tmp_path / "out")]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"simulator: --measured {path}: a result of {found}, this code reads e2e v2: measure it again "
            "(python -m benchmarks.e2e)"
        )
