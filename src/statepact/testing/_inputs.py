"""Inputs the three conformance suites share: the JSON rule's cases, hostile decimal contexts
and clocks that break the ``Clock`` protocol.

One table, so the state, queue and transaction suites (and the fuzz lane) test the same rule
(docs/state-store.md, "What a JSON value may be"): every backing stores an accepted value as
the plain JSON it stands for and refuses the rest with ``ValueError`` naming where it is.
"""

from __future__ import annotations

import enum
import types
from collections import ChainMap, OrderedDict, UserDict, UserList, UserString, defaultdict, deque
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import (
    ROUND_DOWN,
    Clamped,
    Context,
    Decimal,
    Inexact,
    Overflow,
    Rounded,
    Subnormal,
    Underflow,
)
from fractions import Fraction
from typing import Any, NamedTuple

import pytest

__all__ = [
    "ACCEPTED_JSON",
    "AWARE_ELSEWHERE",
    "BROKEN_CLOCK_READINGS",
    "EACH_ACCEPTED_JSON",
    "EACH_BROKEN_CLOCK",
    "EACH_HOSTILE_DECIMAL_CONTEXT",
    "EACH_REFUSED_JSON",
    "HOSTILE_DECIMAL_CONTEXTS",
    "REFUSED_JSON",
    "Colour",
    "LyingFloat",
    "LyingInt",
    "LyingText",
    "Mood",
    "assert_plain_json",
    "assert_refused_at",
]


class LyingText(str):
    """A ``str`` subclass whose ``__str__`` lies: the stored text must be the string's own."""

    def __str__(self) -> str:
        return "not me"


class LyingInt(int):
    """An ``int`` subclass whose ``__repr__`` and ``__str__`` lie."""

    def __repr__(self) -> str:
        return "not me"

    __str__ = __repr__


class LyingFloat(float):
    """A ``float`` subclass whose ``__repr__`` lies."""

    def __repr__(self) -> str:
        return "not me"


class Colour(enum.IntEnum):
    RED = 1


class Mood(enum.StrEnum):
    CALM = "calm"


class _Pair(NamedTuple):
    x: int
    y: int


class _KeyTwice(Mapping[str, int]):
    """A mapping that yields one key twice: a JSON object cannot hold both."""

    def __getitem__(self, key: str) -> int:
        return 1

    def __iter__(self) -> Iterator[str]:
        yield "k"
        yield "k"

    def __len__(self) -> int:
        return 2


def _deep(levels: int) -> Any:
    value: Any = 1
    for level in range(levels):
        value = types.MappingProxyType({"d": value}) if level % 2 else (value,)
    return value


def _cycle() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


#: ``(id, value, what a read gives back)``: accepted anywhere a JSON value goes.
ACCEPTED_JSON: list[tuple[str, Any, Any]] = [
    ("mappingproxy", types.MappingProxyType({"b": 1}), {"b": 1}),
    ("ordereddict", OrderedDict([("z", 1), ("a", [2])]), {"z": 1, "a": [2]}),
    ("defaultdict", defaultdict(list, {"k": [1]}), {"k": [1]}),
    ("userdict", UserDict({"u": {"v": None}}), {"u": {"v": None}}),
    ("chainmap", ChainMap({"a": 1}, {"a": 2, "b": 3}), {"a": 1, "b": 3}),
    ("tuple", (1, "two", None, (3.5,)), [1, "two", None, [3.5]]),
    ("namedtuple", _Pair(1, 2), [1, 2]),
    ("str-subclass", LyingText("text"), "text"),
    ("strenum", Mood.CALM, "calm"),
    ("str-subclass-key", {LyingText("key"): 1}, {"key": 1}),
    ("int-subclass", LyingInt(7), 7),
    ("intenum", Colour.RED, 1),
    ("bool", True, True),
    ("float-subclass", LyingFloat(2.5), 2.5),
    ("int-128-bits", 2**128 - 1, 2**128 - 1),
    ("negative-int-128-bits", -(2**128 - 1), -(2**128 - 1)),
    ("mappingproxy-of-tuples", types.MappingProxyType({"t": ((1,), [2])}), {"t": [[1], [2]]}),
]

#: ``(id, value, words the error says)``: refused with ``ValueError`` naming the path.
REFUSED_JSON: list[tuple[str, Any, str]] = [
    ("set", {1}, "set"),
    ("frozenset", frozenset({1}), "frozenset"),
    ("deque", deque([1]), "deque"),
    ("userlist", UserList([1]), "UserList"),
    ("userstring", UserString("a"), "UserString"),
    ("range", range(3), "range"),
    ("bytes", b"x", "bytes"),
    ("bytearray", bytearray(b"x"), "bytearray"),
    ("memoryview", memoryview(b"x"), "memoryview"),
    ("decimal", Decimal("1.5"), "Decimal"),
    ("fraction", Fraction(1, 3), "Fraction"),
    ("complex", complex(1, 2), "complex"),
    ("datetime", datetime(2026, 1, 1, tzinfo=UTC), "datetime"),
    ("object", object(), "object"),
    ("int-129-bits", 2**128, "too large"),
    ("negative-int-129-bits", -(2**128), "too large"),
    ("int-400-digits", 10**400, "too large"),
    ("nan", float("nan"), "nan"),
    ("inf-in-mappingproxy", types.MappingProxyType({"x": float("inf")}), "inf"),
    ("nan-in-tuple", (1, float("nan")), "nan"),
    ("nan-float-subclass", LyingFloat("nan"), "nan"),
    ("lone-surrogate", "a\ud800b", "Unicode"),
    ("lone-surrogate-key", {"\udfff": 1}, "Unicode"),
    ("nul", "a\x00b", "NUL"),
    ("nul-key", {"a\x00": 1}, "NUL"),
    ("int-key-in-mappingproxy", types.MappingProxyType({1: "x"}), "key"),
    ("none-key", {None: 1}, "key"),
    ("tuple-key", {(1, 2): 1}, "key"),
    ("key-twice", _KeyTwice(), "twice"),
    ("too-deep", _deep(130), "deeper"),
    ("cycle", _cycle(), "deeper"),
]


def assert_plain_json(value: Any, where: str = "value") -> None:
    """``value`` holds only what ``json.loads`` makes: dict, list, str, int, float, bool, None."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r} is a {type(key).__name__}"
            assert_plain_json(item, f"{where}[{key!r}]")
    elif kind is list:
        for index, item in enumerate(value):
            assert_plain_json(item, f"{where}[{index}]")
    else:
        assert kind in (str, int, float, bool, type(None)), f"{where}: a {kind.__name__}"


#: Decimal contexts a caller may have set; a cost must stay exact to 1e-9 under each.
HOSTILE_DECIMAL_CONTEXTS: list[tuple[str, Context]] = [
    ("prec-9", Context(prec=9)),
    ("prec-3-round-down-traps", Context(prec=3, rounding=ROUND_DOWN, traps=[Inexact, Rounded])),
    (
        "tiny-emax",
        Context(prec=28, Emax=2, Emin=-2, traps=[Overflow, Underflow, Subnormal, Clamped]),
    ),
    ("lowercase-e", Context(prec=12, capitals=0, clamp=1)),
]

#: ``(id, what a broken clock's now() returns, the error)``.
BROKEN_CLOCK_READINGS: list[tuple[str, Any, type[Exception]]] = [
    ("naive-datetime", datetime(2026, 1, 1, 12, 0), ValueError),  # noqa: DTZ001 - the point
    ("iso-string", "2026-01-01T00:00:00+00:00", TypeError),
    ("date", date(2026, 1, 1), TypeError),
    ("epoch-float", 1_767_225_600.0, TypeError),
    ("none", None, TypeError),
]

#: An aware reading in another zone: accepted, and stored as the same instant in UTC.
AWARE_ELSEWHERE = datetime(2026, 1, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))


def _each(names: str | tuple[str, ...], cases: list[Any]) -> pytest.MarkDecorator:
    """A parametrize mark over ``(id, *values)`` cases, the id naming each."""
    return pytest.mark.parametrize(
        names, [case[1:] if len(case) > 2 else case[1] for case in cases], ids=[c[0] for c in cases]
    )


#: ``@EACH_ACCEPTED_JSON`` gives a test ``value`` and ``stored`` (what a read gives back).
EACH_ACCEPTED_JSON = _each(("value", "stored"), ACCEPTED_JSON)
#: ``@EACH_REFUSED_JSON`` gives a test ``value`` and ``says`` (words the refusal holds).
EACH_REFUSED_JSON = _each(("value", "says"), REFUSED_JSON)
#: ``@EACH_HOSTILE_DECIMAL_CONTEXT`` gives a test ``context``.
EACH_HOSTILE_DECIMAL_CONTEXT = _each("context", HOSTILE_DECIMAL_CONTEXTS)
#: ``@EACH_BROKEN_CLOCK`` gives a test ``reading`` and ``error``.
EACH_BROKEN_CLOCK = _each(("reading", "error"), BROKEN_CLOCK_READINGS)


def assert_refused_at(refusal: BaseException, path: str, says: str) -> None:
    """The refusal is a ValueError whose message starts with ``path`` and holds ``says``."""
    message = str(refusal)
    assert isinstance(refusal, ValueError), repr(refusal)
    assert message.startswith(path), message
    assert says.lower() in message.lower(), message
