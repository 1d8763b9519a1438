"""The worker registry: which workers are alive, what they run, when they were last seen.

A worker announces itself with :func:`start_presence` (one call when it starts;
the task it returns beats every third of the time to live and takes the entry
away when cancelled); the dashboard's workers page reads :meth:`WorkerRegistry.live`.
One registry per place a queue lives: a hash on Redis (``WorkerKeys``), the
``statepact_workers`` table on PostgreSQL (revision ``statepact_0010``), a dict in
the process for memory. An entry whose worker stopped beating is gone after its
time to live. See docs/dashboard.md, "Workers".

This module must never import starlette (a worker imports it) and never import
a driver before a registry on its server is asked for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from statepact._cancel import finish
from statepact._codec import require_id
from statepact.clock import Clock, SystemClock
from statepact.models import WorkItem
from statepact.queue import BaseWorkQueue, WorkQueue

__all__ = [
    "DEFAULT_TTL",
    "MAX_LISTED",
    "MemoryWorkerRegistry",
    "PostgresWorkerRegistry",
    "RedisWorkerRegistry",
    "WorkerInfo",
    "WorkerRegistry",
    "registry_for",
    "start_presence",
]

logger = logging.getLogger("statepact.dashboard")

#: Seconds an entry stays listed after its worker's last beat.
DEFAULT_TTL = 30.0
#: The most workers one listing returns (the page and /metrics are bounded by it).
MAX_LISTED = 500


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as its last beat described it."""

    worker_id: str
    host: str
    queues: tuple[str, ...]
    concurrency: int
    in_flight: int
    started_at: datetime
    last_seen: datetime
    ttl_seconds: float = DEFAULT_TTL
    failures: int = 0
    last_error: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "worker_id": self.worker_id,
                "host": self.host,
                "queues": list(self.queues),
                "concurrency": self.concurrency,
                "in_flight": self.in_flight,
                "started_at": self.started_at.isoformat(),
                "last_seen": self.last_seen.isoformat(),
                "ttl_seconds": self.ttl_seconds,
                "failures": self.failures,
                "last_error": self.last_error,
            }
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerInfo:
        data = json.loads(raw)
        return cls(
            worker_id=str(data["worker_id"]),
            host=str(data["host"]),
            queues=tuple(str(q) for q in data["queues"]),
            concurrency=int(data["concurrency"]),
            in_flight=int(data["in_flight"]),
            started_at=datetime.fromisoformat(data["started_at"]),
            last_seen=datetime.fromisoformat(data["last_seen"]),
            ttl_seconds=float(data["ttl_seconds"]),
            failures=int(data["failures"]),
            last_error=data["last_error"],
        )

    def alive_at(self, now: datetime) -> bool:
        return now - self.last_seen <= timedelta(seconds=self.ttl_seconds)


class WorkerRegistry(Protocol):
    """Where workers announce themselves. Times come from the caller's ``WorkerInfo``
    (a beat) and the registry's clock (a listing)."""

    async def beat(self, info: WorkerInfo) -> None:
        """Write (or rewrite) the worker's entry."""
        ...

    async def leave(self, worker_id: str) -> None:
        """Take the worker's entry away (it stopped)."""
        ...

    async def live(self) -> list[WorkerInfo]:
        """The workers seen within their time to live, by id, at most ``MAX_LISTED``."""
        ...


class MemoryWorkerRegistry:
    """The registry of one process (memory queues): a dict."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._entries: dict[str, WorkerInfo] = {}

    async def beat(self, info: WorkerInfo) -> None:
        self._entries[info.worker_id] = info

    async def leave(self, worker_id: str) -> None:
        self._entries.pop(worker_id, None)

    async def live(self) -> list[WorkerInfo]:
        now = self._clock.now()
        for worker_id in [w for w, info in self._entries.items() if not info.alive_at(now)]:
            del self._entries[worker_id]
        return sorted(self._entries.values(), key=lambda info: info.worker_id)[:MAX_LISTED]


class RedisWorkerRegistry:
    """A hash ``<namespace>:workers`` of worker id -> JSON; the key expires with the last
    beat's time to live (fields have no expiry before Redis 7.4, so a listing also drops
    the entries it finds stale)."""

    def __init__(self, client: Any, *, namespace: str, clock: Clock | None = None) -> None:
        from statepact.storage.redis import WorkerKeys

        self._client = client
        self._key = WorkerKeys(namespace).registry
        self._clock = clock or SystemClock()

    async def beat(self, info: WorkerInfo) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(self._key, info.worker_id, info.to_json())
            pipe.expire(self._key, max(1, int(info.ttl_seconds * 2)))
            await pipe.execute()

    async def leave(self, worker_id: str) -> None:
        await self._client.hdel(self._key, worker_id)

    async def live(self) -> list[WorkerInfo]:
        now = self._clock.now()
        # HSCAN in pages keeps one call bounded; a registry holds workers, not items.
        listed: list[WorkerInfo] = []
        stale: list[str] = []
        async for worker_id, raw in self._client.hscan_iter(self._key, count=MAX_LISTED):
            info = WorkerInfo.from_json(raw)
            if info.alive_at(now):
                listed.append(info)
            else:
                stale.append(worker_id)
            if len(listed) + len(stale) >= 4 * MAX_LISTED:
                break
        if stale:
            await self._client.hdel(self._key, *stale)
        return sorted(listed, key=lambda info: info.worker_id)[:MAX_LISTED]


class PostgresWorkerRegistry:
    """The ``statepact_workers`` table (revision ``statepact_0010``), one row per worker."""

    def __init__(
        self, engine: Any, *, db_schema: str | None = None, clock: Clock | None = None
    ) -> None:
        from statepact.storage.postgres.schema import worker_table_for

        self._engine = engine
        self._table = worker_table_for(db_schema)
        self._clock = clock or SystemClock()

    async def beat(self, info: WorkerInfo) -> None:
        from sqlalchemy import delete
        from sqlalchemy.dialects.postgresql import insert

        t = self._table
        values = {
            "worker_id": info.worker_id,
            "host": info.host,
            "queues": list(info.queues),
            "concurrency": info.concurrency,
            "in_flight": info.in_flight,
            "failures": info.failures,
            "last_error": info.last_error,
            "ttl_seconds": info.ttl_seconds,
            "started_at": info.started_at,
            "last_seen": info.last_seen,
        }
        upsert = insert(t).values(values)
        upsert = upsert.on_conflict_do_update(
            index_elements=[t.c.worker_id],
            set_={k: upsert.excluded[k] for k in values if k != "worker_id"},
        )
        # Rows of workers gone for ten times their time to live, a bounded batch per beat.
        gone = info.last_seen - timedelta(seconds=10 * info.ttl_seconds)
        doomed = t.select().with_only_columns(t.c.worker_id).where(t.c.last_seen < gone)
        sweep = delete(t).where(t.c.worker_id.in_(doomed.limit(100).scalar_subquery()))
        async with self._engine.begin() as conn:
            await conn.execute(upsert)
            await conn.execute(sweep)

    async def leave(self, worker_id: str) -> None:
        from sqlalchemy import delete

        async with self._engine.begin() as conn:
            await conn.execute(delete(self._table).where(self._table.c.worker_id == worker_id))

    async def live(self) -> list[WorkerInfo]:
        from sqlalchemy import Interval, cast, func, literal, select

        t = self._table
        now = self._clock.now()
        # Index range on last_seen (the longest time to live bounds it), then each row's own.
        ttl = cast(func.concat(t.c.ttl_seconds, literal(" seconds")), Interval)
        query = (
            select(t)
            .where(t.c.last_seen >= now - timedelta(hours=1))
            .where(t.c.last_seen + ttl >= now)
            .order_by(t.c.worker_id)
            .limit(MAX_LISTED)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            WorkerInfo(
                worker_id=row["worker_id"],
                host=row["host"],
                queues=tuple(row["queues"]),
                concurrency=row["concurrency"],
                in_flight=row["in_flight"],
                started_at=row["started_at"],
                last_seen=row["last_seen"],
                ttl_seconds=row["ttl_seconds"],
                failures=row["failures"],
                last_error=row["last_error"],
            )
            for row in rows
        ]


# Memory queues share one registry per queue object, so a worker and a dashboard in the
# same process see each other.
_MEMORY: weakref.WeakKeyDictionary[Any, MemoryWorkerRegistry] = weakref.WeakKeyDictionary()


def registry_for(queue: WorkQueue, *, client: Any = None) -> WorkerRegistry:
    """The registry beside ``queue``: on its Redis (its namespace), its PostgreSQL (its
    schema), or, for a memory queue, the one of this process. ``client`` is the queue's
    redis-py client or SQLAlchemy engine; when ``None`` it is the one the queue was built
    on (for a PostgreSQL queue bound to a connection or session, that one's engine: a beat
    never joins the caller's transaction)."""
    clock = queue.clock if isinstance(queue, BaseWorkQueue) else None
    from statepact.storage.memory import MemoryWorkQueue

    if isinstance(queue, MemoryWorkQueue):
        registry = _MEMORY.get(queue)
        if registry is None:
            registry = _MEMORY[queue] = MemoryWorkerRegistry(clock=clock)
        return registry
    # A backing's package is loaded only if one of its queues exists (importing it would
    # import its driver): look for the class only where it is loaded already.
    if "statepact.storage.redis" in sys.modules:
        from statepact.storage.redis import RedisWorkQueue

        if isinstance(queue, RedisWorkQueue):
            # The queue's own client: the registry lives on the server that holds the queue.
            redis = client if client is not None else queue.client
            return RedisWorkerRegistry(redis, namespace=queue.settings.namespace, clock=clock)
    if "statepact.storage.postgres" in sys.modules:
        from statepact.storage.postgres import PostgresWorkQueue

        if isinstance(queue, PostgresWorkQueue):
            engine = client if client is not None else _engine_of(queue.client)
            schema = queue.settings.db_schema
            return PostgresWorkerRegistry(engine, db_schema=schema, clock=clock)
    raise TypeError(f"queue: no worker registry for a {type(queue).__name__}")


def _engine_of(target: Any) -> Any:
    """The engine behind a PostgreSQL queue's client (an engine, connection or session)."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    if isinstance(target, AsyncSession):
        target = target.bind
    if isinstance(target, AsyncConnection):
        target = target.engine
    if not isinstance(target, AsyncEngine):
        raise ValueError("queue: no engine behind this PostgresWorkQueue for the registry")
    return target


@dataclass
class _Tally:
    """Failures seen by the worker's hooks (``failed`` and ``lease_lost``)."""

    failures: int = 0
    last_error: str | None = None
    started_at: datetime | None = field(default=None)


def _hooks_counting(tally: _Tally) -> Any:
    from statepact.worker import WorkerHooks

    class _Failures(WorkerHooks):
        def failed(self, job: Any, item: WorkItem, error: str) -> None:
            tally.failures += 1
            tally.last_error = error

        def lease_lost(self, job: Any, reason: str) -> None:
            tally.failures += 1
            tally.last_error = f"lease lost: {reason}"

    return _Failures()


def start_presence(
    queue: WorkQueue,
    worker_id: str,
    *,
    concurrency: int,
    in_flight: Callable[[], int],
    hooks: Any = None,
    queues: Sequence[str] | None = None,
    ttl: float = DEFAULT_TTL,
    registry: WorkerRegistry | None = None,
) -> asyncio.Task[None]:
    """Announce a worker until the returned task is cancelled (then its entry is removed).

    The one call a worker makes when it starts: the task beats every ``ttl / 3``
    seconds with ``in_flight()`` and, when ``hooks`` (the worker's ``HookSet``, or
    anything with ``add(WorkerHooks)``) is given, the failures its handlers
    reported. A beat that fails is logged and retried at the next interval: the
    registry is for operators and must never stop a worker.
    """
    require_id("worker_id", worker_id)
    if not ttl > 0:
        raise ValueError(f"ttl: must be > 0 seconds, got {ttl!r}")
    where = registry or registry_for(queue)
    clock: Clock = queue.clock if isinstance(queue, BaseWorkQueue) else SystemClock()
    tally = _Tally(started_at=clock.now())
    if hooks is not None:
        hooks.add(_hooks_counting(tally))
    base = WorkerInfo(
        worker_id=worker_id,
        host=socket.gethostname(),
        queues=tuple(queues or (queue.name,)),
        concurrency=concurrency,
        in_flight=0,
        started_at=tally.started_at or clock.now(),
        last_seen=clock.now(),
        ttl_seconds=ttl,
    )

    async def run() -> None:
        failing = False  # warn once per outage (a registry never migrated fails every beat)
        try:
            while True:
                try:
                    info = replace(
                        base,
                        in_flight=in_flight(),
                        last_seen=clock.now(),
                        failures=tally.failures,
                        last_error=tally.last_error,
                    )
                    await where.beat(info)
                    failing = False
                except Exception as exc:
                    level = logging.DEBUG if failing else logging.WARNING
                    logger.log(level, "worker %s: registry beat failed: %s", worker_id, exc)
                    failing = True
                await asyncio.sleep(ttl / 3)
        finally:
            try:
                await finish(where.leave(worker_id))
            except Exception as exc:
                logger.warning("worker %s: leaving the registry failed: %s", worker_id, exc)

    return asyncio.create_task(run(), name="statepact-presence")
