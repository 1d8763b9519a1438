"""``PostgresStateStore``: runs and sessions in ``adk_runs`` / ``adk_sessions``.

It implements only the ``_``-methods of :class:`~statepact.state.BaseStateStore`;
the front has validated, encoded and size-checked everything and read the
injected clock (every timestamp is a bound parameter, never the server's
``now()``). Statements are built once per table naming, as small functions of
Core expressions, and executed with bound parameters.

Round trips per call on an engine (AUTOCOMMIT, prepared statements cached):
``get_run``, ``put_run``, ``patch_run``, ``list_runs``, ``delete_run``, the
session calls: one statement each. Only a refused write takes a second: a
put that conflicts reads the stored version to report ``actual``, a patch that
matched no row reads whether the run exists and which counter would overflow.

Run writes sent again (``put_run``, ``patch_run``): each call draws a call id
(``new_op_id``), the same across the failover's resends. Its one statement,
in CTEs: the write, guarded by "this call's row in ``adk_run_writes`` is not
there"; the insert of that row from the rows the write produced (a refused
write leaves none); the sweep of the run's rows older than
``WRITE_RETENTION``; then the written run, or, when the row was there (a
resend after the first attempt committed), the run as it is now, reported as
the success the first attempt was. A resend that arrives while its first
attempt is still running on the server waits on the run's row lock, applies
on top, and its insert of the call's row hits the primary key (23505): the
statement aborts, nothing of it applied, and the executor sends it again
(``FirstAttemptCommitted``). A refused resend's follow-up read also asks for
the call's row, so a put whose first attempt bumped the version is not
reported as a conflict with itself. So a write lands once however the
connection was cut, and the executor resends these writes (``resend_safe``).
``delete_run`` deletes the run's rows with it. ``put_session`` and
``delete_run`` carry no call id: a cut after they were sent is reported
(``reason="unavailable"``, outcome unknown), not resent.

Blobs are stored in ``json`` columns as the exact text the front encoded, and
read back as text and decoded here: a caller gets what the memory reference
gives back, whatever JSON (de)serializer the engine was configured with.

This module must never create or alter a table, never read the server's
clock, and never retry inside a caller's transaction (``bound``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Self

from sqlalchemy import (
    JSON,
    BigInteger,
    CompoundSelect,
    DateTime,
    Exists,
    Insert,
    Numeric,
    Select,
    Table,
    Text,
    Update,
    bindparam,
    cast,
    delete,
    exists,
    false,
    insert,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact._codec import decimal_to_nanos, decode_json, nanos_to_decimal
from statepact._retry import new_op_id
from statepact.clock import Clock
from statepact.errors import RunNotFoundError, StateConflictError, StatePersistenceError
from statepact.models import RunRecord, RunStatus, SessionRecord
from statepact.settings import PostgresStoreSettings
from statepact.state import BaseStateStore, CounterDelta, ListQuery, RunWrite, SessionWrite
from statepact.storage.postgres._client import (
    BoundExecutor,
    EngineExecutor,
    Executor,
    FirstAttemptCommitted,
    Runner,
    constraint_of,
    sqlstate_of,
)
from statepact.storage.postgres.schema import WRITE_RETENTION, StateTables, Tables, tables_for

__all__ = ["PostgresStateStore"]

# What a BIGINT holds; memory and Redis refuse the same overflow.
MAX_COUNTER = 2**63 - 1
COUNTERS = ("input_tokens", "output_tokens", "cost", "iterations", "cursor")
_TZ = DateTime(timezone=True)
_CREATED_COLUMNS = (
    "tenant",
    "run_id",
    "session_id",
    "status",
    "data",
    "version",
    "created_at",
    "updated_at",
)
_COST = Numeric(38, 9, asdecimal=True)


def _p(name: str, type_: Any = None) -> Any:
    """A named bound parameter; every name starts with ``p_`` so none shadows a column."""
    return bindparam(f"p_{name}", type_=type_)


def _json_param(name: str) -> ColumnElement[Any]:
    # The front already encoded the blob: send that text and let the server
    # check it is JSON, rather than have SQLAlchemy serialize it a second time.
    return cast(_p(name, Text()), JSON)


def _row_columns(table: Table) -> list[ColumnElement[Any]]:
    """Every column, the JSON blob read back as its exact text."""
    return [
        cast(column, Text).label(column.name) if column.name == "data" else column
        for column in table.columns
    ]


def _meta_columns(table: Table) -> list[ColumnElement[Any]]:
    """Every column but the blob: a write already holds the blob it sent."""
    return [column for column in table.columns if column.name != "data"]


def _key(table: Table, id_column: str) -> list[ColumnElement[bool]]:
    return [table.c.tenant == _p("tenant"), table.c[id_column] == _p("record_id")]


# -- statements --------------------------------------------------------------


def get_record(table: Table, id_column: str) -> Select[Any]:
    return select(*_row_columns(table)).where(*_key(table, id_column))


def record_version(table: Table, id_column: str) -> Select[Any]:
    return select(table.c.version).where(*_key(table, id_column))


def _done(writes: Table) -> Exists:
    """This call's row: a resend carries its first attempt's call id and clock reading.

    Uncorrelated, so the server evaluates it once per statement, on the
    statement's snapshot.
    """
    return exists().where(
        writes.c.tenant == _p("tenant", Text()),
        writes.c.run_id == _p("record_id", Text()),
        writes.c.applied_at == _p("now", _TZ),
        writes.c.op_id == _p("op_id", Text()),
    )


def _recorded(writes: Table, applied: CTE) -> CTE:
    """Insert this call's row for the run the write produced; a refused write produced none.

    A plain insert: a resend racing its still-running first attempt hits the
    primary key here and the whole statement aborts.
    """
    return (
        insert(writes)
        .from_select(
            ["tenant", "run_id", "applied_at", "op_id"],
            select(applied.c.tenant, applied.c.run_id, _p("now", _TZ), _p("op_id", Text())),
        )
        .cte("recorded")
    )


def _swept(writes: Table, applied: CTE) -> CTE:
    """Delete the run's rows older than the retention (``p_cutoff``): a range of the key.

    Only when the write applied: a refused write (or a resend that found its
    first attempt) changes nothing at all.
    """
    return (
        delete(writes)
        .where(
            writes.c.tenant == _p("tenant", Text()),
            writes.c.run_id == _p("record_id", Text()),
            writes.c.applied_at < _p("cutoff", _TZ),
            exists().select_from(applied),
        )
        .cte("swept")
    )


def _once(
    runs: Table, writes: Table, write: ReturningInsert[Any] | ReturningUpdate[Any]
) -> CompoundSelect[Any]:
    """The write applied once: ``write`` unless this call's row is there, else the run as it is.

    Rows: ``replayed`` (false: written now; true: a resend found its first
    attempt), then every column of the run; ``data`` is the stored text when
    ``write`` returns it, else NULL (a write already holds the blob it sent).
    """
    applied = write.cte("applied")
    fresh = select(
        false().label("replayed"),
        *[
            applied.c[column.name]
            if column.name in applied.c
            else cast(null(), Text).label(column.name)
            for column in runs.columns
        ],
    )
    replayed = select(true().label("replayed"), *_row_columns(runs)).where(
        *_key(runs, "run_id"), _done(writes)
    )
    return union_all(fresh, replayed).add_cte(_recorded(writes, applied), _swept(writes, applied))


def create_run(runs: Table, writes: Table) -> CompoundSelect[Any]:
    """Version 0: insert at version 1 with zero counters, or nothing if the run exists."""
    values = select(
        _p("tenant", Text()),
        _p("record_id", Text()),
        _p("session_id", Text()),
        _p("status", Text()),
        _json_param("data"),
        literal_column("1", BigInteger()),
        _p("now", _TZ),
        _p("now", _TZ),
    ).where(~_done(writes))
    write = (
        pg_insert(runs)
        .from_select(
            [*_CREATED_COLUMNS],
            values,
        )
        .on_conflict_do_nothing(index_elements=[runs.c.tenant, runs.c.run_id])
        .returning(*_meta_columns(runs))
    )
    return _once(runs, writes, write)


def update_run(runs: Table, writes: Table) -> CompoundSelect[Any]:
    """Write blob, status and session if the stored version is the expected one; bump it."""
    write = (
        update(runs)
        .where(
            *_key(runs, "run_id"),
            runs.c.version == _p("expected", BigInteger()),
            ~_done(writes),
        )
        .values(
            session_id=_p("session_id", Text()),
            status=_p("status"),
            data=_json_param("data"),
            version=runs.c.version + 1,
            updated_at=_p("now", _TZ),
        )
        .returning(*_meta_columns(runs))
    )
    return _once(runs, writes, write)


def patch_run(runs: Table, writes: Table) -> CompoundSelect[Any]:
    """Add the deltas in place (``SET c = c + :n``) unless a counter would pass its limit."""
    headroom = [runs.c[name] <= _p(f"max_{name}", runs.c[name].type) for name in COUNTERS]
    write = (
        update(runs)
        .where(*_key(runs, "run_id"), *headroom, ~_done(writes))
        .values(
            {
                **{name: runs.c[name] + _p(name, runs.c[name].type) for name in COUNTERS},
                "version": runs.c.version + 1,
                "updated_at": _p("now", _TZ),
            }
        )
        .returning(*_row_columns(runs))
    )
    return _once(runs, writes, write)


def run_after_write(runs: Table, writes: Table) -> Select[Any]:
    """A refused write's follow-up: the run, and whether this call's first attempt applied."""
    return select(*_row_columns(runs), _done(writes).label("replayed")).where(*_key(runs, "run_id"))


def list_runs(runs: Table, *, by_session: bool, by_status: bool) -> Select[Any]:
    """A page by ``seq``: each filter has an index ending in ``seq`` (see schema.py)."""
    criteria: list[ColumnElement[bool]] = [
        runs.c.tenant == _p("tenant"),
        runs.c.seq > _p("after", BigInteger()),
    ]
    if by_session:
        criteria.append(runs.c.session_id == _p("session_id"))
    if by_status:
        criteria.append(runs.c.status == _p("status"))
    return (
        select(*_row_columns(runs))
        .where(*criteria)
        .order_by(runs.c.seq)
        .limit(_p("limit", BigInteger()))
    )


def delete_run(runs: Table, writes: Table) -> ReturningDelete[Any]:
    """Delete the run and every row of its writes, in one statement."""
    forgotten = (
        delete(writes)
        .where(writes.c.tenant == _p("tenant"), writes.c.run_id == _p("record_id"))
        .cte("forgotten")
    )
    return delete(runs).where(*_key(runs, "run_id")).returning(runs.c.seq).add_cte(forgotten)


def create_session(sessions: Table) -> Insert:
    return (
        pg_insert(sessions)
        .values(
            tenant=_p("tenant"),
            session_id=_p("record_id"),
            data=_json_param("data"),
            version=1,
            created_at=_p("now", _TZ),
            updated_at=_p("now", _TZ),
        )
        .on_conflict_do_nothing(index_elements=[sessions.c.tenant, sessions.c.session_id])
        .returning(*_meta_columns(sessions))
    )


def update_session(sessions: Table) -> Update:
    return (
        update(sessions)
        .where(*_key(sessions, "session_id"), sessions.c.version == _p("expected", BigInteger()))
        .values(data=_json_param("data"), version=sessions.c.version + 1, updated_at=_p("now", _TZ))
        .returning(*_meta_columns(sessions))
    )


def list_sessions(sessions: Table) -> Select[Any]:
    return (
        select(*_row_columns(sessions))
        .where(sessions.c.tenant == _p("tenant"), sessions.c.seq > _p("after", BigInteger()))
        .order_by(sessions.c.seq)
        .limit(_p("limit", BigInteger()))
    )


@dataclass(frozen=True, slots=True)
class _Statements:
    get_run: Select[Any]
    run_after_write: Select[Any]
    create_run: CompoundSelect[Any]
    update_run: CompoundSelect[Any]
    patch_run: CompoundSelect[Any]
    list_runs: Mapping[tuple[bool, bool], Select[Any]]
    delete_run: ReturningDelete[Any]
    get_session: Select[Any]
    session_version: Select[Any]
    create_session: Insert
    update_session: Update
    list_sessions: Select[Any]

    @classmethod
    def build(cls, tables: Tables) -> _Statements:
        runs, sessions, writes = tables.runs, tables.sessions, tables.run_writes
        return cls(
            get_run=get_record(runs, "run_id"),
            run_after_write=run_after_write(runs, writes),
            create_run=create_run(runs, writes),
            update_run=update_run(runs, writes),
            patch_run=patch_run(runs, writes),
            list_runs={
                (by_session, by_status): list_runs(runs, by_session=by_session, by_status=by_status)
                for by_session in (False, True)
                for by_status in (False, True)
            },
            delete_run=delete_run(runs, writes),
            get_session=get_record(sessions, "session_id"),
            session_version=record_version(sessions, "session_id"),
            create_session=create_session(sessions),
            update_session=update_session(sessions),
            list_sessions=list_sessions(sessions),
        )


_STATEMENTS: dict[Tables, _Statements] = {}


def _statements(tables: Tables) -> _Statements:
    built = _STATEMENTS.get(tables)
    if built is None:
        built = _STATEMENTS[tables] = _Statements.build(tables)
    return built


# -- records -----------------------------------------------------------------


def _run_record(row: RowMapping, data: Any) -> RunRecord:
    return RunRecord(
        tenant=row["tenant"],
        run_id=row["run_id"],
        session_id=row["session_id"],
        status=RunStatus(row["status"]),
        data=data,
        version=row["version"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        cost=_cost(row["cost"]),
        iterations=row["iterations"],
        cursor=row["cursor"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        seq=row["seq"],
    )


def _session_record(row: RowMapping, data: Any) -> SessionRecord:
    return SessionRecord(
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


class PostgresStateStore(BaseStateStore):
    """The ``StateStore`` on PostgreSQL, through SQLAlchemy Core (asyncpg).

    ``PostgresStateStore(engine, clock=, settings=, tables=)`` skips the schema
    check; ``await PostgresStateStore.open(engine, ...)`` runs ``verify()``
    first. ``engine`` is an ``AsyncEngine`` (each call checks out a pooled
    connection in AUTOCOMMIT) or an ``AsyncConnection`` (calls take turns on it,
    each in its own transaction). ``bound(session)`` runs inside a transaction
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
        self._sql = _statements(self._tables)
        self._writes_key = str(self._tables.run_writes.primary_key.name)
        self._executor: Executor = EngineExecutor(
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

    def bound(self, session: AsyncSession | AsyncConnection) -> Self:
        """This store, running inside the transaction ``session`` already opened.

        Nothing is committed, rolled back or retried: the caller's transaction
        decides whether the writes (and the work queued beside them) land.
        """
        clone = copy.copy(self)
        clone._executor = BoundExecutor(session, unavailable=_unavailable, what="state store")
        return clone

    @property
    def tables(self) -> Tables:
        return self._tables

    def __repr__(self) -> str:
        mode = "bound" if self._executor.bound else "engine"
        return f"PostgresStateStore(runs={self._tables.runs.name!r}, {mode})"

    # -- runs -------------------------------------------------------------

    @staticmethod
    def _call_params(now: datetime) -> dict[str, Any]:
        """A run write's call id (the same in every resend) and its sweep cutoff."""
        return {"p_op_id": new_op_id(), "p_cutoff": now - WRITE_RETENTION}

    async def _write(
        self, conn: Runner, statement: CompoundSelect[Any], params: Mapping[str, Any]
    ) -> RowMapping | None:
        """Run one write statement; its row, or None when it applied nothing."""
        try:
            result = await conn.execute(statement, params)
        except sa_exc.IntegrityError as exc:
            if sqlstate_of(exc) == "23505" and constraint_of(exc) == self._writes_key:
                raise FirstAttemptCommitted(
                    "this call's first attempt committed while its resend waited"
                ) from exc
            raise
        return result.mappings().first()

    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        async def work(conn: Runner) -> RunRecord | None:
            result = await conn.execute(
                self._sql.get_run, {"p_tenant": tenant, "p_record_id": run_id}
            )
            row = result.mappings().first()
            return None if row is None else _run_record(row, decode_json(row["data"]))

        return await self._executor.run(work, idempotent=True)

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
        creating = write.expected_version == 0
        statement = self._sql.create_run if creating else self._sql.update_run

        async def work(conn: Runner) -> RunRecord:
            # A create can find the run there, then gone before the follow-up
            # read: try again rather than report "expected 0, found 0".
            for _ in range(3):
                row = await self._write(conn, statement, params)
                if row is not None:
                    data = write.data if row["data"] is None else row["data"]
                    return _run_record(row, decode_json(data))
                found = (await conn.execute(self._sql.run_after_write, params)).mappings().first()
                if found is not None and found["replayed"]:
                    # The first attempt applied, then the resend lost a race to it.
                    return _run_record(found, decode_json(found["data"]))
                stored = None if found is None else found["version"]
                if stored is not None or not creating:
                    break
            raise StateConflictError(
                tenant=write.tenant,
                record_id=write.run_id,
                expected=write.expected_version,
                actual=0 if stored is None else int(stored),
                kind="run",
            )

        return await self._executor.run(work, idempotent=False, resend_safe=True)

    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord:
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

        async def work(conn: Runner) -> RunRecord:
            while True:
                row = await self._write(conn, self._sql.patch_run, params)
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
                    stored = found[name]
                    stored_units = decimal_to_nanos(stored) if name == "cost" else stored
                    if stored_units + deltas[name] > MAX_COUNTER:
                        unit = " nano-units" if name == "cost" else ""
                        raise ValueError(
                            f"{name}: run {run_id!r} of tenant {tenant!r} would pass the "
                            f"counter's limit of {MAX_COUNTER}{unit}"
                        )
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

        return await self._executor.run(work, idempotent=True)

    async def _delete_run(self, tenant: str, run_id: str) -> bool:
        async def work(conn: Runner) -> bool:
            result = await conn.execute(
                self._sql.delete_run, {"p_tenant": tenant, "p_record_id": run_id}
            )
            return result.first() is not None

        return await self._executor.run(work, idempotent=False)

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

        return await self._executor.run(work, idempotent=True)

    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        params = {"p_tenant": tenant, "p_after": after_seq, "p_limit": limit + 1}

        async def work(conn: Runner) -> list[SessionRecord]:
            result = await conn.execute(self._sql.list_sessions, params)
            return [_session_record(row, decode_json(row["data"])) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True)
