"""``WorkQueueConformance``: the behaviour every ``WorkQueue`` backing must show.

Subclass it in a test module and provide these fixtures:

- ``work_queue``: a fresh, empty ``WorkQueue`` built with the test's ``clock``,
  the ``queue_policy`` fixture's policy and the default ``max_value_bytes``.
  It must see nothing another test wrote.
- ``clock``: the ``ManualClock`` the queue was built with. The class defines it
  as the plugin's ``statepact_clock``, so a fixture built with
  ``statepact_clock`` (or with ``clock``, inside the class) needs nothing more.

``queue_policy`` is defined by this class (:data:`SUITE_POLICY`: three attempts,
backoff 10 s doubling, capped at 40 s, no jitter), so a backing fixture only has
to *take* it: ``def my_work_queue(statepact_clock, queue_policy)``. A test that
needs another policy overrides it with ``@pytest.mark.parametrize("queue_policy",
[...])``, which reaches the backing fixture too. The class also hands its policy
to the plugin's ``statepact_queue_policy``, which the ``statepact_*_work_queue``
fixtures are built with (outside the suite that is ``QueuePolicy()``).

::

    import pytest
    from statepact.testing.queue_suite import WorkQueueConformance

    @pytest.fixture
    def work_queue(statepact_clock, queue_policy):
        return MyWorkQueue(clock=statepact_clock, policy=queue_policy)

    class TestMyWorkQueue(WorkQueueConformance):
        pass

The suite uses the public API and the clock only; it must run unchanged against
every backing, and memory (``MemoryWorkQueue``) is the reference. A known
divergence is a strict ``xfail`` in the subclass, with its reason.

What it pins beyond the protocol docstrings (``MemoryWorkQueue``'s module
docstring has the full list):

- Due is ``available_at <= now``; a lease lapses at ``expires_at <= now``.
- Rotation: the lowest ``(turn, tenant)`` among tenants with due work is served,
  where a tenant's turn is the value of a per-queue counter when it was last
  served (0 if never) and the counter moves on every item claimed; ties go by
  tenant id in code-point order (``"B" < "a" < "b"``).
- Within a tenant: priority, then enqueue order, also for an item that was
  delayed or retried.
- A leased item is never claimed again, even lapsed, until ``reap`` moves it.
  A lapsed lease still settles and heartbeats until then.
- ``reap`` writes ``last_error = "lease expired"`` on every item it moves.
- ``heartbeat`` leaves the item's record (``updated_at`` too) as it was.
- ``requeue`` keeps ``last_error``; ``dead_letters`` are ordered by the time
  each item died, then ``item_id``; ``purge_dead`` deletes dead items outright,
  freeing their ids.
- ``stats`` count queued items whether due or not, and omit idle tenants; done
  items are not counted.
- ``next_due`` is the earliest ``available_at`` later than now of a queued item
  (for a tenant with no due work; see ``WorkQueue.next_due``).
- Tokens: each claim and heartbeat gives a token greater than any the item had.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta
from typing import Any

import pytest

from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact.clock import ManualClock
from statepact.errors import LeaseLostError, StatePersistenceError
from statepact.models import ItemStatus, Lease, QueueStats, TenantQueueStats, WorkItem
from statepact.queue import QueuePolicy, WorkQueue, WorkWatch
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

__all__ = ["SUITE_POLICY", "WorkQueueConformance"]

SUITE_POLICY = QueuePolicy(max_attempts=3, backoff_base=10, backoff_cap=40, jitter=0)
LIMIT = DEFAULT_MAX_VALUE_BYTES
LEASE = 30.0


def _item(tenant: str, item_id: str, **fields: Any) -> WorkItem:
    return WorkItem(tenant=tenant, item_id=item_id, **fields)


async def _woken_by(watch: WorkWatch, write: Callable[[], Awaitable[object]]) -> None:
    """Use up the wake-ups earlier writes left, start a long wait and check that it waits,
    then ``write``: the wait must return True within five seconds."""
    while await watch.wait(0.05):
        pass
    waiting = asyncio.ensure_future(watch.wait(30))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await write()
    assert await asyncio.wait_for(waiting, 5) is True


async def _fill(queue: WorkQueue, tenant: str, count: int, *, prefix: str = "i") -> None:
    for index in range(count):
        await queue.enqueue(_item(tenant, f"{prefix}{index:04d}"))


async def _claim(queue: WorkQueue, worker: str = "w1", lease_for: float = LEASE) -> Lease:
    lease = await queue.claim(worker, lease_for=lease_for)
    assert lease is not None, "expected an item to be due"
    return lease


def _stats(**tenants: tuple[int, int, int]) -> dict[str, TenantQueueStats]:
    return {
        tenant: TenantQueueStats(queued=queued, leased=leased, dead=dead)
        for tenant, (queued, leased, dead) in tenants.items()
    }


class WorkQueueConformance:
    """One test per promise of ``WorkQueue``; see the module docstring for the fixtures."""

    @pytest.fixture
    def clock(self, statepact_clock: ManualClock) -> ManualClock:
        """The suite's clock is the plugin's ``statepact_clock``: build the backing with either."""
        return statepact_clock

    @pytest.fixture
    def queue_policy(self) -> QueuePolicy:
        """The policy every suite queue is built with, unless a test overrides it."""
        return SUITE_POLICY

    @pytest.fixture
    def statepact_queue_policy(self, queue_policy: QueuePolicy) -> QueuePolicy:
        """The plugin's ``statepact_*_work_queue`` fixtures get the suite's policy too."""
        return queue_policy

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
            ([{"tenant": "acme", "item_id": "x"}], TypeError, "items[0]"),
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

    # -- concurrency ----------------------------------------------------------

    async def test_ten_workers_take_ten_different_items(self, work_queue: WorkQueue) -> None:
        """Ten workers claiming at once take ten different items."""
        await _fill(work_queue, "acme", 10)
        leases = await asyncio.gather(
            *(work_queue.claim(f"w{n}", lease_for=LEASE) for n in range(10))
        )
        taken = [lease.item.item_id for lease in leases if lease is not None]
        assert len(taken) == 10
        assert len(set(taken)) == 10
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 10, 0))

    async def test_no_item_is_held_by_two_live_leases(self, work_queue: WorkQueue) -> None:
        """With more workers than items, every item goes to exactly one worker."""
        await _fill(work_queue, "acme", 3)
        await _fill(work_queue, "beta", 1)
        leases = await asyncio.gather(
            *(work_queue.claim(f"w{n}", lease_for=LEASE) for n in range(10))
        )
        taken = [(lease.item.tenant, lease.item.item_id) for lease in leases if lease is not None]
        assert len(taken) == 4
        assert len(set(taken)) == 4
        assert sum(lease is None for lease in leases) == 6

    async def test_concurrent_batches_take_different_items(self, work_queue: WorkQueue) -> None:
        """Concurrent claim_batch calls never hand one item to two of them."""
        await _fill(work_queue, "acme", 12)
        await _fill(work_queue, "beta", 8)
        batches = await asyncio.gather(
            *(work_queue.claim_batch(f"w{n}", lease_for=LEASE, limit=6) for n in range(5))
        )
        taken = [(lease.item.tenant, lease.item.item_id) for batch in batches for lease in batch]
        assert len(taken) == 20
        assert len(set(taken)) == 20
        assert all(lease.worker_id == f"w{n}" for n, b in enumerate(batches) for lease in b)

    async def test_claim_batch(self, work_queue: WorkQueue) -> None:
        """claim_batch gives up to limit leases, as that many successive claims would."""
        await _fill(work_queue, "a", 3)
        await _fill(work_queue, "b", 1)
        await _fill(work_queue, "c", 2)
        leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=10)
        assert [lease.item.tenant for lease in leases] == ["a", "b", "c", "a", "c", "a"]
        assert [lease.item.item_id for lease in leases if lease.item.tenant == "a"] == [
            "i0000",
            "i0001",
            "i0002",
        ]
        assert len({lease.token for lease in leases}) == 6
        assert all(lease.item.attempts == 1 for lease in leases)
        assert all(lease.item.status is ItemStatus.LEASED for lease in leases)

    async def test_claim_batch_respects_limit(self, work_queue: WorkQueue) -> None:
        """claim_batch never gives more than limit leases."""
        await _fill(work_queue, "acme", 5)
        first = await work_queue.claim_batch("w1", lease_for=LEASE, limit=2)
        second = await work_queue.claim_batch("w1", lease_for=LEASE, limit=2)
        third = await work_queue.claim_batch("w1", lease_for=LEASE, limit=2)
        assert [len(first), len(second), len(third)] == [2, 2, 1]
        ids = [lease.item.item_id for lease in first + second + third]
        assert ids == ["i0000", "i0001", "i0002", "i0003", "i0004"]

    # -- fairness -------------------------------------------------------------

    async def test_a_backlog_cannot_starve_its_neighbours(self, work_queue: WorkQueue) -> None:
        """Tenant A with 1,000 due items beside B and C with 10 each: B and C get all 20 of
        theirs within the first 30 claims."""
        await _fill(work_queue, "A", 1000)
        await _fill(work_queue, "B", 10)
        await _fill(work_queue, "C", 10)
        leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=15)
        for _ in range(15):
            leases.append(await _claim(work_queue))
        served = Counter(lease.item.tenant for lease in leases)
        assert served == {"A": 10, "B": 10, "C": 10}

    async def test_k_tenants_are_served_in_any_k_consecutive_claims(
        self, work_queue: WorkQueue
    ) -> None:
        """With k tenants holding due work, any k consecutive claims serve k different tenants."""
        tenants = ["delta", "alpha", "charlie", "bravo"]
        for index, tenant in enumerate(tenants):
            await _fill(work_queue, tenant, 8 + index * 3)
        served = [(await _claim(work_queue)).item.tenant for _ in range(32)]
        for start in range(len(served) - 3):
            window = served[start : start + 4]
            assert len(set(window)) == 4, f"claims {start}..{start + 3} served {window}"

    async def test_ties_go_by_tenant_id_in_code_point_order(self, work_queue: WorkQueue) -> None:
        """Never-served tenants tie; the tie goes by tenant id in code-point order."""
        for tenant in ["b", "a", "B", "é", "Z"]:
            await _fill(work_queue, tenant, 2)
        served = [(await _claim(work_queue)).item.tenant for _ in range(10)]
        assert served == ["B", "Z", "a", "b", "é"] * 2

    async def test_the_tenant_served_longest_ago_goes_first(self, work_queue: WorkQueue) -> None:
        """A claim serves the tenant served longest ago (never served counts as longest ago),
        then sends it to the back."""
        await _fill(work_queue, "A", 3)
        await _fill(work_queue, "B", 3)
        await _fill(work_queue, "C", 3)
        assert (await _claim(work_queue)).item.tenant == "A"
        assert (await _claim(work_queue)).item.tenant == "B"
        await _fill(work_queue, "D", 3)  # never served: ties with C, loses on id
        served = [(await _claim(work_queue)).item.tenant for _ in range(6)]
        assert served == ["C", "D", "A", "B", "C", "D"]

    async def test_an_idle_tenant_returning_goes_first(self, work_queue: WorkQueue) -> None:
        """A tenant that ran dry and gets work again is served before tenants served since."""
        await _fill(work_queue, "A", 1)
        await _fill(work_queue, "B", 5)
        await _fill(work_queue, "C", 5)
        served = [(await _claim(work_queue)).item.tenant for _ in range(5)]
        assert served == ["A", "B", "C", "B", "C"]
        await _fill(work_queue, "A", 2, prefix="again")
        served = [(await _claim(work_queue)).item.tenant for _ in range(4)]
        assert served == ["A", "B", "C", "A"]

    async def test_a_tenant_returning_keeps_its_last_turn(self, work_queue: WorkQueue) -> None:
        """A tenant that ran dry and gets work again waits behind tenants served longer ago."""
        await _fill(work_queue, "a", 5)
        await _fill(work_queue, "b", 5)
        await _fill(work_queue, "c", 1)
        served = [(await _claim(work_queue)).item.tenant for _ in range(3)]
        assert served == ["a", "b", "c"]
        await _fill(work_queue, "c", 2, prefix="again")
        served = [(await _claim(work_queue)).item.tenant for _ in range(5)]
        assert served == ["a", "b", "c", "a", "b"]

    async def test_priority_does_not_cross_tenants(self, work_queue: WorkQueue) -> None:
        """Priority orders items within a tenant only; rotation still alternates tenants."""
        for index in range(3):
            await work_queue.enqueue(_item("A", f"hi{index}", priority=1000))
            await work_queue.enqueue(_item("B", f"lo{index}", priority=-1000))
        served = [(await _claim(work_queue)).item.tenant for _ in range(6)]
        assert served == ["A", "B", "A", "B", "A", "B"]

    async def test_a_tenant_with_only_delayed_work_is_skipped(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Only due work takes part in the rotation; a tenant whose items are not due yet
        is skipped and keeps its turn."""
        await work_queue.enqueue(_item("A", "later"), delay=10)
        await _fill(work_queue, "B", 3)
        assert (await _claim(work_queue)).item.tenant == "B"
        assert (await _claim(work_queue)).item.tenant == "B"
        clock.advance(10)
        assert (await _claim(work_queue)).item.tenant == "A"
        assert (await _claim(work_queue)).item.tenant == "B"

    # -- leases ---------------------------------------------------------------

    async def test_reap_returns_expired_leases_to_ready(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """An expired lease is moved back to ready by reap, which returns what it moved."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.enqueue(_item("acme", "job-2"))
        first = await _claim(work_queue, "w1")
        clock.advance(10)
        await _claim(work_queue, "w1")
        clock.advance(LEASE - 10 - 0.001)
        assert await work_queue.reap() == []
        clock.advance(0.001)  # exactly at expires_at: lapsed
        moved = await work_queue.reap()
        assert [item.item_id for item in moved] == ["job-1"]
        (item,) = moved
        assert item.status is ItemStatus.QUEUED
        assert item.attempts == 1
        assert item.last_error == "lease expired"
        assert item.available_at == item.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == item
        assert await work_queue.reap() == []
        again = await _claim(work_queue, "w2")
        assert again.item.item_id == "job-1"
        assert again.item.attempts == 2
        assert again.token > first.token
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 2, 0))

    async def test_a_stale_holder_changes_nothing(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """After reap moved an item, its old holder's ack, fail, release and heartbeat raise
        LeaseLostError and change nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        stale = await _claim(work_queue, "w1")
        clock.advance(LEASE + 1)
        await work_queue.reap()
        after_reap = await work_queue.get_item("acme", "job-1")
        stats = await work_queue.stats()
        settles: list[Callable[[], Awaitable[object]]] = [
            lambda: work_queue.ack(stale),
            lambda: work_queue.fail(stale, "late"),
            lambda: work_queue.fail(stale, "late", retryable=False),
            lambda: work_queue.release(stale),
            lambda: work_queue.heartbeat(stale),
        ]
        for settle in settles:
            with pytest.raises(LeaseLostError) as caught:
                await settle()
            assert caught.value.retryable is False
            assert await work_queue.get_item("acme", "job-1") == after_reap
            assert await work_queue.stats() == stats
        fresh = await _claim(work_queue, "w2")
        with pytest.raises(LeaseLostError):
            await work_queue.ack(stale)
        with pytest.raises(LeaseLostError):
            await work_queue.heartbeat(stale)
        assert await work_queue.get_item("acme", "job-1") == fresh.item
        done = await work_queue.ack(fresh)
        assert done.status is ItemStatus.DONE

    async def test_an_expired_lease_is_not_claimable_until_reaped(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A claim never takes a leased item, even one whose lease lapsed; reap moves it."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await _claim(work_queue, "w1")
        clock.advance(LEASE * 3)
        assert await work_queue.claim("w2", lease_for=LEASE) is None
        assert await work_queue.claim_batch("w2", lease_for=LEASE, limit=5) == []
        await work_queue.reap()
        assert (await _claim(work_queue, "w2")).item.item_id == "job-1"

    async def test_a_lapsed_lease_still_settles_until_reaped(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A lapsed lease stays good until reap or a new claim moves the item on."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.enqueue(_item("acme", "job-2"))
        one = await _claim(work_queue)
        two = await _claim(work_queue)
        clock.advance(LEASE * 2)
        assert (await work_queue.ack(one)).status is ItemStatus.DONE
        renewed = await work_queue.heartbeat(two)
        assert renewed.expires_at == clock.now() + timedelta(seconds=LEASE)
        assert await work_queue.reap() == []
        assert (await work_queue.ack(renewed)).status is ItemStatus.DONE

    async def test_heartbeat_changes_the_token_and_extends(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """heartbeat extends the lease by its duration from now with a new token; the old
        token is stale."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue, "w1", lease_for=LEASE)
        clock.advance(20)
        renewed = await work_queue.heartbeat(lease)
        assert renewed.token > lease.token
        assert renewed.expires_at == clock.now() + timedelta(seconds=LEASE)
        assert renewed.worker_id == "w1"
        assert renewed.lease_seconds == LEASE
        clock.advance(5)
        again = await work_queue.heartbeat(renewed)
        assert again.token > renewed.token
        with pytest.raises(LeaseLostError):
            await work_queue.heartbeat(lease)
        with pytest.raises(LeaseLostError):
            await work_queue.ack(renewed)
        assert (await work_queue.get_item("acme", "job-1")) == lease.item
        assert (await work_queue.ack(again)).status is ItemStatus.DONE

    async def test_heartbeat_leaves_the_item_as_it_was(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """heartbeat moves only the token and the expiry: the item record is unchanged."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"k": "v"}))
        lease = await _claim(work_queue)
        clock.advance(7)
        renewed = await work_queue.heartbeat(lease)
        assert renewed.item == lease.item
        assert await work_queue.get_item("acme", "job-1") == lease.item

    async def test_a_reap_after_a_live_heartbeat_moves_nothing(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A reaper that lost the race to a live heartbeat writes nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue, lease_for=LEASE)
        clock.advance(20)
        renewed = await work_queue.heartbeat(lease)
        clock.advance(20)  # past the first expiry, before the renewed one
        assert await work_queue.reap() == []
        item = await work_queue.get_item("acme", "job-1")
        assert item is not None
        assert item.status is ItemStatus.LEASED
        assert (await work_queue.ack(renewed)).status is ItemStatus.DONE

    async def test_a_reap_racing_a_heartbeat_never_both_win(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A reap racing a heartbeat on a lapsed lease: either the heartbeat wins and reap moves
        nothing, or reap moves the item and the heartbeat raises LeaseLostError."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        clock.advance(LEASE + 1)
        moved, beat = await asyncio.gather(
            work_queue.reap(), work_queue.heartbeat(lease), return_exceptions=True
        )
        assert not isinstance(moved, BaseException)
        item = await work_queue.get_item("acme", "job-1")
        assert item is not None
        if isinstance(beat, LeaseLostError):
            assert [m.item_id for m in moved] == ["job-1"]
            assert item.status is ItemStatus.QUEUED
        else:
            assert isinstance(beat, Lease)
            assert moved == []
            assert item.status is ItemStatus.LEASED
            assert (await work_queue.ack(beat)).status is ItemStatus.DONE

    async def test_every_settle_is_fenced(self, work_queue: WorkQueue) -> None:
        """A lease that was settled already cannot settle again: LeaseLostError, nothing changes."""
        await _fill(work_queue, "acme", 3)
        acked, failed, released = await work_queue.claim_batch("w1", lease_for=LEASE, limit=3)
        await work_queue.ack(acked)
        await work_queue.fail(failed, "boom")
        await work_queue.release(released)
        before = [await work_queue.get_item("acme", f"i{n:04d}") for n in range(3)]
        for lease in (acked, failed, released):
            settles: list[Callable[[Lease], Awaitable[object]]] = [
                work_queue.ack,
                lambda held: work_queue.fail(held, "again"),
                work_queue.release,
                work_queue.heartbeat,
            ]
            for settle in settles:
                with pytest.raises(LeaseLostError):
                    await settle(lease)
        assert [await work_queue.get_item("acme", f"i{n:04d}") for n in range(3)] == before

    async def test_lapses_dead_letter_after_max_attempts(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A lease that lapses counts as a failed attempt without backoff; at max_attempts the
        item is dead-lettered with 'lease expired'."""
        await work_queue.enqueue(_item("acme", "job-1"))
        for attempt in (1, 2):
            lease = await _claim(work_queue)
            assert lease.item.attempts == attempt
            clock.advance(LEASE)
            (moved,) = await work_queue.reap()
            assert moved.status is ItemStatus.QUEUED
        await _claim(work_queue)
        clock.advance(LEASE)
        (moved,) = await work_queue.reap()
        assert moved.status is ItemStatus.DEAD
        assert moved.attempts == 3
        assert moved.last_error == "lease expired"
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue.dead_letters("acme") == [moved]

    # -- fail, retry, dead letter -----------------------------------------------

    async def test_fail_retries_with_the_policys_backoff(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """fail retries after the policy's backoff: not claimable before it is due, claimable
        at it; after max attempts the item is dead with its last error kept."""
        await work_queue.enqueue(_item("acme", "job-1"))
        for attempt, backoff in ((1, 10), (2, 20)):
            lease = await _claim(work_queue)
            assert lease.item.attempts == attempt
            failed = await work_queue.fail(lease, f"boom {attempt}")
            assert failed.status is ItemStatus.QUEUED
            assert failed.attempts == attempt
            assert failed.last_error == f"boom {attempt}"
            assert failed.available_at == clock.now() + timedelta(seconds=backoff)
            assert await work_queue.get_item("acme", "job-1") == failed
            clock.advance(backoff - 0.001)
            assert await work_queue.claim("w1", lease_for=LEASE) is None
            clock.advance(0.001)
        lease = await _claim(work_queue)
        assert lease.item.attempts == 3
        assert lease.item.last_error == "boom 2"
        dead = await work_queue.fail(lease, "boom 3")
        assert dead.status is ItemStatus.DEAD
        assert dead.attempts == 3
        assert dead.last_error == "boom 3"
        assert await work_queue.get_item("acme", "job-1") == dead
        clock.advance(3600)
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue.dead_letters("acme") == [dead]
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 1))

    async def test_fail_retry_in_replaces_the_backoff_not_the_dead_letter(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``retry_in`` sets when a retry is due (0: at once); the policy still dead-letters
        at max attempts; a bad ``retry_in`` is refused naming it and changes nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        for bad, error in ((-1, ValueError), (float("nan"), ValueError), ("soon", TypeError)):
            with pytest.raises(error, match="retry_in"):
                await work_queue.fail(lease, "boom", retry_in=bad)  # type: ignore[arg-type]
        assert await work_queue.get_item("acme", "job-1") == lease.item
        failed = await work_queue.fail(lease, "boom", retry_in=timedelta(seconds=3))
        assert failed.status is ItemStatus.QUEUED
        assert failed.available_at == clock.now() + timedelta(seconds=3)
        clock.advance(3)
        lease = await _claim(work_queue)
        failed = await work_queue.fail(lease, "boom", retry_in=0)
        assert failed.available_at == clock.now()
        lease = await _claim(work_queue)
        assert lease.item.attempts == 3
        dead = await work_queue.fail(lease, "boom", retry_in=1)
        assert dead.status is ItemStatus.DEAD

    async def test_a_non_retryable_failure_dead_letters_at_once(
        self, work_queue: WorkQueue
    ) -> None:
        """fail(retryable=False) dead-letters the item at once, with its error."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        dead = await work_queue.fail(lease, "poison: unparseable", retryable=False)
        assert dead.status is ItemStatus.DEAD
        assert dead.attempts == 1
        assert dead.last_error == "poison: unparseable"
        assert await work_queue.dead_letters("acme") == [dead]
        assert await work_queue.claim("w1", lease_for=LEASE) is None

    @pytest.mark.parametrize("queue_policy", [QueuePolicy(max_attempts=1, jitter=0)])
    async def test_the_queue_follows_its_policy(
        self, work_queue: WorkQueue, clock: ManualClock, queue_policy: QueuePolicy
    ) -> None:
        """Retries and the dead letter follow the queue's own QueuePolicy (here: one attempt)."""
        await work_queue.enqueue(_item("acme", "failed"))
        await work_queue.enqueue(_item("acme", "lapsed"))
        failed = await _claim(work_queue)
        assert (await work_queue.fail(failed, "once")).status is ItemStatus.DEAD
        await _claim(work_queue)
        clock.advance(LEASE)
        (moved,) = await work_queue.reap()
        assert moved.status is ItemStatus.DEAD
        assert {i.item_id for i in await work_queue.dead_letters("acme")} == {"failed", "lapsed"}

    async def test_error_text_round_trips(self, work_queue: WorkQueue) -> None:
        """The error text is kept as given (unicode included), without NUL characters."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        failed = await work_queue.fail(lease, "Ошибка ✗ 错误\nline 2\x00!")
        assert failed.last_error == "Ошибка ✗ 错误\nline 2!"
        stored = await work_queue.get_item("acme", "job-1")
        assert stored is not None
        assert stored.last_error == "Ошибка ✗ 错误\nline 2!"

    async def test_release_does_not_count_an_attempt(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """release gives the item back, due now, without counting the attempt."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        await work_queue.fail(lease, "first")
        clock.advance(10)
        lease = await _claim(work_queue)
        assert lease.item.attempts == 2
        clock.advance(3)
        released = await work_queue.release(lease)
        assert released.status is ItemStatus.QUEUED
        assert released.attempts == 1
        assert released.last_error == "first"
        assert released.available_at == released.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == released
        again = await _claim(work_queue)
        assert again.item.attempts == 2
        assert again.token > lease.token

    async def test_requeue_brings_a_dead_item_back(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """requeue brings a dead item back, due now, with attempts reset and its last error kept."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"x": 1}))
        dead = await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        clock.advance(60)
        back = await work_queue.requeue(dead)
        assert back.status is ItemStatus.QUEUED
        assert back.attempts == 0
        assert back.last_error == "poison"
        assert back.available_at == back.updated_at == clock.now()
        assert back.payload == {"x": 1}
        assert await work_queue.get_item("acme", "job-1") == back
        assert await work_queue.dead_letters("acme") == []
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))
        lease = await _claim(work_queue)
        assert lease.item.attempts == 1

    async def test_requeue_refuses_an_item_that_is_not_dead(self, work_queue: WorkQueue) -> None:
        """requeue of a missing, queued, leased or done item raises ValueError naming item_id."""
        await _fill(work_queue, "acme", 3)
        queued = await work_queue.get_item("acme", "i0002")
        leased = await _claim(work_queue)
        done = await work_queue.ack(await _claim(work_queue))
        assert queued is not None
        for item in (queued, leased.item, done, _item("acme", "missing")):
            with pytest.raises(ValueError, match="item_id"):
                await work_queue.requeue(item)
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0))

    async def test_dead_letters_oldest_first(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """dead_letters lists the tenant's dead items by the time they died, then item id."""
        for item_id in ["x-late", "b", "a", "c-first"]:
            await work_queue.enqueue(_item("acme", item_id))
        await work_queue.enqueue(_item("other", "z"))
        leases = {
            lease.item.item_id: lease
            for lease in await work_queue.claim_batch("w1", lease_for=LEASE, limit=5)
        }
        await work_queue.fail(leases["c-first"], "e", retryable=False)
        clock.advance(1)
        await work_queue.fail(leases["z"], "e", retryable=False)
        await work_queue.fail(leases["b"], "e", retryable=False)
        await work_queue.fail(leases["a"], "e", retryable=False)
        clock.advance(1)
        await work_queue.fail(leases["x-late"], "e", retryable=False)
        dead = await work_queue.dead_letters("acme")
        assert [item.item_id for item in dead] == ["c-first", "a", "b", "x-late"]
        assert all(item.status is ItemStatus.DEAD for item in dead)
        limited = await work_queue.dead_letters("acme", limit=2)
        assert [item.item_id for item in limited] == ["c-first", "a"]
        assert [item.item_id for item in await work_queue.dead_letters("other")] == ["z"]
        assert await work_queue.dead_letters("nobody") == []

    async def test_purge_dead_deletes_only_that_tenants_dead_items(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """purge_dead deletes the tenant's dead items and returns how many; its queued,
        leased and done items and every other tenant's items are left as they were."""
        await _fill(work_queue, "acme", 6)
        await _fill(work_queue, "other", 2)
        leases = {
            (lease.item.tenant, lease.item.item_id): lease
            for lease in await work_queue.claim_batch("w1", lease_for=LEASE, limit=8)
        }
        for item_id in ("i0000", "i0001", "i0002"):
            await work_queue.fail(leases[("acme", item_id)], "poison", retryable=False)
        await work_queue.fail(leases[("other", "i0000")], "poison", retryable=False)
        done = await work_queue.ack(leases[("acme", "i0003")])
        queued = await work_queue.release(leases[("acme", "i0004")])
        leased = leases[("acme", "i0005")].item
        kept_other = [await work_queue.get_item("other", f"i000{n}") for n in range(2)]
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 3), other=(0, 1, 1))
        clock.advance(1)
        assert await work_queue.purge_dead("acme") == 3
        assert await work_queue.dead_letters("acme") == []
        for item_id in ("i0000", "i0001", "i0002"):
            assert await work_queue.get_item("acme", item_id) is None
        assert await work_queue.get_item("acme", "i0003") == done
        assert await work_queue.get_item("acme", "i0004") == queued
        assert await work_queue.get_item("acme", "i0005") == leased
        assert [await work_queue.get_item("other", f"i000{n}") for n in range(2)] == kept_other
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0), other=(0, 1, 1))
        # The lease beside them still settles; the other tenant's dead letter is still there.
        await work_queue.ack(leases[("acme", "i0005")])
        assert [i.item_id for i in await work_queue.dead_letters("other")] == ["i0000"]

    async def test_purge_dead_again_returns_zero(self, work_queue: WorkQueue) -> None:
        """A second purge_dead, or one of a tenant with no dead item, deletes nothing and
        returns 0."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        assert await work_queue.purge_dead("acme") == 1
        assert await work_queue.purge_dead("acme") == 0
        assert await work_queue.purge_dead("nobody") == 0
        assert (await work_queue.stats()).tenants == {}

    async def test_purge_dead_frees_the_item_ids(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A purged item is gone as if never enqueued: enqueue of its id stores a new item."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"v": 1}))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        await work_queue.purge_dead("acme")
        clock.advance(5)
        fresh = await work_queue.enqueue(_item("acme", "job-1", payload={"v": 2}))
        assert fresh.status is ItemStatus.QUEUED
        assert (fresh.payload, fresh.attempts, fresh.last_error) == ({"v": 2}, 0, None)
        assert fresh.created_at == clock.now()
        lease = await _claim(work_queue)
        assert (lease.item.item_id, lease.item.attempts) == ("job-1", 1)

    async def test_purge_dead_of_many_items(self, work_queue: WorkQueue) -> None:
        """purge_dead deletes a dead letter larger than one batch of any backing (2,500)."""
        await work_queue.enqueue_many([_item("acme", f"i{n:05d}") for n in range(2500)])
        for _ in range(3):
            leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=1000)
            for lease in leases:
                await work_queue.fail(lease, "poison", retryable=False)
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 2500))
        assert await work_queue.purge_dead("acme") == 2500
        assert (await work_queue.stats()).tenants == {}

    @pytest.mark.parametrize(
        ("tenant", "error"), [("", ValueError), ("a\x00b", ValueError), (7, TypeError)]
    )
    async def test_purge_dead_refuses_a_bad_tenant(
        self, work_queue: WorkQueue, tenant: Any, error: type[Exception]
    ) -> None:
        """purge_dead of a bad tenant raises ValueError/TypeError naming tenant, deleting
        nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        with pytest.raises(error, match="tenant"):
            await work_queue.purge_dead(tenant)
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 1))

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
