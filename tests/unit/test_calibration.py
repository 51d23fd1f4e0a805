"""The engine's cost per step fitted on the training runs' own engine steps (`EngineStep` traces)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from benchmarks import simulation as sim
from benchmarks.calibration import STEP_COLUMNS, fit_cost_model, step_rows
from benchmarks.simulated_world import Cluster, CostModel
from benchmarks.simulation_validation import validate_on_measurements
from benchmarks.stamp import stamp
from open_instruct.messages import EngineStep

TRUTH = CostModel(
    decode_base_s=0.004,
    decode_per_seq_s=0.0002,
    decode_per_context_token_s=3e-7,
    per_sample_s=0.002,
    prefill_per_token_s=1e-5,
    max_running=64,
    weight_sync_pause_s=0.1,
    learner_base_s=0.5,
    learner_per_token_s=1e-5,
)


def step(at: float, queued: int = 4, pauses: int = 0, generated: int = 4, engine_s: float = 0.0) -> EngineStep:
    return EngineStep(at, engine_s, generated, 0, 0, queued, 64 * generated, pauses)


def test_only_steps_that_ran_right_after_the_one_before_are_kept():
    trace = [
        step(10.0),
        step(10.01),  # back to back: kept
        step(10.03, queued=0),  # kept; nothing queued after it, so the engine waited for work
        step(11.5),  # after an idle gap: left out
        step(11.52),  # kept
        step(12.4, pauses=2),  # a weight-sync pause (and its resume) came between: left out
        step(12.43, pauses=2, engine_s=0.025),  # kept, timed by the engine's clock
        step(12.5, pauses=3),  # the output of a step before the pause, arriving after it began: left out
    ]
    rows = step_rows(trace)
    assert [row[0] for row in rows] == pytest.approx([0.01, 0.02, 0.02, 0.025])
    assert all(len(row) == len(STEP_COLUMNS) for row in rows) and rows[0][1:] == [4, 256, 0, 0]
    assert step_rows(trace[:1]) == [] and step_rows([]) == []


def true_step_s(generated: int, kv: int, prefill: int, started: int) -> float:
    return TRUTH.step_s(generated, kv) + prefill * TRUTH.prefill_per_token_s + started * TRUTH.per_sample_s


def runs_of(mode: str, shapes: list[tuple[int, int, int, int]]) -> dict:
    return {"mode": mode, "round": 0, "steps": [[true_step_s(*shape), *shape] for shape in shapes]}


def measurements() -> dict:
    return {
        "decode": [{"samples": [[20, 10]], "elapsed_s": 1.0}],  # batches: what the default fit would use
        "engine_steps": [
            runs_of("synchronous", [(32, 2000, 640, 32), (32, 4000, 0, 0), (3, 900, 0, 0), (1, 1000, 0, 0)]),
            runs_of("streaming", [(60, 5000, 40, 2), (64, 9000, 0, 0), (50, 7000, 20, 1), (64, 3000, 80, 4)]),
        ],
        "prefill_tokens_per_s": 1 / TRUTH.prefill_per_token_s,
        "learner": [{"tokens": t, "step_s": TRUTH.learner_step_s(t, 1)} for t in (1000, 4000)],
        "weight_sync_pause_s": TRUTH.weight_sync_pause_s,
        "max_running": TRUTH.max_running,
    }


def test_the_engine_costs_fitted_on_run_steps_are_the_ones_that_made_them():
    fitted = fit_cost_model(measurements(), steps_of_modes={"synchronous", "streaming"})
    for field in dataclasses.fields(CostModel):
        assert getattr(fitted, field.name) == pytest.approx(getattr(TRUTH, field.name), rel=1e-6)
    # One mode's steps alone tell the costs apart too (these vary in every term).
    alone = fit_cost_model(measurements(), steps_of_modes={"streaming"})
    assert alone.per_sample_s == pytest.approx(TRUTH.per_sample_s, rel=1e-6)
    # By default the batches decide, not the steps.
    assert fit_cost_model(measurements()).decode_per_seq_s != pytest.approx(TRUTH.decode_per_seq_s)
    with pytest.raises(ValueError, match="no engine steps of \\['one_step_async'\\]"):
        fit_cost_model(measurements(), steps_of_modes={"one_step_async"})


def test_validation_predicts_each_mode_with_costs_fitted_on_every_modes_steps_and_on_the_others(tmp_path, capsys):
    measured = measurements()
    small = {"prompts_per_step": 4, "samples_per_prompt": 2, "num_steps": 3, "prompt_tokens": 20}
    measured["workload"] = {**small, "median_tokens": 30, "sigma": 0.5, "max_tokens": 120, "tool_latency_s": 0.0}
    measured["cluster"] = {"num_engines": 1, "num_learners": 1}
    measured["measured_trained_samples_per_s"] = {
        "synchronous": {"median": 10.0, "min": 9.0, "max": 11.0},
        "streaming": {"median": 20.0, "min": 19.0, "max": 21.0},
        "streaming_mask": {"median": 20.0, "min": 19.0, "max": 21.0},  # measured, not a simulated mode
    }
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({**measured, "stamp": stamp("e2e")}))
    entry, _ = validate_on_measurements(path, async_steps=1)
    validation = entry["step_calibrated"]
    assert set(validation["per_mode"]) == {"synchronous", "streaming"}
    assert validation["cost_model_all_modes"]["per_sample_s"] == pytest.approx(TRUTH.per_sample_s, rel=1e-6)
    for mode, v in validation["per_mode"].items():
        # Steps made by one cost model: every fit recovers it, so every prediction is the truth's.
        truth = sim.simulate(mode, sim.workload_from_json(measured["workload"]), TRUTH, Cluster(1, 1), 1, None)
        assert v["predicted_all_modes"] == pytest.approx(truth.trained_samples_per_s, rel=1e-6)
        assert v["predicted_other_modes"] == pytest.approx(truth.trained_samples_per_s, rel=1e-6)
        assert v["error_all_modes"] == pytest.approx(v["predicted_all_modes"] / v["measured_median"] - 1)
        assert v["steps"] == 4 and v["step_time_error"] == pytest.approx(0.0, abs=1e-9)
    assert "other modes" in capsys.readouterr().out


def test_batches_count_their_contexts_in_the_engines_kv_blocks():
    # Only a context cost, on contexts held in whole blocks of 16; three one-sample batches of (prompt, length).
    truth = dataclasses.replace(TRUTH, decode_base_s=0.0, decode_per_seq_s=0.0, per_sample_s=0.0)
    batches = []
    for prompt, length in ((20, 50), (5, 200), (30, 7)):
        held = sum(16 * math.ceil((prompt + k) / 16) for k in range(length))
        elapsed = held * truth.decode_per_context_token_s + prompt * truth.prefill_per_token_s
        batches.append({"samples": [[prompt, length]], "elapsed_s": elapsed})
    measured = {**measurements(), "decode": batches, "kv_block_tokens": 16}
    fitted = fit_cost_model(measured)
    assert fitted.kv_block_tokens == 16
    assert fitted.decode_per_context_token_s == pytest.approx(truth.decode_per_context_token_s, rel=1e-6)
    assert fitted.decode_base_s == pytest.approx(0.0, abs=1e-12)
    assert fitted.decode_per_seq_s == pytest.approx(0.0, abs=1e-12)
