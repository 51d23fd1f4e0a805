"""What the open-instruct flags that work here do: naming and tracking, schedule, data order, eval length,
data inputs, the R1 format reward, and the refusal of features not built yet (one line, exit code 2)."""

from __future__ import annotations

import asyncio

import pytest

from open_instruct.config import ConfigError, parse_config, unsupported_features


def test_run_name_tracking_and_wandb_names():
    cfg = parse_config(
        ["--run_name", "mine", "--report_to", "wandb", "--wandb_project", "p", "--wandb_group_name", "g"]
    )
    assert cfg.run_name == "mine" and cfg.tracking_enabled
    assert not parse_config(["--report_to", "none"]).tracking_enabled
    assert parse_config([]).run_name == "grpo__1"


def test_schedule_flags_shape_the_run_and_the_learning_rate():
    from open_instruct.learner import LearnerSettings

    cfg = parse_config(["--total_episodes", "640", "--max_train_steps", "4", "--warmup_ratio", "0.5"])
    assert cfg.num_training_steps == 4  # 640 episodes would be 10 steps
    assert LearnerSettings.from_config(cfg, "m").warm_up_steps == 2
    explicit = parse_config(["--warmup_ratio", "0.5", "--warm_up_steps", "7"])
    assert LearnerSettings.from_config(explicit, "m").warm_up_steps == 7


def test_data_loader_seed_changes_the_prompt_order_but_not_the_sampling_seeds():
    from dataclasses import dataclass

    from open_instruct.messages import SamplingSettings
    from open_instruct.prompt_feeder import PromptFeeder

    @dataclass(frozen=True)
    class Row:
        index: int
        prompt_token_ids: tuple = (1,)
        ground_truths: tuple = ("1",)
        verifier_names: tuple = ("gsm8k",)

        @property
        def prompt_id(self):
            return f"r:{self.index}"

    rows = [Row(i) for i in range(50)]

    def admitted(order_seed):
        feeder = PromptFeeder(rows, prompts_per_step=8, samples_per_prompt=2, async_steps=0,
                              sampling=SamplingSettings(max_tokens=4), seed=3, order_seed=order_seed)  # fmt: skip
        return {r.prompt_id: r.seed for r in feeder.admit(learner_version=0)}

    same, other = admitted(None), admitted(11)
    assert list(same) != list(other)
    assert all(other[pid] == same.get(pid, other[pid]) for pid in other)  # a prompt's seed ignores the order


def test_eval_response_length_sizes_eval_requests_and_the_engines():
    from open_instruct.engine_setup import EngineSettings

    cfg = parse_config(["--response_length", "64", "--eval_response_length", "200", "--pack_length", "512"])
    assert cfg.eval_response_length == 200
    assert EngineSettings.from_config(cfg, "m").max_model_len == cfg.data.max_prompt_token_length + 200
    assert parse_config(["--response_length", "64"]).eval_response_length == 64


def test_data_inputs_read_the_system_prompt_file_and_skip_the_cache(tmp_path):
    from open_instruct.orchestrator import data_inputs

    path = tmp_path / "system.txt"
    path.write_text("  Answer tersely.\n")
    model, train, evaluation = data_inputs(
        parse_config(["--system_prompt_override_file", str(path), "--dataset_skip_cache"])
    )
    assert model.system_prompt_override == "Answer tersely."
    assert train.dataset_local_cache_dir == "" and evaluation.dataset_local_cache_dir == ""
    with pytest.raises(ConfigError, match="no such file"):
        parse_config(["--system_prompt_override_file", str(tmp_path / "missing.txt")])
    with pytest.raises(ConfigError, match="give one"):
        parse_config(["--system_prompt_override_file", str(path), "--system_prompt_override", "x"])


def test_rho_correction_flags_map_onto_the_importance_cap():
    from open_instruct.learner import LearnerSettings

    def cap(*flags):
        return LearnerSettings.from_config(parse_config(list(flags)), "m").importance_ratio_cap

    assert cap() == 2.0  # open-instruct's default TIS at 2.0 is ours too
    assert cap("--use_rho_correction", "False") == 0.0  # off: the ratio is only logged
    assert cap("--rho_clamp_upper_bound", "3.0") == 3.0 == cap("--truncated_importance_sampling_ratio_cap", "3.0")
    with pytest.raises(ConfigError, match="same cap; give one"):
        parse_config(["--rho_clamp_upper_bound", "3.0", "--truncated_importance_sampling_ratio_cap", "4.0"])
    with pytest.raises(ConfigError, match="must be 0 \\(off\\) or > 1"):
        parse_config(["--rho_clamp_upper_bound", "0.5"])


def test_load_ref_policy_false_needs_beta_zero():
    assert parse_config(["--load_ref_policy", "False", "--beta", "0"]).loss_extras.load_ref_policy is False
    with pytest.raises(ConfigError, match="--load_ref_policy False leaves the KL term"):
        parse_config(["--load_ref_policy", "False", "--beta", "0.05"])


@pytest.mark.parametrize(
    ("flags", "well_formed", "malformed"),
    [
        # Additive: the format score adds to the verifier's reward (10 for a correct answer).
        (["--apply_r1_style_format_reward", "--additive_format_reward"], 11.0, 10.0),
        # Gate: the verifier's reward counts only when the format matches, whatever the format score is
        # (open-instruct compares the score with exactly 1, so a score of 0.5 zeroes every reward there).
        (["--apply_r1_style_format_reward", "--r1_style_format_reward", "0.5"], 10.0, 0.0),
        ([], 10.0, 10.0),
    ],
)
def test_the_r1_format_reward_adds_up(flags, well_formed, malformed):
    from open_instruct.rewards.scoring import RewardScorer, RewardSettings

    cfg = parse_config(flags)
    with RewardScorer(RewardSettings.from_config(cfg), max_workers=1) as scorer:

        def score(text):
            return asyncio.run(scorer.score("s", text, ["4"], ["gsm8k"], "stop", 5)).reward

        assert score("<think>2+2</think> <answer>4</answer>") == well_formed
        assert score("the answer is 4") == malformed
    assert cfg.max_possible_reward == 10.0 + (1.0 if "--additive_format_reward" in flags else 0.0)


def test_features_not_built_yet_stop_the_run_with_one_line(capsys):
    from open_instruct.grpo_fast import main

    assert main(["--loss_fn", "cispo", "--single_gpu_mode"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--loss_fn cispo: not supported yet" in err and "--single_gpu_mode" in err
    # Their defaults, passed explicitly as scripts do, are fine.
    assert unsupported_features(parse_config(["--loss_fn", "dapo", "--vllm_sync_backend", "nccl"])) == []
