"""ADK sessions in this process, beside a ``MemoryStateStore``: the reference store.

One ``MemorySessions`` per memory backing (every service opened on it shares it).
Each call runs in one step of the event loop, so it is atomic without a lock: the
run's counters move through the state store's own ``patch_run`` in the same step.
The rules it pins for the other stores: docs/agent-frameworks.md.

It must never await anything that suspends inside a call.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from statepact._codec import decimal_to_nanos, decode_json
from statepact._limits import MAX_COUNTER, MAX_PAGE
from statepact.errors import StateConflictError
from statepact.integrations.adk._store import (
    RUN_PREFIX,
    Appended,
    CounterOverflow,
    CreatedSession,
    Encoded,
    EventsQuery,
    LeaseHeld,
    LeaseLost,
    LeaseRequest,
    NewEvent,
    NewSession,
    SessionKey,
    SessionsQuery,
    Stale,
    StoredSession,
    UsageTotals,
)
from statepact.models import RunRecord, RunStatus
from statepact.state import StateStore

__all__ = ["MemorySessions"]


@dataclass(slots=True)
class _Session:
    seq: int
    version: int
    state: Encoded
    last_update_time: float
    updated_at: datetime
    # (seq, timestamp, JSON), oldest first
    events: list[tuple[int, float, str]] = field(default_factory=list)
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires: datetime | None = None

    def holder(self, now: datetime) -> str | None:
        live = self.lease_expires is not None and self.lease_expires > now
        return self.lease_owner if live else None


_STORES: weakref.WeakKeyDictionary[Any, MemorySessions] = weakref.WeakKeyDictionary()


class MemorySessions:
    """The sessions of one memory backing; its runs are its ``MemoryStateStore``'s."""

    def __init__(self, state: StateStore) -> None:
        self._state = state
        self._sessions: dict[SessionKey, _Session] = {}
        self._apps: dict[str, Encoded] = {}
        self._users: dict[tuple[str, str], Encoded] = {}
        self._seq = 0

    @classmethod
    def of(cls, state: StateStore) -> MemorySessions:
        """The sessions beside ``state`` (made on first use)."""
        found = _STORES.get(state)
        if found is None:
            found = _STORES[state] = cls(state)
        return found

    async def check(self) -> None:
        return None

    def _stored(self, key: SessionKey, session: _Session, events: list[str]) -> StoredSession:
        return StoredSession(
            key=key,
            seq=session.seq,
            version=session.version,
            last_update_time=session.last_update_time,
            state=dict(session.state),
            app_state=dict(self._apps.get(key.app, {})),
            user_state=dict(self._users.get((key.app, key.user), {})),
            events=events,
        )

    async def create(self, new: NewSession) -> CreatedSession | None:
        key = new.key
        if key in self._sessions:
            return None
        self._seq += 1
        self._sessions[key] = _Session(
            seq=self._seq,
            version=1,
            state=dict(new.state.session),
            last_update_time=new.last_update_time,
            updated_at=new.now,
        )
        app = self._apps.setdefault(key.app, {})
        app.update(new.state.app)
        user = self._users.setdefault((key.app, key.user), {})
        user.update(new.state.user)
        if await self._state.get_run(key.app, key.run_id) is None:
            record = RunRecord(
                tenant=key.app,
                run_id=key.run_id,
                session_id=key.user,
                status=RunStatus.RUNNING,
                data=decode_json(new.run_data),
            )
            try:
                await self._state.put_run(record)
            except StateConflictError:  # pragma: no cover - nothing suspends in between
                pass
        return CreatedSession(seq=self._seq, app_state=dict(app), user_state=dict(user))

    async def get(self, query: EventsQuery) -> StoredSession | None:
        session = self._sessions.get(query.key)
        if session is None:
            return None
        events = session.events
        start = 0
        if query.recent is not None:
            start = max(0, len(events) - query.recent)
        if query.after is not None:
            for index in range(len(events) - 1, start - 1, -1):
                if events[index][1] < query.after:
                    start = index + 1
                    break
        return self._stored(query.key, session, [data for _, _, data in events[start:]])

    async def append(
        self, new: NewEvent
    ) -> Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None:
        session = self._sessions.get(new.key)
        if session is None:
            return None
        holder = session.holder(new.now)
        if new.lease is not None:
            if holder != new.lease.owner or session.lease_token != new.lease.token:
                return LeaseLost()
        elif holder is not None:
            return LeaseHeld(holder)
        if session.version != new.expected:
            return Stale(session.version)
        run = await self._state.get_run(new.key.app, new.key.run_id)
        if run is not None:
            usage = new.usage
            deltas = (
                ("input_tokens", run.input_tokens, usage.input_tokens),
                ("output_tokens", run.output_tokens, usage.output_tokens),
                ("iterations", run.iterations, usage.iterations),
                ("cursor", run.cursor, 1),
            )
            for name, stored, delta in deltas:
                if stored + delta > MAX_COUNTER:
                    return CounterOverflow(name)
            await self._state.patch_run(
                new.key.app,
                new.key.run_id,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                iterations=usage.iterations,
                cursor=1,
            )
        session.version += 1
        session.state.update(new.delta.session)
        if new.delta.app:
            self._apps.setdefault(new.key.app, {}).update(new.delta.app)
        if new.delta.user:
            self._users.setdefault((new.key.app, new.key.user), {}).update(new.delta.user)
        session.events.append((session.version, new.timestamp, new.event))
        session.last_update_time = new.timestamp
        session.updated_at = new.now
        return Appended(session.version)

    async def delete(self, key: SessionKey) -> bool:
        return self._sessions.pop(key, None) is not None

    async def page(self, query: SessionsQuery) -> list[StoredSession]:
        found = sorted(
            (session.seq, key, session)
            for key, session in self._sessions.items()
            if key.app == query.app
            and (query.user is None or key.user == query.user)
            and session.seq > query.after_seq
        )
        return [self._stored(key, session, []) for _, key, session in found[: query.limit + 1]]

    async def user_state(self, app: str, user: str) -> Encoded:
        return dict(self._users.get((app, user), {}))

    async def events(
        self, key: SessionKey, after_seq: int, limit: int
    ) -> list[tuple[int, str]] | None:
        session = self._sessions.get(key)
        if session is None:
            return None
        later = [(seq, data) for seq, _, data in session.events if seq > after_seq]
        return later[:limit]

    async def usage(self, app: str, user: str | None) -> UsageTotals:
        totals = [0, 0, 0, 0, 0, 0]
        after: str | None = None
        while True:
            page = await self._state.list_runs(app, session_id=user, limit=MAX_PAGE, after=after)
            for run in page.items:
                if run.run_id.startswith(RUN_PREFIX):
                    counted = (
                        1,
                        run.input_tokens,
                        run.output_tokens,
                        decimal_to_nanos(run.cost),
                        run.iterations,
                        run.cursor,
                    )
                    totals = [a + b for a, b in zip(totals, counted, strict=True)]
            if page.next is None:
                break
            after = page.next
        return UsageTotals(*totals)

    async def acquire_lease(self, request: LeaseRequest) -> int | LeaseHeld | None:
        session = self._sessions.get(request.key)
        if session is None:
            return None
        holder = session.holder(request.now)
        if holder is not None and holder != request.owner:
            return LeaseHeld(holder)
        session.lease_token += 1
        session.lease_owner = request.owner
        session.lease_expires = request.expires_at
        return session.lease_token

    def _holds(self, request: LeaseRequest) -> _Session | None:
        session = self._sessions.get(request.key)
        if session is None or session.lease_owner != request.owner:
            return None
        return session if session.lease_token == request.token else None

    async def renew_lease(self, request: LeaseRequest) -> bool:
        session = self._holds(request)
        if session is None or session.holder(request.now) is None:
            return False
        session.lease_expires = request.expires_at
        return True

    async def release_lease(self, request: LeaseRequest) -> bool:
        session = self._holds(request)
        if session is None:
            return False
        session.lease_owner = session.lease_expires = None
        return True

    async def prune_sessions(self, app: str, cutoff: datetime, limit: int) -> int:
        idle = sorted(
            (session.updated_at, session.seq, key)
            for key, session in self._sessions.items()
            if key.app == app and session.updated_at < cutoff
        )
        for _, _, key in idle[:limit]:
            del self._sessions[key]
        return min(limit, len(idle))

    async def prune_events(self, app: str, cutoff: float, limit: int) -> int:
        heads = sorted(
            (session.events[0][1], session.seq, key)
            for key, session in self._sessions.items()
            if key.app == app and session.events and session.events[0][1] < cutoff
        )
        removed = 0
        for _, _, key in heads:
            events = self._sessions[key].events
            count = 0
            while count < len(events) and events[count][1] < cutoff and removed < limit:
                count += 1
                removed += 1
            del events[:count]
            if removed >= limit:
                break
        return removed
