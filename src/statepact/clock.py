"""The one clock of statepact.

Leases, backoff, expiry and ``created_at``/``updated_at`` read the injected
:class:`Clock`, never the server's ``TIME``: each worker brings its own clock, so
a conformance suite can move time with :class:`ManualClock`. The fronts read it
through :func:`read_clock`, which holds every clock to the protocol (aware, in
UTC) once, so no backing sees a naive time. This module must never read time
any other way.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock", "from_micros", "read_clock", "to_micros"]


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


def read_clock(clock: Clock) -> datetime:
    """``clock.now()``, held to the protocol: a timezone-aware ``datetime``, returned in UTC.

    A naive reading (or one whose ``tzinfo`` gives no offset) raises ``ValueError``, anything
    but a ``datetime`` ``TypeError``, both naming the clock; an aware reading in another zone
    is the same instant, converted to UTC. Every front reads its clock through this, before
    anything is sent, so each backing stores the same instant the same way.
    """
    moment = clock.now()
    name = type(clock).__name__
    if not isinstance(moment, datetime):
        raise TypeError(
            f"clock: {name}.now() returned a {type(moment).__name__}, not a datetime; "
            "a Clock returns timezone-aware datetimes in UTC, such as datetime.now(UTC)"
        )
    if moment.utcoffset() is None:
        raise ValueError(
            f"clock: {name}.now() returned a naive datetime ({moment.isoformat()}); "
            "a Clock returns timezone-aware datetimes in UTC, such as datetime.now(UTC)"
        )
    return moment.astimezone(UTC)


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
