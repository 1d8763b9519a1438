"""``MemoryWorkQueue``: the reference ``WorkQueue``, held in this process.

It implements the ``_``-methods of :class:`~statepact.queue.BaseWorkQueue`,
which has validated and encoded everything, read the clock and asked
``QueuePolicy`` what a failure or a lapse means: this module stores what it is
told, fenced on the lease token, and decides only the order of claims. The
rules it pins for every backing: docs/backings.md#memory.

It must never await inside a read-modify-write (each call is one step of the
event loop) and never scan the backlog to claim or prune; it is not safe across
OS threads or processes.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import Self

from statepact._queue_limits import QueueLimits
from statepact.clock import Clock, from_micros, to_micros
from statepact.models import (
    ItemStatus,
    Lease,
    QueueStats,
    TenantQueueStats,
    WorkItem,
    stored_lease,
)
from statepact.queue import (
    FailOutcome,
    LapseOutcome,
    OnCancel,
    QueuePolicy,
    WorkWatch,
    holds_unique_slot,
    unique_slot,
)
from statepact.settings import MemoryStoreSettings
from statepact.storage.memory._entries import Entry, MemoryWatch
from statepact.storage.memory._flow import FlowLedger
from statepact.storage.memory._queue_reads import MemoryReads

__all__ = ["MemoryWorkQueue"]


class MemoryWorkQueue(MemoryReads):
    """Heaps all the way down: claim, promote and reap cost O(log n) per item moved.

    - ``_ready[tenant]``: due queued items, ``(-priority, order, item_id)``.
    - ``_delayed``: queued items not yet due, ``(available_at, order, tenant, item_id)``.
      Every queued item has exactly one entry in one of the two: a claim takes an
      item out of ``queued`` and pops that entry; a cancel leaves it, stale (the item
      is no longer queued, or a new item has its id and another order), and the
      heaps skip it when they reach it.
    - ``_rotation``: one ``(turn, tenant)`` per tenant in ``_active`` (tenants with
      entries in ``_ready``).
    - ``_expiry``: ``(expires_at, token, tenant, item_id)`` per lease given; an
      entry is stale once the item was settled or its token moved on, and is
      dropped when ``reap`` reaches it (a queue never reaped keeps them).
    - ``_finished``: ``(updated_at, order, tenant, item_id)`` per item that finished
      (done, cancelled, dead), by status; stale once the item moved on (requeued,
      purged), dropped when ``prune`` reaches it.
    - ``_slots``: ``(tenant, slot) -> item_id`` for every unique slot held.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        settings: MemoryStoreSettings | None = None,
        policy: QueuePolicy | None = None,
        name: str | None = None,
        max_value_bytes: int | None = None,
    ) -> None:
        """``name`` and ``max_value_bytes``, when given, win over ``settings.queue_name`` and
        ``settings.max_value_bytes``."""
        settings = settings or MemoryStoreSettings()
        super().__init__(
            clock=clock,
            policy=policy,
            name=settings.queue_name if name is None else name,
            max_value_bytes=(
                settings.max_value_bytes if max_value_bytes is None else max_value_bytes
            ),
        )
        self._items: dict[tuple[str, str], Entry] = {}
        self._ready: dict[str, list[tuple[int, int, str]]] = {}
        self._delayed: list[tuple[datetime, int, str, str]] = []
        self._rotation: list[tuple[int, str]] = []
        self._active: set[str] = set()
        self._turns: dict[str, int] = {}
        self._turn_counter = 0
        self._expiry: list[tuple[datetime, int, str, str]] = []
        self._token_counter = 0
        self._order_counter = 0
        self._dead: dict[str, set[str]] = {}
        self._counts: dict[str, dict[ItemStatus, int]] = {}
        self._finished: dict[ItemStatus, list[tuple[datetime, int, str, str]]] = {}
        self._slots: dict[tuple[str, str], str] = {}
        self._paused_now = False
        self._flow = FlowLedger()
        # When the earliest item a rate held back in the last claim fits (next_due's hint).
        self._rate_wake: datetime | None = None
        self._pruning = False
        # The open watches (watch()); each is told when an item is scheduled.
        self._watches: set[MemoryWatch] = set()

    @classmethod
    async def open(
        cls,
        *,
        clock: Clock | None = None,
        settings: MemoryStoreSettings | None = None,
        policy: QueuePolicy | None = None,
    ) -> Self:
        """A queue built as the constructor builds it (no server to check)."""
        return cls(clock=clock, settings=settings, policy=policy)

    def __repr__(self) -> str:
        return f"MemoryWorkQueue(name={self.name!r}, items={len(self._items)})"

    # -- enqueue and claim --------------------------------------------------

    async def _enqueue(self, item: WorkItem, payload: bytes) -> WorkItem:
        return self._put(item, payload)

    @asynccontextmanager
    async def _watch(self, on_cancel: OnCancel | None) -> AsyncIterator[WorkWatch]:
        watch = MemoryWatch(on_cancel)
        self._watches.add(watch)
        try:
            yield watch
        finally:
            self._watches.discard(watch)

    async def _enqueue_many(self, batch: list[tuple[WorkItem, bytes]]) -> list[WorkItem]:
        # No await between the puts: the batch lands whole, as one step of the loop.
        return [self._put(item, payload) for item, payload in batch]

    def _put(self, item: WorkItem, payload: bytes) -> WorkItem:
        key = (item.tenant, item.item_id)
        existing = self._items.get(key)
        if existing is not None:
            return self._record(existing)
        assert item.available_at is not None and item.created_at is not None  # set by the front
        slot = unique_slot(item, item.created_at)
        if slot is not None:
            holder = self._slots.get((item.tenant, slot))
            if holder is not None:
                return self._record(self._items[(item.tenant, holder)])
            self._slots[(item.tenant, slot)] = item.item_id
        self._order_counter += 1
        entry = Entry(
            tenant=item.tenant,
            item_id=item.item_id,
            payload=payload,
            priority=item.priority,
            order=self._order_counter,
            available_at=item.available_at,
            created_at=item.created_at,
            updated_at=item.created_at,
            unique_key=item.unique_key,
            unique_for=item.unique_for,
            timeout=item.timeout,
            slot=slot,
            limit_key=item.limit_key,
            weight=item.weight,
        )
        self._items[key] = entry
        self._count(entry.tenant, ItemStatus.QUEUED, +1)
        self._schedule(entry, item.created_at)
        return self._record(entry)

    async def _claim(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        if self._paused_now:
            return []
        self._promote(now)
        if not self._flow.limits.empty:
            return self._claim_limited(worker_id, now, seconds, limit)
        leases: list[Lease] = []
        while len(leases) < limit and self._rotation:
            _turn, tenant = heapq.heappop(self._rotation)
            entry = self._pop_ready(tenant)
            if entry is None:
                self._active.discard(tenant)
                continue
            self._take_turn(tenant)
            self._set_status(entry, ItemStatus.LEASED)
            entry.attempts += 1
            entry.updated_at = now
            leases.append(self._grant(entry, worker_id, now, seconds))
        return leases

    def _claim_limited(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        """``_claim`` under ``QueueLimits``: a tenant whose next items are held back by a cap
        or a rate keeps its turn and the rotation goes on to the next tenant; within a
        tenant at most ``LOOKAHEAD`` (``_flow``) held-back items are passed over per claim, so the
        cost does not grow with the backlog."""
        micros = to_micros(now)
        leases: list[Lease] = []
        passed: list[tuple[int, str]] = []
        wake: int | None = None
        while len(leases) < limit and self._rotation:
            turn, tenant = heapq.heappop(self._rotation)
            cap = self._flow.limits.tenant_cap(tenant)
            if cap is not None and self._counts.get(tenant, {}).get(ItemStatus.LEASED, 0) >= cap:
                passed.append((turn, tenant))
                continue
            entry, held, fits_at = self._flow.pop_allowed(
                self._ready.get(tenant), micros, partial(self._queued, tenant)
            )
            if fits_at is not None:
                wake = fits_at if wake is None else min(wake, fits_at)
            if entry is None:
                if held:
                    passed.append((turn, tenant))
                else:
                    self._active.discard(tenant)
                continue
            self._take_turn(tenant)
            self._flow.spend(entry, micros)
            self._set_status(entry, ItemStatus.LEASED)
            entry.attempts += 1
            entry.updated_at = now
            leases.append(self._grant(entry, worker_id, now, seconds))
        for turn_tenant in passed:
            heapq.heappush(self._rotation, turn_tenant)
        self._rate_wake = None if wake is None else from_micros(wake)
        return leases

    def _take_turn(self, tenant: str) -> None:
        """The tenant was served: to the back of the rotation, or out of it when idle."""
        self._turn_counter += 1
        self._turns[tenant] = self._turn_counter
        if self._ready.get(tenant):
            heapq.heappush(self._rotation, (self._turn_counter, tenant))
        else:
            self._active.discard(tenant)
            self._ready.pop(tenant, None)

    # -- settle -------------------------------------------------------------

    async def _heartbeat(self, lease: Lease, now: datetime, expires_at: datetime) -> Lease | None:
        entry = self._held(lease)
        if entry is None:
            return None
        return self._grant(entry, lease.worker_id, now, lease.lease_seconds)

    async def _ack(self, lease: Lease, now: datetime) -> WorkItem | None:
        entry = self._held(lease)
        if entry is None:
            return None
        self._end_lease(entry, ItemStatus.DONE, now)
        return self._record(entry)

    async def _ack_many(self, leases: list[Lease], now: datetime) -> list[WorkItem | None]:
        # No await between the acks: the batch is one step of the loop.
        done: list[WorkItem | None] = []
        for lease in leases:
            entry = self._held(lease)
            if entry is not None:
                self._end_lease(entry, ItemStatus.DONE, now)
            done.append(None if entry is None else self._record(entry))
        return done

    async def _fail(
        self, lease: Lease, now: datetime, error: str, outcome: FailOutcome
    ) -> WorkItem | None:
        entry = self._held(lease)
        if entry is None:
            return None
        entry.set_error(error, "failed", now)
        entry.available_at = outcome.available_at
        if outcome.dead:
            self._end_lease(entry, ItemStatus.DEAD, now)
        else:
            self._end_lease(entry, ItemStatus.QUEUED, now)
        return self._record(entry)

    async def _release(
        self, lease: Lease, now: datetime, *, available_at: datetime, count_attempt: bool
    ) -> WorkItem | None:
        entry = self._held(lease)
        if entry is None:
            return None
        if not count_attempt:
            entry.attempts -= 1
        entry.available_at = available_at
        self._end_lease(entry, ItemStatus.QUEUED, now)
        return self._record(entry)

    async def _cancel_many(
        self, tenant: str, item_ids: list[str], reason: str | None, now: datetime
    ) -> list[WorkItem | None]:
        # No await between the cancels: the batch is one step of the loop. A queued item's
        # heap entry stays behind, stale; the heaps skip it.
        answers: list[WorkItem | None] = []
        for item_id in item_ids:
            entry = self._items.get((tenant, item_id))
            if entry is None:
                answers.append(None)
                continue
            if entry.status is ItemStatus.QUEUED or entry.status is ItemStatus.LEASED:
                voided = entry.token if entry.status is ItemStatus.LEASED else None
                entry.set_error(reason, "cancelled", now)
                self._end_lease(entry, ItemStatus.CANCELLED, now)
                if voided is not None:
                    for watch in self._watches:
                        watch.cancelled(tenant, item_id, voided)
            answers.append(self._record(entry))
        return answers

    async def _set_paused(self, paused: bool) -> None:
        self._paused_now = paused
        if not paused:
            for watch in self._watches:
                watch.notify()

    async def _paused(self) -> bool:
        return self._paused_now

    async def _set_limits(self, limits: QueueLimits) -> None:
        self._flow.limits = limits
        for watch in self._watches:
            watch.notify()  # a raised limit may make held-back items claimable

    async def _limits(self) -> QueueLimits:
        return self._flow.limits

    async def _prune(
        self, now: datetime, cutoffs: Mapping[ItemStatus, datetime], batch: int
    ) -> int:
        if self._pruning:
            return 0  # another prune of this queue is under way
        self._pruning = True
        pruned = 0
        try:
            for status, cutoff in cutoffs.items():
                while True:
                    taken = self._prune_batch(status, cutoff, batch)
                    pruned += taken
                    if taken < batch:
                        break
                    await asyncio.sleep(0)  # let the loop breathe between batches
        finally:
            self._pruning = False
        return pruned

    def _prune_batch(self, status: ItemStatus, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` items of ``status`` that finished before ``cutoff``; the
        heap entries this skips (stale) are not counted against ``batch``."""
        heap = self._finished.get(status, [])
        taken = 0
        while heap and taken < batch and heap[0][0] < cutoff:
            entry = self._finished_entry(status, *heapq.heappop(heap))
            if entry is None:
                continue
            self._delete(entry)
            taken += 1
        return taken

    async def _reap(self, now: datetime, outcome: LapseOutcome) -> list[WorkItem]:
        moved: list[WorkItem] = []
        while self._expiry and self._expiry[0][0] <= now:
            _expires, token, tenant, item_id = heapq.heappop(self._expiry)
            entry = self._items.get((tenant, item_id))
            if entry is None or entry.status is not ItemStatus.LEASED or entry.token != token:
                continue  # settled, or heartbeat/claimed since: this expiry is stale
            entry.set_error(outcome.error, "lease_expired", now)
            entry.available_at = now
            if outcome.is_dead(entry.attempts):
                self._end_lease(entry, ItemStatus.DEAD, now)
            else:
                self._end_lease(entry, ItemStatus.QUEUED, now)
            moved.append(self._record(entry))
        return moved

    # -- inspect and recover ------------------------------------------------

    async def _dead_letters(self, tenant: str, limit: int) -> list[WorkItem]:
        ids = self._dead.get(tenant, set())
        entries = sorted(
            (self._items[(tenant, item_id)] for item_id in ids),
            key=lambda entry: (entry.updated_at, entry.item_id),
        )
        return [self._record(entry) for entry in entries[:limit]]

    async def _requeue(
        self, tenant: str, item_id: str, now: datetime
    ) -> WorkItem | ItemStatus | None:
        entry = self._items.get((tenant, item_id))
        if entry is None or entry.status is not ItemStatus.DEAD:
            return None if entry is None else entry.status
        self._set_status(entry, ItemStatus.QUEUED)
        entry.attempts = 0
        entry.available_at = now
        entry.updated_at = now
        self._schedule(entry, now)
        return self._record(entry)

    async def _purge_dead(self, tenant: str) -> int:
        # A dead item sits in no ready, delayed or rotation heap; an _expiry or _finished
        # entry it left is skipped once the record is gone.
        ids = list(self._dead.get(tenant, ()))
        for item_id in ids:
            self._delete(self._items[(tenant, item_id)])
        return len(ids)

    async def _get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        entry = self._items.get((tenant, item_id))
        return None if entry is None else self._record(entry)

    async def _stats(self) -> QueueStats:
        tenants = {
            tenant: TenantQueueStats(
                queued=counts.get(ItemStatus.QUEUED, 0),
                leased=counts.get(ItemStatus.LEASED, 0),
                dead=counts.get(ItemStatus.DEAD, 0),
                cancelled=counts.get(ItemStatus.CANCELLED, 0),
            )
            for tenant, counts in sorted(self._counts.items())
            if any(counts.values())
        }
        return QueueStats(queue=self.name, tenants=tenants)

    async def _next_due(self, now: datetime) -> datetime | None:
        self._promote(now)
        while self._delayed and self._stale(*self._delayed[0][1:]):
            heapq.heappop(self._delayed)
        due = self._delayed[0][0] if self._delayed else None
        wake = self._rate_wake
        if wake is not None and wake > now and (due is None or wake < due):
            return wake
        return due

    # -- helpers ------------------------------------------------------------

    def _count(self, tenant: str, status: ItemStatus, change: int) -> None:
        counts = self._counts.setdefault(tenant, {})
        counts[status] = counts.get(status, 0) + change

    def _set_status(self, entry: Entry, status: ItemStatus) -> None:
        """Move the item between statuses, keeping stats, the dead index and its unique
        slot in step."""
        self._leave(entry)
        was_leased = entry.status is ItemStatus.LEASED
        entry.status = status
        if status is ItemStatus.LEASED and entry.limit_key is not None:
            self._flow.hold_key(entry, +1)
        if was_leased and status is not ItemStatus.LEASED and not self._flow.limits.empty:
            for watch in self._watches:
                watch.notify()  # a freed slot: a held-back item may be claimable now
        if status is not ItemStatus.DONE:
            self._count(entry.tenant, status, +1)
        if status is ItemStatus.DEAD:
            self._dead.setdefault(entry.tenant, set()).add(entry.item_id)
        if entry.slot is not None and not holds_unique_slot(
            status, by_period=entry.unique_for is not None
        ):
            self._free_slot(entry)

    def _leave(self, entry: Entry) -> None:
        """Take the item out of its status's count and the dead index."""
        if entry.status is ItemStatus.LEASED and entry.limit_key is not None:
            self._flow.hold_key(entry, -1)
        if entry.status is ItemStatus.DEAD:
            dead = self._dead[entry.tenant]
            dead.discard(entry.item_id)
            if not dead:
                del self._dead[entry.tenant]
        if entry.status is not ItemStatus.DONE:
            self._count(entry.tenant, entry.status, -1)

    def _free_slot(self, entry: Entry) -> None:
        if entry.slot is not None and self._slots.get((entry.tenant, entry.slot)) == entry.item_id:
            del self._slots[(entry.tenant, entry.slot)]
        entry.slot = None

    def _delete(self, entry: Entry) -> None:
        """Forget a finished item: its id and unique slot are free; heap entries it left
        are stale."""
        self._leave(entry)
        self._free_slot(entry)
        del self._items[(entry.tenant, entry.item_id)]

    def _queued(self, tenant: str, top: tuple[int, int, str]) -> Entry | None:
        """The queued item a ready heap entry of ``tenant`` stands for (``None``: stale)."""
        return None if self._stale(top[1], tenant, top[2]) else self._items[(tenant, top[2])]

    def _stale(self, order: int, tenant: str, item_id: str) -> bool:
        """Whether a ready/delayed heap entry no longer stands for a queued item."""
        entry = self._items.get((tenant, item_id))
        return entry is None or entry.order != order or entry.status is not ItemStatus.QUEUED

    def _schedule(self, entry: Entry, now: datetime) -> None:
        """Put a queued item where a claim will find it: ready if due, else delayed."""
        if entry.available_at <= now:
            self._push_ready(entry)
        else:
            heapq.heappush(
                self._delayed, (entry.available_at, entry.order, entry.tenant, entry.item_id)
            )
        # A delayed item wakes watchers too: they ask next_due() and sleep until it.
        for watch in self._watches:
            watch.notify()

    def _push_ready(self, entry: Entry) -> None:
        ready = self._ready.setdefault(entry.tenant, [])
        heapq.heappush(ready, (-entry.priority, entry.order, entry.item_id))
        if entry.tenant not in self._active:
            self._active.add(entry.tenant)
            heapq.heappush(self._rotation, (self._turns.get(entry.tenant, 0), entry.tenant))

    def _promote(self, now: datetime) -> None:
        """Move delayed items that have come due into their tenants' ready heaps."""
        while self._delayed and self._delayed[0][0] <= now:
            _at, order, tenant, item_id = heapq.heappop(self._delayed)
            if not self._stale(order, tenant, item_id):
                self._push_ready(self._items[(tenant, item_id)])

    def _pop_ready(self, tenant: str) -> Entry | None:
        """The tenant's next due item, or ``None`` if it has none."""
        ready = self._ready.get(tenant)
        while ready:
            _priority, order, item_id = heapq.heappop(ready)
            if not self._stale(order, tenant, item_id):
                return self._items[(tenant, item_id)]
        self._ready.pop(tenant, None)
        return None

    def _grant(self, entry: Entry, worker_id: str, now: datetime, seconds: float) -> Lease:
        """A new token and expiry for a leased item; every earlier token is now stale."""
        self._token_counter += 1
        entry.token = self._token_counter
        expires_at = now + timedelta(seconds=seconds)
        heapq.heappush(self._expiry, (expires_at, entry.token, entry.tenant, entry.item_id))
        return stored_lease(self._record(entry), worker_id, entry.token, expires_at, seconds)

    def _held(self, lease: Lease) -> Entry | None:
        """The leased item if ``lease`` still holds it, else ``None``."""
        item = lease.item
        entry = None if item.queue != self.name else self._items.get((item.tenant, item.item_id))
        if entry is None or entry.status is not ItemStatus.LEASED or entry.token != lease.token:
            return None
        return entry

    def _end_lease(self, entry: Entry, status: ItemStatus, now: datetime) -> None:
        """Settle an item into ``status``: queued items are scheduled again, finished ones
        wait for ``prune``."""
        self._set_status(entry, status)
        entry.updated_at = now
        if status is ItemStatus.QUEUED:
            self._schedule(entry, now)
        else:
            heapq.heappush(
                self._finished.setdefault(status, []),
                (now, entry.order, entry.tenant, entry.item_id),
            )
