"""Time, size, bad input and round trips."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import StatePersistenceError
from statepact.models import RunRecord, SessionRecord
from statepact.state import StateStore
from statepact.testing._inputs import (
    AWARE_ELSEWHERE,
    EACH_ACCEPTED_JSON,
    EACH_BROKEN_CLOCK,
    EACH_REFUSED_JSON,
    LyingInt,
    LyingText,
    Mood,
    assert_plain_json,
    assert_refused_at,
)
from statepact.testing._state_suite._common import LIMIT, create

__all__ = ["LimitsConformance"]


class LimitsConformance:
    """Time, size, bad input and round trips."""

    # -- time ---------------------------------------------------------------------

    async def test_times_come_from_the_injected_clock(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """created_at and updated_at come from the injected clock, never the server's."""
        start = clock.now()
        created = await create(state_store, "run_1")
        assert created.created_at == start
        assert created.updated_at == start
        clock.advance(timedelta(hours=5, microseconds=7))
        patched = await state_store.patch_run("acme", "run_1", iterations=1)
        assert patched.created_at == start
        assert patched.updated_at == clock.now()
        clock.advance(1.5)
        written = await state_store.put_run(patched.model_copy(update={"data": {"x": 1}}))
        assert written.created_at == start
        assert written.updated_at == clock.now()
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.updated_at == clock.now()
        assert stored.updated_at is not None and stored.updated_at.utcoffset() == timedelta(0)

    @EACH_BROKEN_CLOCK
    async def test_a_clock_without_a_timezone_is_refused_naming_the_clock(
        self,
        state_store: StateStore,
        clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch,
        reading: Any,
        error: type[Exception],
    ) -> None:
        """A clock whose now() is naive or not a datetime is refused naming the clock, by
        every call that reads it, before anything is written."""
        created = await create(state_store, "run_1")
        session = await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        monkeypatch.setattr(clock, "now", lambda: reading)
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: create(state_store, "run_2"),
            lambda: state_store.put_run(created.model_copy(update={"data": {"x": 1}})),
            lambda: state_store.patch_run("acme", "run_1", iterations=1),
            lambda: state_store.put_session(SessionRecord(tenant="acme", session_id="s2")),
            lambda: state_store.put_session(session.model_copy(update={"data": {"x": 1}})),
        ]
        for call in calls:
            with pytest.raises(error, match=r"^clock"):
                await call()
        monkeypatch.undo()
        assert await state_store.get_run("acme", "run_1") == created
        assert await state_store.get_run("acme", "run_2") is None
        assert await state_store.get_session("acme", "s1") == session
        assert await state_store.get_session("acme", "s2") is None

    async def test_a_clock_in_another_zone_is_stored_as_utc(
        self, state_store: StateStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An aware reading in another zone is the same instant, stored and returned in UTC."""
        monkeypatch.setattr(clock, "now", lambda: AWARE_ELSEWHERE)
        created = await create(state_store, "run_1")
        session = await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        fetched = await state_store.get_run("acme", "run_1")
        assert fetched is not None
        for moment in (created.created_at, fetched.updated_at, session.created_at):
            assert moment == AWARE_ELSEWHERE
            assert moment is not None and moment.tzinfo is not None
            assert moment.utcoffset() == timedelta(0) and moment == moment.astimezone(UTC)

    # -- size -------------------------------------------------------------------

    async def test_blob_at_the_limit_is_stored(self, state_store: StateStore) -> None:
        """A blob of exactly max_value_bytes serialized bytes is stored and read back whole."""
        data = {"x": "a" * (LIMIT - len('{"x":""}'))}
        created = await create(state_store, "run_1", data=data)
        assert created.data == data
        assert await state_store.get_run("acme", "run_1") == created

    async def test_blob_over_the_limit_is_refused(self, state_store: StateStore) -> None:
        """A blob over max_value_bytes raises StatePersistenceError(reason='too_large'), not
        retryable, and nothing is written."""
        big = {"x": "a" * (LIMIT - len('{"x":""}') + 1)}
        with pytest.raises(StatePersistenceError) as caught:
            await create(state_store, "run_1", data=big)
        assert caught.value.reason == "too_large"
        assert caught.value.retryable is False
        assert await state_store.get_run("acme", "run_1") is None
        assert (await state_store.list_runs("acme")).items == []

        created = await create(state_store, "run_2", data={"small": True})
        with pytest.raises(StatePersistenceError) as again:
            await state_store.put_run(created.model_copy(update={"data": big}))
        assert again.value.reason == "too_large"
        assert await state_store.get_run("acme", "run_2") == created

        with pytest.raises(StatePersistenceError):
            await state_store.put_session(SessionRecord(tenant="acme", session_id="s1", data=big))
        assert await state_store.get_session("acme", "s1") is None

    async def test_the_limit_counts_utf8_bytes(self, state_store: StateStore) -> None:
        """The size limit counts UTF-8 bytes of the serialized blob, not characters."""
        fits = {"x": "é" * ((LIMIT - len('{"x":""}')) // 2)}
        await create(state_store, "run_1", data=fits)
        over = {"x": "é" * ((LIMIT - len('{"x":""}')) // 2 + 1)}
        with pytest.raises(StatePersistenceError):
            await create(state_store, "run_2", data=over)
        assert await state_store.get_run("acme", "run_2") is None

    # -- bad input --------------------------------------------------------------

    @pytest.mark.parametrize(
        ("fields", "named", "error"),
        [
            ({"tenant": ""}, "tenant", ValueError),
            ({"run_id": ""}, "run_id", ValueError),
            ({"run_id": "a\x00b"}, "run_id", ValueError),
            ({"session_id": ""}, "session_id", ValueError),
            ({"data": {"x": float("nan")}}, "data", ValueError),
            ({"data": {"x": [1.0, float("inf")]}}, "data", ValueError),
            ({"data": {"x": {1, 2}}}, "data", ValueError),
            ({"data": {"x": object()}}, "data", ValueError),
            ({"data": {"x": b"bytes"}}, "data", ValueError),
            ({"data": {"x": "nul\x00here"}}, "data", ValueError),
            ({"data": {"x": {1: "int key"}}}, "data", ValueError),
        ],
    )
    async def test_bad_run_is_refused_naming_the_field(
        self,
        state_store: StateStore,
        fields: dict[str, Any],
        named: str,
        error: type[Exception],
    ) -> None:
        """Bad input (empty ids, NUL, NaN, non-JSON values, non-string keys) raises
        ValueError/TypeError naming the field, and nothing is written."""
        values: dict[str, Any] = {"tenant": "acme", "run_id": "run_1", **fields}
        record = RunRecord.model_construct(**values)
        with pytest.raises(error, match=named):
            await state_store.put_run(record)
        assert await state_store.get_run("acme", "run_1") is None
        assert (await state_store.list_runs("acme")).items == []

    @pytest.mark.parametrize("data", [[1, 2], "text", None, 3])
    async def test_blob_that_is_not_an_object_is_refused(
        self, state_store: StateStore, data: Any
    ) -> None:
        """A blob that is not a JSON object raises ValueError naming data; nothing is written."""
        record = RunRecord.model_construct(tenant="acme", run_id="run_1", data=data)
        with pytest.raises(ValueError, match="data"):
            await state_store.put_run(record)
        session = SessionRecord.model_construct(tenant="acme", session_id="s1", data=data)
        with pytest.raises(ValueError, match="data"):
            await state_store.put_session(session)
        assert await state_store.get_run("acme", "run_1") is None
        assert await state_store.get_session("acme", "s1") is None

    @EACH_ACCEPTED_JSON
    async def test_json_values_beyond_dict_and_list_are_stored_as_plain_json(
        self, state_store: StateStore, value: Any, stored: Any
    ) -> None:
        """Any Mapping is a JSON object, a tuple an array, a str/int/float subclass its plain
        value: a run and a session read back plain JSON, the same on every backing."""
        data = {"a": {"b": value}}
        created = await create(state_store, "run_1", data=data)
        session = await state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data=data)
        )
        fetched = await state_store.get_run("acme", "run_1")
        fetched_session = await state_store.get_session("acme", "s1")
        assert fetched is not None and fetched_session is not None
        for record in (created, fetched, session, fetched_session):
            assert record.data == {"a": {"b": stored}}
            assert_plain_json(record.data, "data")

    @EACH_REFUSED_JSON
    async def test_values_json_cannot_hold_are_refused_naming_where(
        self, state_store: StateStore, value: Any, says: str
    ) -> None:
        """A value JSON cannot hold exactly, at any depth and inside any container, raises
        ValueError naming the path (data['a']['b']...); nothing is written."""
        data = {"a": {"b": value}}
        for call in (
            lambda: state_store.put_run(RunRecord(tenant="acme", run_id="run_1", data=data)),
            lambda: state_store.put_session(
                SessionRecord(tenant="acme", session_id="s1", data=data)
            ),
        ):
            with pytest.raises(ValueError) as caught:
                await call()
            assert_refused_at(caught.value, "data['a']['b']", says)
        assert await state_store.get_run("acme", "run_1") is None
        assert await state_store.get_session("acme", "s1") is None
        assert (await state_store.list_runs("acme")).items == []

    async def test_ids_and_counts_of_subclasses_are_stored_as_plain_values(
        self, state_store: StateStore
    ) -> None:
        """A str subclass id (a StrEnum member, one whose __str__ lies) is its own text and an
        int subclass count its own number, on every backing."""
        record = RunRecord.model_construct(
            **{
                **RunRecord(tenant="acme", run_id="r").model_dump(),
                "tenant": LyingText("acme"),
                "run_id": LyingText("run_1"),
                "session_id": Mood.CALM,
            }
        )
        created = await state_store.put_run(record)
        patched = await state_store.patch_run(
            LyingText("acme"), LyingText("run_1"), iterations=LyingInt(2), cursor=LyingInt(3)
        )
        fetched = await state_store.get_run("acme", "run_1")
        listed = (await state_store.list_runs("acme", session_id="calm")).items
        assert fetched is not None
        assert (created.tenant, created.run_id, created.session_id) == ("acme", "run_1", "calm")
        assert (patched.iterations, patched.cursor) == (2, 3)
        assert fetched == patched and listed == [patched]
        for value in (fetched.tenant, fetched.run_id, fetched.session_id):
            assert type(value) is str
        assert type(fetched.iterations) is int

    async def test_non_string_ids_are_type_errors(self, state_store: StateStore) -> None:
        """An id that is not a str raises TypeError naming it."""
        bad: Any = 42
        with pytest.raises(TypeError, match="tenant"):
            await state_store.get_run(bad, "run_1")
        with pytest.raises(TypeError, match="run_id"):
            await state_store.patch_run("acme", bad, input_tokens=1)
        with pytest.raises(TypeError, match="session_id"):
            await state_store.get_session("acme", bad)
        with pytest.raises(TypeError, match="record"):
            await state_store.put_run(bad)

    @pytest.mark.parametrize(
        ("kwargs", "named"),
        [
            ({"limit": 0}, "limit"),
            ({"limit": 1001}, "limit"),
            ({"after": "not-a-cursor"}, "after"),
            ({"status": "sleeping"}, "status"),
            ({"session_id": ""}, "session_id"),
        ],
    )
    async def test_bad_listing_arguments_are_refused(
        self, state_store: StateStore, kwargs: dict[str, Any], named: str
    ) -> None:
        """A bad limit, cursor, status or session raises ValueError naming it."""
        with pytest.raises(ValueError, match=named):
            await state_store.list_runs("acme", **kwargs)

    # -- round trips --------------------------------------------------------------

    async def test_blob_round_trips_exactly(self, state_store: StateStore) -> None:
        """A blob with unicode, nesting, numbers and nulls reads back exactly as written."""
        nested: dict[str, Any] = {"leaf": True}
        for depth in range(20):
            nested = {f"level{depth}": nested, "list": [depth, [depth, {"d": depth}]]}
        data: dict[str, Any] = {
            "text": "héllo wörld ✓ 日本語 עברית 🦜‍🔥 e\u0301",
            "ключ 🗝": "значение",
            "": "empty key",
            "escapes": 'quote " backslash \\ newline \n tab \t \u2028 \u001f',
            "numbers": [0, -1, 2**53 + 1, -(2**63), 2**100, 0.1, -2.5, 1e-7, 6.02e23, 1.0],
            "flags": [True, False, None],
            "empty": {"object": {}, "list": []},
            "nested": nested,
        }
        created = await create(state_store, "run_1", data=data)
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        for record in (created, stored):
            assert record.data == data
            numbers = record.data["numbers"]
            assert [type(n) for n in numbers] == [type(n) for n in data["numbers"]]
        session = await state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data=data)
        )
        assert session.data == data
        fetched = await state_store.get_session("acme", "s1")
        assert fetched is not None
        assert fetched.data == data

    async def test_unicode_ids_round_trip(self, state_store: StateStore) -> None:
        """Ids may hold any non-NUL unicode, separators included, and round-trip exactly."""
        tenant, run_id, session_id = "ténant:{x}", "rün/1 🦜:{}", "séssion:1"
        created = await create(state_store, run_id, tenant=tenant, session_id=session_id)
        assert created.tenant == tenant
        assert created.run_id == run_id
        assert await state_store.get_run(tenant, run_id) == created
        page = await state_store.list_runs(tenant, session_id=session_id)
        assert [r.run_id for r in page.items] == [run_id]
