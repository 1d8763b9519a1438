"""The ``WorkQueue`` protocol, ``QueuePolicy`` and the front every backing shares.

:class:`BaseWorkQueue` implements the protocol once: it validates arguments,
encodes and size-checks payloads, reads the injected clock, and asks
:class:`QueuePolicy` whether a failed item is retried (and when) or
dead-lettered. A backing only stores what it is told, atomically and fenced on
the lease token; two backings can therefore never disagree about poison.

What the front decides or learns is logged on ``statepact.queue`` (see
docs/observability.md): dead letters and lost leases at WARNING, failures retried
later, reaped leases, requeued items and purged dead letters at INFO, releases at DEBUG;
cancels, pauses, resumes and prunes at INFO.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta

from statepact import _observe
from statepact._codec import (
    require_id,
    require_limit,
    require_seconds,
)
from statepact._limits import (
    DEFAULT_MAX_VALUE_BYTES,
    MAX_BATCH_BYTES,
    MAX_ENQUEUE_BATCH,
    MAX_PRIORITY,
    MAX_RETRY_DELAY,
    MAX_SHARED_ENQUEUES,
    PRUNE_BATCH,
)

# Re-exported: the worker, the backings and the CLI have always imported them from here.
from statepact._queue.checks import MAX_BATCH as MAX_BATCH  # noqa: PLC0414
from statepact._queue.checks import MAX_ERROR_CHARS as MAX_ERROR_CHARS  # noqa: PLC0414
from statepact._queue.checks import (
    CheckedWatch,
    error_text,
    require_lease,
)
from statepact._queue.checks import SleepWatch as SleepWatch  # noqa: PLC0414
from statepact._queue.items import ItemInput, fresh_batch, fresh_item
from statepact._queue.operator import OperatorReads
from statepact._queue.protocol import WorkQueue
from statepact._queue_limits import QueueLimits, Rate
from statepact._queue_policy import (
    FailOutcome,
    LapseOutcome,
    OnCancel,
    QueuePolicy,
    WorkWatch,
    holds_unique_slot,
    unique_slot,
)
from statepact._shared import SharedRoundTrips
from statepact.clock import Clock, SystemClock, read_clock
from statepact.errors import LeaseLostError, StatePersistenceError
from statepact.models import ItemStatus, Lease, QueueStats, WorkItem
from statepact.settings import redact_dsn

__all__ = [
    "MAX_PRIORITY",
    "BaseWorkQueue",
    "FailOutcome",
    "LapseOutcome",
    "OnCancel",
    "QueueLimits",
    "QueuePolicy",
    "Rate",
    "WorkQueue",
    "WorkWatch",
    "holds_unique_slot",
    "unique_slot",
]

_log = logging.getLogger("statepact.queue")


class BaseWorkQueue(OperatorReads):
    """Validation, encoding, time and policy for every ``WorkQueue`` backing; the
    operator's reads (``find_unique``, ``error_history``, ...) come from ``OperatorReads``."""

    # A backing that owns its connections turns this on: concurrent single enqueues then
    # share round trips (statepact._shared). Never inside a caller's transaction.
    _shares_enqueues = False

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        policy: QueuePolicy | None = None,
        name: str = "default",
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._policy = policy or QueuePolicy()
        self._name = require_id("name", name)
        if max_value_bytes <= 0:
            raise ValueError("max_value_bytes: must be positive")
        self._max_value_bytes = max_value_bytes
        self._enqueue_batches: SharedRoundTrips[tuple[WorkItem, bytes], WorkItem] = (
            SharedRoundTrips(
                lambda entry: self._enqueue(*entry),
                self._enqueue_many,
                keys=lambda entry: ((entry[0].tenant, entry[0].item_id),),
                size=lambda entry: len(entry[1]),
                max_items=MAX_SHARED_ENQUEUES,
                max_bytes=MAX_BATCH_BYTES,
                name="statepact-enqueues",
            )
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def policy(self) -> QueuePolicy:
        return self._policy

    @property
    def clock(self) -> Clock:
        return self._clock

    def _prepare(
        self, field: str, item: object, now: datetime, available_at: datetime
    ) -> tuple[WorkItem, bytes]:
        """The checked, fresh record of ``item`` and its encoded payload; errors name ``field``."""
        return fresh_item(
            field,
            item,
            queue=self._name,
            max_value_bytes=self._max_value_bytes,
            now=now,
            available_at=available_at,
        )

    async def enqueue(self, item: WorkItem, *, delay: float | timedelta | None = None) -> WorkItem:
        now = read_clock(self._clock)
        wait = 0.0 if delay is None else require_seconds("delay", delay, allow_zero=True)
        fresh, payload = self._prepare("", item, now, now + timedelta(seconds=wait))
        if not self._shares_enqueues:
            return await self._enqueue(fresh, payload)
        return await self._enqueue_batches.send((fresh, payload))

    async def enqueue_many(
        self, items: Sequence[ItemInput], *, delay: float | timedelta | None = None
    ) -> list[WorkItem]:
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise TypeError(
                f"items: must be a sequence of WorkItem or mappings, got {type(items).__name__}"
            )
        if not 1 <= len(items) <= MAX_ENQUEUE_BATCH:
            raise ValueError(
                f"items: must hold between 1 and {MAX_ENQUEUE_BATCH} items, got {len(items)}"
            )
        now = read_clock(self._clock)
        wait = 0.0 if delay is None else require_seconds("delay", delay, allow_zero=True)
        available_at = now + timedelta(seconds=wait)
        batch = fresh_batch(
            items,
            queue=self._name,
            max_value_bytes=self._max_value_bytes,
            now=now,
            available_at=available_at,
        )
        total = sum(len(payload) for _, payload in batch)
        if total > MAX_BATCH_BYTES:
            raise StatePersistenceError(
                f"items: the batch's payloads are {total} bytes serialized, over the "
                f"{MAX_BATCH_BYTES} one enqueue_many sends; split it",
                reason="too_large",
            )
        return await self._enqueue_many(batch)

    async def claim(self, worker_id: str, *, lease_for: float | timedelta) -> Lease | None:
        leases = await self.claim_batch(worker_id, lease_for=lease_for, limit=1)
        return leases[0] if leases else None

    async def claim_batch(
        self, worker_id: str, *, lease_for: float | timedelta, limit: int
    ) -> list[Lease]:
        worker = require_id("worker_id", worker_id)
        seconds = require_seconds("lease_for", lease_for)
        count = require_limit(limit, MAX_BATCH)
        now = read_clock(self._clock)
        return await self._claim(worker, now, seconds, count)

    async def heartbeat(self, lease: Lease) -> Lease:
        checked = require_lease(lease)
        require_id("lease.worker_id", checked.worker_id)
        seconds = require_seconds("lease.lease_seconds", checked.lease_seconds)
        if checked.lease_seconds != seconds or type(checked.lease_seconds) is not float:
            # A forged lease (model_copy/model_construct) may carry a timedelta or an
            # int: the backings build the next lease from this one, so hand them seconds.
            checked = checked.model_copy(update={"lease_seconds": seconds})
        now = read_clock(self._clock)
        renewed = await self._heartbeat(checked, now, now + timedelta(seconds=seconds))
        if renewed is None:
            raise self._lost("heartbeat", checked)
        return renewed

    async def ack(self, lease: Lease) -> WorkItem:
        checked = require_lease(lease)
        done = await self._ack(checked, read_clock(self._clock))
        if done is None:
            raise self._lost("ack", checked)
        return done

    async def ack_many(self, leases: Sequence[Lease]) -> list[WorkItem | LeaseLostError]:
        if isinstance(leases, str | bytes) or not isinstance(leases, Sequence):
            raise TypeError(f"leases: must be a sequence of Lease, got {type(leases).__name__}")
        if not 1 <= len(leases) <= MAX_BATCH:
            raise ValueError(
                f"leases: must hold between 1 and {MAX_BATCH} leases, got {len(leases)}"
            )
        seen: dict[tuple[str, str], int] = {}
        for index, lease in enumerate(leases):
            checked = require_lease(lease, f"leases[{index}]")
            key = (checked.item.tenant, checked.item.item_id)
            if key in seen:
                raise ValueError(
                    f"leases[{index}]: item {key[1]!r} of tenant {key[0]!r} is already "
                    f"leases[{seen[key]}] of this batch"
                )
            seen[key] = index
        done = await self._ack_many(list(leases), read_clock(self._clock))
        return [
            self._lost("ack", lease) if answer is None else answer
            for lease, answer in zip(leases, done, strict=True)
        ]

    async def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retryable: bool = True,
        retry_in: float | timedelta | None = None,
    ) -> WorkItem:
        checked = require_lease(lease)
        if not isinstance(error, str):
            raise TypeError(f"error: must be a str, got {type(error).__name__}")
        if not isinstance(retryable, bool):
            raise TypeError(f"retryable: must be a bool, got {type(retryable).__name__}")
        wait = (
            None
            if retry_in is None
            else require_seconds("retry_in", retry_in, allow_zero=True, most=MAX_RETRY_DELAY)
        )
        message = error_text(error)
        now = read_clock(self._clock)
        outcome = self._policy.after_failure(checked.item.attempts, now, retryable=retryable)
        if wait is not None and not outcome.dead:
            outcome = FailOutcome(dead=False, available_at=now + timedelta(seconds=wait))
        failed = await self._fail(checked, now, message, outcome)
        if failed is None:
            raise self._lost("fail", checked)
        if failed.status == ItemStatus.DEAD:
            _log.warning(
                "queue %r: item %r of tenant %r dead-lettered after %d attempt(s)%s: %s",
                self._name,
                failed.item_id,
                failed.tenant,
                failed.attempts,
                "" if retryable else " (not retryable)",
                redact_dsn(message)[:200],
                extra=self._fields(failed, attempts=failed.attempts, retryable=retryable),
            )
        else:
            _log.info(
                "queue %r: item %r of tenant %r failed attempt %d, retried at %s",
                self._name,
                failed.item_id,
                failed.tenant,
                failed.attempts,
                outcome.available_at.isoformat(),
                extra=self._fields(failed, attempts=failed.attempts, retryable=retryable),
            )
        return failed

    async def release(
        self,
        lease: Lease,
        *,
        delay: float | timedelta | None = None,
        count_attempt: bool = False,
    ) -> WorkItem:
        checked = require_lease(lease)
        wait = (
            0.0
            if delay is None
            else require_seconds("delay", delay, allow_zero=True, most=MAX_RETRY_DELAY)
        )
        if not isinstance(count_attempt, bool):
            raise TypeError(f"count_attempt: must be a bool, got {type(count_attempt).__name__}")
        now = read_clock(self._clock)
        released = await self._release(
            checked,
            now,
            available_at=now + timedelta(seconds=wait),
            count_attempt=count_attempt,
        )
        if released is None:
            raise self._lost("release", checked)
        _log.debug(
            "queue %r: item %r of tenant %r released by %r",
            self._name,
            released.item_id,
            released.tenant,
            checked.worker_id,
            extra=self._fields(released, worker_id=checked.worker_id),
        )
        return released

    async def cancel(
        self, tenant: str, item_id: str, *, reason: str | None = None
    ) -> WorkItem | None:
        checked = require_id("item_id", item_id)
        return (await self.cancel_many(tenant, [checked], reason=reason))[0]

    async def cancel_many(
        self, tenant: str, item_ids: Sequence[str], *, reason: str | None = None
    ) -> list[WorkItem | None]:
        owner = require_id("tenant", tenant)
        if isinstance(item_ids, str | bytes) or not isinstance(item_ids, Sequence):
            raise TypeError(f"item_ids: must be a sequence of str, got {type(item_ids).__name__}")
        if not 1 <= len(item_ids) <= MAX_BATCH:
            raise ValueError(
                f"item_ids: must hold between 1 and {MAX_BATCH} ids, got {len(item_ids)}"
            )
        seen: dict[str, int] = {}
        for index, item_id in enumerate(item_ids):
            checked = require_id(f"item_ids[{index}]", item_id)
            first = seen.setdefault(checked, index)
            if first != index:
                raise ValueError(
                    f"item_ids[{index}]: {checked!r} is already item_ids[{first}] of this batch"
                )
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason: must be a str or None, got {type(reason).__name__}")
        message = None if reason is None else error_text(reason)
        now = read_clock(self._clock)
        answers = await self._cancel_many(owner, list(seen), message, now)
        cancelled = [
            item.item_id
            for item in answers
            if item is not None and item.status is ItemStatus.CANCELLED and item.updated_at == now
        ]
        if cancelled:
            _log.info(
                "queue %r: cancelled %d item(s) of tenant %r: %s",
                self._name,
                len(cancelled),
                owner,
                ", ".join(repr(item_id) for item_id in cancelled[:20]),
                extra={
                    "queue": self._name,
                    "tenant": owner,
                    "backing": _observe.backing_of(self),
                    "cancelled": len(cancelled),
                },
            )
        return answers

    async def pause(self) -> None:
        await self._set_paused(True)
        _log.info("queue %r paused", self._name, extra=self._queue_fields())

    async def resume(self) -> None:
        await self._set_paused(False)
        _log.info("queue %r resumed", self._name, extra=self._queue_fields())

    async def paused(self) -> bool:
        return await self._paused()

    async def set_limits(self, limits: QueueLimits | None) -> None:
        """Store the queue's flow control on the server (every process claims under it
        from its next claim); ``None`` removes every limit."""
        if limits is not None and not isinstance(limits, QueueLimits):
            raise TypeError(f"limits: must be a QueueLimits or None, got {type(limits).__name__}")
        chosen = limits or QueueLimits()
        await self._set_limits(chosen)
        _log.info(
            "queue %r: limits set to %s", self._name, chosen.to_json(), extra=self._queue_fields()
        )

    async def limits(self) -> QueueLimits:
        """The flow control stored with the queue (empty when none was set)."""
        return await self._limits()

    async def prune(self) -> int:
        now = read_clock(self._clock)
        cutoffs = self._policy.prune_cutoffs(now)
        if not cutoffs:
            return 0
        pruned = await self._prune(now, cutoffs, PRUNE_BATCH)
        if pruned:
            _log.info(
                "queue %r: pruned %d finished item(s)",
                self._name,
                pruned,
                extra={**self._queue_fields(), "pruned": pruned},
            )
        return pruned

    async def reap(self) -> list[WorkItem]:
        moved = await self._reap(read_clock(self._clock), self._policy.after_lapse())
        for item in moved:
            if item.status == ItemStatus.DEAD:
                _log.warning(
                    "queue %r: item %r of tenant %r dead-lettered: its lease lapsed after "
                    "%d attempt(s)",
                    self._name,
                    item.item_id,
                    item.tenant,
                    item.attempts,
                    extra=self._fields(item, attempts=item.attempts),
                )
            else:
                _log.info(
                    "queue %r: reaped item %r of tenant %r: its lease lapsed, ready again",
                    self._name,
                    item.item_id,
                    item.tenant,
                    extra=self._fields(item, attempts=item.attempts),
                )
        return moved

    async def dead_letters(self, tenant: str, *, limit: int = 100) -> list[WorkItem]:
        return await self._dead_letters(
            require_id("tenant", tenant), require_limit(limit, MAX_BATCH)
        )

    async def requeue(self, item: WorkItem) -> WorkItem:
        if not isinstance(item, WorkItem):
            raise TypeError(f"item: must be a WorkItem, got {type(item).__name__}")
        tenant = require_id("tenant", item.tenant)
        item_id = require_id("item_id", item.item_id)
        back = await self._requeue(tenant, item_id, read_clock(self._clock))
        if not isinstance(back, WorkItem):
            state = "does not exist" if back is None else f"is {back.value}, not dead"
            raise ValueError(
                f"item_id: {item_id!r} of tenant {tenant!r} in queue {self._name!r} {state}; "
                "only a dead item can be requeued"
            )
        _log.info(
            "queue %r: dead item %r of tenant %r requeued",
            self._name,
            back.item_id,
            back.tenant,
            extra=self._fields(back),
        )
        return back

    async def purge_dead(self, tenant: str) -> int:
        checked = require_id("tenant", tenant)
        purged = await self._purge_dead(checked)
        if purged:
            _log.info(
                "queue %r: purged %d dead item(s) of tenant %r",
                self._name,
                purged,
                checked,
                extra={
                    "queue": self._name,
                    "tenant": checked,
                    "backing": _observe.backing_of(self),
                    "purged": purged,
                },
            )
        return purged

    async def get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        return await self._get_item(require_id("tenant", tenant), require_id("item_id", item_id))

    async def stats(self) -> QueueStats:
        return await self._stats()

    async def next_due(self) -> datetime | None:
        return await self._next_due(read_clock(self._clock))

    @asynccontextmanager
    async def watch(self, *, on_cancel: OnCancel | None = None) -> AsyncIterator[WorkWatch]:
        if on_cancel is not None and not callable(on_cancel):
            raise TypeError(f"on_cancel: must be callable, got {type(on_cancel).__name__}")
        async with self._watch(on_cancel) as watch:
            yield CheckedWatch(watch)

    # -- what the log records carry ---------------------------------------

    def _queue_fields(self) -> dict[str, object]:
        return {"queue": self._name, "backing": _observe.backing_of(self)}

    def _fields(self, item: WorkItem, **more: object) -> dict[str, object]:
        """The ``extra`` of a record about ``item``: queue, tenant, item id, backing."""
        return {
            "queue": self._name,
            "tenant": item.tenant,
            "item_id": item.item_id,
            "backing": _observe.backing_of(self),
            **more,
        }

    def _lost(self, operation: str, lease: Lease) -> LeaseLostError:
        """The one ``LeaseLostError`` of a stale lease, logged; the caller raises or reports it."""
        _log.warning(
            "queue %r: %s of item %r of tenant %r by %r refused: the lease (token %d) was lost",
            self._name,
            operation,
            lease.item.item_id,
            lease.item.tenant,
            lease.worker_id,
            lease.token,
            extra=self._fields(
                lease.item, operation=operation, worker_id=lease.worker_id, token=lease.token
            ),
        )
        item = lease.item
        return LeaseLostError(
            f"{operation} of item {item.item_id!r} of tenant {item.tenant!r} in queue "
            f"{self._name!r}: lease token {lease.token} no longer holds it; it lapsed and was "
            "moved on, or was settled already",
            item_id=item.item_id,
        )
