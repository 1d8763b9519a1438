"""``SessionServiceContract``: what ``StatepactSessionService`` promises, on every backing.

Written from ADK's documented semantics, with ``InMemorySessionService`` as the
reference where the documentation is silent (``test_reference.py`` replays
scripts against both). A subclass provides ``backing`` (a ``Backing`` built on the
test's ``clock``); the suite uses the public API and the clock only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.genai import types

from statepact.clock import ManualClock, read_clock
from statepact.errors import LeaseLostError, StateConflictError, StatePersistenceError
from statepact.integrations.adk import (
    SessionConflictError,
    SessionLeasedError,
    StatepactSessionService,
)
from statepact.integrations.adk._store import (
    Appended,
    NewEvent,
    SessionKey,
    StateWrite,
    UsageDelta,
)
from statepact.storage import Backing

APP, USER = "support", "ada"


def event(
    delta: dict[str, Any] | None = None,
    *,
    ts: float | None = None,
    author: str = "user",
    usage: tuple[int, int] | None = None,
    **fields: Any,
) -> Event:
    extra: dict[str, Any] = dict(fields)
    if ts is not None:
        extra["timestamp"] = ts
    if usage is not None:
        extra["usage_metadata"] = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=usage[0], candidates_token_count=usage[1]
        )
    return Event(
        invocation_id="inv", author=author, actions=EventActions(state_delta=delta or {}), **extra
    )


async def resend_an_append(backing: Backing[Any, Any, Any], clock: ManualClock) -> None:
    """Send one append (its call id) twice, as the failover does after a lost reply: both
    answer the version it made, and one event is stored, counted once. For the backings
    whose stores recognise a resend (Redis, PostgreSQL): the store is called directly."""
    service = await StatepactSessionService.open(backing)
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    append = NewEvent(
        key=SessionKey(APP, USER, "s"),
        expected=1,
        lease=None,
        event=event(ts=1.0).model_dump_json(exclude_none=True),
        event_id="e1",
        timestamp=1.0,
        delta=StateWrite(session={"k": "1"}),
        usage=UsageDelta(input_tokens=3, output_tokens=1, iterations=1),
        now=read_clock(clock),
        op_id="op-resent",
    )
    assert await service._store.append(append) == Appended(2)
    assert await service._store.append(append) == Appended(2)
    got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert got is not None and len(got.events) == 1
    run = await backing.state.get_run(APP, service.run_id(USER, "s"))
    assert run is not None and (run.input_tokens, run.cursor) == (3, 1)


async def ids(service: StatepactSessionService, **query: Any) -> list[str]:
    return [s.id for s in (await service.list_sessions(**query)).sessions]


class SessionServiceContract:
    """One test per promise of the service; see the module docstring for the fixture."""

    @pytest.fixture
    async def service(self, backing: Backing[Any, Any, Any]) -> StatepactSessionService:
        return await StatepactSessionService.open(backing)

    # -- create, get, delete ---------------------------------------------------------

    async def test_a_missing_session_reads_as_none(self, service: StatepactSessionService) -> None:
        """get_session of a session never created is None, not an error."""
        assert await service.get_session(app_name=APP, user_id=USER, session_id="nope") is None

    async def test_create_returns_what_get_reads(
        self, service: StatepactSessionService, clock: ManualClock
    ) -> None:
        """A created session has an id, the non-temp state, the clock's time; get reads it
        back equal (state, events, time and revision)."""
        created = await service.create_session(
            app_name=APP, user_id=USER, state={"k": "v", "n": 1, "temp:t": 1}
        )
        assert created.id and created.app_name == APP and created.user_id == USER
        assert created.state == {"k": "v", "n": 1}
        assert created.events == []
        assert created.last_update_time == clock.now().timestamp()
        got = await service.get_session(app_name=APP, user_id=USER, session_id=created.id)
        assert got == created

    async def test_an_existing_id_is_refused_and_changes_nothing(
        self, service: StatepactSessionService
    ) -> None:
        """Creating an id that exists raises AlreadyExistsError naming it; the refused
        create's state (every scope) is not applied."""
        await service.create_session(
            app_name=APP, user_id=USER, session_id="s1", state={"k": 1, "app:a": 1, "user:u": 1}
        )
        with pytest.raises(AlreadyExistsError, match="s1"):
            await service.create_session(
                app_name=APP,
                user_id=USER,
                session_id="s1",
                state={"k": 2, "app:a": 2, "user:u": 2},
            )
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert got is not None
        assert got.state == {"k": 1, "app:a": 1, "user:u": 1}

    async def test_the_same_id_under_another_user_is_another_session(
        self, service: StatepactSessionService
    ) -> None:
        """Sessions are keyed by (app, user, id): a second user may reuse an id."""
        first = await service.create_session(app_name=APP, user_id="u1", session_id="s")
        await service.append_event(first, event())
        await service.create_session(app_name=APP, user_id="u2", session_id="s")
        other = await service.get_session(app_name=APP, user_id="u2", session_id="s")
        assert other is not None and other.user_id == "u2" and other.events == []

    async def test_session_ids_are_stripped_and_a_blank_one_is_generated(
        self, service: StatepactSessionService
    ) -> None:
        """As ADK's reference: a padded id names the trimmed one everywhere; a blank id is
        no id at all."""
        await service.create_session(app_name=APP, user_id=USER, session_id="  s1  ")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is not None
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="s1 ")
        blank = await service.create_session(app_name=APP, user_id=USER, session_id="   ")
        assert blank.id.strip() == blank.id and blank.id
        await service.delete_session(app_name=APP, user_id=USER, session_id=" s1")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None

    async def test_delete_removes_one_session_and_its_events_only(
        self, service: StatepactSessionService
    ) -> None:
        """delete_session removes that (app, user, id) with its events; the scopes' state,
        other users' sessions and unknown ids are untouched (a no-op)."""
        mine = await service.create_session(app_name=APP, user_id="u1", session_id="s")
        await service.append_event(mine, event({"app:a": 1, "user:b": 2}))
        await service.create_session(app_name=APP, user_id="u2", session_id="s")
        await service.delete_session(app_name=APP, user_id="u1", session_id="nope")
        await service.delete_session(app_name="other", user_id="u1", session_id="s")
        await service.delete_session(app_name=APP, user_id="u1", session_id="s")
        assert await service.get_session(app_name=APP, user_id="u1", session_id="s") is None
        assert await service.get_session(app_name=APP, user_id="u2", session_id="s") is not None
        again = await service.create_session(app_name=APP, user_id="u1", session_id="s")
        assert again.events == [] and again.state == {"app:a": 1, "user:b": 2}

    async def test_appending_to_a_deleted_or_unknown_session_raises(
        self, service: StatepactSessionService
    ) -> None:
        """append_event to a session that is not stored raises SessionNotFoundError."""
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.delete_session(app_name=APP, user_id=USER, session_id=session.id)
        with pytest.raises(SessionNotFoundError):
            await service.append_event(session, event())
        stranger = Session(app_name=APP, user_id=USER, id="never")
        with pytest.raises(SessionNotFoundError):
            await service.append_event(stranger, event())

    # -- state scopes -----------------------------------------------------------------

    async def test_app_state_is_shared_by_every_user_of_the_app(
        self, service: StatepactSessionService
    ) -> None:
        """app: keys (from create or an event) reach every session of the app, no other app."""
        first = await service.create_session(app_name=APP, user_id="u1", state={"app:k1": 1})
        await service.append_event(first, event({"app:k2": 2}))
        second = await service.create_session(app_name=APP, user_id="u2")
        assert second.state == {"app:k1": 1, "app:k2": 2}
        elsewhere = await service.create_session(app_name="other", user_id="u1")
        assert elsewhere.state == {}

    async def test_user_state_is_shared_by_that_users_sessions_only(
        self, service: StatepactSessionService
    ) -> None:
        """user: keys reach the user's other sessions, not another user's."""
        first = await service.create_session(app_name=APP, user_id="u1", state={"user:k1": 1})
        await service.append_event(first, event({"user:k2": 2}))
        again = await service.create_session(app_name=APP, user_id="u1")
        assert again.state == {"user:k1": 1, "user:k2": 2}
        assert (await service.create_session(app_name=APP, user_id="u2")).state == {}
        assert await service.get_user_state(app_name=APP, user_id="u1") == {"k1": 1, "k2": 2}
        assert await service.get_user_state(app_name=APP, user_id="u2") == {}
        assert await service.get_user_state(app_name="other", user_id="u1") == {}

    async def test_session_state_is_the_sessions_own(
        self, service: StatepactSessionService
    ) -> None:
        """Unprefixed keys stay in their session."""
        first = await service.create_session(app_name=APP, user_id=USER, state={"k1": 1})
        await service.append_event(first, event({"k2": 2}))
        got = await service.get_session(app_name=APP, user_id=USER, session_id=first.id)
        assert got is not None and got.state == {"k1": 1, "k2": 2}
        assert (await service.create_session(app_name=APP, user_id=USER)).state == {}

    async def test_temp_state_reaches_the_callers_session_but_is_never_stored(
        self, service: StatepactSessionService
    ) -> None:
        """temp: keys are visible in the Session passed to append_event (the invocation),
        removed from the event's delta, and absent from every read."""
        session = await service.create_session(app_name=APP, user_id=USER, state={"temp:c": 0})
        appended = event({"temp:k": "v", "k": 1})
        await service.append_event(session, appended)
        assert session.state["temp:k"] == "v"
        assert appended.actions.state_delta == {"k": 1}
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.state == {"k": 1}
        assert got.events[0].actions.state_delta == {"k": 1}

    async def test_a_delta_replaces_values_key_by_key(
        self, service: StatepactSessionService
    ) -> None:
        """A dict value replaces the stored one (no deep merge) in every scope; None is
        stored as null, not a deletion; booleans, ints and floats keep their type."""
        session = await service.create_session(
            app_name=APP,
            user_id=USER,
            state={"p": {"a": 1, "b": 2}, "app:c": {"x": 1, "y": 2}, "flag": True, "f": 1.0},
        )
        await service.append_event(
            session, event({"p": {"a": 9}, "app:c": {"x": 9}, "flag": None, "big": 2**62})
        )
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None
        assert got.state == {
            "p": {"a": 9},
            "app:c": {"x": 9},
            "flag": None,
            "f": 1.0,
            "big": 2**62,
        }
        assert type(got.state["f"]) is float
        assert got.state == session.state

    async def test_rich_values_are_stored_as_pydantic_renders_them(
        self, service: StatepactSessionService
    ) -> None:
        """A datetime (or a model) in state is stored as its JSON rendering."""
        when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        session = await service.create_session(app_name=APP, user_id=USER, state={"at": when})
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.state == {"at": "2026-01-02T03:04:05Z"}

    # -- events -----------------------------------------------------------------------

    async def test_events_read_back_equal_in_append_order(
        self, service: StatepactSessionService
    ) -> None:
        """Every field of an event survives (bytes, usage, custom metadata); order is the
        order of the appends, whatever the timestamps."""
        session = await service.create_session(app_name=APP, user_id=USER)
        rich = event(
            {"k": 1},
            ts=50.0,
            usage=(3, 4),
            content=types.Content(
                role="user", parts=[types.Part.from_bytes(data=b"\x00\xff", mime_type="image/png")]
            ),
            custom_metadata={"a": [1, 2]},
            long_running_tool_ids={"tool"},
        )
        later = event(ts=10.0)
        for each in (rich, later, event(ts=30.0)):
            await service.append_event(session, each)
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None
        assert got.events == session.events
        assert [e.timestamp for e in got.events] == [50.0, 10.0, 30.0]
        assert got == session

    async def test_partial_events_are_not_stored(self, service: StatepactSessionService) -> None:
        """A partial (streaming) event is returned as is and stored nowhere."""
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(session, Event(author="model", partial=True))
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert session.events == [] and got is not None and got.events == []

    async def test_an_event_sets_the_sessions_last_update_time(
        self, service: StatepactSessionService
    ) -> None:
        """last_update_time becomes the appended event's timestamp, on the caller's
        session and in storage."""
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(session, event(ts=session.last_update_time + 10))
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None
        assert (
            session.last_update_time
            == got.last_update_time
            == pytest.approx(got.events[0].timestamp)
        )

    @pytest.mark.parametrize(
        ("recent", "after", "expected"),
        [
            (None, None, [1, 2, 3, 4, 5]),
            (0, None, []),
            (3, None, [3, 4, 5]),
            (9, None, [1, 2, 3, 4, 5]),
            (None, 4.0, [4, 5]),
            (None, 4.5, [5]),
            (None, 99.0, []),
            (None, 0.5, [1, 2, 3, 4, 5]),
            (3, 4.0, [4, 5]),
            (2, 1.0, [4, 5]),
            (0, 4.0, []),
        ],
    )
    async def test_get_session_filters_events(
        self,
        service: StatepactSessionService,
        recent: int | None,
        after: float | None,
        expected: list[int],
    ) -> None:
        """num_recent_events keeps the newest N; after_timestamp keeps the events after the
        newest one older than it (those at or after it); together, both apply."""
        session = await service.create_session(app_name=APP, user_id=USER)
        for i in range(1, 6):
            await service.append_event(session, event(ts=float(i)))
        config = GetSessionConfig(num_recent_events=recent, after_timestamp=after)
        got = await service.get_session(
            app_name=APP, user_id=USER, session_id=session.id, config=config
        )
        assert got is not None
        assert [e.timestamp for e in got.events] == [float(i) for i in expected]

    async def test_after_timestamp_cuts_at_the_newest_older_event(
        self, service: StatepactSessionService
    ) -> None:
        """With timestamps out of order, the events kept are those after the newest event
        whose timestamp is below the cut (ADK's reference), not a filter."""
        session = await service.create_session(app_name=APP, user_id=USER)
        for ts in (10.0, 1.0, 20.0, 2.0, 30.0):
            await service.append_event(session, event(ts=ts))
        got = await service.get_session(
            app_name=APP,
            user_id=USER,
            session_id=session.id,
            config=GetSessionConfig(after_timestamp=5.0),
        )
        assert got is not None and [e.timestamp for e in got.events] == [30.0]

    async def test_events_page_in_append_order(self, service: StatepactSessionService) -> None:
        """list_events pages a session's events by their seq; the last page has no next."""
        session = await service.create_session(app_name=APP, user_id=USER)
        for i in range(7):
            await service.append_event(session, event(ts=float(i)))
        seen: list[float] = []
        after: str | None = None
        while True:
            page = await service.list_events(
                app_name=APP, user_id=USER, session_id=session.id, limit=3, after=after
            )
            seen += [e.timestamp for e in page.events]
            if page.next is None:
                break
            after = page.next
        assert seen == [float(i) for i in range(7)]
        with pytest.raises(SessionNotFoundError):
            await service.list_events(app_name=APP, user_id=USER, session_id="nope")

    async def test_the_same_event_delivered_twice_is_stored_once(
        self, service: StatepactSessionService
    ) -> None:
        """Appending the very event again through the same session (a caller's retry after
        a success) stores it once and applies its delta once."""
        session = await service.create_session(app_name=APP, user_id=USER)
        once = event({"n": 1})
        await service.append_event(session, once)
        await service.append_event(session, once)
        await service.append_event(session, once.model_copy(deep=True))
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and len(got.events) == 1

    async def test_events_sharing_an_id_are_both_stored(
        self, service: StatepactSessionService
    ) -> None:
        """Two different events with one id are two events (ADK's reference)."""
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(session, event(id="same", author="user"))
        await service.append_event(session, event(id="same", author="agent"))
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and [e.author for e in got.events] == ["user", "agent"]

    # -- versions and conflicts -------------------------------------------------------------

    async def test_a_stale_session_is_refused_and_nothing_is_written(
        self, service: StatepactSessionService
    ) -> None:
        """A Session read before another append was stored gets SessionConflictError (both
        statepact's StateConflictError and ADK's StaleSessionError) with both versions;
        its event and deltas are not stored."""
        session = await service.create_session(app_name=APP, user_id=USER)
        stale = session.model_copy(deep=True)
        await service.append_event(session, event({"k": "winner"}))
        with pytest.raises(SessionConflictError) as raised:
            await service.append_event(stale, event({"k": "loser", "app:a": 1, "user:u": 1}))
        assert isinstance(raised.value, StateConflictError)
        assert isinstance(raised.value, StaleSessionError)
        assert (raised.value.expected, raised.value.actual) == (1, 2)
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.state == {"k": "winner"} and len(got.events) == 1
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}

    async def test_a_reloaded_session_appends_after_a_conflict(
        self, service: StatepactSessionService
    ) -> None:
        """The fix for a conflict: get_session again, append again."""
        session = await service.create_session(app_name=APP, user_id=USER)
        stale = session.model_copy(deep=True)
        await service.append_event(session, event())
        with pytest.raises(SessionConflictError):
            await service.append_event(stale, event())
        fresh = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert fresh is not None
        await service.append_event(fresh, event())
        assert len(fresh.events) == 2

    async def test_a_session_carrying_no_revision_is_checked_by_its_newest_event(
        self, service: StatepactSessionService
    ) -> None:
        """A Session built by hand appends if its newest event is the stored newest (or both
        have none); otherwise it is stale."""
        await service.create_session(app_name=APP, user_id=USER, session_id="s")
        bare = Session(app_name=APP, user_id=USER, id="s")
        await service.append_event(bare, event())
        behind = Session(app_name=APP, user_id=USER, id="s", events=list(bare.events))
        current = Session(app_name=APP, user_id=USER, id="s", events=list(bare.events))
        await service.append_event(current, event())
        with pytest.raises(SessionConflictError):
            await service.append_event(behind, event())
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert got is not None and len(got.events) == 2

    async def test_a_new_service_resumes_a_stored_session(
        self, service: StatepactSessionService, backing: Backing[Any, Any, Any]
    ) -> None:
        """A session stored by one service (a worker that died) is read and continued by
        another on the same backing."""
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        await service.append_event(session, event({"step": 1}))
        other = await StatepactSessionService.open(backing)
        resumed = await other.get_session(app_name=APP, user_id=USER, session_id="s")
        assert resumed is not None and resumed.state == {"step": 1}
        await other.append_event(resumed, event({"step": 2}))
        with pytest.raises(SessionConflictError):
            await service.append_event(session, event({"step": 2}))

    # -- listing --------------------------------------------------------------------------

    async def test_list_sessions_by_user_and_for_the_whole_app(
        self, service: StatepactSessionService
    ) -> None:
        """list_sessions returns a user's sessions, or every user's, with merged state and
        no events; an unknown app or user lists nothing."""
        for user, sid in (("u1", "a"), ("u1", "b"), ("u2", "c")):
            session = await service.create_session(
                app_name=APP, user_id=user, session_id=sid, state={"k": sid, f"user:{user}": 1}
            )
            await service.append_event(session, event({"app:shared": 1}))
        mine = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
        assert {s.id for s in mine} == {"a", "b"}
        assert all(s.events == [] for s in mine)
        assert {s.id: s.state for s in mine}["a"] == {"k": "a", "user:u1": 1, "app:shared": 1}
        assert sorted(await ids(service, app_name=APP)) == ["a", "b", "c"]
        assert await ids(service, app_name="other") == []
        assert await ids(service, app_name=APP, user_id="nobody") == []

    async def test_list_sessions_orders_by_last_update_oldest_first(
        self, service: StatepactSessionService
    ) -> None:
        """ADK's order: least recently updated first, ties by user then id."""
        for sid in ("a", "b", "c"):
            await service.create_session(app_name=APP, user_id=USER, session_id=sid)
        a = await service.get_session(app_name=APP, user_id=USER, session_id="a")
        assert a is not None
        await service.append_event(a, event(ts=a.last_update_time + 5))
        assert await ids(service, app_name=APP, user_id=USER) == ["b", "c", "a"]

    async def test_sessions_page_in_creation_order_through_updates(
        self, service: StatepactSessionService
    ) -> None:
        """list_sessions_page pages by creation order: a session updated or created during
        paging is neither skipped nor repeated."""
        for i in range(7):
            await service.create_session(app_name=APP, user_id=f"u{i % 2}", session_id=f"s{i}")
        seen: list[str] = []
        after: str | None = None
        while True:
            page = await service.list_sessions_page(app_name=APP, limit=3, after=after)
            seen += [s.id for s in page.sessions]
            if page.next is None:
                break
            if after is None:
                moved = await service.get_session(app_name=APP, user_id="u1", session_id="s5")
                assert moved is not None
                await service.append_event(moved, event())
                await service.create_session(app_name=APP, user_id="u0", session_id="s7")
            after = page.next
        assert seen == [f"s{i}" for i in range(8)]
        theirs = await service.list_sessions_page(app_name=APP, user_id="u1", limit=10)
        assert [s.id for s in theirs.sessions] == ["s1", "s3", "s5"] and theirs.next is None

    async def test_paging_refuses_a_bad_limit_or_cursor(
        self, service: StatepactSessionService
    ) -> None:
        """limit is 1..1000; after is a cursor this service returned."""
        with pytest.raises(ValueError, match="limit"):
            await service.list_sessions_page(app_name=APP, limit=0)
        with pytest.raises(ValueError, match="after"):
            await service.list_sessions_page(app_name=APP, after="x1")

    # -- usage -----------------------------------------------------------------------------

    async def test_usage_metadata_feeds_the_sessions_run(
        self, service: StatepactSessionService, backing: Backing[Any, Any, Any]
    ) -> None:
        """Each session's run (tenant = app, statepact session = user) counts its events'
        tokens (prompt in, candidates out), its model responses and its events; the run
        outlives the session; usage() sums them per user and per app."""
        first = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
        await service.append_event(first, event(usage=(10, 5), author="model"))
        await service.append_event(first, event())
        second = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
        await service.append_event(second, event(usage=(1, 2), author="model"))
        run = await backing.state.get_run(APP, service.run_id("u1", "s1"))
        assert run is not None
        assert (run.session_id, run.input_tokens, run.output_tokens) == ("u1", 10, 5)
        assert (run.iterations, run.cursor) == (1, 2)
        listed = await backing.state.list_runs(APP, session_id="u2")
        assert [r.run_id for r in listed.items] == [service.run_id("u2", "s2")]
        await service.delete_session(app_name=APP, user_id="u1", session_id="s1")
        mine = await service.usage(app_name=APP, user_id="u1")
        assert (mine.sessions, mine.input_tokens, mine.output_tokens) == (1, 10, 5)
        assert (mine.iterations, mine.events) == (1, 2)
        everyone = await service.usage(app_name=APP)
        assert (everyone.sessions, everyone.input_tokens, everyone.output_tokens) == (2, 11, 7)
        assert (await service.usage(app_name="other")).sessions == 0

    async def test_usage_counts_only_the_services_runs(
        self, service: StatepactSessionService, backing: Backing[Any, Any, Any]
    ) -> None:
        """A run of the same tenant written by the application is not summed; cost the
        application patched into a session's run is."""
        from statepact.models import RunRecord

        await backing.state.put_run(RunRecord(tenant=APP, run_id="job-1", session_id=USER))
        await backing.state.patch_run(APP, "job-1", input_tokens=100)
        await service.create_session(app_name=APP, user_id=USER, session_id="s")
        await backing.state.patch_run(APP, service.run_id(USER, "s"), cost="0.25")
        totals = await service.usage(app_name=APP, user_id=USER)
        assert (totals.sessions, totals.input_tokens, str(totals.cost)) == (1, 0, "0.250000000")

    # -- leases ----------------------------------------------------------------------------

    async def test_a_lease_admits_its_holder_only(
        self, service: StatepactSessionService, clock: ManualClock
    ) -> None:
        """While a lease is live, appends through it are taken and others refused
        (SessionLeasedError); a second owner gets None; once released, anyone appends."""
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        lease = await service.leases.acquire(
            app_name=APP, user_id=USER, session_id="s", owner="w1", ttl=30
        )
        assert lease is not None and lease.expires_at == clock.now() + timedelta(seconds=30)
        assert (
            await service.leases.acquire(
                app_name=APP, user_id=USER, session_id="s", owner="w2", ttl=30
            )
            is None
        )
        with pytest.raises(SessionLeasedError):
            await service.append_event(session, event())
        await service.with_lease(lease).append_event(session, event())
        assert await service.leases.release(lease) is True
        await service.append_event(session, event())
        assert len(session.events) == 2

    async def test_an_expired_or_superseded_lease_is_fenced(
        self, service: StatepactSessionService, clock: ManualClock
    ) -> None:
        """A holder whose lease expired, or was taken over, has its appends refused
        (LeaseLostError) and cannot renew; tokens only grow."""
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        old = await service.leases.acquire(
            app_name=APP, user_id=USER, session_id="s", owner="w1", ttl=10
        )
        assert old is not None
        renewed = await service.leases.renew(old, ttl=20)
        assert renewed.token == old.token
        clock.advance(21)
        with pytest.raises(LeaseLostError):
            await service.with_lease(old).append_event(session, event())
        new = await service.leases.acquire(
            app_name=APP, user_id=USER, session_id="s", owner="w2", ttl=10
        )
        assert new is not None and new.token > old.token
        with pytest.raises(LeaseLostError):
            await service.leases.renew(old)
        assert await service.leases.release(old) is False
        await service.with_lease(new).append_event(session, event())
        with pytest.raises(ValueError, match="lease"):
            other = await service.create_session(app_name=APP, user_id=USER, session_id="t")
            await service.with_lease(new).append_event(other, event())

    async def test_leased_releases_on_the_way_out(self, service: StatepactSessionService) -> None:
        """``async with service.leased(...)`` holds the lease for the block only."""
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        async with service.leased(
            app_name=APP, user_id=USER, session_id="s", owner="w1", ttl=30
        ) as leased:
            assert leased is not None
            await leased.append_event(session, event())
            async with service.leased(
                app_name=APP, user_id=USER, session_id="s", owner="w2", ttl=30
            ) as refused:
                assert refused is None
        await service.append_event(session, event())
        with pytest.raises(SessionNotFoundError):
            await service.leases.acquire(
                app_name=APP, user_id=USER, session_id="none", owner="w", ttl=1
            )

    # -- retention ------------------------------------------------------------------------

    async def test_prune_sessions_removes_idle_sessions_in_batches(
        self, service: StatepactSessionService, clock: ManualClock
    ) -> None:
        """Sessions last written before now - older_than go, oldest first, at most limit per
        call; their runs and the scopes' state stay."""
        for sid in ("a", "b", "c"):
            await service.create_session(app_name=APP, user_id=USER, session_id=sid)
            clock.advance(10)
        kept = await service.get_session(app_name=APP, user_id=USER, session_id="a")
        assert kept is not None
        await service.append_event(kept, event({"user:u": 1}))
        clock.advance(100)
        await service.create_session(app_name=APP, user_id=USER, session_id="new")
        assert await service.prune_sessions(app_name=APP, older_than=50, limit=1) == 1
        assert sorted(await ids(service, app_name=APP)) == ["a", "c", "new"]
        assert await service.prune_sessions(app_name=APP, older_than=50) == 2
        assert await ids(service, app_name=APP) == ["new"]
        assert await service.prune_sessions(app_name=APP, older_than=50) == 0
        assert await service.usage(app_name=APP) is not None
        assert (await service.usage(app_name=APP)).sessions == 4
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"u": 1}

    async def test_prune_events_drops_each_sessions_oldest(
        self, service: StatepactSessionService, clock: ManualClock
    ) -> None:
        """Events go from each session's oldest while their timestamp is before now -
        older_than, at most limit per call; the session, its state and its version stay."""
        now = clock.now().timestamp()
        one = await service.create_session(app_name=APP, user_id=USER, session_id="one")
        two = await service.create_session(app_name=APP, user_id=USER, session_id="two")
        for ts in (now - 300, now - 200, now - 500, now - 10):
            await service.append_event(one, event({"n": ts}, ts=ts))
        for ts in (now - 400, now - 5):
            await service.append_event(two, event(ts=ts))
        assert await service.prune_events(app_name=APP, older_than=100, limit=2) == 2
        assert await service.prune_events(app_name=APP, older_than=100) == 2
        assert await service.prune_events(app_name=APP, older_than=100) == 0
        got = await service.get_session(app_name=APP, user_id=USER, session_id="one")
        assert got is not None and [e.timestamp for e in got.events] == [now - 10]
        assert got.state == {"n": now - 10}
        page = await service.list_events(app_name=APP, user_id=USER, session_id="two")
        assert [e.timestamp for e in page.events] == [now - 5]
        await service.append_event(got, event(ts=now))
        again = await service.get_session(
            app_name=APP,
            user_id=USER,
            session_id="one",
            config=GetSessionConfig(num_recent_events=5),
        )
        assert again is not None and [e.timestamp for e in again.events] == [now - 10, now]

    # -- refusals -----------------------------------------------------------------------

    async def test_bad_ids_are_refused_naming_the_field(
        self, service: StatepactSessionService
    ) -> None:
        """Ids are non-empty str of at most 256 bytes, checked before anything is sent."""
        with pytest.raises(TypeError, match="app_name"):
            await service.get_session(app_name=1, user_id=USER, session_id="s")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="user_id"):
            await service.create_session(app_name=APP, user_id="")
        with pytest.raises(ValueError, match="session_id"):
            await service.create_session(app_name=APP, user_id=USER, session_id="x" * 257)
        with pytest.raises(TypeError, match="session_id"):
            await service.create_session(app_name=APP, user_id=USER, session_id=7)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="after_timestamp"):
            await service.get_session(
                app_name=APP,
                user_id=USER,
                session_id="s",
                config=GetSessionConfig(after_timestamp=float("nan")),
            )

    async def test_bad_state_is_refused_before_anything_is_written(
        self, service: StatepactSessionService
    ) -> None:
        """A value JSON cannot hold (NaN, a function) is refused naming its key; the
        session, the event and every scope stay as they were."""
        with pytest.raises(ValueError, match="'bad'"):
            await service.create_session(app_name=APP, user_id=USER, state={"bad": float("nan")})
        session = await service.create_session(app_name=APP, user_id=USER)
        with pytest.raises(TypeError, match="'app:fn'"):
            await service.append_event(session, event({"ok": 1, "app:fn": lambda: 1}))
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.events == [] and got.state == {}
        assert await ids(service, app_name=APP) == [session.id]

    async def test_an_oversized_event_or_delta_is_refused_unsent(
        self, service: StatepactSessionService
    ) -> None:
        """Over max_value_bytes (the backing's), an event or a scope's delta raises
        StatePersistenceError(reason="too_large") and nothing is written."""
        session = await service.create_session(app_name=APP, user_id=USER)
        with pytest.raises(StatePersistenceError) as raised:
            await service.append_event(session, event({"user:big": "x" * 300_000}))
        assert raised.value.reason == "too_large"
        with pytest.raises(StatePersistenceError):
            await service.append_event(session, event(custom_metadata={"x": "y" * 300_000}))
        with pytest.raises(StatePersistenceError):
            await service.create_session(app_name=APP, user_id=USER, state={"k": "v" * 300_000})
        got = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert got is not None and got.events == []
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}
