"""``PostgresWorkQueue``: work items in ``adk_work``, the tenant rotation in ``adk_queue_turns``.

It implements the ``_``-methods of :class:`~statepact.queue.BaseWorkQueue`
with the memory reference's semantics, by running the statements of
``_sql/queue/``: a claim, a batch claim and every settle is one statement.
How the claim walks the rotation and why claims never deadlock:
docs/backings.md#the-claim.

This module must never read the server's clock, never decide a retry or the
dead letter (the front passes ``QueuePolicy``'s decision), and never retry
inside a caller's transaction (``bound``).
"""

from __future__ import annotations

import contextlib
import copy
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Self, overload

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session, scoped_session

from statepact._cancel import finish
from statepact.clock import Clock
from statepact.errors import QueueUnavailableError
from statepact.models import (
    ItemStatus,
    Lease,
    WorkItem,
    stored_lease,
)
from statepact.queue import (
    FailOutcome,
    LapseOutcome,
    OnCancel,
    QueueLimits,
    QueuePolicy,
    SleepWatch,
    WorkWatch,
)
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres._client import (
    BoundExecutor,
    EngineExecutor,
    Executor,
)
from statepact.storage.postgres._direct import DirectExecutor, Prepared
from statepact.storage.postgres._enqueue import batch_params, store_many, store_one
from statepact.storage.postgres._flow import claim_limited
from statepact.storage.postgres._listen import ListenWatch, control_channel
from statepact.storage.postgres._queue_reads import PostgresReads
from statepact.storage.postgres._queue_support import (
    Conn,
    Statements,
    item_of,
    item_or_none,
    prune,
)
from statepact.storage.postgres._sql.queue import CoreStatement, QueueStatements
from statepact.storage.postgres._sql.queue import statements as _statements
from statepact.storage.postgres.schema import StateTables, Tables, tables_for
from statepact.storage.postgres.sync import SyncBoundWorkQueue, SyncSession

__all__ = ["PostgresWorkQueue"]

REAP_BATCH = 500


@cache
def _prepared(tables: Tables) -> QueueStatements[Prepared]:
    """``QueueStatements`` compiled once for the driver (``_direct.Prepared``)."""
    return _statements(tables).map(Prepared)


def _channel(tables: Tables, queue: str) -> str:
    """The LISTEN/NOTIFY channel of ``queue`` on ``tables``: short, an identifier, and apart
    for every table naming and queue sharing a database."""
    work = tables.work
    name = f"{work.schema}.{work.name}" if work.schema else work.name
    return f"statepact_work_{zlib.crc32(f'{name}/{queue}'.encode()):08x}"


# Items from which a batch is first sent as ``enqueue_new`` (no ON CONFLICT): the probe of
# the unique index ON CONFLICT makes for every row is a large part of a bulk load's
# statement (docs/benchmarks.md#queue-statement-plans).
# A batch naming a stored item then costs a failed statement, and the server logs it as an
# ERROR (a unique violation): smaller batches, which idempotent re-enqueues and the shared
# single enqueues make, always go as ``enqueue_many``, which fails nothing.
_NEW_FIRST_FROM = 1_000


class PostgresWorkQueue(PostgresReads):
    """The ``WorkQueue`` on PostgreSQL, through SQLAlchemy Core (asyncpg).

    ``PostgresWorkQueue(engine, clock=, settings=, policy=, tables=)`` skips the
    schema check; ``await PostgresWorkQueue.open(engine, ...)`` runs ``verify()``
    first. The queue's name is ``settings.queue_name``. ``bound(session)`` runs
    inside a transaction the caller opened (enqueue beside the state change it
    belongs to). Size the engine's pool to the worker count: a worker holds a
    connection only for the statement, but every in-flight call needs one.
    """

    def __init__(
        self,
        engine: AsyncEngine | AsyncConnection,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        policy: QueuePolicy | None = None,
        tables: StateTables | None = None,
    ) -> None:
        self._settings = settings or PostgresStoreSettings()
        super().__init__(
            clock=clock,
            policy=policy,
            name=self._settings.queue_name,
            max_value_bytes=self._settings.max_value_bytes,
        )
        self._tables = tables_for(tables, self._settings.db_schema)
        #: Whether this queue's last claim found ``QueueLimits`` set (claims then go to
        #: the limited claim first; a hint only, the control row decides).
        self._limited = False
        self._executor: Executor
        # The statements the executor runs: compiled once for the driver on an engine (the
        # DirectExecutor, a fraction of SQLAlchemy's cost per statement), Core expressions on
        # one AsyncConnection and inside a caller's transaction (bound).
        self._sql: Statements
        if isinstance(engine, AsyncEngine):
            self._shares_enqueues = True
            self._sql = _prepared(self._tables)
            self._executor = DirectExecutor(
                engine, policy=self._settings.retry_policy, unavailable=_unavailable, what="queue"
            )
        else:
            self._sql = _statements(self._tables)
            self._executor = EngineExecutor(
                engine, policy=self._settings.retry_policy, unavailable=_unavailable, what="queue"
            )
        # watch() listens on its own connection of the engine (a bound clone keeps it).
        self._listen_on = engine if isinstance(engine, AsyncEngine) else None
        self._channel = _channel(self._tables, self.name)

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine | AsyncConnection,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        policy: QueuePolicy | None = None,
        tables: StateTables | None = None,
    ) -> Self:
        """Run ``verify()`` (schema version, ``statement_timeout``), then build the queue."""
        from statepact.storage.postgres.verify import verify

        settings = settings or PostgresStoreSettings()
        await verify(engine, tables=tables, db_schema=settings.db_schema)
        return cls(engine, clock=clock, settings=settings, policy=policy, tables=tables)

    @overload
    def bound(self, session: AsyncSession | AsyncConnection) -> Self: ...
    @overload
    def bound(self, session: SyncSession) -> SyncBoundWorkQueue: ...
    def bound(
        self, session: AsyncSession | AsyncConnection | SyncSession
    ) -> Self | SyncBoundWorkQueue:
        """This queue, inside the transaction ``session`` already opened; it retries nothing.
        A sync ``Session``, ``Connection`` or ``scoped_session`` gets blocking calls
        (``sync.SyncBoundWorkQueue``)."""
        if isinstance(session, Session | Connection | scoped_session):
            return SyncBoundWorkQueue(self, session)
        clone = copy.copy(self)
        clone._executor = BoundExecutor(session, unavailable=_unavailable, what="queue")
        clone._sql = _statements(self._tables)
        clone._shares_enqueues = False  # each enqueue is a statement of the caller's transaction
        return clone

    @property
    def tables(self) -> Tables:
        return self._tables

    @property
    def settings(self) -> PostgresStoreSettings:
        return self._settings

    @property
    def client(self) -> AsyncEngine | AsyncConnection | AsyncSession:
        """The client the calls go through (observability reads where it points)."""
        return self._executor.target

    def __repr__(self) -> str:
        mode = "bound" if self._executor.bound else "engine"
        return f"PostgresWorkQueue(name={self.name!r}, work={self._tables.work.name!r}, {mode})"

    def _key(self, tenant: str, item_id: str) -> dict[str, Any]:
        return {"p_queue": self.name, "p_tenant": tenant, "p_item_id": item_id}

    @asynccontextmanager
    async def _watch(self, on_cancel: OnCancel | None) -> AsyncIterator[WorkWatch]:
        # A watcher claims and settles in quick succession (a worker's acks follow its
        # claim's answer by a few loop steps): the executor keeps its connections between
        # them for a few idle steps while it watches (DirectExecutor.warm).
        executor = self._executor
        with executor.warm() if isinstance(executor, DirectExecutor) else contextlib.nullcontext():
            if self._listen_on is None:
                yield SleepWatch()
                return
            watch = ListenWatch(self._listen_on, self._channel, on_cancel)
            try:
                if on_cancel is not None:
                    await watch.open()  # cancel notices are heard from the start
                yield watch
            finally:
                await finish(watch.close())

    # -- enqueue and claim ------------------------------------------------

    async def _enqueue(self, item: WorkItem, payload: bytes) -> WorkItem:
        async def work(conn: Conn) -> WorkItem:
            return await store_one(conn, self._sql, self._channel, item, payload)

        return await self._executor.run(work, idempotent=True)

    async def _enqueue_many(self, batch: list[tuple[WorkItem, bytes]]) -> list[WorkItem]:
        params, slots = batch_params(self.name, self._channel, batch)
        # Only on the driver (autocommit), where a failed statement aborts nothing else;
        # never inside a caller's transaction (bound) or on the caller's AsyncConnection.
        new_first = isinstance(self._executor, DirectExecutor) and len(batch) >= _NEW_FIRST_FROM

        async def work(conn: Conn) -> list[WorkItem]:
            return await store_many(
                conn,
                self._sql,
                self._channel,
                batch,
                params=params,
                slots=slots,
                new_first=new_first,
            )

        return await self._executor.run(work, idempotent=True)

    async def _claim(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        expires_at = now + timedelta(seconds=seconds)
        params = {
            "p_queue": self.name,
            "p_now": now,
            "p_worker": worker_id,
            "p_expires_at": expires_at,
        }

        async def work(conn: Conn) -> list[Lease]:
            rows: list[RowMapping] = []
            if self._limited:
                # The last claim found limits: claim under them first, without the plain
                # claims (which yield nothing then) nor the probe (None: limits gone).
                limited = await claim_limited(conn, self._sql, params, now, limit, probe=False)
                if limited is not None:
                    return leases(limited)
                self._limited = False
            if limit > 1:
                batch = {**params, "p_limit": limit}
                rows = list((await conn.execute(self._sql.claim_many, batch)).mappings().all())
            # A short batch (a tenant with less than its share, items other claims hold):
            # claim the rest one by one until the limit or until nothing is due.
            while len(rows) < limit:
                row = (await conn.execute(self._sql.claim, params)).mappings().first()
                if row is None:
                    break
                rows.append(row)
            if not rows:
                # Nothing due, or the queue has limits (the plain claims then yield
                # nothing): only an empty claim pays for asking (docs/backings.md#flow-control).
                limited = await claim_limited(conn, self._sql, params, now, limit)
                self._limited = limited is not None
                rows = rows if limited is None else limited
            return leases(rows)

        def leases(rows: list[RowMapping]) -> list[Lease]:
            return [
                stored_lease(item_of(row), worker_id, row["token"], expires_at, seconds)
                for row in rows
            ]

        return await self._executor.run(work, idempotent=False)

    # -- settle -----------------------------------------------------------

    def _fence(self, lease: Lease) -> dict[str, Any] | None:
        """The parameters of a fenced write, or ``None`` when the lease names another queue."""
        if lease.item.queue != self.name:
            return None
        return {**self._key(lease.item.tenant, lease.item.item_id), "p_token": lease.token}

    async def _settle(
        self, lease: Lease, statement: CoreStatement | Prepared, extra: Mapping[str, Any]
    ) -> RowMapping | None:
        """Run a fenced write; its row, or ``None`` when the lease no longer holds the item."""
        fence = self._fence(lease)
        if fence is None:
            return None
        params = {**fence, **extra}

        async def work(conn: Conn) -> RowMapping | None:
            row: RowMapping | None = (await conn.execute(statement, params)).mappings().first()
            return row

        return await self._executor.run(work, idempotent=False)

    async def _heartbeat(self, lease: Lease, now: datetime, expires_at: datetime) -> Lease | None:
        row = await self._settle(lease, self._sql.heartbeat, {"p_expires_at": expires_at})
        if row is None:
            return None
        return stored_lease(
            item_of(row), lease.worker_id, row["token"], expires_at, lease.lease_seconds
        )

    async def _ack(self, lease: Lease, now: datetime) -> WorkItem | None:
        return item_or_none(await self._settle(lease, self._sql.ack, {"p_now": now}))

    async def _ack_many(self, leases: list[Lease], now: datetime) -> list[WorkItem | None]:
        # A lease of another queue is lost at once; the rest go in one statement.
        mine = [lease for lease in leases if lease.item.queue == self.name]
        acked: dict[tuple[str, str], WorkItem] = {}
        if mine:
            params = {
                "p_queue": self.name,
                "p_now": now,
                "p_tenants": [lease.item.tenant for lease in mine],
                "p_item_ids": [lease.item.item_id for lease in mine],
                "p_tokens": [lease.token for lease in mine],
            }

            async def work(conn: Conn) -> list[RowMapping]:
                return list((await conn.execute(self._sql.ack_many, params)).mappings().all())

            for row in await self._executor.run(work, idempotent=False):
                acked[(row["tenant"], row["item_id"])] = item_of(row)
        return [
            acked.get((lease.item.tenant, lease.item.item_id))
            if lease.item.queue == self.name
            else None
            for lease in leases
        ]

    async def _fail(
        self, lease: Lease, now: datetime, error: str, outcome: FailOutcome
    ) -> WorkItem | None:
        status = ItemStatus.DEAD if outcome.dead else ItemStatus.QUEUED
        extra = {
            "p_status": status.value,
            "p_error": error,
            "p_available_at": outcome.available_at,
            "p_now": now,
            "p_channel": self._channel,
        }
        return item_or_none(await self._settle(lease, self._sql.fail, extra))

    async def _release(
        self, lease: Lease, now: datetime, *, available_at: datetime, count_attempt: bool
    ) -> WorkItem | None:
        extra = {
            "p_now": now,
            "p_available_at": available_at,
            "p_count_attempt": count_attempt,
            "p_channel": self._channel,
        }
        return item_or_none(await self._settle(lease, self._sql.release, extra))

    async def _reap(self, now: datetime, outcome: LapseOutcome) -> list[WorkItem]:
        params = {
            "p_queue": self.name,
            "p_now": now,
            "p_batch": REAP_BATCH,
            "p_dead_at": outcome.dead_at,
            "p_error": outcome.error,
            "p_channel": self._channel,
        }

        async def work(conn: Conn) -> list[RowMapping]:
            rows: list[RowMapping] = []
            while True:
                batch = list((await conn.execute(self._sql.reap, params)).mappings())
                rows.extend(batch)
                if len(batch) < REAP_BATCH:
                    return rows

        rows = await self._executor.run(work, idempotent=False)
        # In the order the leases lapsed, as the memory reference returns them.
        rows.sort(key=lambda row: (row["lapsed_at"], row["lapsed_token"]))
        return [item_of(row) for row in rows]

    # -- inspect and recover ----------------------------------------------

    async def _dead_letters(self, tenant: str, limit: int) -> list[WorkItem]:
        params = {"p_queue": self.name, "p_tenant": tenant, "p_limit": limit}

        async def work(conn: Conn) -> list[WorkItem]:
            result = await conn.execute(self._sql.dead_letters, params)
            return [item_of(row) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True)

    async def _requeue(
        self, tenant: str, item_id: str, now: datetime
    ) -> WorkItem | ItemStatus | None:
        params = {**self._key(tenant, item_id), "p_now": now, "p_channel": self._channel}

        async def work(conn: Conn) -> WorkItem | ItemStatus | None:
            row = (await conn.execute(self._sql.requeue, params)).mappings().first()
            if row is not None:
                return item_of(row)
            found = (await conn.execute(self._sql.get_item, params)).mappings().first()
            return None if found is None else ItemStatus(found["status"])

        return await self._executor.run(work, idempotent=False)

    async def _purge_dead(self, tenant: str) -> int:
        params = {"p_queue": self.name, "p_tenant": tenant}

        async def work(conn: Conn) -> int:
            return int((await conn.execute(self._sql.purge_dead, params)).scalar_one())

        # Not retried once sent: a resend after a lost reply would report only what the
        # first attempt left. Purging again is harmless, so the caller may just call again.
        return await self._executor.run(work, idempotent=False)

    async def _get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        params = self._key(tenant, item_id)

        async def work(conn: Conn) -> WorkItem | None:
            row = (await conn.execute(self._sql.get_item, params)).mappings().first()
            return None if row is None else item_of(row)

        return await self._executor.run(work, idempotent=True)

    # -- cancel, pause, prune ---------------------------------------------

    async def _cancel_many(
        self, tenant: str, item_ids: list[str], reason: str | None, now: datetime
    ) -> list[WorkItem | None]:
        params = {
            "p_queue": self.name,
            "p_tenant": tenant,
            "p_item_ids": item_ids,
            "p_reason": reason,
            "p_now": now,
            "p_ctl_channel": control_channel(self._channel),
        }

        async def work(conn: Conn) -> list[WorkItem | None]:
            found: dict[str, WorkItem] = {}
            for row in (await conn.execute(self._sql.cancel_many, params)).mappings():
                found[row["item_id"]] = item_of(row)
            # An item neither cancelled nor seen finished moved on while the statement
            # waited for it (a settle finished it first): read it as it is now.
            for item_id in item_ids:
                if item_id not in found:
                    key = self._key(tenant, item_id)
                    row = (await conn.execute(self._sql.get_item, key)).mappings().first()
                    if row is not None:
                        found[item_id] = item_of(row)
            return [found.get(item_id) for item_id in item_ids]

        # Not resent: a cancel whose reply was lost answers, when called again, with the
        # items as the first attempt left them (cancelled), which is the same answer.
        return await self._executor.run(work, idempotent=True)

    async def _set_paused(self, paused: bool) -> None:
        params = {"p_queue": self.name, "p_paused": paused, "p_channel": self._channel}

        async def work(conn: Conn) -> None:
            await conn.execute(self._sql.set_paused, params)

        await self._executor.run(work, idempotent=True)

    async def _set_limits(self, limits: QueueLimits) -> None:
        stored = None if limits.empty else limits.to_json()
        params = {"p_queue": self.name, "p_limits": stored, "p_channel": self._channel}

        async def work(conn: Conn) -> None:
            await conn.execute(self._sql.set_limits, params)

        await self._executor.run(work, idempotent=True)

    async def _limits(self) -> QueueLimits:
        async def work(conn: Conn) -> str | None:
            result = await conn.execute(self._sql.limits, {"p_queue": self.name})
            value = result.scalar()
            return None if value is None else str(value)

        return QueueLimits.from_json(await self._executor.run(work, idempotent=True))

    async def _paused(self) -> bool:
        async def work(conn: Conn) -> bool:
            result = await conn.execute(self._sql.paused, {"p_queue": self.name})
            return bool(result.scalar())

        return await self._executor.run(work, idempotent=True)

    async def _prune(
        self, now: datetime, cutoffs: Mapping[ItemStatus, datetime], batch: int
    ) -> int:
        return await prune(
            self._executor,
            self._sql,
            queue=self.name,
            clock=self.clock,
            now=now,
            cutoffs=cutoffs,
            batch=batch,
        )

    async def _next_due(self, now: datetime) -> datetime | None:
        async def work(conn: Conn) -> datetime | None:
            due: datetime | None = (
                await conn.execute(self._sql.next_due, {"p_queue": self.name, "p_now": now})
            ).scalar_one()
            return due

        return await self._executor.run(work, idempotent=True)


def _unavailable(message: str) -> QueueUnavailableError:
    return QueueUnavailableError(message)
