"""The storage protocol under ``StatepactSessionService``: what each backing module implements.

The service (``service.py``) validates and encodes everything, reads the clock and
decides every outcome a caller sees; a store gets checked requests and answers with
outcomes (``Stale``, ``LeaseHeld``, ``None`` for a missing session), never with an
ADK error. State values travel as their JSON text, one per key, and events as the
JSON ADK's ``model_dump_json`` wrote. Semantics: docs/agent-frameworks.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from statepact.errors import StatePersistenceError
from statepact.state import CounterOverflow

__all__ = [
    "Appended",
    "CounterOverflow",
    "CreatedSession",
    "EventsQuery",
    "LeaseHeld",
    "LeaseHold",
    "LeaseLost",
    "LeaseRequest",
    "NewEvent",
    "NewSession",
    "SessionKey",
    "SessionStore",
    "SessionsQuery",
    "Stale",
    "StateWrite",
    "StoredSession",
    "UsageDelta",
    "UsageTotals",
    "run_id_of",
    "unavailable",
]

#: A state scope as stored: key -> the JSON text of its value.
Encoded = dict[str, str]


def run_id_of(user: str, session: str) -> str:
    """The statepact run holding an ADK session's counters: ``adk:<bytes>:<user>:<session>``
    (the user's UTF-8 length first, so no two (user, session) pairs share one)."""
    return f"adk:{len(user.encode('utf-8'))}:{user}:{session}"


def unavailable(message: str) -> StatePersistenceError:
    """The error of a server that stayed down past the backing's failover budget."""
    return StatePersistenceError(message, reason="unavailable")


#: What every run id of the service starts with.
RUN_PREFIX = "adk:"


@dataclass(frozen=True, slots=True)
class SessionKey:
    app: str
    user: str
    session: str

    @property
    def run_id(self) -> str:
        return run_id_of(self.user, self.session)


@dataclass(frozen=True, slots=True)
class StateWrite:
    """Checked state, split by scope (the ``app:``/``user:`` prefixes removed, ``temp:`` gone)."""

    session: Encoded = field(default_factory=dict)
    app: Encoded = field(default_factory=dict)
    user: Encoded = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NewSession:
    key: SessionKey
    state: StateWrite
    last_update_time: float
    run_data: bytes
    now: datetime
    op_id: str


@dataclass(frozen=True, slots=True)
class CreatedSession:
    seq: int
    app_state: Encoded
    user_state: Encoded


@dataclass(frozen=True, slots=True)
class UsageDelta:
    input_tokens: int = 0
    output_tokens: int = 0
    iterations: int = 0


@dataclass(frozen=True, slots=True)
class LeaseHold:
    owner: str
    token: int


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An append: taken if the session is at ``expected`` (and, when a lease is live,
    ``lease`` is it); the event's seq is then the session's new version ``expected + 1``."""

    key: SessionKey
    expected: int
    lease: LeaseHold | None
    event: str
    event_id: str
    timestamp: float
    delta: StateWrite
    usage: UsageDelta
    now: datetime
    op_id: str


@dataclass(frozen=True, slots=True)
class Appended:
    version: int


@dataclass(frozen=True, slots=True)
class Stale:
    version: int


@dataclass(frozen=True, slots=True)
class LeaseHeld:
    owner: str


@dataclass(frozen=True, slots=True)
class LeaseLost:
    pass


@dataclass(frozen=True, slots=True)
class EventsQuery:
    """``recent``: the most recent events wanted (None: all); ``after``: only the events
    after the newest one whose timestamp is below it (None: no such cut)."""

    key: SessionKey
    recent: int | None
    after: float | None


@dataclass(frozen=True, slots=True)
class SessionsQuery:
    app: str
    user: str | None
    after_seq: int
    limit: int


@dataclass(frozen=True, slots=True)
class StoredSession:
    key: SessionKey
    seq: int
    version: int
    last_update_time: float
    state: Encoded
    app_state: Encoded
    user_state: Encoded
    events: list[str]


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    key: SessionKey
    owner: str
    token: int
    now: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class UsageTotals:
    sessions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanos: int = 0
    iterations: int = 0
    cursor: int = 0


class SessionStore(Protocol):
    """One backing's storage of ADK sessions; every call is atomic on its own."""

    async def check(self) -> None:
        """Refuse (``SchemaVersionError``, naming the fix) storage that is not ready."""
        ...

    async def create(self, new: NewSession) -> CreatedSession | None:
        """Create the session, its state, its run (unless one exists) and apply its app and
        user state; ``None`` (nothing written) when the session exists."""
        ...

    async def get(self, query: EventsQuery) -> StoredSession | None: ...

    async def append(
        self, new: NewEvent
    ) -> Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None:
        """Append the event, apply every scope's delta and add ``usage`` to the run's
        counters (cursor one more) in one atomic step, or write nothing: ``None`` when the
        session does not exist. A resend of an append that was applied answers
        ``Appended``."""
        ...

    async def delete(self, key: SessionKey) -> bool:
        """Remove the session, its state and its events; the run stays."""
        ...

    async def page(self, query: SessionsQuery) -> list[StoredSession]:
        """Up to ``limit + 1`` sessions with seq above ``after_seq``, in seq order, no events."""
        ...

    async def user_state(self, app: str, user: str) -> Encoded: ...

    async def events(
        self, key: SessionKey, after_seq: int, limit: int
    ) -> list[tuple[int, str]] | None:
        """Up to ``limit`` events (seq, JSON) with seq above ``after_seq``; None: no session."""
        ...

    async def usage(self, app: str, user: str | None) -> UsageTotals:
        """The sums of the counters of the service's runs of ``app`` (of ``user``)."""
        ...

    async def acquire_lease(self, request: LeaseRequest) -> int | LeaseHeld | None:
        """A new token, or who holds the live lease; ``None`` when there is no session."""
        ...

    async def renew_lease(self, request: LeaseRequest) -> bool: ...

    async def release_lease(self, request: LeaseRequest) -> bool: ...

    async def prune_sessions(self, app: str, cutoff: datetime, limit: int) -> int:
        """Remove up to ``limit`` sessions last written before ``cutoff``, oldest first."""
        ...

    async def prune_events(self, app: str, cutoff: float, limit: int) -> int:
        """Remove up to ``limit`` events, each session's oldest first while their timestamp
        is below ``cutoff``."""
        ...
