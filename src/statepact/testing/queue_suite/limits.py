"""Flow control: an item's ``limit_key`` and ``weight``, and ``QueueLimits``' caps and rates.

``test_limit_*`` pin the fields and where the limits live; ``test_flow_*`` pin what
claims do under them (a backing that does not enforce limits yet refuses a
non-empty ``set_limits`` with ``NotImplementedError``: a strict ``xfail`` there).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import QueueLimits, Rate, WorkQueue
from statepact.testing.queue_suite._common import LEASE, SuiteBase, _claim, _item

__all__ = ["FlowControlConformance"]


def _keyed(tenant: str, item_id: str, key: str | None = None, weight: int = 1) -> WorkItem:
    return _item(tenant, item_id, limit_key=key, weight=weight)


async def _claim_all(queue: WorkQueue, limit: int = 100) -> list[tuple[str, str]]:
    leases = await queue.claim_batch("w1", lease_for=LEASE, limit=limit)
    return [(lease.item.tenant, lease.item.item_id) for lease in leases]


class FlowControlConformance(SuiteBase):
    async def test_limit_key_and_weight_are_stored_and_read(self, work_queue: WorkQueue) -> None:
        stored = await work_queue.enqueue(_keyed("acme", "a", "openai:gpt-4o", 1200))
        assert (stored.limit_key, stored.weight) == ("openai:gpt-4o", 1200)
        many = await work_queue.enqueue_many([_keyed("acme", "b", "k", 3), _keyed("acme", "c")])
        assert [(i.limit_key, i.weight) for i in many] == [("k", 3), (None, 1)]
        for item_id, expected in (
            ("a", ("openai:gpt-4o", 1200)),
            ("b", ("k", 3)),
            ("c", (None, 1)),
        ):
            got = await work_queue.get_item("acme", item_id)
            assert got is not None and (got.limit_key, got.weight) == expected
        lease = await _claim(work_queue)
        assert (lease.item.limit_key, lease.item.weight) == ("openai:gpt-4o", 1200)

    @pytest.mark.parametrize(
        ("fields", "error", "field"),
        [
            ({"weight": 0}, ValueError, "weight"),
            ({"weight": 10**9}, ValueError, "weight"),
            ({"limit_key": ""}, ValueError, "limit_key"),
            ({"limit_key": "a\x00b"}, ValueError, "limit_key"),
        ],
    )
    async def test_limit_fields_are_checked(
        self, work_queue: WorkQueue, fields: dict[str, Any], error: type[Exception], field: str
    ) -> None:
        item = WorkItem.model_construct(tenant="acme", item_id="x", **fields)
        with pytest.raises(error, match=field):
            await work_queue.enqueue(item)
        with pytest.raises(error, match=rf"items\[0\]\.{field}"):
            await work_queue.enqueue_many([item])
        assert await work_queue.get_item("acme", "x") is None

    async def test_limit_none_is_stored_and_read_by_every_process(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        assert (await work_queue.limits()).empty
        await work_queue.set_limits(None)
        assert (await work_queue_peer.limits()).empty

    async def test_flow_limits_are_stored_and_read_by_every_process(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        limits = QueueLimits(
            per_tenant=3,
            per_key=5,
            key_caps={"k": 2},
            per_tenant_key=1,
            key_rates={"openai": Rate(weight=90_000, per=60)},
            tenant_rate=Rate(weight=10, per=timedelta(seconds=1)),
        )
        await work_queue.set_limits(limits)
        assert await work_queue_peer.limits() == limits
        await work_queue_peer.set_limits(None)
        assert (await work_queue.limits()).empty

    async def test_flow_tenant_cap(self, work_queue: WorkQueue) -> None:
        await work_queue.enqueue_many([_keyed("a", f"a{i}") for i in range(5)])
        await work_queue.enqueue(_keyed("b", "b0"))
        await work_queue.set_limits(QueueLimits(per_tenant=2))
        assert await _claim_all(work_queue) == [("a", "a0"), ("b", "b0"), ("a", "a1")]
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        await work_queue.set_limits(QueueLimits(per_tenant=2, tenant_caps={"a": 3}))
        assert await _claim_all(work_queue) == [("a", "a2")]

    async def test_flow_key_cap_across_tenants(self, work_queue: WorkQueue) -> None:
        await work_queue.enqueue_many(
            [_keyed(t, f"{t}{i}", "k") for t in ("a", "b") for i in range(3)]
            + [_keyed("a", "free"), _keyed("b", "k2", "other")]
        )
        await work_queue.set_limits(QueueLimits(per_key=1, key_caps={"k": 2}))
        claimed = await _claim_all(work_queue)
        assert sorted(claimed) == [("a", "a0"), ("a", "free"), ("b", "b0"), ("b", "k2")]
        stats = await work_queue.stats()
        assert stats.leased == 4

    async def test_flow_tenant_key_cap(self, work_queue: WorkQueue) -> None:
        await work_queue.enqueue_many(
            [_keyed(t, f"{t}{k}{i}", k) for t in ("a", "b") for k in ("x", "y") for i in range(2)]
        )
        await work_queue.set_limits(QueueLimits(per_tenant_key=1))
        claimed = await _claim_all(work_queue)
        assert sorted(claimed) == [("a", "ax0"), ("a", "ay0"), ("b", "bx0"), ("b", "by0")]

    async def test_flow_capped_tenant_leaves_the_others_their_rotation(
        self, work_queue: WorkQueue
    ) -> None:
        for tenant in ("a", "b", "c"):
            await work_queue.enqueue_many([_keyed(tenant, f"{tenant}{i}") for i in range(3)])
        await work_queue.set_limits(QueueLimits(tenant_caps={"a": 1}))
        order = [(await _claim(work_queue)).item.tenant for _ in range(7)]
        assert order == ["a", "b", "c", "b", "c", "b", "c"]
        assert await work_queue.claim("w1", lease_for=LEASE) is None

    async def test_flow_slot_comes_back_on_every_end_of_a_lease(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        await work_queue.enqueue_many([_keyed("a", f"i{n}", "k") for n in range(7)])
        await work_queue.set_limits(QueueLimits(per_tenant=1, per_key=1))

        async def held() -> Any:
            lease = await _claim(work_queue)
            assert await work_queue.claim("w1", lease_for=LEASE) is None
            return lease

        await work_queue.ack(await held())
        await work_queue.fail(await held(), "boom", retryable=False)
        await work_queue.release(await held(), delay=3600)
        await work_queue.cancel("a", (await held()).item.item_id)
        lease = await work_queue.claim("w1", lease_for=5)
        assert lease is not None
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        clock.advance(6)
        reaped = await work_queue.reap()
        assert [item.item_id for item in reaped] == [lease.item.item_id]
        again = await _claim(work_queue)  # the reaped item, or the next: the slot is free
        assert again.item.status is ItemStatus.LEASED

    async def test_flow_key_rate_counts_weights_in_a_sliding_window(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        await work_queue.enqueue_many([_keyed("a", f"i{n}", "llm", 4) for n in range(4)])
        await work_queue.enqueue(_keyed("b", "other", "tool", 100))
        await work_queue.set_limits(QueueLimits(key_rates={"llm": Rate(weight=10, per=60)}))
        first = await _claim_all(work_queue)
        assert sorted(first) == [("a", "i0"), ("a", "i1"), ("b", "other")]  # 8 of 10 spent
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        now = clock.now()
        due = await work_queue.next_due()
        assert due is not None and now < due <= now + timedelta(seconds=66)
        clock.advance(30)
        assert await work_queue.claim("w1", lease_for=LEASE) is None  # still in the window
        clock.advance(due - clock.now())
        assert [
            lease.item.item_id
            for lease in await work_queue.claim_batch("w1", lease_for=LEASE, limit=10)
        ] == ["i2", "i3"]

    async def test_flow_tenant_rate_and_an_item_heavier_than_the_rate(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        await work_queue.enqueue_many(
            [
                _keyed("a", "huge", weight=50),
                _keyed("a", "s1", weight=3),
                _keyed("a", "s2", weight=3),
            ]
        )
        await work_queue.enqueue(_keyed("b", "b0", weight=9))
        await work_queue.set_limits(QueueLimits(tenant_rate=Rate(weight=5, per=10)))
        claimed = await _claim_all(work_queue)
        assert sorted(claimed) == [("a", "s1")]  # huge never fits; b0 (9) never fits either
        clock.advance(12)
        assert await _claim_all(work_queue) == [("a", "s2")]
        huge = await work_queue.get_item("a", "huge")
        assert huge is not None and huge.status is ItemStatus.QUEUED
