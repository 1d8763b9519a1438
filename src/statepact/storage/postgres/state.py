"""``PostgresStateStore``: runs and sessions in ``adk_runs`` / ``adk_sessions``.

It implements the ``_``-methods of :class:`~statepact.state.BaseStateStore`
(the front has validated, encoded and size-checked everything and read the
clock) by running the statements of ``_sql/state.py``, one per call; a run
write carries a call id so the failover may send it again. On an engine,
concurrent ``patch_run`` calls, and concurrent ``put_run`` calls of existing
runs, share round trips (``statepact._shared``): while one is on its way, the
next ones go together in one statement. Round trips and resends:
docs/backings.md#run-writes-sent-again.

This module must never create or alter a table, never read the server's clock,
and never retry inside a caller's transaction (``bound``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, Self, overload

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session, scoped_session

from statepact._codec import decimal_to_nanos, decode_json, nanos_to_decimal
from statepact._limits import MAX_BATCH_BYTES, MAX_COUNTER, MAX_SHARED_WRITES
from statepact._retry import new_op_id
from statepact._shared import SharedRoundTrips
from statepact.clock import Clock
from statepact.errors import RunNotFoundError, StateConflictError, StatePersistenceError
from statepact.models import RunRecord, RunStatus, RunTotals, SessionRecord, stored
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
from statepact.storage.postgres._client import (
    BoundExecutor,
    EngineExecutor,
    Executor,
    FirstAttemptCommitted,
    Runner,
    constraint_of,
    sqlstate_of,
)
from statepact.storage.postgres._direct import DirectExecutor, Prepared
from statepact.storage.postgres._sql import LOCK_NOT_AVAILABLE
from statepact.storage.postgres._sql.state import COUNTERS, CoreStatement, StateStatements
from statepact.storage.postgres._sql.state import statements as _statements
from statepact.storage.postgres.schema import WRITE_RETENTION, StateTables, Tables, tables_for
from statepact.storage.postgres.sync import SyncBoundStateStore, SyncSession

__all__ = ["PostgresStateStore"]

# A batch's arrays (``p_each_<name>``), each from the same parameter of every call.
_EACH = {
    "tenant": "p_tenant",
    "run_id": "p_record_id",
    "op_id": "p_op_id",
    "at": "p_now",
    "cutoff": "p_cutoff",
}
_EACH_PATCH = {
    **_EACH,
    **{name: f"p_{name}" for name in COUNTERS},
    **{f"max_{name}": f"p_max_{name}" for name in COUNTERS},
}
_EACH_UPDATE = {
    **_EACH,
    "session_id": "p_session_id",
    "status": "p_status",
    "data": "p_data",
    "expected": "p_expected",
}


@dataclass(frozen=True, slots=True)
class _Patch:
    """One ``patch_run`` call: its statement's parameters and the deltas it adds."""

    params: dict[str, Any]
    deltas: dict[str, int]


@dataclass(frozen=True, slots=True)
class _Put:
    """One ``put_run`` call: the front's write and its statement's parameters."""

    write: RunWrite
    params: dict[str, Any]


def _each(calls: list[dict[str, Any]], names: Mapping[str, str]) -> dict[str, list[Any]]:
    """The parameters of a batch statement: one array per name, a call's value each."""
    return {f"p_each_{name}": [call[key] for call in calls] for name, key in names.items()}


def _run_record(row: RowMapping, data: Any) -> RunRecord:
    # Read from this store's own table: every field is of its type already, no validation.
    return stored(
        RunRecord,
        {
            "tenant": row["tenant"],
            "run_id": row["run_id"],
            "session_id": row["session_id"],
            "status": RunStatus(row["status"]),
            "data": data,
            "version": row["version"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "cost": _cost(row["cost"]),
            "iterations": row["iterations"],
            "cursor": row["cursor"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "seq": row["seq"],
        },
    )


def _session_record(row: RowMapping, data: Any) -> SessionRecord:
    return SessionRecord.model_construct(
        tenant=row["tenant"],
        session_id=row["session_id"],
        data=data,
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        seq=row["seq"],
    )


def _cost(value: Decimal) -> Decimal:
    # NUMERIC(38,9) already has nine places; normalise the exponent like memory does.
    return nanos_to_decimal(decimal_to_nanos(value))


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


#: The store's statements: compiled for the driver on an engine, Core otherwise.
_Sql = StateStatements[Prepared] | StateStatements[CoreStatement]


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
        self._sql: _Sql
        self._executor: Executor
        # Concurrent run writes sharing round trips: on an engine only (see the module).
        self._patches: SharedRoundTrips[_Patch, RunRecord | CounterOverflow | None] | None = None
        self._puts: SharedRoundTrips[_Put, RunRecord | None] | None = None
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

    @staticmethod
    def _call_params(now: datetime) -> dict[str, Any]:
        """A run write's call id (the same in every resend) and its sweep cutoff."""
        return {"p_op_id": new_op_id(), "p_cutoff": now - WRITE_RETENTION}

    async def _written(self, conn: Runner, statement: Any, params: Mapping[str, Any]) -> Any:
        """Run one write statement; its result."""
        try:
            return await conn.execute(statement, params)
        except Exception as exc:
            if sqlstate_of(exc) == "23505" and constraint_of(exc) == self._writes_key:
                raise FirstAttemptCommitted(
                    "a call's first attempt committed while its resend waited"
                ) from exc
            raise

    async def _write(self, conn: Runner, statement: Any, params: Mapping[str, Any]) -> Any:
        """Run one write statement; its row, or None when it applied nothing."""
        return (await self._written(conn, statement, params)).mappings().first()

    async def _many(
        self, statement: Any, params: dict[str, list[Any]], count: int
    ) -> list[RowMapping | None]:
        """Run one batch statement of ``count`` calls' writes (``patch_runs``,
        ``update_runs``); each call's row, or None where its write applied nothing.

        Each write carries its call id and the statement skips those already applied,
        so the failover may send the batch again, as it does one write. A run row another
        session holds fails the statement at once (``shared_lock_timeout``): then no
        write applied, and each is sent again alone, where it may wait for its row.
        """

        async def work(conn: Runner) -> list[RowMapping | None]:
            rows: list[RowMapping | None] = [None] * count
            try:
                result = await self._written(conn, statement, params)
            except Exception as exc:
                if sqlstate_of(exc) == LOCK_NOT_AVAILABLE:
                    return rows  # a run another session holds: each write alone, to wait
                raise
            for row in result.mappings().all():
                rows[row["ord"] - 1] = row
            return rows

        return await self._executor.run(work, idempotent=False, resend_safe=True)

    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        async def work(conn: Runner) -> RunRecord | None:
            result = await conn.execute(
                self._sql.get_run, {"p_tenant": tenant, "p_record_id": run_id}
            )
            row = result.mappings().first()
            return None if row is None else _run_record(row, decode_json(row["data"]))

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _put_run(self, write: RunWrite) -> RunRecord:
        params = {
            "p_tenant": write.tenant,
            "p_record_id": write.run_id,
            "p_session_id": write.session_id,
            "p_status": write.status.value,
            "p_data": write.data.decode("utf-8"),
            "p_now": write.now,
            "p_expected": write.expected_version,
            **self._call_params(write.now),
        }
        call = _Put(write, params)
        if write.expected_version == 0 or self._puts is None:
            return await self._put_alone(call, resent=False)
        answer = await self._puts.send(call)
        # Not applied with the others (a version conflict, the run gone): on its own,
        # as a resend, since an earlier attempt of the batch may have applied it.
        return answer if answer is not None else await self._put_alone(call, resent=True)

    async def _put_many(self, calls: list[_Put]) -> list[RunRecord | None]:
        params = _each([call.params for call in calls], _EACH_UPDATE)
        rows = await self._many(self._sql.update_runs, params, len(calls))
        # A write's row leaves the blob out: it is the one the call sent.
        return [
            None if row is None else _run_record(row, call.write.value)
            for call, row in zip(calls, rows, strict=True)
        ]

    async def _put_alone(self, call: _Put, *, resent: bool) -> RunRecord:
        write, params = call.write, call.params
        creating = write.expected_version == 0
        attempt_of = self._sql.create_run if creating else self._sql.update_run
        first, again = attempt_of.first, attempt_of.again
        attempts = 1 if resent else 0

        async def work(conn: Runner) -> RunRecord:
            nonlocal attempts
            attempts += 1
            # Only an attempt after the first can meet an earlier one applied.
            statement = first if attempts == 1 else again
            # A create can find the run there, then gone before the follow-up
            # read: try again rather than report "expected 0, found 0".
            for _ in range(3):
                row = await self._write(conn, statement, params)
                if row is not None:
                    # A write's row leaves the blob out: it is the one this call sent.
                    data = write.value if row["data"] is None else decode_json(row["data"])
                    return _run_record(row, data)
                found = (await conn.execute(self._sql.run_after_write, params)).mappings().first()
                if found is not None and found["replayed"]:
                    # The first attempt applied, then the resend lost a race to it.
                    return _run_record(found, decode_json(found["data"]))
                version = None if found is None else found["version"]
                if version is not None or not creating:
                    break
            raise StateConflictError(
                tenant=write.tenant,
                record_id=write.run_id,
                expected=write.expected_version,
                actual=0 if version is None else int(version),
                kind="run",
            )

        return await self._executor.run(work, idempotent=False, resend_safe=True)

    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord | CounterOverflow:
        deltas = {
            "input_tokens": delta.input_tokens,
            "output_tokens": delta.output_tokens,
            "cost": delta.cost_nanos,
            "iterations": delta.iterations,
            "cursor": delta.cursor,
        }
        params: dict[str, Any] = {
            "p_tenant": tenant,
            "p_record_id": run_id,
            "p_now": now,
            **self._call_params(now),
        }
        for name, amount in deltas.items():
            room = MAX_COUNTER - amount
            if name == "cost":
                params["p_cost"] = nanos_to_decimal(amount)
                params["p_max_cost"] = nanos_to_decimal(room)
            else:
                params[f"p_{name}"] = amount
                params[f"p_max_{name}"] = room

        call = _Patch(params, deltas)
        if self._patches is None:
            return await self._patch_alone(call, resent=False)
        answer = await self._patches.send(call)
        # Not applied with the others (the run gone, a counter at its limit): on its own,
        # as a resend, since an earlier attempt of the batch may have applied it.
        return answer if answer is not None else await self._patch_alone(call, resent=True)

    async def _patch_many(self, calls: list[_Patch]) -> list[RunRecord | CounterOverflow | None]:
        params = _each([call.params for call in calls], _EACH_PATCH)
        rows = await self._many(self._sql.patch_runs, params, len(calls))
        return [None if row is None else _run_record(row, decode_json(row["data"])) for row in rows]

    async def _patch_alone(self, call: _Patch, *, resent: bool) -> RunRecord | CounterOverflow:
        params, deltas = call.params, call.deltas
        tenant, run_id = params["p_tenant"], params["p_record_id"]
        attempts = 1 if resent else 0

        async def work(conn: Runner) -> RunRecord | CounterOverflow:
            nonlocal attempts
            attempts += 1
            # Only an attempt after the first can meet an earlier one applied.
            statement = self._sql.patch_run.first if attempts == 1 else self._sql.patch_run.again
            while True:
                row = await self._write(conn, statement, params)
                if row is not None:
                    return _run_record(row, decode_json(row["data"]))
                # No row: the run is missing, or a counter would pass its limit,
                # or this call's first attempt applied while the resend waited.
                found = (await conn.execute(self._sql.run_after_write, params)).mappings().first()
                if found is None:
                    raise RunNotFoundError(tenant=tenant, run_id=run_id)
                if found["replayed"]:
                    return _run_record(found, decode_json(found["data"]))
                for name in COUNTERS:
                    count = found[name]
                    stored_units = decimal_to_nanos(count) if name == "cost" else count
                    if stored_units + deltas[name] > MAX_COUNTER:
                        return CounterOverflow(name)
                # Neither: the run changed between the two statements; apply again.

        return await self._executor.run(work, idempotent=False, resend_safe=True)

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
            return [_run_record(row, decode_json(row["data"])) for row in result.mappings()]

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
            for _ in range(3):
                row = (await conn.execute(statement, params)).mappings().first()
                if row is not None:
                    return _session_record(row, decode_json(write.data))
                stored = (await conn.execute(self._sql.session_version, params)).scalar()
                if stored is not None or not creating:
                    break
            raise StateConflictError(
                tenant=write.tenant,
                record_id=write.session_id,
                expected=write.expected_version,
                actual=0 if stored is None else int(stored),
                kind="session",
            )

        return await self._executor.run(work, idempotent=False)

    async def _get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        async def work(conn: Runner) -> SessionRecord | None:
            result = await conn.execute(
                self._sql.get_session, {"p_tenant": tenant, "p_record_id": session_id}
            )
            row = result.mappings().first()
            return None if row is None else _session_record(row, decode_json(row["data"]))

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        params = {"p_tenant": tenant, "p_after": after_seq, "p_limit": limit + 1}

        async def work(conn: Runner) -> list[SessionRecord]:
            result = await conn.execute(self._sql.list_sessions, params)
            return [_session_record(row, decode_json(row["data"])) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _delete_session(self, tenant: str, session_id: str) -> bool:
        async def work(conn: Runner) -> bool:
            result = await conn.execute(
                self._sql.delete_session, {"p_tenant": tenant, "p_record_id": session_id}
            )
            return result.first() is not None

        return await self._executor.run(work, idempotent=False)
