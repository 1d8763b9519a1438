"""The one clock of statepact.

Leases, backoff, expiry and ``created_at``/``updated_at`` read the injected
:class:`Clock`, never the server's ``TIME``: each worker brings its own clock, so
a conformance suite can move time with :class:`ManualClock`. This module must
never read time any other way.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "from_micros", "to_micros"]


@runtime_checkable
class Clock(Protocol):
    """A source of the current time."""

    def now(self) -> datetime:
        """Return the current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The wall clock of this process (``datetime.now(UTC)``)."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("start: ManualClock needs a timezone-aware datetime")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move the clock forward and return the new time; refuses going backwards."""
        delta = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        if delta < timedelta(0):
            raise ValueError("seconds: a ManualClock only moves forward")
        self._now += delta
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()})"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(moment: datetime) -> int:
    """Microseconds since the Unix epoch; exact, for storing times as integers."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no place here; use a timezone-aware one")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The inverse of :func:`to_micros`."""
    return _EPOCH + timedelta(microseconds=micros)
