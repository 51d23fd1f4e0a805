"""The plain-data codec between an assert test's judge and its program (`code_server/remote_calls.py`): exact
round trips for every plain type, and a `ProtocolError` (never another exception, never a value that
compares equal to everything) for whatever a hostile program might send instead."""

from __future__ import annotations

import decimal
import fractions
import json
import math
from collections import Counter, OrderedDict, namedtuple

import pytest

from code_server.remote_calls import ProtocolError, Remote, _sync, decode, encode


def no_handles(value: object) -> int:
    raise AssertionError(f"{value!r} should have been plain data")


def round_trip(value: object) -> object:
    wire = json.loads(json.dumps(encode(value, no_handles)))  # what crosses the pipe
    return decode(wire, no_handles)


PLAIN = [
    None,
    True,
    0,
    -(10**5000),
    2**64 + 1,
    0.1,
    -0.0,
    math.inf,
    1e308,
    complex(1.5, -2),
    "text \udc80 with a lone surrogate",
    b"\x00\xff",
    bytearray(b"ab"),
    [1, "a", 2.5, None, True],
    (1, 2),
    [[1, 2], [3, 4]],
    {"a": [1, {2: (3,)}], (1, 2): frozenset({1})},
    {1, 2, 3},
    fractions.Fraction(1, 3),
    decimal.Decimal("1.10"),
    [10**5000, 1],
]


@pytest.mark.parametrize("value", PLAIN, ids=[type(v).__name__ + str(i) for i, v in enumerate(PLAIN)])
def test_plain_values_cross_exactly(value: object) -> None:
    back = round_trip(value)
    assert type(back) is type(value) and back == value
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_stays_nan_and_subclasses_arrive_as_their_plain_values() -> None:
    assert math.isnan(round_trip(math.nan))
    Point = namedtuple("Point", "x y")
    assert round_trip(Point(1, 2)) == (1, 2) and type(round_trip(Point(1, 2))) is tuple
    assert round_trip(Counter("aab")) == {"a": 2, "b": 1}
    assert type(round_trip(OrderedDict(a=1))) is dict

    class Sly(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert round_trip(Sly(3)) == 3 and round_trip(Sly(3)) != 4


def test_other_objects_become_handles_and_modules_names() -> None:
    registered = []
    assert encode(object, registered.append) == ["h", None] and registered == [object]
    assert encode(math, no_handles) == ["m", "math"]


@pytest.mark.parametrize(
    "wire",
    [
        "not a list",
        [],
        ["i"],
        ["i", 12],
        ["i", "zz"],
        ["b", 1],
        ["f", "nope"],
        ["y", "!!!"],
        ["l", "abc"],
        ["d", [[["l", []], ["n"]]]],  # an unhashable key
        ["L", "[[1]]"],
        ["L", "[" + "1" * 5000 + "]"],
        ["L", "[" * 100000 + "]" * 100000],
        ["m", "not_a_stdlib_module_xyz"],
        ["m", 5],
        ["h", "1"],
        ["?"],
    ],
)
def test_malformed_wire_values_are_protocol_errors(wire: object) -> None:
    with pytest.raises(ProtocolError):
        decode(wire, lambda handle: handle)


def test_values_nested_too_deeply_are_refused_both_ways() -> None:
    deep: list = []
    for _ in range(500):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        encode(deep, no_handles)
    wire: list = ["n"]
    for _ in range(500):
        wire = ["l", [wire]]
    with pytest.raises(ProtocolError):
        decode(wire, no_handles)


def test_an_argument_changed_in_place_is_changed_in_place_in_the_judge() -> None:
    matrix = [[1, 2], [3, 4]]
    row = matrix[0]
    _sync(matrix, [[9, 2], [3, 4]])
    assert matrix == [[9, 2], [3, 4]] and matrix[0] is row
    items = [1, 2, 3]
    _sync(items, [3])
    assert items == [3]
    table, seen = {"a": 1}, {1}
    _sync(table, {"b": 2})
    _sync(seen, {2, 3})
    assert table == {"b": 2} and seen == {2, 3}


def test_a_handle_refuses_comparison_with_plain_data() -> None:
    handle = Remote(link=None, handle=1)
    with pytest.raises(TypeError, match="not plain data"):
        _ = handle == 3
    with pytest.raises(TypeError, match="not plain data"):
        _ = [handle] == [3]
