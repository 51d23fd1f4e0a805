"""The resumable driver state: versioned, and read through one migration from every older schema."""

from __future__ import annotations

import dataclasses
import pickle
import sys

import pytest

from open_instruct import checkpoints
from open_instruct.errors import UserError
from open_instruct.prompt_feeder import FeederState
from open_instruct.replay_buffer import BufferState
from open_instruct.rewards import evolving_rubrics
from open_instruct.rewards.evolving_rubrics import QueryRubrics


def _state(**changes) -> checkpoints.DriverState:
    lengths = {"generated_lengths": (5, 9), "trained_lengths": (5,), "dropped_lengths": (9,)}
    buffer = BufferState(groups=(), next_seq=3, learner_version=2, counters={"dropped": 1}, **lengths)
    rubrics = ({"q": QueryRubrics(persistent=[{"title": "t", "weight": 1.0}])}, {"row-1": ("gt",)})
    feeder = FeederState(epoch=1, position=2)
    outcomes = {"trained": 3}
    state = checkpoints.DriverState(4, 3, feeder, buffer, (), episodes=12, outcomes=outcomes, rubrics=rubrics)
    return dataclasses.replace(state, **changes)


def _as_schema_1(state: checkpoints.DriverState) -> bytes:
    """The bytes a run of the flat layout wrote: no `schema` field, QueryRubrics at its old module path."""
    object.__delattr__(state, "schema")  # frozen: bypassed, as pickle's own restore does
    old = "open_instruct.evolving_rubrics"
    sys.modules[old] = evolving_rubrics
    QueryRubrics.__module__ = old
    try:
        return pickle.dumps(state)
    finally:
        QueryRubrics.__module__ = evolving_rubrics.__name__
        del sys.modules[old]


def test_a_state_of_the_flat_layout_loads_as_the_current_schema(tmp_path):
    raw = _as_schema_1(_state())
    assert b"open_instruct.evolving_rubrics" in raw and b"schema" not in raw
    (tmp_path / "driver.pkl").write_bytes(raw)
    loaded = checkpoints.load_driver_state(tmp_path / "driver.pkl")
    assert loaded.schema == checkpoints.SCHEMA_VERSION
    assert loaded == _state()
    assert isinstance(loaded.rubrics[0]["q"], QueryRubrics)


def test_fields_a_state_predates_take_their_defaults(tmp_path):
    state = _state()
    for name in ("rubrics", "outcomes", "schema"):
        object.__delattr__(state, name)
    (tmp_path / "driver.pkl").write_bytes(pickle.dumps(state))
    loaded = checkpoints.load_driver_state(tmp_path / "driver.pkl")
    assert (loaded.rubrics, loaded.outcomes, loaded.episodes) == (None, {}, 12)


def test_a_state_newer_than_the_code_is_refused_in_one_line(tmp_path):
    (tmp_path / "driver.pkl").write_bytes(pickle.dumps(_state(schema=checkpoints.SCHEMA_VERSION + 1)))
    with pytest.raises(UserError, match=r"schema 3, newer than this code's 2: resume it with the version") as raised:
        checkpoints.load_driver_state(tmp_path / "driver.pkl")
    assert "\n" not in str(raised.value)


def test_save_then_latest_state_round_trips(tmp_path):
    class Learners:
        def save_state(self, path: str) -> None:
            (tmp_path / "saved_learner").write_text(path)

    checkpoints.save_state(Learners(), str(tmp_path / "state"), _state())
    path, loaded = checkpoints.latest_state(str(tmp_path / "state"))
    assert path.name == "step_4" and loaded == _state()
