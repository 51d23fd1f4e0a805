"""Every flag of open-instruct's grpo_fast parses here, and a non-default value either lands in the config
or is refused with the agreed message ("not supported yet: <reason>", or a validation error naming it).

The table is `tests/data/open_instruct_grpo_fast_flags.tsv`, extracted from the reference flag list; a
flag missing from our CLI fails `test_every_reference_flag_is_accepted` by name.
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from open_instruct.config.core import GROUPS, ConfigError, parse_config, unsupported_features

TABLE = Path(__file__).resolve().parents[1] / "data" / "open_instruct_grpo_fast_flags.tsv"
FLAGS = [line.split("\t")[0] for line in TABLE.read_text().splitlines() if line and not line.startswith("#")]
FIELDS = {f.name: (group, f) for group in GROUPS for f in fields(group)}

# Values that the generic rule (flip a bool, add to a number, pick another choice) would make invalid
# for reasons unrelated to the flag, and the companions some values need.
SPECIAL: dict[str, list[str]] = {
    "max_prompt_token_length": ["--max_prompt_token_length", "100", "--pack_length", "1024"],
    "response_length": ["--response_length", "300", "--pack_length", "1024"],
    "pack_length": ["--pack_length", "1024"],
    "vllm_top_p": ["--vllm_top_p", "0.5"],
    "vllm_gpu_memory_utilization": ["--vllm_gpu_memory_utilization", "0.5"],
    "kl_estimator": ["--kl_estimator", "3"],
    "loss_denominator": ["--loss_denominator", "2.0"],
    "deepspeed_stage": ["--deepspeed_stage", "3"],
    "num_learners_per_node": ["--num_learners_per_node", "2"],
    "remap_verifier": ["--remap_verifier", "math=gsm8k"],
    "checkpoint_state_freq": ["--checkpoint_state_freq", "7", "--checkpoint_state_dir", "/tmp/state"],
    "alpha": ["--alpha", "0.9"],
    "rho_clamp_upper_bound": ["--rho_clamp_upper_bound", "3.0"],
    "load_ref_policy": ["--load_ref_policy", "False", "--beta", "0"],
    "tool_call_names": ["--tools", "python", "--tool_call_names", "code"],
    "tool_configs": ["--tools", "python", "--tool_configs", "{}"],
    "tools": ["--tools", "python"],
    "tool_parser_type": ["--tool_parser_type", "vllm_hermes"],
    "dataset_mixer_list": ["--dataset_mixer_list", "rows.jsonl", "1.0"],
    "dataset_mixer_eval_list": ["--dataset_mixer_eval_list", "rows.jsonl", "1.0"],
    "warmup_ratio": ["--warmup_ratio", "0.5"],
    "no_resampling_pass_rate": ["--no_resampling_pass_rate", "0.5"],
    "eval_on_step_0": ["--eval_on_step_0", "True"],
    "active_sampling": ["--active_sampling", "True"],
    "temperature": ["--temperature", "0.5"],
    "async_steps": ["--async_steps", "2"],
}


def _base_type(group, name: str):
    """The flag's type with Optional removed: a class, or a Literal / list[...] alias."""
    hint = typing.get_type_hints(group)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def non_default_argv(name: str, tmp_path: Path) -> list[str]:
    """A command line that gives flag `name` a value other than its default."""
    if name == "system_prompt_override_file":
        path = tmp_path / "system.txt"
        path.write_text("Be brief.\n")
        return ["--system_prompt_override_file", str(path)]
    if name in SPECIAL:
        return SPECIAL[name]
    group, f = FIELDS[name]
    default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
    hint = _base_type(group, name)
    if typing.get_origin(hint) is typing.Literal:
        return [f"--{name}", next(str(c) for c in typing.get_args(hint) if c != default)]
    if hint is bool:
        return [f"--{name}", str(not default)]
    if typing.get_origin(hint) is list:
        return [f"--{name}", "2"] if typing.get_args(hint) == (int,) else [f"--{name}", "alpha", "beta"]
    if hint is int:
        return [f"--{name}", str((default or 0) + 3)]
    if hint is float:
        return [f"--{name}", str((default or 0.0) + 0.5)]
    return [f"--{name}", "some-value"]


def test_every_reference_flag_is_accepted():
    missing = [name for name in FLAGS if name not in FIELDS]
    assert not missing, f"flags of open-instruct's grpo_fast missing from our CLI: {missing}"


@pytest.mark.parametrize("name", FLAGS)
def test_a_non_default_value_lands_in_the_config_or_is_refused_by_name(name, tmp_path):
    argv = non_default_argv(name, tmp_path)
    group, f = FIELDS[name]
    default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
    try:
        cfg = parse_config(argv)
    except ConfigError as error:
        assert f"--{name}" in str(error), error
        return
    refused = [problem for problem in unsupported_features(cfg) if problem.startswith(f"--{name}")]
    value = getattr(_group_of(cfg, group), name)
    if refused:
        assert "not supported yet" in refused[0]
    else:
        assert value != default, f"--{name} {argv[1:]} parsed to its default {default!r}"


def _group_of(cfg, group_class):
    return next(getattr(cfg, f.name) for f in fields(cfg) if isinstance(getattr(cfg, f.name), group_class))


@pytest.mark.parametrize("name", [n for n in FLAGS if _base_type(FIELDS[n][0], n) is bool and FIELDS[n][1].default])
def test_booleans_that_default_to_true_take_the_no_form(name):
    try:
        cfg = parse_config([f"--no_{name}"])
    except ConfigError as error:
        assert f"--{name}" in str(error) or f"--no_{name}" in str(error)
        return
    refused = [p for p in unsupported_features(cfg) if p.startswith(f"--{name}")]
    assert refused or getattr(_group_of(cfg, FIELDS[name][0]), name) is False


def test_infrastructure_flags_say_so_in_help():
    import contextlib
    import io

    from open_instruct.config.core import build_parser
    from open_instruct.config.fields import flag_kind

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        build_parser().print_help()
    options = shown.getvalue().split("\n  --")[1:]  # one entry per flag of the options list, after the usage
    for name in ("hf_entity", "gs_bucket_path", "send_slack_alerts", "eval_workspace", "oe_eval_tasks"):
        assert flag_kind(FIELDS[name][1]) == "Beaker only"
        (entry,) = [option for option in options if option.startswith(f"{name} ")]
        assert "[Beaker only: accepted for compatibility" in " ".join(entry.split())  # --help renders the kind


def test_a_flags_kind_is_metadata_and_argparse_never_sees_it():
    from open_instruct.config.fields import arg, help_for_argparse, rendered_help

    pending = arg(0, "How many.", kind="pending", reason="needs X")
    assert dict(pending.metadata) == {"help": "How many.", "kind": "pending", "reason": "needs X"}
    assert rendered_help(pending) == "[not supported yet: needs X] How many."
    assert dict(help_for_argparse(pending).metadata) == {"help": "[not supported yet: needs X] How many."}
    with pytest.raises(ValueError, match="unknown flag kind"):
        arg(0, "x", kind="sometimes")


def test_a_flags_bounds_are_metadata_checked_at_parse_time_and_printed_in_its_help():
    from dataclasses import dataclass

    from open_instruct.config.fields import arg, help_for_argparse, out_of_bounds, rendered_help

    @dataclass(frozen=True)
    class Group:
        steps: int = arg(1, "Steps.", bounds=">= 1")
        share: float | None = arg(None, "A share.", bounds="(0, 1]")
        floor: float = arg(0.0, "A floor.", bounds="(0, 1)", off=0)

    flags = {flag.name: flag for flag in fields(Group)}
    assert rendered_help(flags["steps"]) == "Steps. Must be >= 1."
    assert rendered_help(flags["floor"]) == "A floor. Must be 0 (off) or in (0, 1)."
    assert dict(help_for_argparse(flags["share"]).metadata) == {"help": "A share. Must be in (0, 1]."}
    assert out_of_bounds(Group()) == []  # an unset flag and the `off` value pass
    assert out_of_bounds(Group(steps=1, share=1.0, floor=0.5)) == []  # the closed ends are inside
    assert out_of_bounds(Group(steps=0, share=0.0, floor=1.0)) == [
        "--steps 0 must be >= 1",
        "--share 0.0 must be in (0, 1]",
        "--floor 1.0 must be 0 (off) or in (0, 1)",
    ]
    with pytest.raises(ValueError):  # a malformed bound fails where it is declared
        arg(1, "x", bounds="at least 1")


def test_the_seed_command_and_common_script_flags_still_run():
    cfg = parse_config(
        [
            "--vllm_sync_backend",
            "nccl",
            "--load_ref_policy",
            "False",
            "--beta",
            "0",
            "--gradient_checkpointing",
            "--ground_truths_key",
            "ground_truth",
            "--sft_messages_key",
            "messages",
            "--run_name",
            "mine",
            "--report_to",
            "wandb",
            "--wandb_project",
            "p",
            "--max_train_steps",
            "3",
            "--warmup_ratio",
            "0.1",
        ]
    )
    assert unsupported_features(cfg) == []
    assert cfg.run_name == "mine" and cfg.tracking_enabled and cfg.num_training_steps == 3
