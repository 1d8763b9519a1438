"""``WorkQueueConformance``'s part: unique keys (one item per key while it blocks)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import WorkQueue
from statepact.testing.queue_suite._common import LEASE, SuiteBase, _claim, _item, _stats

__all__ = ["UniqueConformance"]

HOUR = timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _to_next_period(clock: ManualClock, period: timedelta) -> None:
    """Move the clock to the first instant of the next ``period`` bucket."""
    since = clock.now() - _EPOCH
    clock.advance(period - since % period)


class UniqueConformance(SuiteBase):
    """``WorkItem.unique_key`` and ``unique_for``, enforced by the server."""

    async def test_a_unique_key_returns_the_item_holding_it(self, work_queue: WorkQueue) -> None:
        """While an item with the key is queued or leased, enqueue of another returns it and
        stores nothing; once it is done the key is free."""
        first = await work_queue.enqueue(_item("acme", "a", unique_key="summarise:c1"))
        assert first.unique_key == "summarise:c1"
        assert await work_queue.enqueue(_item("acme", "b", unique_key="summarise:c1")) == first
        assert await work_queue.get_item("acme", "b") is None
        lease = await _claim(work_queue)
        again = await work_queue.enqueue(_item("acme", "c", unique_key="summarise:c1"))
        assert again.item_id == "a" and again.status is ItemStatus.LEASED
        await work_queue.ack(lease)
        fresh = await work_queue.enqueue(_item("acme", "d", unique_key="summarise:c1"))
        assert fresh.item_id == "d" and fresh.status is ItemStatus.QUEUED
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))

    async def test_a_delayed_item_holds_its_key(self, work_queue: WorkQueue) -> None:
        """A queued item not yet due holds its key too."""
        later = await work_queue.enqueue(_item("acme", "a", unique_key="k"), delay=60)
        assert await work_queue.enqueue(_item("acme", "b", unique_key="k")) == later

    async def test_unique_keys_are_per_tenant(self, work_queue: WorkQueue) -> None:
        """One key in two tenants is two items."""
        one = await work_queue.enqueue(_item("acme", "a", unique_key="k"))
        two = await work_queue.enqueue(_item("globex", "a", unique_key="k"))
        assert (one.tenant, two.tenant) == ("acme", "globex")
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0), globex=(1, 0, 0))

    async def test_item_id_is_checked_before_the_key(self, work_queue: WorkQueue) -> None:
        """An enqueue of a stored id returns that item, whatever key it names."""
        first = await work_queue.enqueue(_item("acme", "a", unique_key="k"))
        assert await work_queue.enqueue(_item("acme", "a", unique_key="other")) == first
        assert await work_queue.enqueue(_item("acme", "b", unique_key="other")) != first

    async def test_a_retried_item_keeps_its_key_and_dead_or_cancelled_frees_it(
        self, work_queue: WorkQueue
    ) -> None:
        """An item waiting for its retry still blocks; dead or cancelled, it does not, and a
        requeued dead item holds no key."""
        await work_queue.enqueue(_item("acme", "a", unique_key="k"))
        retried = await work_queue.fail(await _claim(work_queue), "flaky")
        assert retried.status is ItemStatus.QUEUED
        assert (await work_queue.enqueue(_item("acme", "b", unique_key="k"))).item_id == "a"
        await work_queue.cancel("acme", "a")
        assert (await work_queue.enqueue(_item("acme", "b", unique_key="k"))).item_id == "b"
        dead = await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        assert dead.item_id == "b" and dead.status is ItemStatus.DEAD
        assert (await work_queue.enqueue(_item("acme", "c", unique_key="k"))).item_id == "c"
        back = await work_queue.requeue(dead)
        assert back.status is ItemStatus.QUEUED
        assert (await work_queue.enqueue(_item("acme", "d", unique_key="k"))).item_id == "c"

    async def test_a_period_blocks_through_done_until_it_ends(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """With unique_for, a done item keeps its key until the period it was enqueued in
        ends; the next period takes a new item."""
        _to_next_period(clock, HOUR)
        first = await work_queue.enqueue(_item("acme", "a", unique_key="k", unique_for=HOUR))
        assert first.unique_for == HOUR
        done = await work_queue.ack(await _claim(work_queue))
        clock.advance(HOUR - timedelta(seconds=1))
        blocked = await work_queue.enqueue(_item("acme", "b", unique_key="k", unique_for=HOUR))
        assert blocked == done
        clock.advance(1)
        fresh = await work_queue.enqueue(_item("acme", "c", unique_key="k", unique_for=HOUR))
        assert fresh.item_id == "c" and fresh.status is ItemStatus.QUEUED

    async def test_a_period_key_is_freed_by_dead_and_cancel(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Within its period, a dead or cancelled item no longer holds its key."""
        _to_next_period(clock, HOUR)
        await work_queue.enqueue(_item("acme", "a", unique_key="k", unique_for=HOUR))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        second = await work_queue.enqueue(_item("acme", "b", unique_key="k", unique_for=HOUR))
        assert second.item_id == "b"
        await work_queue.cancel("acme", "b")
        third = await work_queue.enqueue(_item("acme", "c", unique_key="k", unique_for=HOUR))
        assert third.item_id == "c"

    async def test_concurrent_enqueues_of_one_key_store_one_item(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """Twenty enqueues of one key at once, through two queue objects, store one item and
        all return it."""
        answers = await asyncio.gather(
            *(
                (work_queue if index % 2 else work_queue_peer).enqueue(
                    _item("acme", f"job-{index:02d}", unique_key="k")
                )
                for index in range(20)
            )
        )
        assert len({item.item_id for item in answers}) == 1
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))
        lease = await _claim(work_queue)
        assert lease.item.item_id == answers[0].item_id
        assert await work_queue.claim("w1", lease_for=LEASE) is None

    async def test_enqueue_many_with_one_key_twice_stores_the_first(
        self, work_queue: WorkQueue
    ) -> None:
        """A batch naming one key twice stores its first item; the later one is answered
        with it, in its place."""
        answers = await work_queue.enqueue_many(
            [
                _item("acme", "x1", unique_key="k"),
                _item("acme", "y", unique_key="other"),
                _item("acme", "x2", unique_key="k"),
                _item("acme", "z"),
            ]
        )
        assert [item.item_id for item in answers] == ["x1", "y", "x1", "z"]
        assert answers[2] == answers[0]
        assert await work_queue.get_item("acme", "x2") is None
        again = await work_queue.enqueue_many([_item("acme", "x3", unique_key="k")])
        assert again == [answers[0]]

    async def test_concurrent_batches_of_one_key_store_one_item(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """Batches racing with one key between them store one item of it."""
        answers = await asyncio.gather(
            *(
                queue.enqueue_many(
                    [_item("acme", f"{name}-{index}", unique_key="k") for index in range(3)]
                )
                for name, queue in (("a", work_queue), ("b", work_queue_peer), ("c", work_queue))
            )
        )
        winners = {item.item_id for batch in answers for item in batch}
        assert len(winners) == 1
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))

    async def test_unique_fields_and_timeout_round_trip(self, work_queue: WorkQueue) -> None:
        """unique_key, unique_for and timeout are stored and returned by every read."""
        item = _item("acme", "a", unique_key="k", unique_for=HOUR, timeout=2.5)
        stored = await work_queue.enqueue(item)
        assert (stored.unique_key, stored.unique_for, stored.timeout) == ("k", HOUR, 2.5)
        assert await work_queue.get_item("acme", "a") == stored
        lease = await _claim(work_queue)
        assert (lease.item.unique_key, lease.item.unique_for, lease.item.timeout) == (
            "k",
            HOUR,
            2.5,
        )
        dead = await work_queue.fail(lease, "x", retryable=False)
        (listed,) = await work_queue.dead_letters("acme")
        assert listed == dead and listed.timeout == 2.5 and listed.unique_for == HOUR
        plain = await work_queue.enqueue(_item("acme", "b"))
        assert (plain.unique_key, plain.unique_for, plain.timeout) == (None, None, None)

    @pytest.mark.parametrize(
        ("fields", "error", "field"),
        [
            ({"unique_key": ""}, ValueError, "unique_key"),
            ({"unique_key": "a\x00b"}, ValueError, "unique_key"),
            ({"unique_for": HOUR}, ValueError, "unique_for"),
            ({"unique_key": "k", "unique_for": timedelta(0)}, ValueError, "unique_for"),
            ({"unique_key": "k", "unique_for": timedelta(seconds=-1)}, ValueError, "unique_for"),
            ({"timeout": 0}, ValueError, "timeout"),
            ({"timeout": -1.5}, ValueError, "timeout"),
            ({"timeout": float("nan")}, ValueError, "timeout"),
        ],
    )
    async def test_bad_unique_and_timeout_fields_are_refused_naming_them(
        self, work_queue: WorkQueue, fields: dict[str, object], error: type[Exception], field: str
    ) -> None:
        """A bad unique_key, unique_for or timeout is refused naming the field (with its
        place in a batch), before anything is written."""
        with pytest.raises(error, match=field):
            await work_queue.enqueue(WorkItem(tenant="acme", item_id="a", **fields))
        batch = [_item("acme", "ok"), WorkItem(tenant="acme", item_id="a", **fields)]
        with pytest.raises(error, match=rf"items\[1\]\.{field}"):
            await work_queue.enqueue_many(batch)
        assert await work_queue.get_item("acme", "ok") is None
