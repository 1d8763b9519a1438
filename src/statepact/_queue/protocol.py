"""The ``WorkQueue`` protocol: what every queue answers, whatever stores it.

Re-exported by :mod:`statepact.queue`, whose :class:`~statepact.queue.BaseWorkQueue`
implements it once for every backing.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from statepact._queue.items import ItemInput
from statepact._queue_limits import QueueLimits
from statepact._queue_policy import OnCancel, WorkWatch
from statepact.errors import LeaseLostError
from statepact.models import Lease, QueueStats, WorkItem

__all__ = ["WorkQueue"]


@runtime_checkable
class WorkQueue(Protocol):
    """Work items with fenced leases, fair tenants, retries and a dead letter.

    Claims serve tenants in rotation: among tenants with due work, the one
    served longest ago goes first, then to the back (ties: tenant id order).
    Within a tenant, due items go highest ``priority`` first, then in enqueue
    order. Times are the injected clock's. An attempt is counted at claim.
    Every settle is fenced on the lease token: a token the item no longer
    carries raises ``LeaseLostError`` and writes nothing; a lapsed lease stays
    good until ``reap`` (or a new claim) moves the item on. Errors: bad input
    raises ``ValueError``/``TypeError`` naming the field before anything is
    sent; an oversized payload raises ``StatePersistenceError(reason="too_large")``;
    a server down past the budget raises ``QueueUnavailableError``.
    """

    @property
    def name(self) -> str:
        """The queue's name; every item it holds carries it."""
        ...

    async def enqueue(self, item: WorkItem, *, delay: float | timedelta | None = None) -> WorkItem:
        """Store the item, due at ``now + delay``.

        An item already stored under ``(queue, tenant, item_id)`` is returned as it is;
        then an item of the tenant holding the same unique slot (:func:`unique_slot`)
        is returned instead, and nothing is written. The server enforces both.
        """
        ...

    async def enqueue_many(
        self, items: Sequence[ItemInput], *, delay: float | timedelta | None = None
    ) -> list[WorkItem]:
        """Store up to 10,000 items in one round trip, all or none, each due at ``now + delay``.

        Each item is a ``WorkItem`` or a plain mapping of its fields
        (``{"tenant": ..., "item_id": ..., "payload": {...}}``), taken as
        ``WorkItem(**mapping)`` would take it and refused exactly where that item would be.

        Idempotent per item, as ``enqueue`` is: an item already stored (or holding
        the item's unique slot, an earlier one of the batch included) is returned as
        it is, in its place in the answer. Every item is checked (errors name
        ``items[i].field``, a repeated id in the batch included) before anything
        is sent.
        """
        ...

    async def claim(self, worker_id: str, *, lease_for: float | timedelta) -> Lease | None:
        """Lease the next due item by tenant rotation, or ``None`` when nothing is due."""
        ...

    async def claim_batch(
        self, worker_id: str, *, lease_for: float | timedelta, limit: int
    ) -> list[Lease]:
        """Up to ``limit`` leases, as ``limit`` successive claims would give them."""
        ...

    async def heartbeat(self, lease: Lease) -> Lease:
        """Extend the lease by its duration from now, with a new token."""
        ...

    async def ack(self, lease: Lease) -> WorkItem:
        """Mark the item done."""
        ...

    async def ack_many(self, leases: Sequence[Lease]) -> list[WorkItem | LeaseLostError]:
        """Ack up to 1,000 leases in one round trip, each fenced on its own token.

        The answer is in lease order: the done item, or the ``LeaseLostError`` a
        single ``ack`` of that lease would have raised (that item is unchanged);
        the others land. Every lease is checked (errors name ``leases[i]``, an
        item named twice included) before anything is sent.
        """
        ...

    async def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retryable: bool = True,
        retry_in: float | timedelta | None = None,
    ) -> WorkItem:
        """Record the error; retry after backoff or dead-letter, as ``QueuePolicy`` decides.

        ``retry_in`` replaces the policy's backoff for a retry (the policy still
        decides whether it is one, or the dead letter).
        """
        ...

    async def release(
        self,
        lease: Lease,
        *,
        delay: float | timedelta | None = None,
        count_attempt: bool = False,
    ) -> WorkItem:
        """Give the item back, due at ``now + delay``.

        The attempt is given back too unless ``count_attempt`` (a worker shutting
        down keeps it, so an item that always hangs still reaches the dead letter).
        """
        ...

    async def cancel(
        self, tenant: str, item_id: str, *, reason: str | None = None
    ) -> WorkItem | None:
        """Cancel one item: ``cancel_many`` of one id."""
        ...

    async def cancel_many(
        self, tenant: str, item_ids: Sequence[str], *, reason: str | None = None
    ) -> list[WorkItem | None]:
        """Cancel up to 1,000 items of a tenant in one round trip; answers in ``item_ids`` order.

        A queued (delayed too) or leased item becomes ``cancelled`` with
        ``last_error = reason`` and is never claimed again; a leased one's lease is
        void (its settles and heartbeats raise ``LeaseLostError``) and every
        ``watch(on_cancel=...)`` is told. A done, dead or cancelled item is returned
        unchanged; a missing one is ``None``. An id named twice is refused.
        """
        ...

    async def pause(self) -> None:
        """Stop every process claiming from this queue (stored on the server) until
        ``resume``; leased items still settle."""
        ...

    async def resume(self) -> None:
        """Undo ``pause``; open watches wake as on an enqueue."""
        ...

    async def paused(self) -> bool:
        """Whether the queue is paused."""
        ...

    async def set_limits(self, limits: QueueLimits | None) -> None:
        """Store the queue's flow control (``QueueLimits``; ``None``: no limits) on the
        server: every process claims under it from its next claim."""
        ...

    async def limits(self) -> QueueLimits:
        """The flow control stored with the queue (empty when none was set)."""
        ...

    async def prune(self) -> int:
        """Delete finished items older than the policy's ``keep_*``; return how many.

        Done, cancelled and dead items whose ``updated_at`` is before ``now - keep``
        go, in batches of at most ``PRUNE_BATCH``; their ids and unique keys are free
        again. At most one process prunes a queue at a time: another caller gets 0
        at once.
        """
        ...

    async def reap(self) -> list[WorkItem]:
        """Move expired leases back to ready (or to the dead letter); return the moved items."""
        ...

    async def dead_letters(self, tenant: str, *, limit: int = 100) -> list[WorkItem]:
        """The tenant's dead items, oldest first."""
        ...

    async def requeue(self, item: WorkItem) -> WorkItem:
        """Bring a dead item back, due now, with its attempts reset.

        Raises ``ValueError`` naming ``item_id`` when the item is missing or not dead.
        """
        ...

    async def purge_dead(self, tenant: str) -> int:
        """Delete every dead item of the tenant; return how many were deleted.

        Queued, leased and done items, and other tenants, are untouched. A purged
        item is gone as if it had never been enqueued: its ``item_id`` is free
        again, so an ``enqueue`` of the same id stores a new item. Raises
        ``ValueError`` naming ``tenant`` for a bad tenant. Not one atomic step on
        every backing (Redis deletes in bounded batches): an item that dies while
        a purge runs may or may not be purged by it.
        """
        ...

    async def get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        """The item's current record, or ``None``."""
        ...

    def watch(self, *, on_cancel: OnCancel | None = None) -> AbstractAsyncContextManager[WorkWatch]:
        """Wake-ups for an idle claimer: ``async with queue.watch() as watch:`` then
        ``await watch.wait(timeout)`` returns when work may have arrived (True) or the
        timeout passed (False). A wake-up may be spurious, and one may be lost (a
        dropped connection): claim after every return, and keep the timeout as the
        bound on how late a lost one makes an item.

        ``on_cancel(tenant, item_id, token)`` is called, while the watch is open, when
        a leased item is cancelled by any process (``token`` is the voided lease's).
        Like a wake-up it may be lost: a heartbeat raising ``LeaseLostError`` stays
        the fallback."""
        ...

    async def stats(self) -> QueueStats:
        """Queued (depth), leased, dead and cancelled counts per tenant; its cost does not
        grow with done items."""
        ...

    async def next_due(self) -> datetime | None:
        """When the earliest queued item that is not due yet comes due, or ``None``.

        A hint for an idle claimer, which sleeps until then instead of a fixed
        poll: it may be early (claim, and ask again), and a delay that a
        concurrent write is moving may be missed, so keep the poll interval as
        the bound.
        """
        ...
