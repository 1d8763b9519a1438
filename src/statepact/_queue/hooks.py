"""What a queue backing implements: the hooks :class:`~statepact.queue.BaseWorkQueue` calls.

Each hook gets input the front has checked and the clock's reading; every settle is
fenced on the lease token. The lifecycle hooks are not abstract, so a backing written
before them still loads: it raises ``NotImplementedError`` naming itself when called.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta

from statepact._queue_limits import QueueLimits
from statepact._queue_policy import FailOutcome, LapseOutcome, OnCancel, WorkWatch
from statepact.models import AttemptError, ItemStatus, Lease, QueueStats, WorkItem

__all__ = ["BackingHooks"]


class BackingHooks(ABC):
    """The backing's side of a queue; :class:`~statepact.queue.BaseWorkQueue` is the other."""

    @abstractmethod
    async def _enqueue(self, item: WorkItem, payload: bytes) -> WorkItem:
        """Insert ``item`` unless ``(queue, tenant, item_id)`` exists; return the stored item."""

    @abstractmethod
    def _watch(self, on_cancel: OnCancel | None) -> AbstractAsyncContextManager[WorkWatch]:
        """The backing's wake-ups (``WorkQueue.watch``); ``timeout`` arrives checked.

        With ``on_cancel``, the watch calls it for every leased item cancelled anywhere
        while it is open (a callback that raises must not end the watch)."""

    @abstractmethod
    async def _enqueue_many(self, batch: list[tuple[WorkItem, bytes]]) -> list[WorkItem]:
        """Store every new item of ``batch`` at once (all or none) in one round trip.

        The answer is in ``batch`` order: an item already stored is returned as it is.
        """

    @abstractmethod
    async def _claim(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        """Lease up to ``limit`` due items by tenant rotation, counting an attempt on each."""

    # Every settle is fenced on ``lease.token``: a lease that no longer holds its item
    # (another token, another status, another queue) changes nothing and answers None.

    @abstractmethod
    async def _heartbeat(self, lease: Lease, now: datetime, expires_at: datetime) -> Lease | None:
        """Move the expiry and the token; ``None`` for a stale lease."""

    @abstractmethod
    async def _ack(self, lease: Lease, now: datetime) -> WorkItem | None: ...

    @abstractmethod
    async def _ack_many(self, leases: list[Lease], now: datetime) -> list[WorkItem | None]:
        """Ack every lease that still holds its item, in one round trip; each stale one is
        ``None`` in its place and changes nothing."""

    @abstractmethod
    async def _fail(
        self, lease: Lease, now: datetime, error: str, outcome: FailOutcome
    ) -> WorkItem | None: ...

    @abstractmethod
    async def _release(
        self, lease: Lease, now: datetime, *, available_at: datetime, count_attempt: bool
    ) -> WorkItem | None:
        """Back to queued, due at ``available_at``; attempts less one unless ``count_attempt``."""

    @abstractmethod
    async def _reap(self, now: datetime, outcome: LapseOutcome) -> list[WorkItem]:
        """Expired leases back to queued (due now) or dead, as ``outcome`` says."""

    @abstractmethod
    async def _dead_letters(self, tenant: str, limit: int) -> list[WorkItem]: ...

    @abstractmethod
    async def _requeue(
        self, tenant: str, item_id: str, now: datetime
    ) -> WorkItem | ItemStatus | None:
        """A dead item back to queued, due now, attempts 0: the item; else nothing is
        written and the answer is the status it has, or ``None`` when there is none."""

    @abstractmethod
    async def _purge_dead(self, tenant: str) -> int:
        """Delete the tenant's dead items (their ids become free); return how many."""

    @abstractmethod
    async def _get_item(self, tenant: str, item_id: str) -> WorkItem | None: ...

    @abstractmethod
    async def _stats(self) -> QueueStats: ...

    @abstractmethod
    async def _next_due(self, now: datetime) -> datetime | None:
        """The earliest ``available_at`` later than ``now`` of a queued item, or ``None``."""

    # The lifecycle hooks (issue 33). Not abstract while a backing is without them: a
    # backing that has not implemented one raises NotImplementedError naming itself.

    async def _cancel_many(
        self, tenant: str, item_ids: list[str], reason: str | None, now: datetime
    ) -> list[WorkItem | None]:
        """Queued/leased items to cancelled (``last_error = reason``, ``updated_at = now``,
        lease void, slot freed, ``on_cancel`` told of each leased one), all in one round
        trip; others unchanged; answers in ``item_ids`` order, ``None`` for a missing one."""
        raise self._missing("cancel")

    async def _set_paused(self, paused: bool) -> None:
        """Store the flag on the server; on ``False`` wake the watches as an enqueue does."""
        raise self._missing("pause/resume")

    async def _paused(self) -> bool:
        raise self._missing("paused")

    async def _set_limits(self, limits: QueueLimits) -> None:
        """Store ``limits`` with the queue on the server (``to_json``); empty removes them."""
        raise self._missing("set_limits")

    async def _limits(self) -> QueueLimits:
        raise self._missing("limits")

    async def _prune(
        self, now: datetime, cutoffs: Mapping[ItemStatus, datetime], batch: int
    ) -> int:
        """The whole prune: take the queue's try-lock (0 at once when another holds it),
        then delete items of each status in ``cutoffs`` whose ``updated_at`` is before its
        cutoff, at most ``batch`` per statement/script, until none is left; return how many."""
        raise self._missing("prune")

    async def _count_prunable(
        self, cutoffs: Mapping[ItemStatus, datetime]
    ) -> dict[ItemStatus, int]:
        """Per status of ``cutoffs``, how many items of it have ``updated_at`` before its cutoff."""
        raise self._missing("prunable")

    async def _dead_letters_all(self, after: tuple[str, str] | None, limit: int) -> list[WorkItem]:
        """Up to ``limit`` dead items of any tenant with ``(tenant, item_id)`` after ``after``,
        in that order."""
        raise self._missing("dead_letters_all")

    # The dashboard's reads (issue 38): each bounded, none reads every finished item.

    async def _unique_holder(self, tenant: str, slot: str) -> WorkItem | None:
        """The item holding unique slot ``slot`` of the tenant now, or ``None``."""
        raise self._missing("find_unique")

    async def _oldest_ready(self, now: datetime) -> dict[str, datetime]:
        """Per tenant with a ready item (queued, ``available_at <= now``), the earliest
        ``available_at`` of its ready items."""
        raise self._missing("oldest_waiting")

    async def _finished_counts(
        self, since: datetime, width: timedelta, buckets: int
    ) -> dict[ItemStatus, list[int]]:
        """Per finished status (done, cancelled, dead), how many items finished (their
        ``updated_at``) in each of ``buckets`` spans ``[since + i*width, since + (i+1)*width)``."""
        raise self._missing("finished_per_minute")

    async def _queues(self) -> list[QueueStats]:
        """The stats of every queue with items on this storage, by queue name."""
        raise self._missing("queues")

    async def _error_history(self, tenant: str, item_id: str) -> list[AttemptError] | None:
        """The item's error history, oldest first (``[]``: none), or ``None`` when there is
        no such item. Every write of ``last_error`` (fail, reap, cancel with a reason)
        appends one entry in the same atomic write, dropping the oldest past
        ``MAX_ERROR_HISTORY``; a stale settle appends nothing. Only this hook reads it."""
        raise self._missing("error_history")

    def _missing(self, call: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} does not implement {call} yet")
