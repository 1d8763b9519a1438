"""The statements of ``PostgresStateStore``: runs and sessions in ``adk_runs``/``adk_sessions``.

Run writes are one statement each, made safe to send again by the call's row
in ``adk_run_writes`` (docs/backings.md#run-writes-sent-again). Every timestamp
is a bound parameter from the injected clock, never the server's ``now()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Generic, TypeVar

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
    any_,
    cast,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
    null,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import (
    TZ,
    param,
    prune_step,
    shared_lock_timeout,
    unseen_param,
)
from statepact.storage.postgres.schema import Tables

__all__ = ["COUNTERS", "Attempts", "CoreStatement", "StateStatements", "statements"]

#: A statement as built: a SELECT (with data-modifying CTEs, or a UNION), or DML.
CoreStatement = Select[Any] | CompoundSelect[Any] | Insert | Update | ReturningDelete[Any]

S = TypeVar("S")
T = TypeVar("T")
#: A run write as a function of its guard: the extra WHERE a resend adds (none for a
#: first attempt), so each write is written once and built twice (``_attempts``).
_Write = Callable[[list[ColumnElement[bool]]], ReturningInsert[Any] | ReturningUpdate[Any]]

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
    """The record's primary key, unseen by the plan (:func:`unseen_param`): given it as
    constants, the planner planned a run's update and patch again on every call."""
    return [
        table.c.tenant == unseen_param("tenant", Text()),
        table.c[id_column] == unseen_param("record_id", Text()),
    ]


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
        fresh = select(
            false().label("replayed"),
            *[
                applied.c[column.name]
                if column.name in applied.c
                else cast(null(), Text).label(column.name)
                for column in runs.columns
            ],
        )
        return fresh, (_recorded(writes, applied), _swept(writes, applied))

    first, side_effects = once([])
    fresh, again_side_effects = once([~_done(writes)])
    replayed = select(true().label("replayed"), *_row_columns(runs)).where(
        *_key(runs, "run_id"), _done(writes)
    )
    return Attempts(
        first.add_cte(*side_effects),
        union_all(fresh, replayed).add_cte(*again_side_effects),
    )


def create_run(runs: Table, writes: Table) -> Attempts[CoreStatement]:
    """Version 0: insert at version 1 with zero counters, or nothing if the run exists."""

    def write(guard: list[ColumnElement[bool]]) -> ReturningInsert[Any]:
        values = select(
            param("tenant", Text()),
            param("record_id", Text()),
            param("session_id", Text()),
            param("status", Text()),
            _json_param("data"),
            literal_column("1", BigInteger()),
            param("now", TZ),
            param("now", TZ),
        ).where(*guard)
        return (
            pg_insert(runs)
            .from_select(
                [*_CREATED_COLUMNS],
                values,
            )
            .on_conflict_do_nothing(index_elements=[runs.c.tenant, runs.c.run_id])
            .returning(*_meta_columns(runs))
        )

    return _attempts(runs, writes, write)


def update_run(runs: Table, writes: Table) -> Attempts[CoreStatement]:
    """Write blob, status and session if the stored version is the expected one; bump it."""

    def write(guard: list[ColumnElement[bool]]) -> ReturningUpdate[Any]:
        return (
            update(runs)
            .where(*_key(runs, "run_id"), runs.c.version == param("expected", BigInteger()), *guard)
            .values(
                session_id=param("session_id", Text()),
                status=param("status"),
                data=_json_param("data"),
                version=runs.c.version + 1,
                updated_at=param("now", TZ),
            )
            .returning(*_meta_columns(runs))
        )

    return _attempts(runs, writes, write)


def patch_run(runs: Table, writes: Table) -> Attempts[CoreStatement]:
    """Add the deltas in place (``SET c = c + :n``) unless a counter would pass its limit."""
    headroom = [runs.c[name] <= param(f"max_{name}", runs.c[name].type) for name in COUNTERS]

    def write(guard: list[ColumnElement[bool]]) -> ReturningUpdate[Any]:
        return (
            update(runs)
            .where(*_key(runs, "run_id"), *headroom, *guard)
            .values(
                {
                    **{name: runs.c[name] + param(name, runs.c[name].type) for name in COUNTERS},
                    "version": runs.c.version + 1,
                    "updated_at": param("now", TZ),
                }
            )
            .returning(*_row_columns(runs))
        )

    return _attempts(runs, writes, write)


def _many(
    runs: Table, writes: Table, columns: Mapping[str, Any]
) -> tuple[CTE, list[ColumnElement[bool]]]:
    """Several run writes of one statement (``patch_runs``, ``update_runs``): the batch
    (parallel arrays, one bind each: ``p_each_<name>`` for ``tenant``, ``run_id``,
    ``op_id``, ``at`` and ``cutoff`` and for ``columns``, name to element type), each write's
    run row locked, and the join of a locked write to its run.

    The rows are locked in ``(tenant, run_id)`` byte order (``FOR NO KEY UPDATE`` above
    a sort), so two batches sharing runs wait on each other in one order, never in a
    cycle, and a single write holds one row only; under ``shared_lock_timeout``, so a
    row another session holds fails the batch at once instead of holding it. A write
    whose call id's row is there (a resend whose first attempt applied) is left out, as
    a resend's ``_done`` does.
    """
    arrays: dict[str, Any] = {
        "tenant": Text(),
        "run_id": Text(),
        "op_id": Text(),
        "at": TZ,
        "cutoff": TZ,
        **columns,
    }
    batch = (
        func.unnest(*[cast(param(f"each_{name}"), ARRAY(type_)) for name, type_ in arrays.items()])
        .table_valued(*arrays, with_ordinality="ord")
        .render_derived(name="batch")
    )
    done = exists().where(
        writes.c.tenant == batch.c.tenant,
        writes.c.run_id == batch.c.run_id,
        writes.c.applied_at == batch.c.at,
        writes.c.op_id == batch.c.op_id,
    )
    locked = (
        select(*batch.c)
        .select_from(shared_lock_timeout())
        .join_from(
            batch, runs, (runs.c.tenant == batch.c.tenant) & (runs.c.run_id == batch.c.run_id)
        )
        .where(~done)
        .order_by(runs.c.tenant.collate("C"), runs.c.run_id.collate("C"))
        .with_for_update(of=runs, key_share=True)
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    return locked, [runs.c.tenant == locked.c.tenant, runs.c.run_id == locked.c.run_id]


def _many_once(runs: Table, writes: Table, locked: CTE, write: ReturningUpdate[Any]) -> Select[Any]:
    """A batch's writes applied, each recording its call's row and sweeping its run's old
    ones (as ``_recorded`` and ``_swept`` do for one); a row per applied write, with its
    place in the batch (``ord``, from 1). A write that is not answered applied nothing."""
    applied = write.returning(locked.c.ord, locked.c.at, locked.c.cutoff, locked.c.op_id).cte(
        "applied"
    )
    recorded = insert(writes).from_select(
        ["tenant", "run_id", "applied_at", "op_id"],
        select(applied.c.tenant, applied.c.run_id, applied.c.at, applied.c.op_id),
    )
    swept = delete(writes).where(
        writes.c.tenant == applied.c.tenant,
        writes.c.run_id == applied.c.run_id,
        writes.c.applied_at < applied.c.cutoff,
    )
    answered = [
        applied.c[column.name]
        if column.name in applied.c
        else cast(null(), Text).label(column.name)
        for column in runs.columns
    ]
    return select(applied.c.ord, *answered).add_cte(recorded.cte("recorded"), swept.cte("swept"))


def patch_runs(runs: Table, writes: Table) -> Select[Any]:
    """Several ``patch_run`` calls of different runs in one statement, see ``_many``: each
    adds its deltas (``p_each_<counter>``) unless a counter would pass its limit
    (``p_each_max_<counter>``); the rows of the writes that applied, ``data`` as text."""
    columns: dict[str, Any] = {}
    for name in COUNTERS:
        columns[name] = runs.c[name].type
        columns[f"max_{name}"] = runs.c[name].type
    locked, joined = _many(runs, writes, columns)
    write = (
        update(runs)
        .where(*joined, *[runs.c[name] <= locked.c[f"max_{name}"] for name in COUNTERS])
        .values(
            {
                **{name: runs.c[name] + locked.c[name] for name in COUNTERS},
                "version": runs.c.version + 1,
                "updated_at": locked.c.at,
            }
        )
        .returning(*_row_columns(runs))
    )
    return _many_once(runs, writes, locked, write)


def update_runs(runs: Table, writes: Table) -> Select[Any]:
    """Several ``put_run`` calls of existing runs in one statement, see ``_many``: each
    writes its blob, status and session if its run is at the version it expects
    (``p_each_expected``); the rows of the writes that applied, without ``data``."""
    locked, joined = _many(
        runs,
        writes,
        {"session_id": Text(), "status": Text(), "data": Text(), "expected": BigInteger()},
    )
    write = (
        update(runs)
        .where(*joined, runs.c.version == locked.c.expected)
        .values(
            session_id=locked.c.session_id,
            status=locked.c.status,
            data=cast(locked.c.data, JSON),
            version=runs.c.version + 1,
            updated_at=locked.c.at,
        )
        .returning(*_meta_columns(runs))
    )
    return _many_once(runs, writes, locked, write)


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


def run_totals(runs: Table, *, by_session: bool, by_status: bool) -> Select[Any]:
    """``(status, runs, input_tokens, output_tokens, cost, iterations)`` of the tenant's
    runs created at or after ``p_since``, per status: a range of the ``(tenant,
    created_at)`` index (its rows fetched for the counters), bounded by the window."""
    criteria: list[ColumnElement[bool]] = [
        runs.c.tenant == param("tenant"),
        runs.c.created_at >= param("since", TZ),
    ]
    if by_session:
        criteria.append(runs.c.session_id == param("session_id"))
    if by_status:
        criteria.append(runs.c.status == param("status"))
    return (
        select(
            runs.c.status,
            func.count(),
            func.sum(runs.c.input_tokens),
            func.sum(runs.c.output_tokens),
            func.sum(runs.c.cost),
            func.sum(runs.c.iterations),
        )
        .where(*criteria)
        .group_by(runs.c.status)
    )


def _by_filters(
    runs: Table, build: Callable[..., Select[Any]]
) -> dict[tuple[bool, bool], Select[Any]]:
    """One statement per (filters by session, filters by status)."""
    return {
        (by_session, by_status): build(runs, by_session=by_session, by_status=by_status)
        for by_session in (False, True)
        for by_status in (False, True)
    }


def delete_run(runs: Table, writes: Table) -> ReturningDelete[Any]:
    """Delete the run and every row of its writes, in one statement."""
    forgotten = (
        delete(writes)
        .where(writes.c.tenant == param("tenant"), writes.c.run_id == param("record_id"))
        .cte("forgotten")
    )
    return delete(runs).where(*_key(runs, "run_id")).returning(runs.c.seq).add_cte(forgotten)


def prune_runs(runs: Table, writes: Table, *, one_tenant: bool) -> Select[Any]:
    """One bounded step of ``prune_runs``: look at the next ``p_limit`` runs in
    ``(tenant, seq)`` order after the cursor (``p_after_tenant``, ``p_after``; of
    ``p_tenant`` alone when ``one_tenant``) and delete, with their writes' rows, those
    in ``p_statuses`` whose ``updated_at`` is before ``p_cutoff``.

    The page is a range of the unique ``(tenant, seq)`` index, so a step reads at most
    ``p_limit`` rows however large the table is; there is no index on ``updated_at``
    (it would cost every ``patch_run`` its HOT update). The delete checks status and
    time again on the row it deletes, so a run written since the page was read is
    judged by its new state. Returns one row (``deleted``, ``looked``, and the cursor
    of the last run looked at), none when no run is left past the cursor.
    """
    statuses = any_(cast(param("statuses"), ARRAY(Text())))
    cutoff = param("cutoff", TZ)
    after = param("after", BigInteger())
    cursor = (
        [runs.c.tenant == param("tenant"), runs.c.seq > after]
        if one_tenant
        else [tuple_(runs.c.tenant, runs.c.seq) > tuple_(param("after_tenant"), after)]
    )
    page = (
        select(runs.c.tenant, runs.c.run_id, runs.c.seq, runs.c.status, runs.c.updated_at)
        .where(*cursor)
        .order_by(runs.c.tenant, runs.c.seq)
        .limit(param("limit", BigInteger()))
        .cte("page")
    )
    victims = (
        select(page.c.tenant, page.c.run_id)
        .where(page.c.status == statuses, page.c.updated_at < cutoff)
        .cte("victims")
    )
    gone = (
        delete(runs)
        .where(
            runs.c.tenant == victims.c.tenant,
            runs.c.run_id == victims.c.run_id,
            runs.c.status == statuses,
            runs.c.updated_at < cutoff,
        )
        .returning(runs.c.tenant, runs.c.run_id)
        .cte("gone")
    )
    forgotten = (
        delete(writes)
        .where(writes.c.tenant == gone.c.tenant, writes.c.run_id == gone.c.run_id)
        .cte("forgotten")
    )
    return prune_step(page, [page.c.tenant, page.c.seq], gone, forgotten)


def delete_session(sessions: Table) -> ReturningDelete[Any]:
    return delete(sessions).where(*_key(sessions, "session_id")).returning(sessions.c.seq)


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
class StateStatements(Generic[S]):
    """Every statement of the state store, by name, each of type ``S`` (as built, or
    compiled for the driver: :meth:`map`)."""

    get_run: S
    run_after_write: S
    # Each run write twice: its first attempt, and a resend (which looks for the first).
    create_run: Attempts[S]
    update_run: Attempts[S]
    patch_run: Attempts[S]
    # Several calls' writes of different runs in one statement (concurrent callers).
    update_runs: S
    patch_runs: S
    # By (whether it filters by session, by status).
    list_runs: Mapping[tuple[bool, bool], S]
    # By (whether it filters by session, by status), as list_runs.
    run_totals: Mapping[tuple[bool, bool], S]
    delete_run: S
    # By whether the prune is of one tenant.
    prune_runs: Mapping[bool, S]
    get_session: S
    session_version: S
    create_session: S
    update_session: S
    list_sessions: S
    delete_session: S

    def map(self, convert: Callable[[S], T]) -> StateStatements[T]:
        """The same set with each statement converted (compiled for the driver, say)."""
        converted: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Attempts):
                converted[field.name] = value.map(convert)
            elif isinstance(value, Mapping):
                converted[field.name] = {key: convert(one) for key, one in value.items()}
            else:
                converted[field.name] = convert(value)
        return StateStatements(**converted)

    @staticmethod
    def build(tables: Tables) -> StateStatements[CoreStatement]:
        runs, sessions, writes = tables.runs, tables.sessions, tables.run_writes
        return StateStatements(
            get_run=get_record(runs, "run_id"),
            run_after_write=run_after_write(runs, writes),
            create_run=create_run(runs, writes),
            update_run=update_run(runs, writes),
            patch_run=patch_run(runs, writes),
            update_runs=update_runs(runs, writes),
            patch_runs=patch_runs(runs, writes),
            list_runs=_by_filters(runs, list_runs),
            run_totals=_by_filters(runs, run_totals),
            delete_run=delete_run(runs, writes),
            prune_runs={
                one_tenant: prune_runs(runs, writes, one_tenant=one_tenant)
                for one_tenant in (False, True)
            },
            get_session=get_record(sessions, "session_id"),
            session_version=record_version(sessions, "session_id"),
            create_session=create_session(sessions),
            update_session=update_session(sessions),
            list_sessions=list_sessions(sessions),
            delete_session=delete_session(sessions),
        )


@cache
def statements(tables: Tables) -> StateStatements[CoreStatement]:
    """The statements of one table naming, built on first use."""
    return StateStatements.build(tables)
