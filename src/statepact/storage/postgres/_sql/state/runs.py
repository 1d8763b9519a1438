"""The writes of one run: create, update and patch, each made safe to send again by the
call's row in ``adk_run_writes`` (docs/backings.md#run-writes-sent-again), and the
delete. Each write is built twice (:class:`Attempts`): a first attempt, and a resend
that looks for the first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from sqlalchemy import (
    BigInteger,
    Exists,
    Select,
    Table,
    Text,
    delete,
    exists,
    false,
    insert,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import TZ, param, unseen_param
from statepact.storage.postgres._sql.state._parts import (
    COUNTERS,
    CoreStatement,
    S,
    T,
    as_run_row,
    json_param,
    meta_columns,
    record_key,
    row_columns,
)
from statepact.storage.postgres.schema import insert_new_run

__all__ = [
    "Attempts",
    "create_run",
    "delete_run",
    "patch_run",
    "run_after_write",
    "update_run",
]

#: A run write as a function of its guard: the extra WHERE a resend adds (none for a
#: first attempt), so each write is written once and built twice (``_attempts``).
_Write = Callable[[list[ColumnElement[bool]]], ReturningInsert[Any] | ReturningUpdate[Any]]


def _done(writes: Table) -> Exists:
    """This call's row: a resend carries its first attempt's call id and clock reading.

    Uncorrelated, so the server evaluates it once per statement, on the
    statement's snapshot.
    """
    return exists().where(
        writes.c.tenant == unseen_param("tenant", Text()),
        writes.c.run_id == unseen_param("record_id", Text()),
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
    """Delete the run's rows older than the retention (``p_cutoff``): a range of the key,
    with the run and the cutoff unseen by the plan (:func:`unseen_param`; given the
    cutoff, the planner foresaw no row to delete and planned every call anew).

    Only when the write applied: a refused write (or a resend that found its
    first attempt) changes nothing at all.
    """
    return (
        delete(writes)
        .where(
            writes.c.tenant == unseen_param("tenant", Text()),
            writes.c.run_id == unseen_param("record_id", Text()),
            writes.c.applied_at < unseen_param("cutoff", TZ),
            exists().select_from(applied),
        )
        .cte("swept")
    )


@dataclass(frozen=True, slots=True)
class Attempts(Generic[S]):
    """A run write's two statements: its first attempt, and a resend, which applies only
    if this call's row is not there (else answers the run as it is, ``replayed``)."""

    first: S
    again: S

    def map(self, convert: Callable[[S], T]) -> Attempts[T]:
        return Attempts(convert(self.first), convert(self.again))


def _attempts(runs: Table, writes: Table, write: _Write) -> Attempts[CoreStatement]:
    """``write`` applied once, recording this call's row beside it, as a first attempt
    and as a resend.

    Rows: ``replayed`` (false: written now; true: a resend found its first
    attempt), then every column of the run; ``data`` is the stored text when
    the write returns it, else NULL (a write already holds the blob it sent).
    A first attempt is the write alone: nothing can have applied its call id
    before it (its call id is new), so it does not look.
    """

    def once(guard: list[ColumnElement[bool]]) -> tuple[Select[Any], tuple[CTE, CTE]]:
        applied = write(guard).cte("applied")
        fresh = select(false().label("replayed"), *as_run_row(runs, applied))
        return fresh, (_recorded(writes, applied), _swept(writes, applied))

    first, side_effects = once([])
    fresh, again_side_effects = once([~_done(writes)])
    replayed = select(true().label("replayed"), *row_columns(runs)).where(
        *record_key(runs, "run_id"), _done(writes)
    )
    return Attempts(
        first.add_cte(*side_effects),
        union_all(fresh, replayed).add_cte(*again_side_effects),
    )


def create_run(runs: Table, writes: Table) -> Attempts[CoreStatement]:
    """Version 0: insert at version 1 with zero counters, or nothing if the run exists."""

    def write(guard: list[ColumnElement[bool]]) -> ReturningInsert[Any]:
        return insert_new_run(
            runs,
            tenant=param("tenant", Text()),
            run_id=param("record_id", Text()),
            session_id=param("session_id", Text()),
            status=param("status", Text()),
            data=json_param("data"),
            now=param("now", TZ),
            where=guard,
        ).returning(*meta_columns(runs))

    return _attempts(runs, writes, write)


def update_run(runs: Table, writes: Table) -> Attempts[CoreStatement]:
    """Write blob, status and session if the stored version is the expected one; bump it."""

    def write(guard: list[ColumnElement[bool]]) -> ReturningUpdate[Any]:
        return (
            update(runs)
            .where(
                *record_key(runs, "run_id"),
                runs.c.version == param("expected", BigInteger()),
                *guard,
            )
            .values(
                session_id=param("session_id", Text()),
                status=param("status"),
                data=json_param("data"),
                version=runs.c.version + 1,
                updated_at=param("now", TZ),
            )
            .returning(*meta_columns(runs))
        )

    return _attempts(runs, writes, write)


def patch_run(runs: Table, writes: Table) -> Attempts[CoreStatement]:
    """Add the deltas in place (``SET c = c + :n``) unless a counter would pass its limit."""
    headroom = [runs.c[name] <= param(f"max_{name}", runs.c[name].type) for name in COUNTERS]

    def write(guard: list[ColumnElement[bool]]) -> ReturningUpdate[Any]:
        return (
            update(runs)
            .where(*record_key(runs, "run_id"), *headroom, *guard)
            .values(
                {
                    **{name: runs.c[name] + param(name, runs.c[name].type) for name in COUNTERS},
                    "version": runs.c.version + 1,
                    "updated_at": param("now", TZ),
                }
            )
            .returning(*row_columns(runs))
        )

    return _attempts(runs, writes, write)


def run_after_write(runs: Table, writes: Table) -> Select[Any]:
    """A refused write's follow-up: the run, and whether this call's first attempt applied."""
    return select(*row_columns(runs), _done(writes).label("replayed")).where(
        *record_key(runs, "run_id")
    )


def delete_run(runs: Table, writes: Table) -> ReturningDelete[Any]:
    """Delete the run and every row of its writes, in one statement."""
    forgotten = (
        delete(writes)
        .where(writes.c.tenant == param("tenant"), writes.c.run_id == param("record_id"))
        .cte("forgotten")
    )
    return delete(runs).where(*record_key(runs, "run_id")).returning(runs.c.seq).add_cte(forgotten)
