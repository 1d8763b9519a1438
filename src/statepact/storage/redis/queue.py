"""``RedisWorkQueue``: fair, fenced work queues on Redis (standalone or cluster).

It implements the ``_``-methods of :class:`~statepact.queue.BaseWorkQueue`
with the memory reference's semantics: each call is one script of
``lua/queue/``, the whole queue in one slot. Layout, the claim and
replays: docs/backings.md#the-claim-in-one-script.

This module must never format a key (``_keys``), never read a clock, never
decide a retry or the dead letter (the front passes ``QueuePolicy``'s
decision), and never let a redis-py exception out (``_client``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Self

from statepact._cancel import finish
from statepact._codec import decode_json
from statepact._limits import MAX_ERROR_HISTORY, PRUNE_PAUSE
from statepact._retry import new_op_id
from statepact.clock import Clock, from_micros, to_micros
from statepact.errors import QueueUnavailableError
from statepact.models import (
    ItemStatus,
    Lease,
    QueueStats,
    TenantQueueStats,
    WorkItem,
    stored,
    stored_lease,
)
from statepact.queue import (
    FailOutcome,
    LapseOutcome,
    OnCancel,
    QueueLimits,
    QueuePolicy,
    WorkWatch,
    unique_slot,
)
from statepact.settings import RedisStoreSettings
from statepact.storage.redis._client import as_text
from statepact.storage.redis._keys import QueueKeys, ref
from statepact.storage.redis._queue_reads import RedisReads
from statepact.storage.redis._queue_reads import cutoff_args as _cutoff_args
from statepact.storage.redis._queue_watch import ControlListener, RedisWatch
from statepact.storage.redis._scripts import QUEUE_SCRIPTS, ScriptCalls
from statepact.storage.redis.preflight import check

__all__ = ["RedisWorkQueue"]

# Most delayed items promoted, half-claims finished, leases reaped or dead items
# purged by one script call: bounds how long one call can hold the server.
_STEP = 1000

# The item hash's fields a WorkItem is built from (_item): its error history is not one.
_RECORD_FIELDS = (
    "tenant",
    "id",
    "payload",
    "priority",
    "available",
    "attempts",
    "status",
    "error",
    "created",
    "updated",
    "ukey",
    "ufor",
    "timeout",
    "lkey",
    "weight",
)

# The prune lock's lifetime, started again by every batch: a pruner that dies frees
# the queue for another this long after its last batch.
_PRUNE_LOCK_MS = 30_000


def _unavailable(message: str) -> QueueUnavailableError:
    return QueueUnavailableError(message)


class RedisWorkQueue(RedisReads):
    """A work queue in Redis named ``settings.queue_name``; see the module docstring.

    ``redis`` is a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``
    the caller owns. The constructor does not check the server; :meth:`open`
    runs :func:`~statepact.storage.redis.preflight` first.
    """

    _shares_enqueues = True

    def __init__(
        self,
        redis: Any,
        *,
        clock: Clock | None = None,
        settings: RedisStoreSettings | None = None,
        policy: QueuePolicy | None = None,
    ) -> None:
        settings = settings or RedisStoreSettings()
        super().__init__(
            clock=clock,
            policy=policy,
            name=settings.queue_name,
            max_value_bytes=settings.max_value_bytes,
        )
        self._redis = redis
        self._settings = settings
        self._keys = QueueKeys(settings.namespace, settings.queue_name)
        self._fixed = self._keys.fixed()
        self._scripts = ScriptCalls(redis, QUEUE_SCRIPTS, settings.retry_policy, _unavailable)
        self._failover = self._scripts.failover

    @classmethod
    async def open(
        cls,
        redis: Any,
        *,
        clock: Clock | None = None,
        settings: RedisStoreSettings | None = None,
        policy: QueuePolicy | None = None,
    ) -> Self:
        """A queue on ``redis`` after ``preflight`` (durability as ``settings.durable``)."""
        queue = cls(redis, clock=clock, settings=settings, policy=policy)
        await check(redis, durable=queue._settings.durable, failover=queue._failover)
        return queue

    @property
    def settings(self) -> RedisStoreSettings:
        return self._settings

    @property
    def client(self) -> Any:
        """The client the calls go through (observability reads where it points)."""
        return self._redis

    def _sibling(self, name: str) -> RedisWorkQueue:
        """This queue's twin for queue ``name``: same client, namespace, clock, policy."""
        return RedisWorkQueue(
            self._redis,
            clock=self._clock,
            settings=self._settings.model_copy(update={"queue_name": name}),
            policy=self._policy,
        )

    def __repr__(self) -> str:
        return f"RedisWorkQueue(namespace={self._settings.namespace!r}, name={self.name!r})"

    # -- enqueue and claim --------------------------------------------------

    async def _enqueue(self, item: WorkItem, payload: bytes) -> WorkItem:
        assert item.available_at is not None and item.created_at is not None  # set by the front
        reply = await self._run(
            f"enqueue of item {item.item_id!r} (tenant {item.tenant!r})",
            "enqueue",
            item.created_at,
            *_put_args(item, payload),
        )
        # Stored now: stored as sent (the front built the record); else the one already there.
        return item if int(reply[0]) == 1 else self._item(reply[1])

    @asynccontextmanager
    async def _watch(self, on_cancel: OnCancel | None = None) -> AsyncIterator[WorkWatch]:
        watch = RedisWatch(self._redis, self._keys.wake, self._settings.socket_timeout)
        if on_cancel is None:
            yield watch
            return
        listener = ControlListener(
            self._redis, self._keys.control, self._settings.socket_timeout, on_cancel
        )
        await listener.start()
        try:
            yield watch
        finally:
            await finish(listener.stop())

    async def _enqueue_many(self, batch: list[tuple[WorkItem, bytes]]) -> list[WorkItem]:
        args: list[str | int | bytes] = []
        for item, payload in batch:
            args += _put_args(item, payload)
        # The latest clock reading of the batch (concurrent enqueues share one): an item due
        # at its own enqueue is due at it, so it goes to ready, not delayed.
        now = max(item.created_at for item, _ in batch)  # type: ignore[type-var]
        reply = await self._run(f"enqueue of {len(batch)} items", "enqueue_many", now, *args)
        return [
            batch[i // 2][0] if int(reply[i]) == 1 else self._item(reply[i + 1])
            for i in range(0, len(reply), 2)
        ]

    async def _claim(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        op = new_op_id()
        expires_at = now + timedelta(seconds=seconds)
        while True:
            reply = await self._run(
                f"claim by worker {worker_id!r}",
                "claim",
                now,
                to_micros(expires_at),
                limit,
                _STEP,
                op=op,
            )
            # 1: a large batch of delayed items came due and was promoted; claim again.
            if int(reply[0]) == 0:
                break
        return [
            stored_lease(
                self._item(reply[i + 2]), worker_id, int(reply[i + 1]), expires_at, seconds
            )
            for i in range(1, len(reply), 3)
        ]

    # -- settle -------------------------------------------------------------

    async def _heartbeat(self, lease: Lease, now: datetime, expires_at: datetime) -> Lease | None:
        item = lease.item
        if item.queue != self.name:
            return None
        reply = await self._run(
            f"heartbeat of item {item.item_id!r} (tenant {item.tenant!r})",
            "heartbeat",
            now,
            ref(item.tenant, item.item_id),
            lease.token,
            to_micros(expires_at),
            op=new_op_id(),
        )
        if int(reply[0]) == 0:
            return None
        return stored_lease(
            self._item(reply[2]), lease.worker_id, int(reply[1]), expires_at, lease.lease_seconds
        )

    async def _ack(self, lease: Lease, now: datetime) -> WorkItem | None:
        return await self._settle(lease, now, "ack", ItemStatus.DONE)

    async def _ack_many(self, leases: list[Lease], now: datetime) -> list[WorkItem | None]:
        # A lease of another queue is lost at once; the rest go in one script.
        mine = [lease for lease in leases if lease.item.queue == self.name]
        args: list[str | int | bytes] = []
        for lease in mine:
            args += (ref(lease.item.tenant, lease.item.item_id), lease.token)
        reply: list[Any] = []
        if mine:
            reply = await self._run(
                f"ack of {len(mine)} items", "ack_many", now, *args, op=new_op_id()
            )
        answers = iter(range(0, len(reply), 2))
        done: list[WorkItem | None] = []
        for lease in leases:
            if lease.item.queue != self.name:
                done.append(None)
                continue
            at = next(answers)
            done.append(self._item(reply[at + 1]) if int(reply[at]) == 1 else None)
        return done

    async def _fail(
        self, lease: Lease, now: datetime, error: str, outcome: FailOutcome
    ) -> WorkItem | None:
        status = ItemStatus.DEAD if outcome.dead else ItemStatus.QUEUED
        return await self._settle(
            lease, now, "fail", status, available_at=outcome.available_at, error=error
        )

    async def _release(
        self, lease: Lease, now: datetime, *, available_at: datetime, count_attempt: bool
    ) -> WorkItem | None:
        return await self._settle(
            lease,
            now,
            "release",
            ItemStatus.QUEUED,
            available_at=available_at,
            attempts_change=0 if count_attempt else -1,
        )

    async def _settle(
        self,
        lease: Lease,
        now: datetime,
        action: str,
        status: ItemStatus,
        *,
        available_at: datetime | None = None,
        error: str | None = None,
        attempts_change: int = 0,
    ) -> WorkItem | None:
        item = lease.item
        if item.queue != self.name:
            return None
        reply = await self._run(
            f"{action} of item {item.item_id!r} (tenant {item.tenant!r})",
            "settle",
            now,
            ref(item.tenant, item.item_id),
            lease.token,
            status.value,
            "" if available_at is None else to_micros(available_at),
            "0" if error is None else "1",
            error or "",
            attempts_change,
            MAX_ERROR_HISTORY,
            op=new_op_id(),
        )
        if int(reply[0]) == 0:
            return None
        return self._item(reply[1])

    async def _reap(self, now: datetime, outcome: LapseOutcome) -> list[WorkItem]:
        moved: list[WorkItem] = []
        while True:
            reply = await self._run(
                "reap", "reap", now, outcome.dead_at, _STEP, outcome.error, MAX_ERROR_HISTORY
            )
            moved.extend(self._item(fields) for fields in reply[1:])
            if int(reply[0]) == 0:
                return moved

    # -- cancel, pause, prune ------------------------------------------------

    async def _cancel_many(
        self, tenant: str, item_ids: list[str], reason: str | None, now: datetime
    ) -> list[WorkItem | None]:
        reply = await self._run(
            f"cancel of {len(item_ids)} item(s) (tenant {tenant!r})",
            "cancel",
            now,
            "0" if reason is None else "1",
            reason or "",
            MAX_ERROR_HISTORY,
            *(ref(tenant, item_id) for item_id in item_ids),
        )
        return [
            self._item(reply[i + 1]) if int(reply[i]) == 1 else None
            for i in range(0, len(reply), 2)
        ]

    async def _set_paused(self, paused: bool) -> None:
        await self._run("pause" if paused else "resume", "set_paused", None, "1" if paused else "0")

    async def _set_limits(self, limits: QueueLimits) -> None:
        key = self._keys.limits.encode("utf-8")
        text = limits.to_json()
        await self._failover.run(
            f"set_limits (queue {self.name!r})",
            lambda: self._redis.delete(key) if limits.empty else self._redis.set(key, text),
        )

    async def _limits(self) -> QueueLimits:
        key = self._keys.limits.encode("utf-8")
        text = await self._failover.run(
            f"limits (queue {self.name!r})", lambda: self._redis.get(key)
        )
        return QueueLimits.from_json(None if text is None else as_text(text))

    async def _paused(self) -> bool:
        key = self._keys.paused.encode("utf-8")
        found = await self._failover.run(
            f"paused (queue {self.name!r})", lambda: self._redis.exists(key)
        )
        return bool(found)

    async def _prune(
        self, now: datetime, cutoffs: Mapping[ItemStatus, datetime], batch: int
    ) -> int:
        lock = self._keys.prune_lock
        token = new_op_id()
        key = lock.encode("utf-8")

        async def take() -> bool:
            if await self._redis.set(key, token, nx=True, px=_PRUNE_LOCK_MS):
                return True
            # Held: by another pruner, or by this one when the reply of a SET that took
            # it was lost and the failover sent it again.
            return as_text(await self._redis.get(key) or b"") == token

        taken = await self._failover.run(f"prune lock (queue {self.name!r})", take)
        if not taken:
            return 0  # another process prunes this queue now
        limits = _cutoff_args(cutoffs)
        pruned = 0
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                more, deleted = await self._run(
                    "prune", "prune", now, token, _PRUNE_LOCK_MS, batch, *limits, key=lock
                )
                pruned += int(deleted)
                if int(more) != 1:
                    return pruned
                await asyncio.sleep(PRUNE_PAUSE * (loop.time() - started))
        finally:
            await self._run("prune unlock", "prune_unlock", None, token, key=lock)

    # -- inspect and recover ------------------------------------------------

    async def _dead_letters(self, tenant: str, limit: int) -> list[WorkItem]:
        reply = await self._run(
            f"dead_letters of tenant {tenant!r}",
            "dead_letters",
            None,
            tenant,
            limit,
        )
        return [self._item(fields) for fields in reply]

    async def _requeue(
        self, tenant: str, item_id: str, now: datetime
    ) -> WorkItem | ItemStatus | None:
        reply = await self._run(
            f"requeue of item {item_id!r} (tenant {tenant!r})",
            "requeue",
            now,
            ref(tenant, item_id),
            op=new_op_id(),
        )
        if int(reply[0]) == 0:
            return None if len(reply) == 1 else ItemStatus(as_text(reply[1]))
        return self._item(reply[1])

    async def _purge_dead(self, tenant: str) -> int:
        # In batches of _STEP, each its own script call (and replay key): a huge dead
        # letter never holds the server for more than one batch's deletes.
        purged = 0
        while True:
            seen, deleted = await self._run(
                f"purge_dead of tenant {tenant!r}",
                "purge_dead",
                None,
                tenant,
                _STEP,
                op=new_op_id(),
            )
            purged += int(deleted)
            if int(seen) < _STEP:
                return purged

    async def _get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        key = self._keys.item(tenant, item_id).encode("utf-8")
        # The record's fields by name: never the error history beside them (HGETALL would).
        values = await self._failover.run(
            f"get_item of item {item_id!r} (tenant {tenant!r}) (queue {self.name!r})",
            lambda: self._redis.hmget(key, _RECORD_FIELDS),
        )
        if values[0] is None:
            return None
        return self._item(
            {
                name: value
                for name, value in zip(_RECORD_FIELDS, values, strict=True)
                if value is not None
            }
        )

    async def _stats(self) -> QueueStats:
        reply = await self._run("stats", "stats", None)
        queued, leased, dead, cancelled = (_counts(part) for part in reply)
        tenants = sorted(set(queued) | set(leased) | set(dead) | set(cancelled))
        return QueueStats(
            queue=self.name,
            tenants={
                tenant: TenantQueueStats(
                    queued=queued.get(tenant, 0),
                    leased=leased.get(tenant, 0),
                    dead=dead.get(tenant, 0),
                    cancelled=cancelled.get(tenant, 0),
                )
                for tenant in tenants
            },
        )

    async def _next_due(self, now: datetime) -> datetime | None:
        key = self._keys.delayed.encode("utf-8")
        after = f"({to_micros(now)}"
        first = await self._failover.run(
            f"next_due (queue {self.name!r})",
            lambda: self._redis.zrangebyscore(key, after, "+inf", start=0, num=1, withscores=True),
        )
        due = from_micros(int(first[0][1])) if first else None
        wake_key = self._keys.rate_wake.encode("utf-8")
        wake = await self._failover.run(
            f"next_due (queue {self.name!r})", lambda: self._redis.get(wake_key)
        )
        if wake is not None:
            at = from_micros(int(as_text(wake)))
            if at > now and (due is None or at < due):
                return at
        return due

    # -- helpers ------------------------------------------------------------

    def _item(self, fields: Any) -> WorkItem:
        """A ``WorkItem`` from an item hash (a flat HGETALL list or a dict)."""
        record = _as_dict(fields)
        # Read from this queue's own store: every field is decoded to its type here, in
        # the model's order, so the record is built without validating it again.
        return stored(
            WorkItem,
            {
                "tenant": record["tenant"],
                "item_id": record["id"],
                "payload": decode_json(record["payload"]),
                "queue": self.name,
                "priority": int(record["priority"]),
                "available_at": from_micros(int(record["available"])),
                "attempts": int(record["attempts"]),
                "status": ItemStatus(record["status"]),
                "last_error": record.get("error"),
                "created_at": from_micros(int(record["created"])),
                "updated_at": from_micros(int(record["updated"])),
                "unique_key": record.get("ukey"),
                "unique_for": (
                    None if "ufor" not in record else timedelta(microseconds=int(record["ufor"]))
                ),
                "timeout": None if "timeout" not in record else float(record["timeout"]),
                "limit_key": record.get("lkey"),
                "weight": int(record.get("weight", 1)),
            },
        )


def _put_args(item: WorkItem, payload: bytes) -> tuple[str | int | bytes, ...]:
    """An item's ARGV in enqueue.lua's order (enqueue_many.lua's per item)."""
    assert item.available_at is not None and item.created_at is not None  # set by the front
    slot = unique_slot(item, item.created_at)
    return (
        ref(item.tenant, item.item_id),
        item.tenant,
        item.item_id,
        payload,
        item.priority,
        to_micros(item.available_at),
        to_micros(item.created_at),
        item.unique_key or "",
        "" if item.unique_for is None else item.unique_for // timedelta(microseconds=1),
        "" if item.timeout is None else repr(float(item.timeout)),
        slot or "",
        item.limit_key or "",
        item.weight,
    )


def _as_dict(fields: Any) -> dict[str, str]:
    if isinstance(fields, dict):
        return {as_text(key): as_text(value) for key, value in fields.items()}
    # A flat [key, value, ...] list: decoded in one pass (bytes, from a client that does
    # not decode, the usual reply), then paired.
    texts = [value.decode("utf-8") if type(value) is bytes else as_text(value) for value in fields]
    return dict(zip(texts[::2], texts[1::2], strict=True))


def _counts(flat: Sequence[Any]) -> dict[str, int]:
    return {as_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2) if int(flat[i + 1])}
