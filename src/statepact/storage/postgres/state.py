"""``PostgresStateStore``: runs and sessions in ``adk_runs`` / ``adk_sessions``.

It implements the ``_``-methods of :class:`~statepact.state.BaseStateStore`
(the front has validated, encoded and size-checked everything and read the
clock) by running the statements of ``_sql/state/``, one per call; a run
write carries a call id so the failover may send it again (its parts in
``_run_writes.py``, what its methods share in ``_state_support.py``). On an engine,
concurrent ``patch_run`` calls, and concurrent ``put_run`` calls of existing
runs, share round trips (``statepact._shared``): while one is on its way, the
next ones go together in one statement. Round trips and resends:
docs/backings.md#run-writes-sent-again.

This module must never create or alter a table, never read the server's clock,
and never retry inside a caller's transaction (``bound``).
"""

from __future__ import annotations

import copy
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, Self, overload

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session, scoped_session

from statepact._codec import decode_json
from statepact._limits import MAX_BATCH_BYTES, MAX_SHARED_WRITES
from statepact._shared import SharedRoundTrips
from statepact.clock import Clock
from statepact.errors import StatePersistenceError
from statepact.models import RunRecord, RunTotals, SessionRecord
from statepact.settings import PostgresStoreSettings
from statepact.state import (
    BaseStateStore,
    CounterDelta,
    CounterOverflow,
    ListQuery,
    RunPrune,
    RunWrite,
    SessionWrite,
)
from statepact.storage.postgres._client import BoundExecutor, EngineExecutor, Executor, Runner
from statepact.storage.postgres._direct import DirectExecutor, Prepared
from statepact.storage.postgres._run_writes import (
    EACH_PATCH,
    EACH_UPDATE,
    Patch,
    Put,
    Sql,
    batch_rows,
    each,
    patch_answers,
    patch_call,
    patch_once,
    put_answers,
    put_call,
    put_once,
    send_write,
)
from statepact.storage.postgres._sql.state import StateStatements
from statepact.storage.postgres._sql.state import statements as _statements
from statepact.storage.postgres._state_support import (
    run_record,
    session_record,
    written_or_refused,
)
from statepact.storage.postgres.schema import StateTables, Tables, tables_for
from statepact.storage.postgres.sync import SyncBoundStateStore, SyncSession

__all__ = ["PostgresStateStore"]


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


@cache
def _prepared(tables: Tables) -> StateStatements[Prepared]:
    """``StateStatements`` compiled once for the driver (``_direct.Prepared``)."""
    return _statements(tables).map(Prepared)


class PostgresStateStore(BaseStateStore):
    """The ``StateStore`` on PostgreSQL, through SQLAlchemy Core (asyncpg).

    ``PostgresStateStore(engine, clock=, settings=, tables=)`` skips the schema
    check; ``await PostgresStateStore.open(engine, ...)`` runs ``verify()``
    first. ``engine`` is an ``AsyncEngine`` (each call runs on the asyncpg
    connection of a pooled connection, outside any transaction: the
    ``DirectExecutor``) or an ``AsyncConnection`` (calls take turns on it, each
    in its own transaction). ``bound(session)`` runs inside a transaction
    the caller opened. Failover retries come from ``settings``
    (``failover_*``); ``max_value_bytes`` and ``db_schema`` too.
    """

    def __init__(
        self,
        engine: AsyncEngine | AsyncConnection,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        tables: StateTables | None = None,
    ) -> None:
        self._settings = settings or PostgresStoreSettings()
        super().__init__(clock=clock, max_value_bytes=self._settings.max_value_bytes)
        self._tables = tables_for(tables, self._settings.db_schema)
        self._writes_key = str(self._tables.run_writes.primary_key.name)
        # On an engine, the statements compiled once and run on the driver (a fraction of
        # SQLAlchemy's cost per statement); Core on one AsyncConnection and when bound.
        self._sql: Sql
        self._executor: Executor
        # Concurrent run writes sharing round trips: on an engine only (see the module).
        self._patches: SharedRoundTrips[Patch, RunRecord | CounterOverflow | None] | None = None
        self._puts: SharedRoundTrips[Put, RunRecord | None] | None = None
        if isinstance(engine, AsyncEngine):
            self._sql = _prepared(self._tables)
            self._executor = DirectExecutor(
                engine,
                policy=self._settings.retry_policy,
                unavailable=_unavailable,
                what="state store",
            )
            self._patches = SharedRoundTrips(
                lambda call: self._patch_alone(call, resent=False),
                self._patch_many,
                keys=lambda call: ((call.params["p_tenant"], call.params["p_record_id"]),),
                size=lambda _call: 0,  # a handful of numbers: MAX_SHARED_WRITES bounds it
                max_items=MAX_SHARED_WRITES,
                max_bytes=MAX_BATCH_BYTES,
                name="statepact-run-patches",
            )
            self._puts = SharedRoundTrips(
                lambda call: self._put_alone(call, resent=False),
                self._put_many,
                keys=lambda call: ((call.write.tenant, call.write.run_id),),
                size=lambda call: len(call.write.data),
                max_items=MAX_SHARED_WRITES,
                max_bytes=MAX_BATCH_BYTES,
                name="statepact-run-puts",
            )
        else:
            self._sql = _statements(self._tables)
            self._executor = EngineExecutor(
                engine,
                policy=self._settings.retry_policy,
                unavailable=_unavailable,
                what="state store",
            )

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine | AsyncConnection,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        tables: StateTables | None = None,
    ) -> Self:
        """Run ``verify()`` (schema version, ``statement_timeout``), then build the store."""
        from statepact.storage.postgres.verify import verify

        settings = settings or PostgresStoreSettings()
        await verify(engine, tables=tables, db_schema=settings.db_schema)
        return cls(engine, clock=clock, settings=settings, tables=tables)

    @overload
    def bound(self, session: AsyncSession | AsyncConnection) -> Self: ...
    @overload
    def bound(self, session: SyncSession) -> SyncBoundStateStore: ...
    def bound(
        self, session: AsyncSession | AsyncConnection | SyncSession
    ) -> Self | SyncBoundStateStore:
        """This store, running inside the transaction ``session`` already opened.

        Nothing is committed, rolled back or retried: the caller's transaction
        decides whether the writes (and the work queued beside them) land. A sync
        ``Session``, ``Connection`` or ``scoped_session`` gets blocking calls
        (``sync.SyncBoundStateStore``).
        """
        if isinstance(session, Session | Connection | scoped_session):
            return SyncBoundStateStore(self, session)
        clone = copy.copy(self)
        clone._executor = BoundExecutor(session, unavailable=_unavailable, what="state store")
        clone._sql = _statements(self._tables)
        clone._patches = clone._puts = None  # each write a statement of the caller's transaction
        return clone

    @property
    def tables(self) -> Tables:
        return self._tables

    @property
    def client(self) -> AsyncEngine | AsyncConnection | AsyncSession:
        """The client the calls go through (observability reads where it points)."""
        return self._executor.target

    def __repr__(self) -> str:
        mode = "bound" if self._executor.bound else "engine"
        return f"PostgresStateStore(runs={self._tables.runs.name!r}, {mode})"

    # -- runs -------------------------------------------------------------

    async def _many(
        self, statement: Any, params: dict[str, list[Any]], count: int
    ) -> list[RowMapping | None]:
        """Run one batch statement of ``count`` calls' writes (``_run_writes.batch_rows``)."""
        return await self._executor.run(
            lambda conn: batch_rows(conn, statement, params, count, self._writes_key),
            idempotent=False,
            resend_safe=True,
        )

    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        async def work(conn: Runner) -> RunRecord | None:
            result = await conn.execute(
                self._sql.get_run, {"p_tenant": tenant, "p_record_id": run_id}
            )
            row = result.mappings().first()
            return None if row is None else run_record(row, decode_json(row["data"]))

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _put_run(self, write: RunWrite) -> RunRecord:
        call = put_call(write)
        if write.expected_version == 0 or self._puts is None:
            return await self._put_alone(call, resent=False)
        answer = await self._puts.send(call)
        # Not applied with the others (a version conflict, the run gone): on its own,
        # as a resend, since an earlier attempt of the batch may have applied it.
        return answer if answer is not None else await self._put_alone(call, resent=True)

    async def _put_many(self, calls: list[Put]) -> list[RunRecord | None]:
        params = each([call.params for call in calls], EACH_UPDATE)
        return put_answers(calls, await self._many(self._sql.update_runs, params, len(calls)))

    async def _put_alone(self, call: Put, *, resent: bool) -> RunRecord:
        creating = call.write.expected_version == 0
        sql = self._sql
        return await send_write(
            self._executor,
            sql.create_run if creating else sql.update_run,
            resent=resent,
            once=lambda conn, statement: put_once(conn, sql, call, statement, self._writes_key),
        )

    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord | CounterOverflow:
        call = patch_call(tenant, run_id, delta, now)
        if self._patches is None:
            return await self._patch_alone(call, resent=False)
        answer = await self._patches.send(call)
        # Not applied with the others (the run gone, a counter at its limit): on its own,
        # as a resend, since an earlier attempt of the batch may have applied it.
        return answer if answer is not None else await self._patch_alone(call, resent=True)

    async def _patch_many(self, calls: list[Patch]) -> list[RunRecord | CounterOverflow | None]:
        params = each([call.params for call in calls], EACH_PATCH)
        return patch_answers(await self._many(self._sql.patch_runs, params, len(calls)))

    async def _patch_alone(self, call: Patch, *, resent: bool) -> RunRecord | CounterOverflow:
        sql = self._sql
        return await send_write(
            self._executor,
            sql.patch_run,
            resent=resent,
            once=lambda conn, statement: patch_once(conn, sql, call, statement, self._writes_key),
        )

    async def _list_runs(self, query: ListQuery) -> list[RunRecord]:
        statement = self._sql.list_runs[(query.session_id is not None, query.status is not None)]
        params = {
            "p_tenant": query.tenant,
            "p_after": query.after_seq,
            "p_session_id": query.session_id,
            "p_status": None if query.status is None else query.status.value,
            "p_limit": query.limit + 1,
        }

        async def work(conn: Runner) -> list[RunRecord]:
            result = await conn.execute(statement, params)
            return [run_record(row, decode_json(row["data"])) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _run_totals(self, query: ListQuery, since: datetime) -> RunTotals:
        statement = self._sql.run_totals[(query.session_id is not None, query.status is not None)]
        params = {
            "p_tenant": query.tenant,
            "p_since": since,
            "p_session_id": query.session_id,
            "p_status": None if query.status is None else query.status.value,
        }

        async def work(conn: Runner) -> list[Any]:
            return list(await conn.execute(statement, params))

        rows = await self._executor.run(work, idempotent=True, abandonable=True)
        by_status = {status: int(count) for status, count, *_ in rows}
        return RunTotals(
            tenant=query.tenant,
            since=since,
            runs=sum(by_status.values()),
            input_tokens=sum(int(row[2]) for row in rows),
            output_tokens=sum(int(row[3]) for row in rows),
            cost=sum((Decimal(row[4]) for row in rows), Decimal(0)),
            iterations=sum(int(row[5]) for row in rows),
            by_status=dict(sorted(by_status.items())),
        )

    async def _delete_run(self, tenant: str, run_id: str) -> bool:
        async def work(conn: Runner) -> bool:
            result = await conn.execute(
                self._sql.delete_run, {"p_tenant": tenant, "p_record_id": run_id}
            )
            return result.first() is not None

        return await self._executor.run(work, idempotent=False)

    async def _prune_runs(self, prune: RunPrune) -> int:
        one_tenant = prune.tenant is not None
        statement = self._sql.prune_runs[one_tenant]
        params: dict[str, Any] = {
            "p_tenant": prune.tenant,
            "p_after_tenant": "",
            "p_after": 0,
            "p_limit": prune.batch,
            "p_statuses": sorted(status.value for status in prune.statuses),
            "p_cutoff": prune.cutoff,
        }
        deleted = 0
        while True:
            row = await self._prune_step(statement, dict(params))
            if row is None:
                return deleted
            deleted += int(row["deleted"])
            if int(row["looked"]) < prune.batch:
                return deleted
            params["p_after_tenant"], params["p_after"] = row["tenant"], row["seq"]

    async def _prune_step(self, statement: Any, params: dict[str, Any]) -> RowMapping | None:
        """One step of a prune: its own transaction on an engine, so no lock is held
        between steps, and one sent again deletes nothing twice."""

        async def work(conn: Runner) -> RowMapping | None:
            row: RowMapping | None = (await conn.execute(statement, params)).mappings().first()
            return row

        return await self._executor.run(work, idempotent=True)

    # -- sessions ---------------------------------------------------------

    async def _put_session(self, write: SessionWrite) -> SessionRecord:
        params = {
            "p_tenant": write.tenant,
            "p_record_id": write.session_id,
            "p_data": write.data.decode("utf-8"),
            "p_now": write.now,
            "p_expected": write.expected_version,
        }
        creating = write.expected_version == 0
        statement = self._sql.create_session if creating else self._sql.update_session

        async def work(conn: Runner) -> SessionRecord:
            async def written() -> SessionRecord | None:
                row = (await conn.execute(statement, params)).mappings().first()
                return None if row is None else session_record(row, decode_json(write.data))

            async def found() -> int | None:
                stored = (await conn.execute(self._sql.session_version, params)).scalar()
                return None if stored is None else int(stored)

            return await written_or_refused(
                written,
                found,
                kind="session",
                tenant=write.tenant,
                record_id=write.session_id,
                expected=write.expected_version,
            )

        return await self._executor.run(work, idempotent=False)

    async def _get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        async def work(conn: Runner) -> SessionRecord | None:
            result = await conn.execute(
                self._sql.get_session, {"p_tenant": tenant, "p_record_id": session_id}
            )
            row = result.mappings().first()
            return None if row is None else session_record(row, decode_json(row["data"]))

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        params = {"p_tenant": tenant, "p_after": after_seq, "p_limit": limit + 1}

        async def work(conn: Runner) -> list[SessionRecord]:
            result = await conn.execute(self._sql.list_sessions, params)
            return [session_record(row, decode_json(row["data"])) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _delete_session(self, tenant: str, session_id: str) -> bool:
        async def work(conn: Runner) -> bool:
            result = await conn.execute(
                self._sql.delete_session, {"p_tenant": tenant, "p_record_id": session_id}
            )
            return result.first() is not None

        return await self._executor.run(work, idempotent=False)
