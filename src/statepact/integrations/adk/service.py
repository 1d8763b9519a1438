"""``StatepactSessionService``: Google ADK's ``BaseSessionService`` on a statepact ``Backing``.

The front of the integration: it validates and encodes every argument once,
splits state by scope (``app:``, ``user:``, the session's; ``temp:`` never
stored), reads the backing's clock, and turns a store's outcome into what ADK
callers expect (``AlreadyExistsError``, ``SessionNotFoundError``, a stale
append's ``SessionConflictError``). The store underneath is the backing's own
module (``_memory``, ``_redis``, ``_postgres``), imported only for the backing
given. Mapping, costs and conflicts: docs/agent-frameworks.md.

This module must never talk to a server itself, and never read time but
through the backing's clock.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Self

from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic_core import PydanticSerializationError

from statepact._codec import (
    check_size,
    nanos_to_decimal,
    plain_json,
    require_limit,
    require_seconds,
    utf8_size,
)
from statepact._limits import MAX_COUNTER, MAX_PAGE
from statepact._retry import new_op_id
from statepact.clock import Clock, read_clock
from statepact.errors import LeaseLostError
from statepact.integrations.adk._store import (
    Appended,
    CounterOverflow,
    EventsQuery,
    LeaseHeld,
    LeaseHold,
    LeaseLost,
    NewEvent,
    NewSession,
    SessionKey,
    SessionsQuery,
    SessionStore,
    Stale,
    StoredSession,
    run_id_of,
)
from statepact.integrations.adk._values import (
    adk_id,
    adk_session_id,
    check_scopes,
    cursor,
    decoded,
    mark,
    marked,
    require_lease,
    split,
    usage_of,
)
from statepact.integrations.adk.errors import SessionConflictError, SessionLeasedError
from statepact.integrations.adk.leases import SessionLeases
from statepact.integrations.adk.models import EventPage, SessionLease, SessionPage, SessionUsage
from statepact.storage import Backing

__all__ = ["StatepactSessionService"]

#: How far back a re-delivered event is looked for among the session's own events.
_REDELIVERY_WINDOW = 32


class StatepactSessionService(BaseSessionService):
    """ADK sessions, their events and their ``app:``/``user:``/session state on statepact.

    Build it with ``await StatepactSessionService.open(backing)``. An ADK app is a
    statepact tenant; each ADK session has a statepact run
    (:meth:`run_id`, statepact session = the ADK user) whose counters its events'
    ``usage_metadata`` feed. Every append is one atomic step that holds the
    session's version: a ``Session`` read before another append was stored gets
    :class:`SessionConflictError`. See docs/agent-frameworks.md.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        clock: Clock,
        max_value_bytes: int,
        lease: SessionLease | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._max_value_bytes = max_value_bytes
        self._lease = lease

    @classmethod
    async def open(cls, backing: Backing[Any, Any, Any]) -> Self:
        """The service on ``backing`` (memory, Redis or PostgreSQL), sharing its clock and
        settings. On PostgreSQL it refuses (``SchemaVersionError``) a database without the
        tables of revision ``statepact_0006``: run ``alembic upgrade head`` or
        ``statepact db upgrade`` first; it never creates them."""
        if not isinstance(backing, Backing):
            raise TypeError(f"backing: must be a statepact Backing, got {type(backing).__name__}")
        settings = backing.backend.settings
        # The backing package of the state store's class (or of the statepact class it
        # subclasses): only that backing's module is imported.
        package = next(
            (
                kind.__module__.rsplit(".", 1)[0]
                for kind in type(backing.state).__mro__
                if kind.__module__.startswith("statepact.storage.")
            ),
            type(backing.state).__module__,
        )
        store: SessionStore
        if package == "statepact.storage.memory":
            from statepact.integrations.adk._memory import MemorySessions

            store = MemorySessions.of(backing.state)
        elif package == "statepact.storage.redis":
            from statepact.integrations.adk._redis import RedisSessions

            store = RedisSessions(backing.client, settings)
        elif package == "statepact.storage.postgres":
            from statepact.integrations.adk._postgres import PostgresSessions

            store = PostgresSessions(backing.backend.engine, settings, backing.state.tables)
        else:
            raise TypeError(f"backing: no ADK session store for {package}")
        await store.check()
        return cls(store, clock=backing.state.clock, max_value_bytes=settings.max_value_bytes)

    @staticmethod
    def run_id(user_id: str, session_id: str) -> str:
        """The id of the statepact run (in the app's tenant) holding a session's counters."""
        return run_id_of(adk_id("user_id", user_id), adk_session_id(session_id))

    @property
    def leases(self) -> SessionLeases:
        """Acquire, renew and release sessions' leases (one writer at a time)."""
        return SessionLeases(self._store, self._clock)

    @property
    def lease(self) -> SessionLease | None:
        """The lease this service appends under (:meth:`with_lease`), if any."""
        return self._lease

    def _key(self, app_name: object, user_id: object, session_id: object) -> SessionKey:
        return SessionKey(
            adk_id("app_name", app_name), adk_id("user_id", user_id), adk_session_id(session_id)
        )

    @staticmethod
    def _session(
        stored: StoredSession, events: list[Event], app_state: dict[str, Any] | None = None
    ) -> Session:
        """The ADK ``Session`` of a stored one, marked with its version; ``app_state``: the
        app's, decoded once for a whole page."""
        state = decoded(stored.state)
        state.update(
            decoded(stored.app_state, State.APP_PREFIX) if app_state is None else app_state
        )
        state.update(decoded(stored.user_state, State.USER_PREFIX))
        session = Session(
            id=stored.key.session,
            app_name=stored.key.app,
            user_id=stored.key.user,
            state=state,
            events=events,
            last_update_time=stored.last_update_time,
        )
        mark(session, stored.version)
        return session

    # -- ADK's calls --------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        if isinstance(session_id, str) and not session_id.strip():
            session_id = None  # blank, as no id at all (ADK's reference)
        key = self._key(app_name, user_id, session_id or str(uuid.uuid4()))
        scoped = split(state or {}, "state")
        check_scopes(scoped, self._max_value_bytes, f"session {key.session!r}", "state")
        now = read_clock(self._clock)
        _, run_data = plain_json(
            "run", {"adk": {"app_name": key.app, "user_id": key.user, "session_id": key.session}}
        )
        created = await self._store.create(
            NewSession(
                key=key,
                state=scoped,
                last_update_time=now.timestamp(),
                run_data=run_data,
                now=now,
                op_id=new_op_id(),
            )
        )
        if created is None:
            raise AlreadyExistsError(
                f"Session with id {key.session} already exists (user {key.user!r}, "
                f"app {key.app!r})."
            )
        stored = StoredSession(
            key=key,
            seq=created.seq,
            version=1,
            last_update_time=now.timestamp(),
            state=scoped.session,
            app_state=created.app_state,
            user_state=created.user_state,
            events=[],
        )
        return self._session(stored, [])

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        key = self._key(app_name, user_id, session_id)
        recent = after = None
        if config is not None:
            recent, after = config.num_recent_events, config.after_timestamp
        if recent is not None and (isinstance(recent, bool) or recent < 0):
            raise ValueError("config.num_recent_events: must be an int >= 0")
        if after is not None and not math.isfinite(after):
            raise ValueError("config.after_timestamp: must be a finite number of seconds")
        stored = await self._store.get(EventsQuery(key=key, recent=recent, after=after))
        if stored is None:
            return None
        return self._session(stored, [Event.model_validate_json(e) for e in stored.events])

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Every session of the app (or of one user), without events, the least recently
        updated first (ADK's order); read page by page (:meth:`list_sessions_page`)."""
        sessions: list[Session] = []
        after: str | None = None
        while True:
            page = await self.list_sessions_page(
                app_name=app_name, user_id=user_id, limit=MAX_PAGE, after=after
            )
            sessions.extend(page.sessions)
            if page.next is None:
                break
            after = page.next
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await self._store.delete(self._key(app_name, user_id, session_id))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return decoded(
            await self._store.user_state(adk_id("app_name", app_name), adk_id("user_id", user_id))
        )

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        if not isinstance(session, Session) or not isinstance(event, Event):
            raise TypeError("append_event: takes an ADK Session and an ADK Event")
        key = self._key(session.app_name, session.user_id, session.id)
        if self._redelivered(session, event):
            return event
        delta = event.actions.state_delta if event.actions else {}
        scoped = split(delta or {}, "event.actions.state_delta")
        where = f"session {key.session!r}"
        check_scopes(scoped, self._max_value_bytes, where, "event.actions.state_delta")
        usage = usage_of(event)
        timestamp = float(event.timestamp)
        if not math.isfinite(timestamp):
            raise ValueError("event.timestamp: must be a finite number of seconds")
        # ADK's order: temp: state reaches the caller's session, then leaves the event.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        try:
            data = event.model_dump_json(exclude_none=True)
        except PydanticSerializationError as exc:
            raise TypeError(f"event: is not JSON-serializable ({exc})") from exc
        check_size("event", utf8_size(data), self._max_value_bytes, where=where)
        expected = marked(session)
        if expected is None:
            expected = await self._version_matching(key, session)
        outcome = await self._store.append(
            NewEvent(
                key=key,
                expected=expected,
                lease=self._hold(key),
                event=data,
                event_id=event.id,
                timestamp=timestamp,
                delta=scoped,
                usage=usage,
                now=read_clock(self._clock),
                op_id=new_op_id(),
            )
        )
        version = self._appended(key, expected, outcome)
        mark(session, version)
        session.last_update_time = timestamp
        return self._commit_event_to_session(session, event)

    # -- what ADK's calls rely on ------------------------------------------------------

    @staticmethod
    def _redelivered(session: Session, event: Event) -> bool:
        """Whether this very event was appended through this session already (a caller
        retrying a call that succeeded): it is not stored twice (ADK's reference)."""
        for seen in reversed(session.events[-_REDELIVERY_WINDOW:]):
            if seen is event or (seen.id == event.id and seen == event):
                return True
        return False

    async def _version_matching(self, key: SessionKey, session: Session) -> int:
        """The stored version, for a session that carries none (built by hand, or by another
        service): taken when its newest event is the stored newest, else a conflict."""
        stored = await self._store.get(EventsQuery(key=key, recent=1, after=None))
        if stored is None:
            raise SessionNotFoundError(f"Session {key.session} not found.")
        newest = Event.model_validate_json(stored.events[-1]).id if stored.events else None
        held = session.events[-1].id if session.events else None
        if newest != held:
            raise SessionConflictError(
                app_name=key.app,
                user_id=key.user,
                session_id=key.session,
                expected=0,
                actual=stored.version,
            )
        return stored.version

    def _hold(self, key: SessionKey) -> LeaseHold | None:
        lease = self._lease
        if lease is None:
            return None
        if (lease.app_name, lease.user_id, lease.session_id) != (key.app, key.user, key.session):
            raise ValueError(
                f"session: this service appends under the lease of session "
                f"{lease.session_id!r} (user {lease.user_id!r}, app {lease.app_name!r}), "
                f"not {key.session!r}"
            )
        return LeaseHold(owner=lease.owner, token=lease.token)

    def _appended(
        self,
        key: SessionKey,
        expected: int,
        outcome: Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None,
    ) -> int:
        if isinstance(outcome, Appended):
            return outcome.version
        if outcome is None:
            raise SessionNotFoundError(f"Session {key.session} not found.")
        if isinstance(outcome, Stale):
            raise SessionConflictError(
                app_name=key.app,
                user_id=key.user,
                session_id=key.session,
                expected=expected,
                actual=outcome.version,
            )
        if isinstance(outcome, LeaseHeld):
            raise SessionLeasedError(
                app_name=key.app, user_id=key.user, session_id=key.session, owner=outcome.owner
            )
        if isinstance(outcome, LeaseLost):
            assert self._lease is not None
            raise LeaseLostError(
                f"lease on session {key.session!r} with token {self._lease.token} held by "
                f"{self._lease.owner!r} expired or was taken over; nothing was appended"
            )
        raise ValueError(
            f"usage_metadata: the {outcome.counter} of session {key.session!r}'s run would "
            f"pass the counter's limit of {MAX_COUNTER}; nothing was appended"
        )

    # -- beyond ADK: pages, usage, leases, retention --------------------------------------

    async def list_sessions_page(
        self,
        *,
        app_name: str,
        user_id: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> SessionPage:
        """One page of the app's (or a user's) sessions in creation order, without events;
        ``after`` is a previous page's ``next``. A session created or updated during paging
        is never skipped nor repeated (the order is its creation's, which never moves)."""
        query = SessionsQuery(
            app=adk_id("app_name", app_name),
            user=None if user_id is None else adk_id("user_id", user_id),
            after_seq=cursor(after),
            limit=require_limit(limit, MAX_PAGE),
        )
        found = await self._store.page(query)
        shown = found[: query.limit]
        following = str(shown[-1].seq) if len(found) > query.limit else None
        app_state = decoded(shown[0].app_state, State.APP_PREFIX) if shown else {}
        sessions = [self._session(s, [], app_state) for s in shown]
        return SessionPage(sessions=sessions, next=following)

    async def list_events(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        limit: int = 100,
        after: str | None = None,
    ) -> EventPage:
        """One page of a session's events in append order (``after``: a previous page's
        ``next``); raises ``SessionNotFoundError`` for a session that does not exist."""
        key = self._key(app_name, user_id, session_id)
        checked = require_limit(limit, MAX_PAGE)
        found = await self._store.events(key, cursor(after), checked + 1)
        if found is None:
            raise SessionNotFoundError(f"Session {key.session} not found.")
        shown = found[:checked]
        return EventPage(
            events=[Event.model_validate_json(data) for _, data in shown],
            next=str(shown[-1][0]) if len(found) > checked else None,
        )

    async def usage(self, *, app_name: str, user_id: str | None = None) -> SessionUsage:
        """The tokens the app's sessions (or one user's) consumed: the sums of their runs'
        counters, in one call. Runs outlive their sessions, so deleted sessions count."""
        totals = await self._store.usage(
            adk_id("app_name", app_name), None if user_id is None else adk_id("user_id", user_id)
        )
        return SessionUsage(
            sessions=totals.sessions,
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            iterations=totals.iterations,
            events=totals.cursor,
            cost=nanos_to_decimal(totals.cost_nanos),
        )

    def with_lease(self, lease: SessionLease) -> StatepactSessionService:
        """This service, appending under ``lease`` (give it to ADK's ``Runner``): its appends
        to that session are fenced by the lease's token, and refused (``LeaseLostError``)
        once another lease was issued or it expired."""
        return type(self)(
            self._store,
            clock=self._clock,
            max_value_bytes=self._max_value_bytes,
            lease=require_lease(lease),
        )

    @asynccontextmanager
    async def leased(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        owner: str,
        ttl: float | timedelta,
    ) -> AsyncIterator[StatepactSessionService | None]:
        """``async with service.leased(...) as leased:`` ``leases.acquire``, then
        :meth:`with_lease` (``None`` when another owner holds it); released on the way out,
        even on a cancellation."""
        lease = await self.leases.acquire(
            app_name=app_name, user_id=user_id, session_id=session_id, owner=owner, ttl=ttl
        )
        if lease is None:
            yield None
            return
        try:
            yield self.with_lease(lease)
        finally:
            await self.leases.release(lease)

    async def prune_sessions(
        self, *, app_name: str, older_than: float | timedelta, limit: int = 1000
    ) -> int:
        """Delete up to ``limit`` of the app's sessions (with their state and events) last
        written more than ``older_than`` ago by the service's clock, oldest first; returns
        how many. Their runs stay (the cost record). Call it again until it returns 0."""
        app = adk_id("app_name", app_name)
        cutoff = read_clock(self._clock) - timedelta(
            seconds=require_seconds("older_than", older_than)
        )
        return await self._store.prune_sessions(app, cutoff, require_limit(limit, MAX_PAGE))

    async def prune_events(
        self, *, app_name: str, older_than: float | timedelta, limit: int = 1000
    ) -> int:
        """Delete up to ``limit`` of the app's events whose timestamp is more than
        ``older_than`` before now: each session loses its oldest events, in order, while
        they are older. The sessions, their state and their versions stay."""
        app = adk_id("app_name", app_name)
        seconds = require_seconds("older_than", older_than)
        cutoff = read_clock(self._clock).timestamp() - seconds
        return await self._store.prune_events(app, cutoff, require_limit(limit, MAX_PAGE))
