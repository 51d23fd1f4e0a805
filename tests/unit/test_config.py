"""CLI compatibility with open-instruct's grpo_fast and fail-fast validation of flag values."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from open_instruct import grpo_fast
from open_instruct.config.core import GROUPS, Config, ConfigError, build_parser, flag_names, parse_config
from open_instruct.config.fields import allowed_values

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SEED_VARIABLES = {
    "exp_name": "2606rl_update_fil_dapo_pol_qwen2_5_orz_only_mix_123",
    "split_value": "hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0",
    "add_bos": "False",
    "model_name_or_path": "hamishivi/qwen2_5_openthoughts2",
    "chat_template_name": "tulu_thinker",
}


def seed_command_text() -> str:
    text = (FIXTURES / "seed_grpo_fast_command.txt").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def seed_argv(overrides: dict[str, str] | None = None) -> list[str]:
    text = seed_command_text()
    for name, value in {**SEED_VARIABLES, **(overrides or {})}.items():
        text = text.replace("${" + name + "}", value)
    argv = shlex.split(text.replace("\\\n", " "))
    assert argv[:2] == ["python", "open_instruct/grpo_fast.py"]
    return argv[2:]


def test_seed_launch_command_parses_to_typed_values():
    cfg = parse_config(seed_argv())
    assert cfg.run.exp_name == SEED_VARIABLES["exp_name"]
    assert cfg.algorithm.beta == 0.0
    assert cfg.generation.num_samples_per_prompt_rollout == 16
    assert cfg.generation.num_unique_prompts_rollout == 256
    assert cfg.learner.learning_rate == pytest.approx(5e-7)
    assert cfg.algorithm.kl_estimator_name == "kl3"
    assert cfg.data.dataset_mixer_list == SEED_VARIABLES["split_value"].split()
    assert cfg.data.dataset_mixer_eval_list == ["hamishivi/tulu_3_rewritten_100k", "32"]
    assert cfg.model.add_bos is False
    assert cfg.generation.response_length == 16384
    assert cfg.learner.pack_length == 20480
    assert cfg.generation.stop_strings == ["</answer>"]
    assert cfg.reward.non_stop_penalty is False
    assert cfg.learner.num_learners_per_node == [8, 8]
    assert cfg.world_size == 16
    assert cfg.generation.vllm_num_engines == 32
    assert cfg.learner.deepspeed_stage == 2
    assert cfg.learner.lr_scheduler_type == "constant"
    assert cfg.reward.apply_verifiable_reward is True
    assert cfg.learner.gradient_checkpointing is True
    assert cfg.run.with_tracking is True
    assert cfg.generation.vllm_enable_prefix_caching is True
    assert cfg.algorithm.clip_higher == pytest.approx(0.28)
    assert cfg.algorithm.mask_truncated_completions is True
    assert cfg.compat.try_launch_beaker_eval_jobs_on_weka is True
    assert cfg.compat.oe_eval_max_length == 32768
    assert cfg.compat.oe_eval_tasks.split(",")[0] == "minerva_math::hamish_zs_reasoning"
    assert cfg.rollout_batch_size == 4096
    assert cfg.num_training_steps == 10_000_000 // 4096
    assert cfg.eval_every_steps == -(-cfg.num_training_steps // 5)
    assert not cfg.uses_embedded_default


@pytest.mark.parametrize("spelling, expected", [("kl1", "kl1"), ("KL4", "kl4"), ("0", "kl1"), ("2", "kl3")])
def test_kl_estimator_accepts_names_and_numbers(spelling, expected):
    assert parse_config(["--kl_estimator", spelling]).algorithm.kl_estimator_name == expected


@pytest.mark.parametrize("spelling, expected", [("True", True), ("true", True), ("False", False), ("false", False)])
def test_booleans_accept_open_instruct_spellings(spelling, expected):
    assert parse_config(["--add_bos", spelling]).model.add_bos is expected


def test_config_is_frozen_and_derived_values_are_not_stored():
    cfg = parse_config(["--num_learners_per_node", "2", "3", "--num_unique_prompts_rollout", "10"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.learner.pack_length = 1  # type: ignore[misc]
    assert cfg.world_size == 5
    assert "world_size" not in {f.name for f in dataclasses.fields(cfg.learner)}


def test_defaults_select_the_embedded_model():
    assert parse_config([]).uses_embedded_default
    assert not parse_config(["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]).uses_embedded_default


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pack_lenght", "10"], r"unknown flag --pack_lenght \(did you mean --pack_length\?\)"),
        (
            ["--pack_length", "100"],
            r"--pack_length 100 < --max_prompt_token_length 256 \+ --response_length 256.*at least 512",
        ),
        (["--num_samples_per_prompt_rollout", "1"], r"--num_samples_per_prompt_rollout must be >= 2"),
        (["--temperature", "2.5"], r"--temperature 2\.5 must be in \[0, 2\]"),
        (["--llm_judge_timeout", "0"], r"--llm_judge_timeout 0 must be > 0"),
        (["--rho_clamp_lower_bound", "1.5"], r"--rho_clamp_lower_bound 1\.5 must be 0 \(off\) or in \(0, 1\)"),
        (["--kl_estimator", "kl9"], r"--kl_estimator 'kl9' is not one of"),
        (["--dataset_mixer_list", "a", "1.0", "b"], r"--dataset_mixer_list takes NAME WEIGHT pairs"),
        (["--dataset_mixer_list", "a", "lots"], r"weight of a must be a number"),
        (["--deepspeed_stage", "4"], r"--deepspeed_stage 4 must be 0, 1, 2 or 3"),
        (["--remap_verifier", "ifeval"], r"--remap_verifier 'ifeval' must look like OLD=NEW"),
        (["--total_episodes", "3"], r"--total_episodes 3 is less than one step's batch"),
        (["--loss_denominator", "tokens"], r"--loss_denominator 'tokens' must be 'token' or a positive number"),
        (
            ["--async_steps", "1", "--weight_sync_every_steps", "4"],
            r"--weight_sync_every_steps 4 leaves the engines up to 3 versions behind.*--max_off_policy_steps >= 3",
        ),
        (["--max_off_policy_steps", "some"], r"--max_off_policy_steps 'some' must be an integer >= 0 or 'auto'"),
        (
            ["--off_policy_min_ess_frac", "0.8"],
            r"--off_policy_min_ess_frac sets a limit of the self-tuning window, which needs --max_off_policy_steps",
        ),
        (
            ["--max_off_policy_steps", "auto", "--off_policy_window_min", "4", "--off_policy_window_max", "3"],
            r"--off_policy_window_min 4 must be <= --off_policy_window_max 3",
        ),
        (
            ["--max_off_policy_steps", "auto", "--off_policy_window_min", "1", "--weight_sync_every_steps", "4"],
            r"up to 3 versions behind the learner, more than the staleness bound 1",
        ),
    ],
)
def test_bad_values_name_the_flag_and_the_fix(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(argv)


def _just_outside(bounds: str, integer: bool) -> float:
    """A value the bounds refuse, next to where they end (an interval: past its upper end, which is never
    the `off` value)."""
    step = 1 if integer else 0.5
    if bounds[0] in "[(":
        high = float(bounds[1:-1].split(",")[1])
        return high + step if bounds[-1] == "]" else high
    comparison, limit = bounds.split()
    return {">=": float(limit) - step, ">": float(limit)}[comparison]


BOUNDED_FLAGS = [
    (flag.name, flag) for group in GROUPS for flag in dataclasses.fields(group) if "bounds" in flag.metadata
]


@pytest.mark.parametrize("name, flag", BOUNDED_FLAGS, ids=[name for name, _ in BOUNDED_FLAGS])
def test_every_bounded_flag_refuses_a_value_just_outside_its_bounds_in_one_line(name, flag):
    integer = "int" in str(flag.type)
    value = _just_outside(flag.metadata["bounds"], integer)
    shown = int(value) if integer else value
    with pytest.raises(ConfigError) as refused:
        parse_config([f"--{name}", str(shown)])
    assert f"--{name} {shown} must be {allowed_values(flag)}" in str(refused.value)


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as error:
        parse_config(["--vllm_top_p", "0", "--beta", "-1"])
    assert "--vllm_top_p" in str(error.value) and "--beta" in str(error.value)


def test_unparseable_value_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--num_epochs", "many"])
    assert "--num_epochs" in capsys.readouterr().err


def test_help_documents_every_flag():
    parser = build_parser()
    help_text = parser.format_help()
    documented = {opt: action.help for action in parser._actions for opt in action.option_strings}
    for name in flag_names():
        assert f"--{name}" in help_text
        assert documented[f"--{name}"], f"--{name} has no help text"
    beaker_only = [a for a in parser._actions if a.help and a.help.startswith("[Beaker only")]
    assert {a.dest for a in beaker_only} >= {
        "try_launch_beaker_eval_jobs_on_weka",
        "oe_eval_tasks",
        "oe_eval_max_length",
    }


def test_entry_point_rejects_bad_flags_before_starting_anything(capsys):
    assert grpo_fast.main(["--response_length", "0"]) == 2
    assert "--response_length 0 must be > 0" in capsys.readouterr().err


def test_entry_point_refuses_features_not_built_yet(capsys):
    assert grpo_fast.main(["--push_to_hub", "True"]) == 2
    assert re.search(r"--push_to_hub True: not supported yet: uploading needs the Hub", capsys.readouterr().err)


@pytest.mark.parametrize("off", ["false", "False", "0"])
def test_push_to_hub_off_is_accepted_as_open_instructs_scripts_write_it(off):
    from open_instruct.config.core import unsupported_features

    assert unsupported_features(parse_config(["--push_to_hub", off])) == []


def test_every_seed_flag_is_a_supported_feature():
    from open_instruct.config.core import unsupported_features

    assert unsupported_features(parse_config(seed_argv())) == []


def test_a_save_interval_without_a_state_dir_saves_under_the_output_dir(tmp_path):
    from open_instruct.config.derived import state_dir

    out = str(tmp_path / "out")
    assert state_dir(parse_config(["--output_dir", out])) is None
    for flags in (["--checkpoint_state_freq", "5"], ["--ephemeral_save_interval", "4"], ["--checkpointing_steps", "9"]):
        assert state_dir(parse_config(["--output_dir", out, *flags])) == f"{out}/checkpoint_state"
    given = str(tmp_path / "state")
    assert state_dir(parse_config(["--checkpoint_state_freq", "5", "--checkpoint_state_dir", given])) == given


def test_config_equality_is_value_based():
    parsed = parse_config(["--seed", "3"])
    assert parsed == Config(run=parsed.run, explicit_flags=frozenset({"seed"}))
    assert parsed.explicit_flags == {"seed"}


def test_a_self_tuning_window_is_sized_for_its_widest_bound():
    from open_instruct.staleness import OffPolicyWindow

    cfg = parse_config(["--max_off_policy_steps", "auto", "--async_steps", "auto", "--off_policy_window_max", "5"])
    policy = cfg.staleness_policy
    assert policy.auto and policy.bound == 5 and cfg.lookahead_max == 5 and policy.minimum == 1
    assert policy.flag_value == "auto" and OffPolicyWindow.of(policy).current == 1
    fixed = parse_config(["--max_off_policy_steps", "3"]).staleness_policy
    assert not fixed.auto and fixed.bound == fixed.minimum == 3 and fixed.flag_value == 3
    # How results tables state the policy they measured.
    assert policy.describe() == "K=auto (1-5, ess >= 0.9, truncated <= 0.02), mask"
    assert fixed.describe() == "K=3, mask"


def test_k_defaults_to_the_lookahead_and_the_action_says_what_the_loop_does():
    from open_instruct.config.staleness import OffPolicyAction
    from open_instruct.staleness import MaxAge

    assert parse_config(["--async_steps", "3"]).staleness_policy.bound == 3
    assert parse_config(["--async_steps", "auto"]).staleness_policy.bound == 8  # open-instruct's default lookahead
    policies = {
        a: parse_config(["--off_policy_action", a]).staleness_policy for a in ("mask", "requeue", "drop", "downweight")
    }
    assert {a: p.action.requeues for a, p in policies.items()} == {
        "mask": True,
        "requeue": True,
        "drop": False,
        "downweight": False,
    }
    assert [a for a, p in policies.items() if p.action.trains_late_groups] == ["mask", "downweight"]
    assert {a: MaxAge.of(p).action for a, p in policies.items()} == {
        "mask": "mask",
        "requeue": "drop",
        "drop": "drop",
        "downweight": "downweight",
    }
    assert policies["mask"].action is OffPolicyAction.MASK
