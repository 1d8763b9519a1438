"""``WorkQueueConformance``'s part: the operator's reads the dashboard shows.

``find_unique``, ``oldest_waiting`` and ``finished_per_minute`` belong to statepact's
own queues (``BaseWorkQueue``), not to the ``WorkQueue`` protocol: a queue without
them skips these tests.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from statepact.clock import ManualClock
from statepact.models import ItemStatus
from statepact.queue import BaseWorkQueue, WorkQueue
from statepact.testing.queue_suite._common import SuiteBase, _claim, _item

__all__ = ["OperatorReadsConformance"]


def _operator(queue: WorkQueue) -> BaseWorkQueue:
    if not isinstance(queue, BaseWorkQueue):
        pytest.skip("the operator's reads belong to statepact's own queues")
    return queue


class OperatorReadsConformance(SuiteBase):
    """The dashboard's reads: an item by unique key, the oldest wait, finished per minute."""

    async def test_find_unique_finds_the_item_holding_the_key(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """find_unique answers the item holding the key in the tenant while it blocks, and
        None for another tenant or once the key is free."""
        queue = _operator(work_queue)
        await queue.enqueue(_item("acme", "a", unique_key="report:7", payload={"n": 1}))
        found = await queue.find_unique("acme", "report:7")
        assert found is not None and found.item_id == "a" and found.payload == {"n": 1}
        assert await queue.find_unique("globex", "report:7") is None
        assert await queue.find_unique("acme", "report:8") is None
        await queue.ack(await _claim(queue))
        assert await queue.find_unique("acme", "report:7") is None
        hour = timedelta(hours=1)
        await queue.enqueue(_item("acme", "p", unique_key="daily", unique_for=hour))
        await queue.ack(await _claim(queue))
        held = await queue.find_unique("acme", "daily", unique_for=hour)
        assert held is not None and held.status is ItemStatus.DONE
        with pytest.raises(ValueError, match="unique_key"):
            await queue.find_unique("acme", "")

    async def test_oldest_waiting_is_the_age_of_the_oldest_ready_item(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """oldest_waiting gives, per tenant with due queued items, now - the earliest
        available_at among them, whatever their priorities; delayed items and other
        tenants' items do not count, and a delayed one counts once it is due."""
        queue = _operator(work_queue)
        assert await queue.oldest_waiting() == {}
        await queue.enqueue(_item("acme", "old", priority=-5))
        clock.advance(5)
        await queue.enqueue(_item("acme", "urgent", priority=9))
        await queue.enqueue(_item("globex", "later"), delay=60)
        clock.advance(5)
        assert await queue.oldest_waiting() == {"acme": 10.0}
        lease = await _claim(queue)
        assert lease.item.item_id == "urgent"
        await queue.ack(lease)
        clock.advance(60)
        assert await queue.oldest_waiting() == {"acme": 70.0, "globex": 5.0}
        await queue.cancel("acme", "old")
        assert await queue.oldest_waiting() == {"globex": 5.0}

    async def test_finished_per_minute_counts_each_status_by_minute(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """finished_per_minute counts done, cancelled and dead items by the minute they
        finished in, the last minute ending at now; older ones are not counted."""
        queue = _operator(work_queue)
        await queue.enqueue(_item("acme", "ancient"))
        await queue.ack(await _claim(queue))
        clock.advance(600)
        await queue.enqueue_many([_item("acme", "a"), _item("acme", "b"), _item("acme", "c")])
        await queue.ack(await _claim(queue))
        clock.advance(90)
        await queue.fail(await _claim(queue), "boom", retryable=False)
        await queue.cancel("acme", "c")
        assert await queue.finished_per_minute(3) == {
            ItemStatus.DONE: [0, 1, 0],
            ItemStatus.CANCELLED: [0, 0, 1],
            ItemStatus.DEAD: [0, 0, 1],
        }
        with pytest.raises(ValueError, match="minutes"):
            await queue.finished_per_minute(0)
