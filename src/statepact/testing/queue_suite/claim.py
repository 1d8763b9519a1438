"""``WorkQueueConformance``'s part: concurrent claims and fair rotation between tenants."""

from __future__ import annotations

import asyncio
from collections import Counter

from statepact.clock import ManualClock
from statepact.models import ItemStatus
from statepact.queue import WorkQueue
from statepact.testing.queue_suite._common import (
    LEASE,
    SuiteBase,
    _claim,
    _fill,
    _item,
    _stats,
)

__all__ = ["ClaimConformance"]


class ClaimConformance(SuiteBase):
    """Concurrent claims and fair rotation between tenants."""

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
