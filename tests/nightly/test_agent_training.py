"""A short training run on a guess-the-number environment with the real stack (vLLM, Ray, DeepSpeed, gloo sync).

Rows carry open-instruct's `env_config` column and the `passthrough` verifier, so every reward comes from
the environment. The first two turns are forced to `<guess>N</guess>` with a free N (structured outputs),
so samples of one prompt guess differently and their rewards spread.
"""

from __future__ import annotations

import json

STEPS = 3


def write_rows(path, count: int) -> None:
    with open(path, "w") as f:
        for i in range(count):
            secret = 7 + (i * 37) % 90
            row = {
                "messages": [{"role": "user", "content": "Find the secret number in 1..100 with <guess>N</guess>."}],
                "ground_truth": str(secret),
                "dataset": "passthrough",
                "env_config": {"env_name": "guess_number", "number": str(secret), "max_steps": 2},
            }
            f.write(json.dumps(row) + "\n")


def test_a_short_run_on_guess_number_trains_on_environment_rewards(tmp_path):
    from helpers.forced_turns import ForcedTurnsActor

    from open_instruct.config.core import parse_config
    from open_instruct.grpo_fast import run

    rows = tmp_path / "guess.jsonl"
    write_rows(rows, 16)
    cfg = parse_config(
        [
            "--dataset_mixer_list",
            str(rows),
            "1.0",
            "--dataset_mixer_eval_list",
            str(rows),
            "4",
            "--dataset_mixer_eval_list_splits",
            "train",
            "--output_dir",
            str(tmp_path / "out"),
            "--num_unique_prompts_rollout",
            "4",
            "--num_samples_per_prompt_rollout",
            "4",
            "--total_episodes",
            str(STEPS * 16),
            "--response_length",
            "160",
            "--max_prompt_token_length",
            "96",
            "--pack_length",
            "256",
            "--async_steps",
            "1",
            "--max_steps",
            "5",
            "--reward_aggregator",
            "last",
            "--learning_rate",
            "1e-5",
            "--beta",
            "0",
            "--vllm_kv_cache_gib",
            "0.25",
            "--num_evals",
            "1",
            "--dataset_local_cache_dir",
            "",
            "--no_filter_zero_std_samples",
        ]
    )
    guess = r"<guess>[1-9][0-9]?</guess>"
    run(cfg, engine_class=ForcedTurnsActor, engine_args=((guess, guess),))
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "training_step" in m]
    assert [m["training_step"] for m in steps] == list(range(STEPS))
    for m in steps:
        # Two guesses per sample (the row's max_steps), each rewarded by the environment: a miss earns
        # 1 - distance/99 > 0, a hit 1. The reward is the last step's (passthrough adds 0). A sample
        # whose guess hit ends there; the others get a third turn to answer.
        assert 1.5 <= m["tools/guess/calls_per_sample"] <= 2.0 and 1.5 <= m["agent/turns_per_sample"] <= 3.0
        assert 0 < m["objective/verifiable_reward"] <= 1.0
        assert m["env/guess_number/guesses"] == m["tools/guess/calls_per_sample"]
        assert 0 < m["env/guess_number/best_distance"] < 99
        assert m["tools/aggregate/failure_rate"] == 0.0
