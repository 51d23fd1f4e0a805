"""The plain-data codec between an assert test's judge and its program (`code_server/remote_calls.py`): exact
round trips for every plain type, and a `ProtocolError` (never another exception, never a value that
compares equal to everything) for whatever a hostile program might send instead."""

from __future__ import annotations

import decimal
import fractions
import json
import math
import sys
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple

import pytest

from code_server.remote_calls import MAX_DEPTH, ProtocolError, Remote, Undecidable, _sync, decode, encode


def no_handles(*value: object) -> list:
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
    point = round_trip(Point(1, 2))
    assert point == (1, 2) and point.x == 1 and point._fields == ("x", "y") and type(point) is not Point
    assert round_trip(Counter("aab")) == Counter("aab") and type(round_trip(Counter("aab"))) is Counter
    assert type(round_trip(OrderedDict(a=1))) is OrderedDict
    table = round_trip(defaultdict(list, a=[1]))
    assert type(table) is defaultdict and table.default_factory is list and table["b"] == []
    queue = round_trip(deque([1, 2], maxlen=3))
    assert type(queue) is deque and queue == deque([1, 2]) and queue.maxlen == 3

    class Sly(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert round_trip(Sly(3)) == 3 and round_trip(Sly(3)) != 4


def test_other_objects_become_handles_and_modules_names() -> None:
    class Mine:
        pass

    mine, registered = Mine(), []
    assert encode(mine, lambda obj: registered.append(obj) or ["h", 7]) == ["h", 7] and registered == [mine]
    assert encode(math, no_handles) == ["m", "math"]
    # What a trusted module holds travels by name, and the judge takes its own copy.
    assert encode(math.isclose, no_handles) == ["o", "math", "isclose"]
    assert encode(fractions.Fraction, no_handles) == ["o", "fractions", "Fraction"]
    assert decode(["o", "math", "isclose"], no_handles) is math.isclose


def test_exceptions_arrive_as_classes_of_their_built_in_base() -> None:
    class InvalidInput(ValueError):
        pass

    wire = json.loads(json.dumps(encode(InvalidInput, no_handles)))
    assert wire == ["E", "InvalidInput", "ValueError"]
    classes: dict = {}
    judged = decode(wire, no_handles, classes)
    assert issubclass(judged, ValueError) and judged.__name__ == "InvalidInput"
    assert decode(wire, no_handles, classes) is judged  # one class per test: `except InvalidInput` catches it
    assert decode(["E", "KeyError", "KeyError"], no_handles) is KeyError


def test_numpy_arrays_keep_dtype_and_shape() -> None:
    numpy = pytest.importorskip("numpy")
    array = numpy.arange(6, dtype=numpy.int32).reshape(2, 3)
    back = round_trip(array)
    assert type(back) is numpy.ndarray and back.dtype == numpy.int32 and back.shape == (2, 3)
    assert (back == array).all()
    with pytest.raises(ProtocolError):
        decode(["A", "<i8", [2, 2], ["L", "[1, 2, 3]"]], no_handles)
    with pytest.raises(ProtocolError):
        decode(["A", "|O", [1], ["L", "[1]"]], no_handles)


@pytest.mark.parametrize(
    "wire",
    [
        ["i", "0x" + "f" * (1 << 17)],  # an int past the judge's bound
        ["q", "0x" + "f" * (1 << 15), "0x3"],  # a fraction whose gcd would burn the judge's CPU
        ["D", "1" * (1 << 15)],
        ["o", "os", "system.__call__"],
        ["o", "not_a_module_xyz", "f"],
        ["o", "antigravity", "fly"],
        ["E", "Mine", "NotABuiltin"],
        ["E", "not an identifier", "ValueError"],
        ["N", "P", ["_x"], [["n"]]],
        ["DD", "print", []],
    ],
)
def test_values_past_the_judges_bounds_are_protocol_errors(wire: object) -> None:
    with pytest.raises(ProtocolError):
        decode(wire, no_handles)


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
        decode(wire, lambda tag, handle: handle)


def test_values_nested_too_deeply_are_refused_both_ways() -> None:
    # Both processes raise their recursion limit to carry MAX_DEPTH (a linked list as nested lists).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(4 * MAX_DEPTH + 500)
    try:
        deep: list = []
        for _ in range(MAX_DEPTH - 10):
            deep = [deep]
        assert round_trip(deep) == deep
        for _ in range(20):
            deep = [deep]
        with pytest.raises(ValueError, match="nested deeper"):
            encode(deep, no_handles)
        wire: list = ["n"]
        for _ in range(MAX_DEPTH + 10):
            wire = ["l", [wire]]
        with pytest.raises(ProtocolError):
            decode(wire, no_handles)
    finally:
        sys.setrecursionlimit(limit)


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


def test_a_handle_refuses_comparison_hash_and_ordering() -> None:
    handle = Remote(link=None, handle=1)
    # Undecidable, never a TypeError, which a test could expect and catch
    with pytest.raises(Undecidable, match="not plain data"):
        _ = handle == 3
    with pytest.raises(Undecidable, match="not plain data"):
        _ = [handle] == [3]
    with pytest.raises(Undecidable, match="no hash"):
        _ = handle in {None, -1}
    with pytest.raises(Undecidable):
        _ = handle < 3
    with pytest.raises(Undecidable):
        _ = 3 >= handle  # noqa: SIM300 - the reflected operator, asked of the handle by int
