"""What the open-instruct flags that work here do: naming and tracking, schedule, data order, eval length,
data inputs, the R1 format reward, and the refusal of features not built yet (one line, exit code 2)."""

from __future__ import annotations

import asyncio

import pytest

from open_instruct.config.core import ConfigError, parse_config, unsupported_features


def test_run_name_tracking_and_wandb_names():
    cfg = parse_config(
        ["--run_name", "mine", "--report_to", "wandb", "--wandb_project", "p", "--wandb_group_name", "g"]
    )
    assert cfg.run_name == "mine" and cfg.tracking_enabled
    assert not parse_config(["--report_to", "none"]).tracking_enabled
    assert parse_config([]).run_name == "grpo__42"


def test_schedule_flags_shape_the_run_and_the_learning_rate():
    from open_instruct.learner.actor import LearnerSettings

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
        feeder = PromptFeeder(
            rows,
            prompts_per_step=8,
            samples_per_prompt=2,
            async_steps=0,
            sampling=SamplingSettings(max_tokens=4),
            seed=3,
            order_seed=order_seed,
        )
        return {r.prompt_id: r.seed for r in feeder.admit(learner_version=0)}

    same, other = admitted(None), admitted(11)
    assert list(same) != list(other)
    assert all(other[pid] == same.get(pid, other[pid]) for pid in other)  # a prompt's seed ignores the order


def test_eval_response_length_sizes_eval_requests_and_the_engines():
    from open_instruct.generation.engine_setup import EngineSettings

    cfg = parse_config(["--response_length", "64", "--eval_response_length", "200", "--pack_length", "512"])
    assert cfg.eval_response_length == 200
    assert EngineSettings.from_config(cfg, "m").max_model_len == cfg.data.max_prompt_token_length + 200
    assert parse_config(["--response_length", "64"]).eval_response_length == 64


def test_data_inputs_read_the_system_prompt_file_and_skip_the_cache(tmp_path):
    from open_instruct.data.dataset import data_inputs

    path = tmp_path / "system.txt"
    path.write_text("  Answer tersely.\n")
    _, train, evaluation = data_inputs(
        parse_config(["--system_prompt_override_file", str(path), "--dataset_skip_cache"])
    )
    assert train.system_prompt_override == evaluation.system_prompt_override == "Answer tersely."
    assert train.dataset_local_cache_dir == "" and evaluation.dataset_local_cache_dir == ""
    with pytest.raises(ConfigError, match="no such file"):
        parse_config(["--system_prompt_override_file", str(tmp_path / "missing.txt")])
    with pytest.raises(ConfigError, match="give one"):
        parse_config(["--system_prompt_override_file", str(path), "--system_prompt_override", "x"])


def test_rho_correction_flags_map_onto_the_importance_cap():
    from open_instruct.learner.actor import LearnerSettings

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
    assert parse_config(["--load_ref_policy", "False", "--beta", "0"]).algorithm.load_ref_policy is False
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
    from open_instruct.rewards import RewardSettings
    from open_instruct.rewards.scoring import RewardScorer

    cfg = parse_config(flags)
    with RewardScorer(RewardSettings.from_config(cfg), max_workers=1) as scorer:

        def score(text):
            return asyncio.run(scorer.score("s", text, ["4"], ["gsm8k"], "stop", 5)).reward

        assert score("<think>2+2</think> <answer>4</answer>") == well_formed
        assert score("the answer is 4") == malformed
    assert cfg.reward.max_possible_reward == 10.0 + (1.0 if "--additive_format_reward" in flags else 0.0)


def test_features_not_built_yet_stop_the_run_with_one_line(capsys):
    from open_instruct.grpo_fast import main

    assert main(["--load_in_8bit", "--load_in_4bit"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--load_in_8bit True: not supported yet" in err and "--load_in_4bit" in err
    # Their defaults, passed explicitly as scripts do, are fine.
    assert unsupported_features(parse_config(["--dataset_cache_mode", "local", "--vllm_sync_backend", "nccl"])) == []
    assert parse_config(["--loss_fn", "cispo"]).algorithm.loss_fn == "cispo"


def test_pass_at_k_matches_a_hand_count():
    from open_instruct.evaluation import pass_at_k

    # 5 samples, 2 correct: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@4 = 1 (only 3 wrong).
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 4) == 1.0 and pass_at_k(5, 0, 3) == 0.0


def test_eval_pass_at_k_samples_each_prompt_k_times_and_reports_pass_at_k():
    from dataclasses import dataclass

    from open_instruct.evaluation import EvalRound
    from open_instruct.messages import Completion, SamplingSettings

    @dataclass(frozen=True)
    class Row:
        prompt_id: str
        prompt_token_ids: tuple = (1,)
        ground_truths: tuple = ("1",)
        verifier_names: tuple = ("gsm8k",)

    train = SamplingSettings(max_tokens=8, temperature=0.7, top_p=1.0)
    greedy = EvalRound.build([Row("a")], 3, train, 1, 0, 0.0)
    assert greedy.requests[0].num_samples == 1 and greedy.requests[0].sampling.temperature == 0.0
    sampled = EvalRound.build([Row("a"), Row("b")], 3, train, 1, 0, 0.0, samples=4, top_p=0.9, max_reward=10.0)
    assert [r.num_samples for r in sampled.requests] == [4, 4]
    assert sampled.requests[0].sampling.temperature == 0.7 and sampled.requests[0].sampling.top_p == 0.9
    rewards = {"eval3:a": [10.0, 0.0, 0.0, 0.0], "eval3:b": [10.0, 10.0, 10.0, 10.0]}
    for prompt_id, values in rewards.items():
        for j, reward in enumerate(values):
            sampled.add(Completion(prompt_id, j, (1,), (2,), (0.0,), "stop", (), 0, 0, reward=reward, is_eval=True))
    assert sampled.done
    m = sampled.metrics()
    assert m["eval/pass_at_1"] == pytest.approx((0.25 + 1) / 2)
    assert m["eval/pass_at_2"] == pytest.approx((0.5 + 1) / 2) and m["eval/pass_at_4"] == 1.0
    with pytest.raises(ConfigError, match=r"--eval_top_p 1\.5 must be in"):
        parse_config(["--eval_top_p", "1.5"])


def test_record_entropy_reaches_the_learners_settings():
    """The entropy it records (`token_entropy_from_logits`) is checked by hand in test_logprobs.py."""
    from open_instruct.learner.actor import LearnerSettings

    assert not LearnerSettings.from_config(parse_config([]), "m").algorithm.record_entropy
    assert LearnerSettings.from_config(parse_config(["--record_entropy"]), "m").algorithm.record_entropy


def test_save_traces_writes_every_trained_rollout_and_reads_back(tmp_path):
    from helpers.fakes import build, config

    from open_instruct.traces import TraceWriter, read_traces

    cfg = config(
        "--save_traces", "--rollouts_save_path", str(tmp_path), "--run_name", "t", steps=3, prompts=2, samples=2
    )
    run = build(cfg)
    run.loop.run()
    records = list(read_traces(str(tmp_path), "t"))
    assert len(records) == 3 * 2 * 2 and sorted({r["step"] for r in records}) == [0, 1, 2]
    first = records[0]
    keys = {
        "prompt_token_ids",
        "response_token_ids",
        "reward",
        "advantage",
        "finish_reason",
        "verifier_names",
        "ground_truths",
        "behaviour_logprobs",
        "version_spans",
        "tool_calls",
    }
    assert set(first) >= keys
    assert first["verifier_names"] and first["ground_truths"]
    for step in range(3):  # advantages of each group sum to zero (centered)
        by_prompt: dict = {}
        for r in records:
            if r["step"] == step:
                by_prompt.setdefault(r["prompt_id"], []).append(r["advantage"])
        assert all(abs(sum(a)) < 1e-9 for a in by_prompt.values())
    assert (tmp_path / "t_metadata.jsonl").exists()
    # Shards roll over at their size, and a resumed writer appends after them.
    writer = TraceWriter(str(tmp_path / "s"), "x", {}, shard_records=3)
    from open_instruct.messages import Completion

    sample = Completion("p", 0, (1,), (2, 3), (-0.5, float("nan")), "stop", (), 0, 0, reward=1.0)
    groups = [type("Group", (), {"prompt_id": "p", "completions": [sample] * 4})()]
    assert writer.write(0, groups, {}, "centered") == 4
    assert TraceWriter(str(tmp_path / "s"), "x", {}, shard_records=3).write(1, groups, {}, "centered") == 8
    assert sorted(p.name for p in (tmp_path / "s").glob("x_rollouts_*")) == [
        f"x_rollouts_00000{i}.jsonl" for i in range(3)
    ]
    back = list(read_traces(str(tmp_path / "s"), "x"))
    assert len(back) == 8 and back[0]["behaviour_logprobs"] == [-0.5, None]  # NaN (tool output) -> null


def test_use_vllm_logprobs_anchors_pi_old_at_the_engines_logprobs_where_they_exist():
    import torch

    from open_instruct.learner.actor import LearnerSettings, engine_logprobs_as_old

    mb = {
        "old_logprobs": torch.tensor([[-1.0, -2.0, -3.0, -4.0]]),
        "behaviour_logprobs": torch.tensor([[0.0, -2.5, float("nan"), 0.0]]),
        "response_mask": torch.tensor([[False, True, True, False]]),
    }
    # Sampled response token: the engine's; tool output (NaN) and non-response tokens: the learner's.
    assert engine_logprobs_as_old(mb).tolist() == [[-1.0, -2.5, -3.0, -4.0]]
    assert LearnerSettings.from_config(parse_config(["--use_vllm_logprobs"]), "m").algorithm.use_vllm_logprobs


def test_rho_flags_become_the_learners_bounds():
    from open_instruct.learner.actor import LearnerSettings
    from open_instruct.loss import RhoBounds

    flags = [
        "--rho_clamp_lower_bound",
        "0.5",
        "--rho_mask_lower_bound",
        "0.2",
        "--rho_mask_upper_bound",
        "5",
        "--rho_mask_sequence_level",
    ]
    settings = LearnerSettings.from_config(parse_config(flags), "m")
    assert settings.rho_bounds == RhoBounds(0.5, 0.2, 5.0, True)
    assert LearnerSettings.from_config(parse_config([]), "m").rho_bounds is None
    with pytest.raises(ConfigError, match=r"--rho_mask_upper_bound 0\.5 must be 0"):
        parse_config(["--rho_mask_upper_bound", "0.5"])


def test_code_perf_penalty_reaches_the_verifier_settings():
    from open_instruct.rewards import RewardSettings

    assert RewardSettings.from_config(parse_config(["--code_apply_perf_penalty"])).reward.code_apply_perf_penalty
    assert not RewardSettings.from_config(parse_config([])).reward.code_apply_perf_penalty


def test_cache_dataset_only_builds_the_cache_and_exits_without_training(tmp_path):
    from open_instruct.grpo_fast import main

    cache = tmp_path / "cache"
    argv = ["--cache_dataset_only", "--dataset_local_cache_dir", str(cache), "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 0
    assert any(cache.rglob("report.json")) and not (tmp_path / "out" / "metrics.jsonl").exists()


def test_tokenizer_flags_reach_the_tokenizer(model_path):
    from open_instruct.data.models import load_tokenizer

    # --tokenizer_name is an alias of --tokenizer_name_or_path: the tokenizer comes from there.
    cfg = parse_config(["--model_name_or_path", "/nonexistent/model", "--tokenizer_name", model_path])
    assert load_tokenizer(cfg.model).name_or_path == model_path
