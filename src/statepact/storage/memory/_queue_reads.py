"""The memory queue's operator reads (``find_unique``, ``oldest_waiting``,
``finished_per_minute``, ``dead_letters_all``, ``queues``, ``prunable``,
``error_history``): :class:`MemoryReads`, which ``MemoryWorkQueue`` subclasses.

Memory is the reference, not a server: a pass over what it holds is its cost
(docs/backings.md#memory). Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from statepact.models import AttemptError, ItemStatus, QueueStats, WorkItem
from statepact.queue import BaseWorkQueue
from statepact.storage.memory._entries import Entry

__all__ = ["MemoryReads"]

_ONE = timedelta(microseconds=1)


class MemoryReads(BaseWorkQueue):
    """The reads of :class:`~statepact.storage.memory.queue.MemoryWorkQueue`, over the
    state it keeps (declared here, set by its constructor)."""

    _items: dict[tuple[str, str], Entry]
    _slots: dict[tuple[str, str], str]
    _dead: dict[str, set[str]]
    _finished: dict[ItemStatus, list[tuple[datetime, int, str, str]]]

    def _record(self, entry: Entry) -> WorkItem:
        return entry.record(self.name)

    async def _count_prunable(
        self, cutoffs: Mapping[ItemStatus, datetime]
    ) -> dict[ItemStatus, int]:
        counts: dict[ItemStatus, int] = {}
        for status, cutoff in cutoffs.items():
            counts[status] = sum(
                1
                for updated_at, order, tenant, item_id in self._finished.get(status, ())
                if updated_at < cutoff
                and self._finished_entry(status, updated_at, order, tenant, item_id)
            )
        return counts

    async def _dead_letters_all(self, after: tuple[str, str] | None, limit: int) -> list[WorkItem]:
        keys = sorted((tenant, item_id) for tenant, ids in self._dead.items() for item_id in ids)
        chosen = [key for key in keys if after is None or key > after][:limit]
        return [self._record(self._items[key]) for key in chosen]

    async def _unique_holder(self, tenant: str, slot: str) -> WorkItem | None:
        item_id = self._slots.get((tenant, slot))
        return None if item_id is None else await self._get_item(tenant, item_id)

    async def _oldest_ready(self, now: datetime) -> dict[str, datetime]:
        # Memory is the reference, not a server: one pass over the items is its cost.
        oldest: dict[str, datetime] = {}
        for entry in self._items.values():
            due = entry.status is ItemStatus.QUEUED and entry.available_at <= now
            # Every due time is before now + 1 µs: the default loses to any of them.
            if due and entry.available_at < oldest.get(entry.tenant, now + _ONE):
                oldest[entry.tenant] = entry.available_at
        return oldest

    async def _finished_counts(
        self, since: datetime, width: timedelta, buckets: int
    ) -> dict[ItemStatus, list[int]]:
        counts: dict[ItemStatus, list[int]] = {}
        for status, entries in self._finished.items():
            row = counts.setdefault(status, [0] * buckets)
            for updated_at, order, tenant, item_id in entries:
                at = (updated_at - since) // width
                if 0 <= at < buckets and self._finished_entry(
                    status, updated_at, order, tenant, item_id
                ):
                    row[at] += 1
        return counts

    async def _queues(self) -> list[QueueStats]:
        return [await self._stats()] if self._items else []

    def _finished_entry(
        self, status: ItemStatus, updated_at: datetime, order: int, tenant: str, item_id: str
    ) -> Entry | None:
        """The item a ``_finished`` entry stands for, or ``None`` when it is stale."""
        entry = self._items.get((tenant, item_id))
        if (
            entry is None
            or entry.order != order
            or entry.status is not status
            or entry.updated_at != updated_at
        ):
            return None
        return entry

    async def _error_history(self, tenant: str, item_id: str) -> list[AttemptError] | None:
        entry = self._items.get((tenant, item_id))
        return None if entry is None else list(entry.errors)
