"""What the memory queue holds: an :class:`Entry` per item and a
:class:`MemoryWatch` per open ``watch()``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from statepact._codec import decode_json
from statepact._limits import MAX_ERROR_HISTORY
from statepact.models import AttemptError, ItemStatus, WorkItem, stored
from statepact.queue import OnCancel

__all__ = ["Entry", "MemoryWatch"]


@dataclass(slots=True)
class Entry:
    """One item as the memory queue stores it (its payload encoded)."""

    tenant: str
    item_id: str
    payload: bytes
    priority: int
    order: int  # enqueue order within the queue
    available_at: datetime
    created_at: datetime
    updated_at: datetime
    attempts: int = 0
    status: ItemStatus = ItemStatus.QUEUED
    last_error: str | None = None
    token: int = 0
    unique_key: str | None = None
    unique_for: timedelta | None = None
    timeout: float | None = None
    slot: str | None = None  # the unique slot it holds now (see queue.unique_slot)
    limit_key: str | None = None
    weight: int = 1
    # The error history (error_history), oldest first; never part of the record.
    errors: list[AttemptError] = field(default_factory=list)

    def set_error(
        self,
        error: str | None,
        kind: Literal["failed", "lease_expired", "cancelled"],
        at: datetime,
    ) -> None:
        """Write ``last_error`` and, for an error (not ``None``), append it to the history,
        keeping the newest ``MAX_ERROR_HISTORY``."""
        self.last_error = error
        if error is not None:
            entry = stored(
                AttemptError, {"attempt": self.attempts, "error": error, "at": at, "kind": kind}
            )
            self.errors = [*self.errors, entry][-MAX_ERROR_HISTORY:]

    def record(self, queue: str) -> WorkItem:
        """The item as ``WorkItem`` of queue ``queue``."""
        # The queue's own entry: every field is of its type already, built in the model's
        # order without validating it again.
        return stored(
            WorkItem,
            {
                "tenant": self.tenant,
                "item_id": self.item_id,
                "payload": decode_json(self.payload),
                "queue": queue,
                "priority": self.priority,
                "available_at": self.available_at,
                "attempts": self.attempts,
                "status": self.status,
                "last_error": self.last_error,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
                "unique_key": self.unique_key,
                "unique_for": self.unique_for,
                "timeout": self.timeout,
                "limit_key": self.limit_key,
                "weight": self.weight,
            },
        )


class MemoryWatch:
    """Waits for the queue to schedule a due item (enqueue, release, retry, reap, requeue).

    Open for as long as ``watch()`` is: an item scheduled while nobody waits is kept
    (as a Redis wake list or a PostgreSQL LISTEN keeps it), and the next ``wait``
    returns at once, so no wake-up is lost between a claim that found nothing and
    the wait that follows it.
    """

    __slots__ = ("_on_cancel", "_pending", "_waiters")

    def __init__(self, on_cancel: OnCancel | None) -> None:
        self._on_cancel = on_cancel
        self._pending = False
        self._waiters: set[asyncio.Future[None]] = set()

    def cancelled(self, tenant: str, item_id: str, token: int) -> None:
        # Called soon, not now: the caller's cancel finishes first, whatever the callback does
        # (an exception it raises goes to the loop's handler, not to the cancel).
        if self._on_cancel is not None:
            asyncio.get_running_loop().call_soon(self._on_cancel, tenant, item_id, token)

    def notify(self) -> None:
        if not self._waiters:
            self._pending = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        if self._pending:
            self._pending = False
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            self._waiters.discard(waiter)
            woken = waiter.done() and not waiter.cancelled()
            waiter.cancel()
        return woken
