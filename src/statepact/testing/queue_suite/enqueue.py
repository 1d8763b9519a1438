"""``WorkQueueConformance``'s part: enqueue, enqueue_many, ack_many, watch, delays and priority."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError, StatePersistenceError
from statepact.models import ItemStatus, WorkItem
from statepact.queue import WorkQueue
from statepact.testing.queue_suite._common import (
    LEASE,
    LIMIT,
    SuiteBase,
    _claim,
    _item,
    _stats,
    _woken_by,
)

__all__ = ["EnqueueConformance"]


class EnqueueConformance(SuiteBase):
    """Enqueue, enqueue_many, ack_many, watch, delays and priority."""

    # -- enqueue, claim, ack --------------------------------------------------

    async def test_is_a_work_queue(self, work_queue: WorkQueue) -> None:
        """The backing satisfies the ``WorkQueue`` protocol."""
        assert isinstance(work_queue, WorkQueue)
        assert isinstance(work_queue.name, str)
        assert work_queue.name

    async def test_enqueue_returns_the_stored_item(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """enqueue stores a queued item, due now, and returns it as get_item reads it."""
        stored = await work_queue.enqueue(_item("acme", "job-1", payload={"n": 1}, priority=3))
        assert stored.queue == work_queue.name
        assert (stored.tenant, stored.item_id) == ("acme", "job-1")
        assert stored.payload == {"n": 1}
        assert stored.priority == 3
        assert stored.status is ItemStatus.QUEUED
        assert stored.attempts == 0
        assert stored.last_error is None
        assert stored.available_at == stored.created_at == stored.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == stored

    async def test_get_missing_item_is_none(self, work_queue: WorkQueue) -> None:
        """get_item of an item that is not there returns None."""
        assert await work_queue.get_item("acme", "nope") is None

    async def test_claim_on_an_empty_queue_is_none(self, work_queue: WorkQueue) -> None:
        """claim returns None when nothing is due; claim_batch returns an empty list."""
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue.claim_batch("w1", lease_for=LEASE, limit=5) == []

    async def test_enqueue_claim_ack(self, work_queue: WorkQueue, clock: ManualClock) -> None:
        """A claim leases the item (attempt counted, fenced token, expiry); ack marks it done."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"task": "summarise"}))
        clock.advance(1)
        lease = await _claim(work_queue, "worker-7")
        assert lease.worker_id == "worker-7"
        assert isinstance(lease.token, int)
        assert lease.expires_at == clock.now() + timedelta(seconds=LEASE)
        assert lease.lease_seconds == LEASE
        assert lease.item.item_id == "job-1"
        assert lease.item.payload == {"task": "summarise"}
        assert lease.item.status is ItemStatus.LEASED
        assert lease.item.attempts == 1
        assert lease.item.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == lease.item
        assert await work_queue.claim("worker-8", lease_for=LEASE) is None
        clock.advance(1)
        done = await work_queue.ack(lease)
        assert done.status is ItemStatus.DONE
        assert done.attempts == 1
        assert done.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == done
        assert await work_queue.claim("worker-8", lease_for=LEASE) is None
        assert (await work_queue.stats()).tenants == {}

    async def test_lease_for_takes_a_timedelta(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """lease_for is seconds or a timedelta; the lease expires that long from now."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await work_queue.claim("w1", lease_for=timedelta(minutes=2, milliseconds=500))
        assert lease is not None
        assert lease.expires_at == clock.now() + timedelta(seconds=120.5)
        assert lease.lease_seconds == 120.5

    async def test_enqueue_is_idempotent(self, work_queue: WorkQueue) -> None:
        """The same (queue, tenant, item_id) again returns the existing item unchanged, whatever
        its status."""
        first = await work_queue.enqueue(_item("acme", "job-1", payload={"v": 1}))
        again = await work_queue.enqueue(_item("acme", "job-1", payload={"v": 2}, priority=9))
        assert again == first
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))
        lease = await _claim(work_queue)
        while_leased = await work_queue.enqueue(_item("acme", "job-1"))
        assert while_leased == lease.item
        assert await work_queue.claim("w2", lease_for=LEASE) is None
        done = await work_queue.ack(lease)
        after_done = await work_queue.enqueue(_item("acme", "job-1", payload={"v": 3}))
        assert after_done == done
        assert after_done.status is ItemStatus.DONE
        assert await work_queue.claim("w2", lease_for=LEASE) is None

    async def test_concurrent_enqueues_of_one_id_store_one_item(
        self, work_queue: WorkQueue
    ) -> None:
        """Ten concurrent enqueues of one id store one item, and all of them return it."""
        results = await asyncio.gather(
            *(work_queue.enqueue(_item("acme", "job-1", payload={"w": i})) for i in range(10))
        )
        assert all(result == results[0] for result in results)
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))

    # -- watch ---------------------------------------------------------------------

    async def test_watch_wakes_on_an_enqueue_and_times_out_without_one(
        self, work_queue: WorkQueue
    ) -> None:
        """A watcher waiting with a long timeout returns True soon after another task's
        enqueue; with nothing enqueued it returns False at its timeout; a bad timeout is
        refused naming it."""
        async with work_queue.watch() as watch:
            with pytest.raises(ValueError, match="timeout"):
                await watch.wait(-1)
            # Whatever wake-ups earlier writes left are used up first.
            while await watch.wait(0.05):
                pass
            assert await watch.wait(0.05) is False
            await _woken_by(watch, lambda: work_queue.enqueue(_item("acme", "wake-1")))

    async def test_watch_keeps_a_wake_up_that_came_while_nobody_waited(
        self, work_queue: WorkQueue
    ) -> None:
        """An enqueue made while the watcher is not waiting (between a claim that found
        nothing and the next wait) is not lost: the next wait returns True at once, and
        only once."""
        async with work_queue.watch() as watch:
            while await watch.wait(0.05):  # earlier writes' wake-ups used up first
                pass
            await work_queue.enqueue(_item("acme", "wake-kept"))
            assert await asyncio.wait_for(watch.wait(30), 5) is True
            assert await watch.wait(0.05) is False

    async def test_watch_wakes_on_an_enqueue_many(self, work_queue: WorkQueue) -> None:
        """A batch of new items wakes a waiting watcher, as a single enqueue does."""
        batch = [_item("acme", "wake-a"), _item("beta", "wake-b")]
        async with work_queue.watch() as watch:
            await _woken_by(watch, lambda: work_queue.enqueue_many(batch))

    async def test_watch_reports_an_enqueue_made_before_its_first_wait(
        self, work_queue: WorkQueue
    ) -> None:
        """An enqueue between opening a watch and its first ``wait`` (a claimer's first
        claim found nothing, the item came just after) is reported by that wait at once."""
        async with work_queue.watch() as watch:
            await work_queue.enqueue(_item("acme", "early"))
            assert await asyncio.wait_for(watch.wait(30), 5) is True

    async def test_watch_wakes_when_an_item_goes_back_to_the_queue(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Every way an item becomes claimable again wakes a waiting watcher, as an enqueue
        does: a release, a retry (due later: the watcher asks ``next_due``), a lapsed
        lease reaped, a dead item requeued. A worker idle on another process learns of it
        without waiting for its poll."""
        await work_queue.enqueue(_item("acme", "back"))
        async with work_queue.watch() as watch:
            released = await work_queue.claim("w1", lease_for=30)
            assert released is not None
            await _woken_by(watch, lambda: work_queue.release(released))

            retried = await work_queue.claim("w1", lease_for=30)
            assert retried is not None
            await _woken_by(watch, lambda: work_queue.fail(retried, "boom", retry_in=60))

            clock.advance(61)
            lease = await work_queue.claim("w1", lease_for=30)
            assert lease is not None
            clock.advance(31)
            await _woken_by(watch, work_queue.reap)

            lease = await work_queue.claim("w1", lease_for=30)
            assert lease is not None
            dead = await work_queue.fail(lease, "fatal", retryable=False)
            assert dead.status is ItemStatus.DEAD
            await _woken_by(watch, lambda: work_queue.requeue(dead))

    # -- enqueue_many ------------------------------------------------------------

    async def test_enqueue_many_stores_the_batch_in_order(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Every item is stored as a single enqueue stores it, answered in batch order,
        and claims serve the batch like the same items enqueued one by one."""
        items = [_item(tenant, f"b{i:03d}", payload={"n": i}) for i in range(6) for tenant in "BA"]
        stored = await work_queue.enqueue_many(items)
        assert [(s.tenant, s.item_id) for s in stored] == [(i.tenant, i.item_id) for i in items]
        for record in stored:
            assert record.status is ItemStatus.QUEUED
            assert record.queue == work_queue.name
            assert record.created_at == record.available_at == clock.now()
            assert await work_queue.get_item(record.tenant, record.item_id) == record
        assert (await work_queue.stats()).tenants == _stats(A=(6, 0, 0), B=(6, 0, 0))
        claimed = [(await _claim(work_queue)).item for _ in range(12)]
        # Rotation across tenants; within a tenant, the batch's order is enqueue order.
        assert [c.tenant for c in claimed] == ["A", "B"] * 6
        assert [c.item_id for c in claimed if c.tenant == "A"] == [f"b{i:03d}" for i in range(6)]

    async def test_enqueue_many_keeps_the_batchs_order_within_a_tenant(
        self, work_queue: WorkQueue
    ) -> None:
        """A tenant's items of one batch are claimed in the batch's order, whatever order
        their ids sort in; a second batch's come after them."""
        first = ["x-2", "x-10", "x-1", "b", "a", "B"]
        second = ["a2", "a1"]
        await work_queue.enqueue_many([_item("acme", i) for i in first])
        await work_queue.enqueue_many([_item("zeta", "z"), *(_item("acme", i) for i in second)])
        claimed = [(await _claim(work_queue)).item for _ in range(len(first) + 3)]
        assert [c.item_id for c in claimed if c.tenant == "acme"] == first + second

    async def test_enqueue_many_is_idempotent_per_item(self, work_queue: WorkQueue) -> None:
        """An item already stored comes back as it is, in its place; the others are stored;
        the same batch again changes nothing."""
        first = await work_queue.enqueue(_item("acme", "job-1", payload={"v": 1}))
        lease = await _claim(work_queue)
        batch = [
            _item("acme", "job-0"),
            _item("acme", "job-1", payload={"v": 2}, priority=9),
            _item("zeta", "job-1"),
        ]
        stored = await work_queue.enqueue_many(batch)
        assert stored[1] == lease.item
        assert stored[1].payload == first.payload
        assert [s.status for s in stored] == [
            ItemStatus.QUEUED,
            ItemStatus.LEASED,
            ItemStatus.QUEUED,
        ]
        again = await work_queue.enqueue_many(batch)
        assert again[0] == stored[0] and again[2] == stored[2]
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0), zeta=(1, 0, 0))

    async def test_enqueue_many_honours_the_delay(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``delay`` applies to every item of the batch."""
        stored = await work_queue.enqueue_many(
            [_item("acme", "d1"), _item("acme", "d2")], delay=timedelta(seconds=5)
        )
        assert {s.available_at for s in stored} == {clock.now() + timedelta(seconds=5)}
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        clock.advance(5)
        assert (await _claim(work_queue)).item.item_id == "d1"

    async def test_concurrent_batches_sharing_ids_store_each_item_once(
        self, work_queue: WorkQueue
    ) -> None:
        """Batches racing over the same ids (in opposite orders) store each item once and
        all answer it; none deadlocks."""
        ids = [f"job-{i:02d}" for i in range(20)]
        batches = [
            [_item("acme", item_id, payload={"by": n}) for item_id in (ids if n % 2 else ids[::-1])]
            for n in range(6)
        ]
        answers = await asyncio.gather(*(work_queue.enqueue_many(b) for b in batches))
        truth = {r.item_id: r for r in answers[0]}
        for answer in answers:
            assert {r.item_id: r for r in answer} == truth
        assert (await work_queue.stats()).tenants == _stats(acme=(20, 0, 0))

    @pytest.mark.parametrize(
        ("fields", "named", "error"),
        [
            ({"tenant": ""}, "items[2].tenant", ValueError),
            ({"item_id": 7}, "items[2].item_id", TypeError),
            ({"payload": {"x": float("nan")}}, "items[2].payload", ValueError),
            ({"priority": 1001}, "items[2].priority", ValueError),
            ({"item_id": "a0"}, "items[2].item_id", ValueError),
        ],
    )
    async def test_enqueue_many_refuses_the_whole_batch_naming_the_item(
        self,
        work_queue: WorkQueue,
        fields: dict[str, Any],
        named: str,
        error: type[Exception],
    ) -> None:
        """One bad item (a repeated id included) refuses the batch, naming ``items[i].field``,
        and nothing of it is stored."""
        values: dict[str, Any] = {"tenant": "acme", "item_id": "a2", **fields}
        batch = [_item("acme", "a0"), _item("acme", "a1"), WorkItem.model_construct(**values)]
        with pytest.raises(error, match=re.escape(named)):
            await work_queue.enqueue_many(batch)
        assert await work_queue.get_item("acme", "a0") is None
        assert (await work_queue.stats()).tenants == {}

    async def test_enqueue_many_refuses_an_oversized_item_before_sending(
        self, work_queue: WorkQueue
    ) -> None:
        """An item over max_value_bytes refuses the batch (too_large) and stores none of it."""
        payload = {"x": "q" * (LIMIT - len('{"x":""}') + 1)}
        with pytest.raises(StatePersistenceError) as caught:
            await work_queue.enqueue_many(
                [_item("acme", "ok"), _item("acme", "big", payload=payload)]
            )
        assert caught.value.reason == "too_large"
        assert "items[1].payload" in str(caught.value)
        assert (await work_queue.stats()).tenants == {}

    @pytest.mark.parametrize(
        ("items", "error", "named"),
        [
            ([], ValueError, "items"),
            ("abc", TypeError, "items"),
            (None, TypeError, "items"),
            ([("acme", "x")], TypeError, "items[0]"),
        ],
    )
    async def test_enqueue_many_refuses_what_is_not_a_batch(
        self, work_queue: WorkQueue, items: Any, error: type[Exception], named: str
    ) -> None:
        with pytest.raises(error, match=re.escape(named)):
            await work_queue.enqueue_many(items)
        assert (await work_queue.stats()).tenants == {}

    async def test_enqueue_many_takes_up_to_ten_thousand(self, work_queue: WorkQueue) -> None:
        """10,000 items land in one call; 10,001 are refused before anything is sent."""
        batch = [_item(f"t{i % 7}", f"i{i:05d}") for i in range(10_001)]
        with pytest.raises(ValueError, match="items"):
            await work_queue.enqueue_many(batch)
        assert (await work_queue.stats()).tenants == {}
        stored = await work_queue.enqueue_many(batch[:10_000])
        assert len(stored) == 10_000
        assert [s.item_id for s in stored] == [b.item_id for b in batch[:10_000]]
        stats = await work_queue.stats()
        assert sum(t.queued for t in stats.tenants.values()) == 10_000

    # -- ack_many ----------------------------------------------------------------

    async def test_ack_many_acks_each_lease_in_order(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Every live lease of the batch is acked, answered in lease order, as ack would."""
        await work_queue.enqueue_many([_item(t, f"a{i}") for i in range(3) for t in "xy"])
        leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=6)
        clock.advance(1)
        done = await work_queue.ack_many(leases[::-1])
        assert [d.item_id for d in done if isinstance(d, WorkItem)] == [
            lease.item.item_id for lease in leases[::-1]
        ]
        for record in done:
            assert isinstance(record, WorkItem)
            assert record.status is ItemStatus.DONE
            assert record.updated_at == clock.now()
            assert await work_queue.get_item(record.tenant, record.item_id) == record
        assert (await work_queue.stats()).tenants == {}

    async def test_a_stale_lease_inside_ack_many_is_reported_and_the_rest_land(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A lease whose item was reaped and claimed again, one heartbeated past, and one
        already acked are each answered with the LeaseLostError ack would raise, and change
        nothing; the live leases of the same batch are acked."""
        await work_queue.enqueue_many([_item("acme", f"s{i}") for i in range(4)])
        stale = await _claim(work_queue, "w1", lease_for=5)
        live = [await _claim(work_queue, "w1", lease_for=LEASE) for _ in range(3)]
        clock.advance(6)
        await work_queue.reap()
        taker = await _claim(work_queue, "w2")
        assert taker.item.item_id == stale.item.item_id
        renewed = await work_queue.heartbeat(live[1])
        acked_before = await work_queue.ack(live[2])
        done = await work_queue.ack_many([live[0], stale, live[1], live[2]])
        assert isinstance(done[0], WorkItem) and done[0].status is ItemStatus.DONE
        for lost, lease in zip(done[1:], (stale, live[1], live[2]), strict=True):
            assert isinstance(lost, LeaseLostError), done
            assert lost.item_id == lease.item.item_id
            assert str(lease.token) in str(lost)
        assert await work_queue.get_item("acme", stale.item.item_id) == taker.item
        assert await work_queue.get_item("acme", live[1].item.item_id) == renewed.item
        assert await work_queue.get_item("acme", live[2].item.item_id) == acked_before
        # The renewed and the new holder still settle.
        assert (await work_queue.ack(renewed)).status is ItemStatus.DONE
        assert (await work_queue.ack(taker)).status is ItemStatus.DONE

    async def test_ack_many_refuses_a_bad_batch_before_sending(self, work_queue: WorkQueue) -> None:
        """An empty batch, more than 1,000 leases, something not a lease, or one item named
        twice: refused naming ``leases``, and nothing is acked."""
        await work_queue.enqueue(_item("acme", "r1"))
        lease = await _claim(work_queue)
        for bad, error, named in (
            ([], ValueError, "leases"),
            ([lease] * 1001, ValueError, "leases"),
            ([lease, "x"], TypeError, "leases[1]"),
            ([lease, lease], ValueError, "leases[1]"),
            ([lease.model_copy(update={"token": -5})], ValueError, "leases[0].token"),
        ):
            with pytest.raises(error, match=re.escape(named)):
                await work_queue.ack_many(bad)  # type: ignore[arg-type]
        assert (await work_queue.get_item("acme", "r1")) == lease.item
        assert (await work_queue.ack(lease)).status is ItemStatus.DONE

    async def test_enqueue_ignores_a_callers_bookkeeping(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """enqueue sets status, attempts, last_error and times itself, whatever the item says."""
        stored = await work_queue.enqueue(
            _item(
                "acme",
                "job-1",
                status=ItemStatus.DEAD,
                attempts=4,
                last_error="old",
                available_at=clock.now() + timedelta(days=9),
                created_at=clock.now() - timedelta(days=9),
            )
        )
        assert stored.status is ItemStatus.QUEUED
        assert stored.attempts == 0
        assert stored.last_error is None
        assert stored.available_at == stored.created_at == clock.now()
        assert (await _claim(work_queue)).item.item_id == "job-1"

    async def test_same_item_id_in_two_tenants(self, work_queue: WorkQueue) -> None:
        """The same item id under two tenants is two items."""
        await work_queue.enqueue(_item("t1", "job-1", payload={"t": 1}))
        await work_queue.enqueue(_item("t2", "job-1", payload={"t": 2}))
        leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=5)
        assert sorted((lease.item.tenant, lease.item.payload["t"]) for lease in leases) == [
            ("t1", 1),
            ("t2", 2),
        ]

    async def test_delay_is_honoured(self, work_queue: WorkQueue, clock: ManualClock) -> None:
        """An item enqueued with a delay is not due before now + delay, and is due at it."""
        stored = await work_queue.enqueue(_item("acme", "later"), delay=10)
        assert stored.available_at == clock.now() + timedelta(seconds=10)
        await work_queue.enqueue(_item("acme", "much-later"), delay=timedelta(minutes=5))
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        clock.advance(9.999)
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        clock.advance(0.001)
        assert (await _claim(work_queue)).item.item_id == "later"
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        clock.advance(290)
        assert (await _claim(work_queue)).item.item_id == "much-later"

    async def test_priority_within_a_tenant(self, work_queue: WorkQueue) -> None:
        """Within a tenant, due items go highest priority first, then in enqueue order."""
        for item_id, priority in [("p0-y", 0), ("p5-z", 5), ("n1", -1), ("p5-a", 5), ("p0-b", 0)]:
            await work_queue.enqueue(_item("acme", item_id, priority=priority))
        order = [(await _claim(work_queue)).item.item_id for _ in range(5)]
        assert order == ["p5-z", "p5-a", "p0-y", "p0-b", "n1"]

    async def test_delayed_item_keeps_its_enqueue_place(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Once due, a delayed item goes in enqueue order, ahead of equal-priority items
        enqueued after it."""
        await work_queue.enqueue(_item("acme", "zulu"), delay=5)
        await work_queue.enqueue(_item("acme", "mike"))
        await work_queue.enqueue(_item("acme", "alpha"))
        clock.advance(5)
        order = [(await _claim(work_queue)).item.item_id for _ in range(3)]
        assert order == ["zulu", "mike", "alpha"]

    async def test_next_due_is_when_the_earliest_delayed_item_comes_due(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """next_due is the earliest available_at later than now among queued items, across
        tenants; due, leased and dead items do not count; None when nothing is delayed."""
        assert await work_queue.next_due() is None
        await work_queue.enqueue(_item("acme", "now"))
        assert await work_queue.next_due() is None
        start = clock.now()
        await work_queue.enqueue(_item("beta", "in-30"), delay=30)
        await work_queue.enqueue(_item("gamma", "in-10"), delay=10)
        assert await work_queue.next_due() == start + timedelta(seconds=10)
        clock.advance(10)  # gamma's item is due now (claimed or not): beta's is next
        assert await work_queue.next_due() == start + timedelta(seconds=30)
        leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=5)
        assert sorted(lease.item.item_id for lease in leases) == ["in-10", "now"]
        assert await work_queue.next_due() == start + timedelta(seconds=30)
        retried = await work_queue.fail(leases[0], "boom", retry_in=5)
        assert await work_queue.next_due() == retried.available_at
        await work_queue.fail(leases[1], "fatal", retryable=False)  # dead: not due ever
        clock.advance(30)
        assert await work_queue.next_due() is None

    async def test_watch_wakes_on_a_delayed_enqueue(self, work_queue: WorkQueue) -> None:
        """A delayed enqueue wakes a watcher too, so an idle claimer can ask next_due and
        sleep until then instead of its whole poll interval."""
        async with work_queue.watch() as watch:
            await _woken_by(watch, lambda: work_queue.enqueue(_item("acme", "later"), delay=60))
