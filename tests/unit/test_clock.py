"""The one clock: ManualClock moves only forward, times are UTC, micros round-trip exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest

from statepact.clock import (
    Clock,
    ManualClock,
    SystemClock,
    from_micros,
    read_clock,
    to_micros,
)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock()
    start = clock.now()
    assert start == datetime(2026, 1, 1, tzinfo=UTC)
    assert clock.now() == start
    assert clock.advance(1.5) == start + timedelta(seconds=1.5)
    assert clock.advance(timedelta(minutes=1)) == start + timedelta(seconds=61.5)
    assert clock.now() == start + timedelta(seconds=61.5)


def test_manual_clock_refuses_going_back() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="seconds"):
        clock.advance(-1)
    assert clock.now() == datetime(2026, 1, 1, tzinfo=UTC)


def test_manual_clock_is_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    clock = ManualClock(datetime(2026, 5, 1, 12, tzinfo=plus_two))
    assert clock.now() == datetime(2026, 5, 1, 10, tzinfo=UTC)
    assert clock.now().utcoffset() == timedelta(0)
    with pytest.raises(ValueError, match="timezone-aware"):
        ManualClock(datetime(2026, 1, 1))


def test_both_clocks_are_clocks() -> None:
    assert isinstance(ManualClock(), Clock)
    assert isinstance(SystemClock(), Clock)
    assert SystemClock().now().tzinfo is not None


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ],
)
def test_micros_round_trip(moment: datetime) -> None:
    assert from_micros(to_micros(moment)) == moment


def test_to_micros_refuses_naive_times() -> None:
    assert to_micros(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1_000_000
    with pytest.raises(ValueError, match="naive"):
        to_micros(datetime(2026, 1, 1))


class _Reads:
    def __init__(self, reading: object) -> None:
        self.reading = reading

    def now(self) -> datetime:
        return self.reading  # type: ignore[return-value]


class _NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None


def test_read_clock_returns_utc() -> None:
    moment = datetime(2026, 1, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    read = read_clock(_Reads(moment))
    assert read == moment
    assert read.tzinfo is UTC
    manual = ManualClock()
    assert read_clock(manual) == manual.now()


@pytest.mark.parametrize(
    ("reading", "error", "says"),
    [
        (datetime(2026, 1, 1), ValueError, "a naive datetime"),
        (datetime(2026, 1, 1, tzinfo=_NoOffset()), ValueError, "a naive datetime"),
        ("2026-01-01T00:00:00Z", TypeError, "a str, not a datetime"),
        (None, TypeError, "a NoneType"),
    ],
)
def test_read_clock_refuses_naming_the_clock(
    reading: object, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=f"^clock: _Reads.now\\(\\) returned {says}"):
        read_clock(_Reads(reading))
