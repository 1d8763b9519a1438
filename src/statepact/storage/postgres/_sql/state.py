"""The statements of ``PostgresStateStore``: runs and sessions in ``adk_runs``/``adk_sessions``.

Run writes are one statement each, made safe to send again by the call's row
in ``adk_run_writes`` (docs/backings.md#run-writes-sent-again). Every timestamp
is a bound parameter from the injected clock, never the server's ``now()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CompoundSelect,
    Exists,
    Insert,
    Select,
    Table,
    Text,
    Update,
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
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres.schema import Tables

__all__ = ["COUNTERS", "StateStatements", "statements"]

COUNTERS = ("input_tokens", "output_tokens", "cost", "iterations", "cursor")
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


def _json_param(name: str) -> ColumnElement[Any]:
    # The front already encoded the blob: send that text and let the server
    # check it is JSON, rather than have SQLAlchemy serialize it a second time.
    return cast(param(name, Text()), JSON)


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
    return [table.c.tenant == param("tenant"), table.c[id_column] == param("record_id")]


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
        writes.c.tenant == param("tenant", Text()),
        writes.c.run_id == param("record_id", Text()),
        writes.c.applied_at == param("now", TZ),
        writes.c.op_id == param("op_id", Text()),
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
            select(applied.c.tenant, applied.c.run_id, param("now", TZ), param("op_id", Text())),
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
            writes.c.tenant == param("tenant", Text()),
            writes.c.run_id == param("record_id", Text()),
            writes.c.applied_at < param("cutoff", TZ),
            exists().select_from(applied),
        )
        .cte("swept")
    )


def _unless_done(writes: Table, resent: bool) -> list[ColumnElement[bool]]:
    """A resend's write applies only if this call's row is not there; a first attempt's
    cannot find one (its call id is new), so it does not look."""
    return [~_done(writes)] if resent else []


def _once(
    runs: Table,
    writes: Table,
    write: ReturningInsert[Any] | ReturningUpdate[Any],
    *,
    resent: bool,
) -> Select[Any] | CompoundSelect[Any]:
    """The write applied once, recording this call's row beside it.

    Rows: ``replayed`` (false: written now; true: a resend found its first
    attempt), then every column of the run; ``data`` is the stored text when
    ``write`` returns it, else NULL (a write already holds the blob it sent).
    A first attempt (``resent=False``) is the write alone: nothing can have
    applied its call id before it. A resend is ``write`` unless this call's row
    is there, else the run as it is.
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
    side_effects = (_recorded(writes, applied), _swept(writes, applied))
    if not resent:
        return fresh.add_cte(*side_effects)
    replayed = select(true().label("replayed"), *_row_columns(runs)).where(
        *_key(runs, "run_id"), _done(writes)
    )
    return union_all(fresh, replayed).add_cte(*side_effects)


def create_run(runs: Table, writes: Table, *, resent: bool) -> Select[Any] | CompoundSelect[Any]:
    """Version 0: insert at version 1 with zero counters, or nothing if the run exists."""
    values = select(
        param("tenant", Text()),
        param("record_id", Text()),
        param("session_id", Text()),
        param("status", Text()),
        _json_param("data"),
        literal_column("1", BigInteger()),
        param("now", TZ),
        param("now", TZ),
    ).where(*_unless_done(writes, resent))
    write = (
        pg_insert(runs)
        .from_select(
            [*_CREATED_COLUMNS],
            values,
        )
        .on_conflict_do_nothing(index_elements=[runs.c.tenant, runs.c.run_id])
        .returning(*_meta_columns(runs))
    )
    return _once(runs, writes, write, resent=resent)


def update_run(runs: Table, writes: Table, *, resent: bool) -> Select[Any] | CompoundSelect[Any]:
    """Write blob, status and session if the stored version is the expected one; bump it."""
    write = (
        update(runs)
        .where(
            *_key(runs, "run_id"),
            runs.c.version == param("expected", BigInteger()),
            *_unless_done(writes, resent),
        )
        .values(
            session_id=param("session_id", Text()),
            status=param("status"),
            data=_json_param("data"),
            version=runs.c.version + 1,
            updated_at=param("now", TZ),
        )
        .returning(*_meta_columns(runs))
    )
    return _once(runs, writes, write, resent=resent)


def patch_run(runs: Table, writes: Table, *, resent: bool) -> Select[Any] | CompoundSelect[Any]:
    """Add the deltas in place (``SET c = c + :n``) unless a counter would pass its limit."""
    headroom = [runs.c[name] <= param(f"max_{name}", runs.c[name].type) for name in COUNTERS]
    write = (
        update(runs)
        .where(*_key(runs, "run_id"), *headroom, *_unless_done(writes, resent))
        .values(
            {
                **{name: runs.c[name] + param(name, runs.c[name].type) for name in COUNTERS},
                "version": runs.c.version + 1,
                "updated_at": param("now", TZ),
            }
        )
        .returning(*_row_columns(runs))
    )
    return _once(runs, writes, write, resent=resent)


def run_after_write(runs: Table, writes: Table) -> Select[Any]:
    """A refused write's follow-up: the run, and whether this call's first attempt applied."""
    return select(*_row_columns(runs), _done(writes).label("replayed")).where(*_key(runs, "run_id"))


def list_runs(runs: Table, *, by_session: bool, by_status: bool) -> Select[Any]:
    """A page by ``seq``: each filter has an index ending in ``seq`` (see schema.py)."""
    criteria: list[ColumnElement[bool]] = [
        runs.c.tenant == param("tenant"),
        runs.c.seq > param("after", BigInteger()),
    ]
    if by_session:
        criteria.append(runs.c.session_id == param("session_id"))
    if by_status:
        criteria.append(runs.c.status == param("status"))
    return (
        select(*_row_columns(runs))
        .where(*criteria)
        .order_by(runs.c.seq)
        .limit(param("limit", BigInteger()))
    )


def delete_run(runs: Table, writes: Table) -> ReturningDelete[Any]:
    """Delete the run and every row of its writes, in one statement."""
    forgotten = (
        delete(writes)
        .where(writes.c.tenant == param("tenant"), writes.c.run_id == param("record_id"))
        .cte("forgotten")
    )
    return delete(runs).where(*_key(runs, "run_id")).returning(runs.c.seq).add_cte(forgotten)


def create_session(sessions: Table) -> Insert:
    return (
        pg_insert(sessions)
        .values(
            tenant=param("tenant"),
            session_id=param("record_id"),
            data=_json_param("data"),
            version=1,
            created_at=param("now", TZ),
            updated_at=param("now", TZ),
        )
        .on_conflict_do_nothing(index_elements=[sessions.c.tenant, sessions.c.session_id])
        .returning(*_meta_columns(sessions))
    )


def update_session(sessions: Table) -> Update:
    return (
        update(sessions)
        .where(*_key(sessions, "session_id"), sessions.c.version == param("expected", BigInteger()))
        .values(
            data=_json_param("data"), version=sessions.c.version + 1, updated_at=param("now", TZ)
        )
        .returning(*_meta_columns(sessions))
    )


def list_sessions(sessions: Table) -> Select[Any]:
    return (
        select(*_row_columns(sessions))
        .where(sessions.c.tenant == param("tenant"), sessions.c.seq > param("after", BigInteger()))
        .order_by(sessions.c.seq)
        .limit(param("limit", BigInteger()))
    )


@dataclass(frozen=True, slots=True)
class StateStatements:
    get_run: Select[Any]
    run_after_write: Select[Any]
    # Each run write twice: its first attempt, and a resend (which looks for the first).
    create_run: Select[Any] | CompoundSelect[Any]
    update_run: Select[Any] | CompoundSelect[Any]
    patch_run: Select[Any] | CompoundSelect[Any]
    create_run_resent: CompoundSelect[Any] | Select[Any]
    update_run_resent: CompoundSelect[Any] | Select[Any]
    patch_run_resent: CompoundSelect[Any] | Select[Any]
    list_runs: Mapping[tuple[bool, bool], Select[Any]]
    delete_run: ReturningDelete[Any]
    get_session: Select[Any]
    session_version: Select[Any]
    create_session: Insert
    update_session: Update
    list_sessions: Select[Any]

    @classmethod
    def build(cls, tables: Tables) -> StateStatements:
        runs, sessions, writes = tables.runs, tables.sessions, tables.run_writes
        return cls(
            get_run=get_record(runs, "run_id"),
            run_after_write=run_after_write(runs, writes),
            create_run=create_run(runs, writes, resent=False),
            update_run=update_run(runs, writes, resent=False),
            patch_run=patch_run(runs, writes, resent=False),
            create_run_resent=create_run(runs, writes, resent=True),
            update_run_resent=update_run(runs, writes, resent=True),
            patch_run_resent=patch_run(runs, writes, resent=True),
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


@cache
def statements(tables: Tables) -> StateStatements:
    """The statements of one table naming, built on first use."""
    return StateStatements.build(tables)
