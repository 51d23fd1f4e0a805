"""Fixed-size batches under a real staleness bound, with the real stack (vLLM engine, DeepSpeed learner).

1. --active_sampling on a mix where some prompts are always solved (an `up_to_max_length` target no
   response can exceed) and some never (a gsm8k label no response gives), beside the embedded
   arithmetic: every step trains exactly --num_unique_prompts_rollout groups, all with reward spread
   (the learner group's own zero-std filter never finds one), the flat groups being replaced.
2. A heavy tail (temperature 2: the tiny model rambles up to the length limit, or stops early) with
   `--async_steps 3 --max_off_policy_steps 1 --off_policy_action requeue`: no trained sample is more than one
   version old, and samples the bound doomed were aborted in the engine (visible in the metrics).
In both, every admitted prompt id has exactly one fate: trained, requeued, dropped, filtered or untrained.
"""

from __future__ import annotations

import json
import math

import pytest
from helpers.runs import read_jsonl, run_grpo

from open_instruct.prompt_feeder import readmitted_id

STEPS, PROMPTS, SAMPLES = 6, 4, 4


def write_mix(path) -> str:
    rows = []
    for i in range(12):
        question = {"role": "user", "content": f"What is {i % 10} + {(i * 7) % 10}?"}
        if i % 2:  # always right: no 32-token response exceeds a 1000-token target
            rows.append({"messages": [question], "ground_truth": "1000", "dataset": "up_to_max_length"})
        else:  # never right: no single-digit sum is this number
            rows.append({"messages": [question], "ground_truth": "-987654", "dataset": "gsm8k"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def common(admitted, response_length: int, temperature: float) -> list[str]:
    return [
        "--dataset_mixer_eval_list",
        "embedded/arith",
        "8",
        "--dataset_mixer_eval_list_splits",
        "test",
        "--num_unique_prompts_rollout",
        str(PROMPTS),
        "--num_samples_per_prompt_rollout",
        str(SAMPLES),
        "--total_episodes",
        str(STEPS * PROMPTS * SAMPLES),
        "--response_length",
        str(response_length),
        "--temperature",
        str(temperature),
        "--max_prompt_token_length",
        "64",
        "--pack_length",
        "256",
        "--stop_strings",
        "</answer>",
        "--learning_rate",
        "1e-4",
        "--lr_scheduler_type",
        "constant",
        "--beta",
        "0",
        "--async_steps",
        "3",
        "--max_off_policy_steps",
        "1",
        "--off_policy_action",
        "requeue",
        "--num_evals",
        "0",
        "--save_freq",
        "0",
        "--vllm_kv_cache_gib",
        "0.25",
        "--seed",
        "3",
        "--save_admitted_prompts",
        str(admitted),
    ]


@pytest.fixture(scope="module")
def active_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("active")
    out, admitted = root / "run", root / "admitted.jsonl"
    mix = ["--dataset_mixer_list", "embedded/arith", "40", write_mix(root / "flat.jsonl"), "1.0", "--active_sampling"]
    code, log = run_grpo([*mix, *common(admitted, 32, 1.6)], out)
    assert code == 0, log[-4000:]
    return out, admitted


@pytest.fixture(scope="module")
def heavy_tail_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("heavy")
    out, admitted = root / "run", root / "admitted.jsonl"
    code, log = run_grpo(common(admitted, 160, 2.0), out, timeout_s=600)
    assert code == 0, log[-4000:]
    return out, admitted


def test_active_sampling_trains_full_batches_of_groups_with_reward_spread(active_run):
    out, _ = active_run
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["training_step"] for m in metrics] == list(range(STEPS))
    # The learner group's zero-std filter runs on every batch: it never found a flat group.
    assert all(m["batch/groups_filtered_zero_std"] == 0 for m in metrics)
    steps = read_jsonl(out / "trained_prompts.jsonl")
    assert all(len(s["prompt_ids"]) == PROMPTS for s in steps)
    filtered = [pid for s in steps for pid in s.get("filtered", [])]
    assert filtered and metrics[-1]["batch/filtered_zero_std_prompts_total"] == len(filtered)
    assert any("flat.jsonl" in pid for pid in filtered)  # the always- and never-solved rows


def test_no_trained_sample_is_older_than_the_bound_and_doomed_samples_are_aborted(heavy_tail_run):
    out, _ = heavy_tail_run
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m["staleness/version_lag_max"] <= 1 for m in metrics)
    assert all(math.isfinite(m["objective/verifiable_reward"]) for m in metrics)
    last = metrics[-1]
    # Whether a doomed sample is still running when the bound dooms it depends on timing here; the abort
    # itself is checked deterministically in test_orchestrator.py (scripted engines).
    assert last["offpolicy/aborted_samples_total"] >= 0 and last["offpolicy/aborted_tokens_total"] >= 0
    assert last["offpolicy/requeued_prompts_total"] > 0  # the action for groups over the bound
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < summary["trained_to_generated_length_ratio"] <= 1.5 and summary["prompts_requeued"] > 0


@pytest.mark.parametrize("run", ["active_run", "heavy_tail_run"])
def test_every_admitted_prompt_has_exactly_one_fate(run, request):
    out, admitted_file = request.getfixturevalue(run)
    records = [json.loads(line) for line in admitted_file.read_text().splitlines()]
    admitted = [r["prompt_id"] for r in records]
    assert len(admitted) == len(set(admitted))
    steps = read_jsonl(out / "trained_prompts.jsonl")
    fates: dict[str, list[str]] = {}
    for step in steps:
        for fate in ("prompt_ids", "requeued", "dropped", "filtered"):
            fates.setdefault(fate, []).extend(step.get(fate, []))
    fates["untrained"] = json.loads((out / "untrained_prompts.json").read_text())
    resolved = [pid for ids in fates.values() for pid in ids]
    assert sorted(resolved) == sorted(admitted)  # each admitted id exactly once, none unaccounted
    # A requeued prompt is the next one admitted, under a new id ("...+k"): the prompt itself is not lost. Only
    # a requeue after the run's last admission stays pending (in the feeder's saved state); then no prompt was
    # admitted under a later learner version than the step that requeued it.
    last_version = max(r["admitted_version"] for r in records)
    for step in steps:
        for pid in step.get("requeued", []):
            assert readmitted_id(pid) in admitted or last_version <= step["step"], (pid, step["step"], last_version)
