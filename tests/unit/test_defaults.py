"""Every default equals open-instruct's grpo_fast default, as `tests/data/open_instruct_grpo_fast_flags.tsv`
records it, except the few flags of `DEFAULTS_UNLIKE_OPEN_INSTRUCT`, each with its reason: a script relies on
every flag it leaves out. Also what the defaults that only act with other flags do on their own."""

from __future__ import annotations

import ast
import math
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from open_instruct.config.algorithm import KL_ESTIMATORS
from open_instruct.config.compat import DEFAULTS_UNLIKE_OPEN_INSTRUCT
from open_instruct.config.core import GROUPS, parse_config
from open_instruct.config.derived import state_dir, state_save_every

TABLE = Path(__file__).resolve().parents[1] / "data" / "open_instruct_grpo_fast_flags.tsv"
REQUIRED = object()  # open-instruct has no default: a script must give the flag
# Cells of the table that describe a default in words instead of writing it, as the value they describe.
DESCRIBED = {
    "report_to": None,  # "declared `all`, but parses to None"
    "activation_checkpointing_modules": [
        f"blocks.*.{module}"
        for module in (
            "attention_norm",
            "attention",
            "attention_residual_stream",
            "feed_forward_norm",
            "feed_forward",
            "feed_forward_residual_stream",
        )
    ],
    "code_api_url": "http://localhost:1234/test_program",  # $CODE_API_URL, unset here, falls back to localhost:1234
}
# Flags with several spellings of one value, compared as the runtime reads them (--kl_estimator 2 is kl3).
SPELLINGS = {"kl_estimator": lambda value: KL_ESTIMATORS[str(value).lower()]}


def theirs() -> dict[str, object]:
    rows = [line.split("\t") for line in TABLE.read_text().splitlines() if line and not line.startswith("#")]
    return {name: DESCRIBED[name] if name in DESCRIBED else recorded(cell) for name, _, cell in rows}


def recorded(cell: str):
    """A default as the table writes it: `0.272`, None, True, `[1]`, `grpo` (set_defaults; ...), None (becomes
    `[]`): the value after open-instruct's own post-processing where the cell gives it."""
    if cell == "**required**":
        return REQUIRED
    becomes = re.search(r"\(becomes `([^`]*)`\)$", cell)
    if becomes and _literal(becomes.group(1)) != becomes.group(1):
        return _literal(becomes.group(1))
    first = re.match(r"`([^`]*)`|(\S+)", cell)
    return _literal(first.group(1) if first.group(1) is not None else first.group(2))


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def ours(monkeypatch) -> dict[str, object]:
    monkeypatch.delenv("CODE_API_URL", raising=False)  # --code_api_url's default reads it, as open-instruct's does
    found = {}
    for group in GROUPS:
        for flag in fields(group):
            found[flag.name] = flag.default if flag.default_factory is MISSING else flag.default_factory()
    return found


def canonical(name: str, value):
    """One representation per value: numbers written as strings (--async_steps "8") as numbers, tuples as lists."""
    if name in SPELLINGS and value is not None:
        return SPELLINGS[name](value)
    if isinstance(value, (list, tuple)):
        return [canonical("", each) for each in value]
    if isinstance(value, str):
        number = _literal(value)
        return number if isinstance(number, (int, float)) and not isinstance(number, bool) else value
    return value


def test_every_default_equals_open_instructs_except_the_listed_differences(monkeypatch):
    recorded_defaults, defaults = theirs(), ours(monkeypatch)
    drifted = [
        f"--{name}: ours {defaults[name]!r}, open-instruct's {value!r}"
        for name, value in recorded_defaults.items()
        if name not in DEFAULTS_UNLIKE_OPEN_INSTRUCT and canonical(name, defaults[name]) != canonical(name, value)
    ]
    assert drifted == [], "defaults unlike open-instruct's (change ours, or list it with its reason in compat.py)"


def test_each_listed_difference_is_a_flag_of_open_instruct_that_differs_for_a_reason(monkeypatch):
    recorded_defaults, defaults = theirs(), ours(monkeypatch)
    for name, reason in DEFAULTS_UNLIKE_OPEN_INSTRUCT.items():
        assert name in recorded_defaults, f"--{name} is not a flag of open-instruct's grpo_fast"
        same = canonical(name, defaults[name]) == canonical(name, recorded_defaults[name])
        assert not same, f"--{name} no longer differs: drop it from the list"
        assert reason.strip(), f"--{name} needs its reason"


def test_the_table_cells_read_as_their_values():
    assert recorded("`0.272`") == 0.272 and recorded("`1` (set_defaults; dataclass 8)") == 1
    assert recorded("`grpo` (set_defaults; dataclass `experiment`)") == "grpo" and recorded("`output/`") == "output/"
    assert recorded("None (becomes `[]`)") == [] and recorded("None (becomes `response_length`)") is None
    assert recorded("`[]` (becomes `'{}'` per tool)") == [] and recorded("None → auto") is None
    assert recorded("True") is True and recorded("`[1]`") == [1] and recorded("**required**") is REQUIRED


def test_the_default_state_interval_saves_only_into_a_state_dir(tmp_path):
    # open-instruct saves its state every 200 steps only where --checkpoint_state_dir says: a run without one
    # writes no state, however long (the demo's 200 steps included)
    assert state_dir(parse_config(["--output_dir", str(tmp_path)])) is None
    given = str(tmp_path / "state")
    cfg = parse_config(["--checkpoint_state_dir", given])
    assert state_save_every(cfg) == (200,) and state_dir(cfg) == given


def test_evaluation_every_100_steps_unless_num_evals_is_given_alone():
    steps = ["--total_episodes", str(64 * 1000)]  # 1000 steps of the default 16 x 4 samples
    assert parse_config(steps).eval_every_steps == 100
    assert parse_config([*steps, "--num_evals", "3"]).eval_every_steps == math.ceil(1000 / 3)
    assert parse_config([*steps, "--num_evals", "0"]).eval_every_steps == 0
    assert parse_config([*steps, "--num_evals", "3", "--local_eval_every", "7"]).eval_every_steps == 7
    assert parse_config([*steps, "--local_eval_every", "-1"]).eval_every_steps == 0


def test_only_an_eval_mix_is_evaluated_except_the_embedded_datasets_own_eval_split():
    # open-instruct: no --dataset_mixer_eval_list, no evaluation; nothing is held out of the training mix and
    # the schedule flags are no error then
    for schedule in ([], ["--local_eval_every", "5"], ["--num_evals", "3", "--eval_on_step_0"]):
        cfg = parse_config(["--dataset_mixer_list", "owner/train-only", "1.0", *schedule])
        assert cfg.eval_data is None
        assert cfg.evaluation_line.startswith("evaluation: none (no --dataset_mixer_eval_list")
    given = parse_config(
        ["--dataset_mixer_list", "a/b", "1.0", "--dataset_mixer_eval_list", "c/d", "16", "--local_eval_every", "5"]
    )
    assert given.eval_data.dataset_mixer_eval_list == ["c/d", "16"]
    assert given.eval_data.dataset_mixer_eval_list_splits == ["test"]  # open-instruct's default split
    assert (
        given.evaluation_line == "evaluation: --dataset_mixer_eval_list c/d 16 [test], every 5 steps and after the last"
    )
    # the embedded default (no dataset flag) evaluates its own eval split, as scripts/cpu_demo.sh shows
    embedded = parse_config(["--num_evals", "0", "--eval_on_step_0"])
    assert embedded.eval_data.dataset_mixer_eval_list == ["embedded/arith", "1.0"]
    assert embedded.evaluation_line == (
        "evaluation: the eval split of embedded/arith (the embedded default), before the first step"
    )
    assert "never" in parse_config(["--local_eval_every", "0"]).evaluation_line


@pytest.mark.parametrize("name", sorted(DEFAULTS_UNLIKE_OPEN_INSTRUCT))
def test_the_configuration_page_gives_each_difference_its_reason(name):
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = page.split("## Deliberate differences from open-instruct's defaults", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith(f"| `--{name}` |"))
    assert " ".join(DEFAULTS_UNLIKE_OPEN_INSTRUCT[name].split()) in row


def test_a_switch_whose_default_we_turned_off_keeps_open_instructs_no_form():
    """--gather_whole_model is on in open-instruct, so its docs write --no_gather_whole_model; off here by default,
    every spelling still parses to what it says."""
    from open_instruct.config.core import parse_config

    assert parse_config([]).learner.gather_whole_model is False
    assert parse_config(["--no_gather_whole_model"]).learner.gather_whole_model is False
    assert parse_config(["--gather_whole_model"]).learner.gather_whole_model is True
    assert parse_config(["--gather_whole_model", "False"]).learner.gather_whole_model is False
