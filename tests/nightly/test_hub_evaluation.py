"""Evaluation as open-instruct does it, end to end on the hub code path: a hub dataset holding only `train` and
no --dataset_mixer_eval_list trains with no evaluation at all (whatever the schedule flags say), and an eval
list is evaluated on exactly its own split. The datasets keep hub names and are read by `datasets.load_dataset`
from a cache a local builder wrote (tests/helpers/hub_datasets.py), offline.
"""

from __future__ import annotations

import json

import pytest
from helpers.hub_datasets import cache_hub_dataset, hub_env
from helpers.runs import read_jsonl, run_grpo

from open_instruct.data.embedded_default import arith_rows

STEPS = 2
FLAGS = [
    *("--num_unique_prompts_rollout", "4", "--num_samples_per_prompt_rollout", "2"),
    *("--total_episodes", str(STEPS * 8), "--response_length", "16", "--stop_strings", "</answer>"),
    *("--max_prompt_token_length", "64", "--pack_length", "128", "--vllm_kv_cache_gib", "0.25"),
    *("--save_freq", "0", "--beta", "0", "--async_steps", "1"),
    # a schedule that would evaluate before the first step and after each one, had the run an eval mix
    *("--local_eval_every", "1", "--eval_on_step_0"),
]
HELD_OUT = "Held-out: "


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """owner/arith-train-only (train) and owner/arith (train, and a test split whose prompts are marked)."""
    cache = tmp_path_factory.mktemp("hub")
    train, held_out = arith_rows()
    for row in held_out:
        row["messages"] = [{**m, "content": HELD_OUT + m["content"]} for m in row["messages"]]
    cache_hub_dataset(cache, "owner/arith-train-only", {"train": train[:64]})
    cache_hub_dataset(cache, "owner/arith", {"train": train[:64], "test": held_out[:6]})
    return cache


def test_a_train_only_hub_dataset_without_an_eval_list_trains_and_evaluates_nothing(hub, tmp_path):
    out = tmp_path / "run"
    code, log = run_grpo([*FLAGS, "--dataset_mixer_list", "owner/arith-train-only", "1.0"], out, env=hub_env(hub))
    assert code == 0, log[-4000:]
    assert "evaluation: none (no --dataset_mixer_eval_list" in log
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["training_step"] for m in metrics] == list(range(STEPS))
    assert not [key for m in metrics for key in m if key.startswith("eval/")]
    assert not (out / "eval.jsonl").exists() or not read_jsonl(out / "eval.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["first_eval_reward"] is None


def test_an_eval_list_is_evaluated_on_its_own_split(hub, tmp_path):
    out = tmp_path / "run"
    eval_mix = ["--dataset_mixer_eval_list", "owner/arith", "1.0", "--dataset_mixer_eval_list_splits", "test"]
    code, log = run_grpo([*FLAGS, "--dataset_mixer_list", "owner/arith", "1.0", *eval_mix], out, env=hub_env(hub))
    assert code == 0, log[-4000:]
    assert "evaluation: --dataset_mixer_eval_list owner/arith 1.0 [test], before the first step and every 1" in log
    rounds = read_jsonl(out / "eval.jsonl")
    assert [r["eval/started_at_step"] for r in rounds] == [0.0, 0.0, 1.0]  # step 0, then after each step
    assert all(r["eval/samples"] == 6.0 for r in rounds)  # the test split's 6 rows, greedily once each
    shown = read_jsonl(out / "eval_samples.jsonl")
    assert shown and all(HELD_OUT in row["prompt"] for row in shown)
    assert "eval/verifiable_reward" in read_jsonl(out / "metrics.jsonl")[-1]


def test_an_eval_split_the_hub_dataset_lacks_stops_the_run_in_one_line_naming_it_and_its_flag(hub, tmp_path):
    mix = ["--dataset_mixer_list", "owner/arith-train-only", "1.0"]
    code, log = run_grpo(
        [*FLAGS, *mix, "--dataset_mixer_eval_list", "owner/arith-train-only", "8"], tmp_path / "run", env=hub_env(hub)
    )
    assert code == 2
    assert log.strip().splitlines()[-1] == (
        "grpo_fast.py: owner/arith-train-only has no split 'test' (its splits: train); "
        "--dataset_mixer_eval_list_splits asked for it: name one it has"
    )
    assert "Traceback" not in log
