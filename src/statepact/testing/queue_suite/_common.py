"""What every part of ``WorkQueueConformance`` shares: its fixtures, policy and helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact.clock import ManualClock
from statepact.models import Lease, TenantQueueStats, WorkItem
from statepact.queue import QueuePolicy, WorkQueue, WorkWatch

__all__ = ["LEASE", "LIMIT", "SUITE_POLICY", "SuiteBase"]

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


_COUNTS = ("queued", "leased", "dead", "cancelled")


def _stats(**tenants: tuple[int, ...]) -> dict[str, TenantQueueStats]:
    """``acme=(queued, leased, dead)`` or ``acme=(queued, leased, dead, cancelled)``."""
    return {
        tenant: TenantQueueStats(**dict(zip(_COUNTS[: len(counts)], counts, strict=True)))
        for tenant, counts in tenants.items()
    }


class SuiteBase:
    """The fixtures of ``WorkQueueConformance`` (see the package docstring)."""

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

    @pytest.fixture
    def work_queue_peer(self, work_queue: WorkQueue) -> WorkQueue:
        """A second queue object on ``work_queue``'s storage, as another process would
        hold: the wired server classes build one on the same server and namespace. The
        default is ``work_queue`` itself (a memory queue is its own storage)."""
        return work_queue
