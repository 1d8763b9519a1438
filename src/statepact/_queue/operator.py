"""The operator's reads of a queue (``statepact queue ...``, the dashboard), which
:class:`~statepact.queue.BaseWorkQueue` inherits: not part of the ``WorkQueue`` protocol.

Each checks what the caller hands it, reads the clock where it needs now, and asks
one hook of the backing; each is bounded (docs/dashboard.md#cost),
and none writes.
"""

from __future__ import annotations

import json
from datetime import timedelta

from statepact._codec import require_id, require_limit
from statepact._queue.checks import MAX_BATCH, dead_cursor
from statepact._queue.hooks import BackingHooks
from statepact._queue_policy import QueuePolicy, unique_slot
from statepact.clock import Clock, read_clock
from statepact.models import AttemptError, ItemStatus, Page, QueueStats, WorkItem

__all__ = ["OperatorReads"]

_FINISHED_STATUSES = (ItemStatus.DONE, ItemStatus.CANCELLED, ItemStatus.DEAD)


class OperatorReads(BackingHooks):
    """The reads an operator makes; ``BaseWorkQueue`` sets the clock and the policy."""

    _clock: Clock
    _policy: QueuePolicy

    async def prunable(self) -> dict[ItemStatus, int]:
        """How many items ``prune`` would delete now, per finished status (``--dry-run``).

        Counts every such item, so it costs what counting them costs; nothing is deleted.
        """
        cutoffs = self._policy.prune_cutoffs(read_clock(self._clock))
        if not cutoffs:
            return {}
        return await self._count_prunable(cutoffs)

    async def dead_letters_all(
        self, *, after: str | None = None, limit: int = 100
    ) -> Page[WorkItem]:
        """Dead items of every tenant, by ``(tenant, item_id)``, a page at a time: pass
        ``next`` back as ``after``. ``after`` is refused (naming it) unless a page gave it."""
        count = require_limit(limit, MAX_BATCH)
        start = None if after is None else dead_cursor(after)
        items = await self._dead_letters_all(start, count + 1)
        if len(items) <= count:
            return Page(items=items)
        shown = items[:count]
        return Page(items=shown, next=json.dumps([shown[-1].tenant, shown[-1].item_id]))

    async def find_unique(
        self, tenant: str, unique_key: str, *, unique_for: timedelta | None = None
    ) -> WorkItem | None:
        """The item of the tenant holding ``unique_key`` now, or ``None``: queued or leased
        (with ``unique_for``, done too, the period being the current one). One probe of
        the unique-slot index; an item whose key no longer blocks is not found by it."""
        key = require_id("unique_key", unique_key)
        probe = WorkItem(
            tenant=require_id("tenant", tenant), item_id="-", unique_key=key, unique_for=unique_for
        )
        slot = unique_slot(probe, read_clock(self._clock)) or key
        return await self._unique_holder(probe.tenant, slot)

    async def oldest_waiting(self) -> dict[str, float]:
        """Per tenant with ready work, the seconds its oldest ready item (queued and due)
        has waited since it came due (``now - available_at``); tenants without ready work
        are left out. Read per tenant from the ready index's head (docs/dashboard.md)."""
        now = read_clock(self._clock)
        oldest = await self._oldest_ready(now)
        return {
            tenant: max(0.0, (now - at).total_seconds()) for tenant, at in sorted(oldest.items())
        }

    async def finished_per_minute(self, minutes: int = 5) -> dict[ItemStatus, list[int]]:
        """Items that finished as done, cancelled and dead in each of the last ``minutes``
        whole minutes up to now, oldest minute first. A range count of the finished index
        per status and minute: it costs what the items finished in those minutes cost,
        never what all finished items do."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 60:
            raise ValueError(f"minutes: must be an int from 1 to 60, got {minutes!r}")
        width = timedelta(minutes=1)
        # The last minute ends just after now, so an item finished at now is counted.
        since = read_clock(self._clock) + timedelta(microseconds=1) - minutes * width
        counts = await self._finished_counts(since, width, minutes)
        return {status: counts.get(status, [0] * minutes) for status in _FINISHED_STATUSES}

    async def queues(self) -> list[QueueStats]:
        """Every queue that holds items on this queue's storage (done ones included), by
        name, each with ``stats()``'s counts."""
        return await self._queues()

    async def error_history(self, tenant: str, item_id: str) -> list[AttemptError] | None:
        """The item's error history, oldest first: one entry per failure, reaped lease
        and cancel with a reason, the newest ``MAX_ERROR_HISTORY`` (20) kept; ``[]`` for
        an item without one, ``None`` for a missing item. One read of the item's history
        alone (docs/work-queue.md#error-history)."""
        return await self._error_history(
            require_id("tenant", tenant), require_id("item_id", item_id)
        )
