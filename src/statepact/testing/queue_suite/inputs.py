"""``WorkQueueConformance``'s part: stats, sizes, bad input, round trips and time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import StatePersistenceError
from statepact.models import QueueStats, WorkItem
from statepact.queue import WorkQueue
from statepact.testing._inputs import (
    AWARE_ELSEWHERE,
    EACH_ACCEPTED_JSON,
    EACH_BROKEN_CLOCK,
    EACH_REFUSED_JSON,
    Colour,
    LyingInt,
    LyingText,
    assert_plain_json,
    assert_refused_at,
)
from statepact.testing.queue_suite._common import (
    LEASE,
    LIMIT,
    SuiteBase,
    _claim,
    _fill,
    _item,
    _stats,
)

__all__ = ["InputConformance"]


class InputConformance(SuiteBase):
    """Stats, sizes, bad input, round trips and time."""

    # -- stats ------------------------------------------------------------------

    async def test_stats_per_tenant(self, work_queue: WorkQueue, clock: ManualClock) -> None:
        """stats counts queued (due or not), leased and dead per tenant; done items and idle
        tenants are left out."""
        assert await work_queue.stats() == QueueStats(queue=work_queue.name)
        await _fill(work_queue, "A", 4)
        await _fill(work_queue, "B", 2)
        await work_queue.enqueue(_item("C", "later"), delay=60)
        await work_queue.enqueue(_item("D", "gone"))
        a1, b1, d1, a2 = await work_queue.claim_batch("w1", lease_for=LEASE, limit=4)
        assert [lease.item.tenant for lease in (a1, b1, d1, a2)] == ["A", "B", "D", "A"]
        await work_queue.ack(d1)
        await work_queue.fail(a1, "poison", retryable=False)
        stats = await work_queue.stats()
        assert stats.queue == work_queue.name
        assert stats.tenants == _stats(A=(2, 1, 1), B=(1, 1, 0), C=(1, 0, 0))
        assert (stats.queued, stats.leased, stats.dead) == (4, 2, 1)
        clock.advance(LEASE)
        await work_queue.reap()
        assert (await work_queue.stats()).tenants == _stats(A=(3, 0, 1), B=(2, 0, 0), C=(1, 0, 0))

    # -- size and bad input ---------------------------------------------------------

    async def test_payload_at_the_limit_is_accepted(self, work_queue: WorkQueue) -> None:
        """A payload of exactly max_value_bytes serialized bytes is stored and claimed whole."""
        payload = {"x": "q" * (LIMIT - len('{"x":""}'))}
        await work_queue.enqueue(_item("acme", "big", payload=payload))
        assert (await _claim(work_queue)).item.payload == payload

    async def test_oversized_payload_is_refused_before_anything_is_sent(
        self, work_queue: WorkQueue
    ) -> None:
        """A payload over max_value_bytes raises StatePersistenceError(reason='too_large'),
        not retryable, before anything is sent."""
        await work_queue.enqueue(_item("acme", "small"))
        before = await work_queue.stats()
        payload = {"x": "q" * (LIMIT - len('{"x":""}') + 1)}
        with pytest.raises(StatePersistenceError) as caught:
            await work_queue.enqueue(_item("acme", "big", payload=payload))
        assert caught.value.reason == "too_large"
        assert caught.value.retryable is False
        assert await work_queue.stats() == before
        assert await work_queue.get_item("acme", "big") is None

    @pytest.mark.parametrize(
        ("fields", "named", "error"),
        [
            ({"tenant": ""}, "tenant", ValueError),
            ({"item_id": ""}, "item_id", ValueError),
            ({"item_id": "a\x00b"}, "item_id", ValueError),
            ({"tenant": 7}, "tenant", TypeError),
            ({"payload": {"x": float("nan")}}, "payload", ValueError),
            ({"payload": {"x": float("-inf")}}, "payload", ValueError),
            ({"payload": {"x": {1, 2}}}, "payload", ValueError),
            ({"payload": {"x": object()}}, "payload", ValueError),
            ({"payload": {"x": {2: "int key"}}}, "payload", ValueError),
            ({"payload": {3: "int key"}}, "payload", ValueError),
            ({"payload": [1, 2]}, "payload", ValueError),
            ({"payload": "text"}, "payload", ValueError),
            ({"priority": 1001}, "priority", ValueError),
            ({"queue": "some-other-queue"}, "queue", ValueError),
        ],
    )
    async def test_bad_item_is_refused_naming_the_field(
        self,
        work_queue: WorkQueue,
        fields: dict[str, Any],
        named: str,
        error: type[Exception],
    ) -> None:
        """A bad item (empty ids, NUL, non-JSON payload, out-of-range priority, another queue)
        raises ValueError/TypeError naming the field; nothing is stored."""
        values: dict[str, Any] = {"tenant": "acme", "item_id": "job-1", **fields}
        with pytest.raises(error, match=named):
            await work_queue.enqueue(WorkItem.model_construct(**values))
        assert await work_queue.get_item("acme", "job-1") is None
        assert (await work_queue.stats()).tenants == {}

    async def test_ids_and_numbers_of_subclasses_are_stored_as_plain_values(
        self, work_queue: WorkQueue
    ) -> None:
        """A str subclass id (one whose __str__ lies) is its own text and an int subclass
        priority or limit its own number, on every backing."""
        item = WorkItem.model_construct(
            **{
                **_item("acme", "job").model_dump(),
                "tenant": LyingText("acme"),
                "item_id": LyingText("job-1"),
                "priority": LyingInt(7),
            }
        )
        stored = await work_queue.enqueue(item)
        await work_queue.enqueue(_item("acme", "job-2", priority=Colour.RED))
        [lease, second] = await work_queue.claim_batch(
            LyingText("w1"), lease_for=LEASE, limit=LyingInt(2)
        )
        assert (stored.tenant, stored.item_id, stored.priority) == ("acme", "job-1", 7)
        assert (lease.item.item_id, second.item.item_id, lease.worker_id) == (
            "job-1",
            "job-2",
            "w1",
        )
        fetched = await work_queue.get_item("acme", "job-1")
        assert fetched is not None and fetched == lease.item
        for value in (fetched.tenant, fetched.item_id, lease.worker_id):
            assert type(value) is str
        assert type(fetched.priority) is int and type(second.item.priority) is int

    @EACH_ACCEPTED_JSON
    async def test_json_values_beyond_dict_and_list_are_stored_as_plain_json(
        self, work_queue: WorkQueue, value: Any, stored: Any
    ) -> None:
        """Any Mapping is a JSON object, a tuple an array, a str/int/float subclass its plain
        value: the item reads back plain JSON, the same on every backing."""
        enqueued = await work_queue.enqueue(_item("acme", "job-1", payload={"a": {"b": value}}))
        lease = await _claim(work_queue)
        fetched = await work_queue.get_item("acme", "job-1")
        assert fetched is not None
        for item in (enqueued, lease.item, fetched):
            assert item.payload == {"a": {"b": stored}}
            assert_plain_json(item.payload, "payload")

    @EACH_REFUSED_JSON
    async def test_values_json_cannot_hold_are_refused_naming_where(
        self, work_queue: WorkQueue, value: Any, says: str
    ) -> None:
        """A payload value JSON cannot hold exactly, at any depth, raises ValueError naming the
        path (payload['a']['b']...); nothing is stored."""
        with pytest.raises(ValueError) as caught:
            await work_queue.enqueue(_item("acme", "job-1", payload={"a": {"b": value}}))
        assert_refused_at(caught.value, "payload['a']['b']", says)
        assert await work_queue.get_item("acme", "job-1") is None
        assert (await work_queue.stats()).tenants == {}

    @pytest.mark.parametrize(
        ("kwargs", "named", "error"),
        [
            ({"delay": -1}, "delay", ValueError),
            ({"delay": float("nan")}, "delay", ValueError),
            ({"delay": "5"}, "delay", TypeError),
        ],
    )
    async def test_bad_delay_is_refused(
        self, work_queue: WorkQueue, kwargs: dict[str, Any], named: str, error: type[Exception]
    ) -> None:
        """A negative or non-numeric delay raises ValueError/TypeError naming delay."""
        with pytest.raises(error, match=named):
            await work_queue.enqueue(_item("acme", "job-1"), **kwargs)
        assert await work_queue.get_item("acme", "job-1") is None

    @pytest.mark.parametrize(
        ("kwargs", "named", "error"),
        [
            ({"lease_for": 0}, "lease_for", ValueError),
            ({"lease_for": -5}, "lease_for", ValueError),
            ({"lease_for": timedelta(0)}, "lease_for", ValueError),
            ({"lease_for": float("inf")}, "lease_for", ValueError),
            ({"lease_for": "30"}, "lease_for", TypeError),
            ({"worker_id": ""}, "worker_id", ValueError),
            ({"limit": 0}, "limit", ValueError),
            ({"limit": 1001}, "limit", ValueError),
        ],
    )
    async def test_bad_claim_is_refused(
        self, work_queue: WorkQueue, kwargs: dict[str, Any], named: str, error: type[Exception]
    ) -> None:
        """A non-positive lease, an empty worker id or a bad limit raises ValueError/TypeError
        naming it; nothing is claimed."""
        await work_queue.enqueue(_item("acme", "job-1"))
        args: dict[str, Any] = {"worker_id": "w1", "lease_for": LEASE, "limit": 1, **kwargs}
        with pytest.raises(error, match=named):
            await work_queue.claim_batch(**args)
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))

    async def test_bad_settle_arguments_are_refused(self, work_queue: WorkQueue) -> None:
        """A settle given something other than a Lease, or fail given a non-str error, raises
        TypeError; nothing changes."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        bad: Any = {"token": lease.token}
        settles: list[Callable[[Any], Awaitable[object]]] = [
            work_queue.ack,
            work_queue.release,
            work_queue.heartbeat,
        ]
        for settle in settles:
            with pytest.raises(TypeError, match="lease"):
                await settle(bad)
        with pytest.raises(TypeError, match="error"):
            await work_queue.fail(lease, bad)
        assert await work_queue.get_item("acme", "job-1") == lease.item

    # -- round trips and time ------------------------------------------------------

    async def test_payload_round_trips_exactly(self, work_queue: WorkQueue) -> None:
        """A payload with unicode, nesting, numbers and nulls comes back exactly as enqueued."""
        payload: dict[str, Any] = {
            "prompt": "Résumé ✓ 日本語 🦜‍🔥 e\u0301",
            "ключ": {"nested": [1, [2, [3, {"deep": None}]]], "": ""},
            "numbers": [0, -7, 2**53 + 1, 2**100, 0.1, -2.5, 1e-7, 6.02e23, 1.0],
            "flags": [True, False, None],
            "escapes": 'quote " backslash \\ newline \n \u2028',
        }
        stored = await work_queue.enqueue(_item("ténant:{x}", "ïtem/1 🦜", payload=payload))
        assert stored.payload == payload
        lease = await _claim(work_queue)
        for item in (lease.item, await work_queue.get_item("ténant:{x}", "ïtem/1 🦜")):
            assert item is not None
            assert (item.tenant, item.item_id) == ("ténant:{x}", "ïtem/1 🦜")
            assert item.payload == payload
            numbers = item.payload["numbers"]
            assert [type(n) for n in numbers] == [type(n) for n in payload["numbers"]]

    async def test_times_come_from_the_injected_clock(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """created_at, updated_at, available_at and expires_at all come from the injected clock."""
        start = clock.now()
        stored = await work_queue.enqueue(_item("acme", "job-1"), delay=timedelta(hours=1))
        assert stored.created_at == stored.updated_at == start
        assert stored.available_at == start + timedelta(hours=1)
        clock.advance(timedelta(hours=1, microseconds=3))
        lease = await _claim(work_queue)
        assert lease.item.created_at == start
        assert lease.item.updated_at == clock.now()
        assert lease.expires_at == clock.now() + timedelta(seconds=LEASE)
        assert lease.expires_at.utcoffset() == timedelta(0)
        clock.advance(2)
        failed = await work_queue.fail(lease, "x")
        assert failed.created_at == start
        assert failed.updated_at == clock.now()

    @EACH_BROKEN_CLOCK
    async def test_a_clock_without_a_timezone_is_refused_naming_the_clock(
        self,
        work_queue: WorkQueue,
        clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch,
        reading: Any,
        error: type[Exception],
    ) -> None:
        """A clock whose now() is naive or not a datetime is refused naming the clock, by
        every call that reads it, before anything changes."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.enqueue(_item("acme", "job-2"))
        lease = await _claim(work_queue)
        dead = await _claim(work_queue)
        dead_item = await work_queue.fail(dead, "poison", retryable=False)
        before = (
            await work_queue.stats(),
            await work_queue.get_item("acme", "job-1"),
            await work_queue.get_item("acme", "job-2"),
        )
        monkeypatch.setattr(clock, "now", lambda: reading)
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: work_queue.enqueue(_item("acme", "job-3")),
            lambda: work_queue.claim("w2", lease_for=LEASE),
            lambda: work_queue.heartbeat(lease),
            lambda: work_queue.ack(lease),
            lambda: work_queue.fail(lease, "x"),
            lambda: work_queue.release(lease),
            work_queue.reap,
            lambda: work_queue.requeue(dead_item),
        ]
        for call in calls:
            with pytest.raises(error, match=r"^clock"):
                await call()
        monkeypatch.undo()
        after = (
            await work_queue.stats(),
            await work_queue.get_item("acme", "job-1"),
            await work_queue.get_item("acme", "job-2"),
        )
        assert after == before
        assert await work_queue.get_item("acme", "job-3") is None

    async def test_a_clock_in_another_zone_is_stored_as_utc(
        self, work_queue: WorkQueue, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An aware reading in another zone is the same instant, stored and returned in UTC."""
        monkeypatch.setattr(clock, "now", lambda: AWARE_ELSEWHERE)
        stored = await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        fetched = await work_queue.get_item("acme", "job-1")
        assert fetched is not None
        moments = [
            stored.created_at,
            stored.available_at,
            lease.item.updated_at,
            fetched.updated_at,
        ]
        for moment in moments:
            assert moment == AWARE_ELSEWHERE
            assert moment is not None and moment.utcoffset() == timedelta(0)
            assert moment == moment.astimezone(UTC)
        assert lease.expires_at == AWARE_ELSEWHERE + timedelta(seconds=LEASE)
        assert lease.expires_at.utcoffset() == timedelta(0)
