"""``WorkQueueConformance``'s part: retention (``prune``) and what stats count."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from statepact.clock import ManualClock
from statepact.models import ItemStatus
from statepact.queue import QueuePolicy, WorkQueue
from statepact.testing.queue_suite._common import LEASE, SuiteBase, _claim, _item, _stats

__all__ = ["RetentionConformance"]

HOUR = timedelta(hours=1)
KEEPING = QueuePolicy(
    max_attempts=3,
    backoff_base=10,
    backoff_cap=40,
    jitter=0,
    keep_done=HOUR,
    keep_cancelled=2 * HOUR,
    keep_dead=3 * HOUR,
)
FOREVER = QueuePolicy(keep_done=None, keep_cancelled=None, keep_dead=None)


async def _finish_one_of_each(queue: WorkQueue) -> None:
    """acme: ``done``, ``dead`` and ``gone`` (cancelled) finished now; ``queued`` waiting
    and ``leased`` held."""
    names = ("done", "dead", "leased", "gone", "queued")
    await queue.enqueue_many([_item("acme", name, unique_key=name) for name in names])
    await queue.ack(await _claim(queue))
    await queue.fail(await _claim(queue), "poison", retryable=False)
    await _claim(queue, lease_for=10 * 86_400)
    await queue.cancel("acme", "gone")


class RetentionConformance(SuiteBase):
    """``QueuePolicy.keep_*`` and ``prune``; ``stats`` counts cancelled items."""

    @pytest.mark.parametrize("queue_policy", [KEEPING])
    async def test_prune_deletes_each_status_past_its_keep_only(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """prune deletes done, cancelled and dead items that finished longer ago than
        keep_done, keep_cancelled and keep_dead, returns how many, and touches nothing
        else."""
        await _finish_one_of_each(work_queue)
        assert await work_queue.prune() == 0
        clock.advance(HOUR)
        assert await work_queue.prune() == 0  # finished exactly keep_done ago: kept
        clock.advance(1)
        assert await work_queue.prune() == 1
        assert await work_queue.get_item("acme", "done") is None
        clock.advance(HOUR)
        assert await work_queue.prune() == 1
        assert await work_queue.get_item("acme", "gone") is None
        clock.advance(HOUR)
        assert await work_queue.prune() == 1
        assert await work_queue.get_item("acme", "dead") is None
        assert await work_queue.dead_letters("acme") == []
        queued = await work_queue.get_item("acme", "queued")
        leased = await work_queue.get_item("acme", "leased")
        assert queued is not None and queued.status is ItemStatus.QUEUED
        assert leased is not None and leased.status is ItemStatus.LEASED
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0, 0))

    @pytest.mark.parametrize("queue_policy", [KEEPING])
    async def test_a_pruned_items_id_and_key_are_free(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """After prune, an enqueue of a pruned item's id stores a new item, and its unique
        key (kept through done by a period) is free."""
        await work_queue.enqueue(_item("acme", "a", unique_key="k", unique_for=10 * HOUR))
        await work_queue.ack(await _claim(work_queue))
        clock.advance(HOUR + timedelta(seconds=1))
        assert await work_queue.prune() == 1
        again = await work_queue.enqueue(_item("acme", "a", payload={"run": 2}))
        assert again.status is ItemStatus.QUEUED and again.payload == {"run": 2}
        keyed = await work_queue.enqueue(_item("acme", "b", unique_key="k", unique_for=10 * HOUR))
        assert keyed.item_id == "b"

    @pytest.mark.parametrize("queue_policy", [FOREVER])
    async def test_none_keeps_forever(self, work_queue: WorkQueue, clock: ManualClock) -> None:
        """keep_* = None: prune deletes nothing, however old."""
        await _finish_one_of_each(work_queue)
        clock.advance(timedelta(days=3650))
        assert await work_queue.prune() == 0
        for item_id in ("done", "dead", "gone"):
            assert await work_queue.get_item("acme", item_id) is not None

    @pytest.mark.parametrize("queue_policy", [KEEPING])
    async def test_prune_goes_past_one_batch(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A prune of more items than one batch (PRUNE_BATCH, 500) deletes them all."""
        total = 1_203
        await work_queue.enqueue_many([_item("acme", f"job-{i:05d}") for i in range(total)])
        while leases := await work_queue.claim_batch("w1", lease_for=LEASE, limit=1000):
            await work_queue.ack_many(leases)
        clock.advance(2 * HOUR)
        assert await work_queue.prune() == total
        assert await work_queue.get_item("acme", "job-00000") is None
        assert await work_queue.prune() == 0

    @pytest.mark.parametrize("queue_policy", [KEEPING])
    async def test_concurrent_prunes_delete_each_item_once(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue, clock: ManualClock
    ) -> None:
        """Two prunes at once (one may get 0 at once) delete every item once between them."""
        await work_queue.enqueue_many([_item("acme", f"job-{i:03d}") for i in range(40)])
        await work_queue.ack_many(await work_queue.claim_batch("w1", lease_for=LEASE, limit=40))
        clock.advance(2 * HOUR)
        counts = await asyncio.gather(work_queue.prune(), work_queue_peer.prune())
        assert sum(counts) + await work_queue.prune() == 40
        assert (await work_queue.stats()).tenants == {}

    async def test_prune_of_an_empty_queue_is_zero(self, work_queue: WorkQueue) -> None:
        """Nothing finished: prune answers 0."""
        assert await work_queue.prune() == 0

    async def test_stats_count_cancelled_per_tenant(self, work_queue: WorkQueue) -> None:
        """stats count cancelled items per tenant beside queued, leased and dead; a tenant
        with only cancelled items is listed."""
        await work_queue.enqueue_many(
            [_item("acme", "a"), _item("acme", "b"), _item("globex", "c")]
        )
        await work_queue.cancel_many("acme", ["a", "b"])
        await work_queue.cancel("globex", "c")
        stats = await work_queue.stats()
        assert stats.tenants == _stats(acme=(0, 0, 0, 2), globex=(0, 0, 0, 1))
        assert stats.cancelled == 3
