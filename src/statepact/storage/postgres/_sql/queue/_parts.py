"""What the queue's statements share: status literals, the item's columns, its key and
fence, the end of a lease, the error history's append, and the turns upsert of items
put (back) in the queue.

Nothing here is a whole statement; every statement lives in the module of its seam.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Table,
    Text,
    case,
    cast,
    func,
    literal_column,
    null,
    select,
)
from sqlalchemy.dialects.postgresql import dialect as _postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE
from sqlalchemy.types import UserDefinedType

from statepact._limits import MAX_ERROR_HISTORY
from statepact.storage.postgres._sql import TZ, param, unseen_param

# Status constants are rendered as SQL literals, not bound: the planner matches
# a partial index (WHERE status = 'queued') only against a constant.
QUEUED: ColumnElement[str] = literal_column("'queued'")
LEASED: ColumnElement[str] = literal_column("'leased'")
DONE: ColumnElement[str] = literal_column("'done'")
DEAD: ColumnElement[str] = literal_column("'dead'")
CANCELLED: ColumnElement[str] = literal_column("'cancelled'")
# A constant LIMIT, so a generic plan of the prepared claim knows it is one row.
ONE = literal_column("1", Integer)
# Every other number in a statement is a literal too, never a bound parameter: a prepared
# statement's generic plan (the one PostgreSQL caches after five executions, instead of
# planning each call again) matches a partial index (WHERE queued > 0) only against a
# constant, so a bound 0 left the claim planned anew on every call.
ZERO = literal_column("0", BigInteger)


class Tid(UserDefinedType[Any]):
    """PostgreSQL's ``tid``: a row version's place (``ctid``)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "TID"


# Quotes a table's name where a statement names its ctid.
PREPARER = _postgresql().identifier_preparer  # type: ignore[no-untyped-call]


def ctid_of(work: Table) -> ColumnElement[Any]:
    """The ``ctid`` of the row an UPDATE of ``work`` targets (its own, not an alias's)."""
    return literal_column(f"{PREPARER.quote(work.name)}.ctid")


class _Regclass(UserDefinedType[Any]):
    """PostgreSQL's ``regclass``, for a cast only (``nextval`` takes one)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "REGCLASS"


def identity_sequence(work: Table) -> ColumnElement[Any]:
    """The sequence of ``work.id``'s identity, looked up once per statement (an InitPlan)."""
    name = PREPARER.format_table(work).replace("'", "''")
    lookup = func.pg_get_serial_sequence(literal_column(f"'{name}'"), literal_column("'id'"))
    return select(cast(lookup, _Regclass())).scalar_subquery()


def item_columns(work: Table, source: Any = None) -> list[ColumnElement[Any]]:
    """The columns a ``WorkItem`` and a ``Lease`` need, the payload as its exact text."""
    source = work if source is None else source
    names = (
        "queue",
        "tenant",
        "item_id",
        "priority",
        "available_at",
        "attempts",
        "status",
        "last_error",
        "created_at",
        "updated_at",
        "token",
        "expires_at",
        "unique_key",
        "unique_for",
        "timeout",
        "limit_key",
        "weight",
    )
    return [cast(source.c.payload, Text).label("payload"), *(source.c[name] for name in names)]


def queue_name() -> Any:
    """The queue's name where a worker's statements (claims, acks, heartbeats, settles)
    compare to it, unseen by their plans (:func:`unseen_param`).

    Its statistics rarely hold a queue's name (ANALYZE saw other queues, or the
    queue empty), so the planner rated every custom plan cheaper and planned the
    worker's statements on each call, about half of each call's cost
    (docs/benchmarks.md#queue-statement-plans). The plans kept
    are safe whatever the table holds: each finds its rows by key (``ack_many``, the
    fenced settles), by ``ctid`` (both claims: a claim that joined its pick by primary
    key kept, from a small table, a scan of every queued row) or through the partial
    claim index (each tenant's probe). ``reap`` keeps the constant: its batch is a
    ``LIMIT`` parameter, which a generic plan would guess.
    """
    return unseen_param("queue", Text())


def item_key(work: Table) -> list[ColumnElement[bool]]:
    return [
        work.c.queue == queue_name(),
        work.c.tenant == param("tenant"),
        work.c.item_id == param("item_id"),
    ]


def fenced(work: Table) -> list[ColumnElement[bool]]:
    """The item is leased under exactly the lease's token."""
    return [*item_key(work), work.c.status == LEASED, work.c.token == param("token", BigInteger())]


def lease_taken(work: Table, token: Any) -> dict[str, Any]:
    """The columns of a claim's new lease: leased under ``token`` by ``p_worker`` until
    ``p_expires_at``, one attempt more."""
    return {
        "status": LEASED,
        "attempts": work.c.attempts + ONE,
        "token": token,
        "worker_id": param("worker"),
        "expires_at": param("expires_at", TZ),
        "updated_at": param("now", TZ),
    }


def lease_ended() -> dict[str, Any]:
    """The columns of a lease that ended (settled or reaped): no holder, no token, no expiry."""
    return {
        "token": null(),
        "worker_id": null(),
        "expires_at": null(),
        "updated_at": param("now", TZ),
    }


def history_appended(work: Table, error: str, kind: str, *, maybe_null: bool = False) -> Any:
    """``error_history`` with ``{"attempt", "error", "at", "kind"}`` appended (the item's
    ``attempts``, the text parameter ``p_<error>``, ``p_now``, ``kind``), keeping the
    newest ``MAX_ERROR_HISTORY`` entries; ``maybe_null``: left as it is when the
    parameter is NULL (a cancel without a reason). Only in the UPDATE that writes
    ``last_error``, so the two move together."""
    text = cast(param(error, Text()), Text)
    entry = func.jsonb_build_object(
        literal_column("'attempt'"),
        work.c.attempts,
        literal_column("'error'"),
        text,
        literal_column("'at'"),
        param("now", TZ),
        literal_column("'kind'"),
        literal_column(f"'{kind}'"),
    )
    history = func.coalesce(work.c.error_history, literal_column("'[]'::jsonb"))
    newest: ColumnElement[Any] = literal_column(
        f"'$[last - {MAX_ERROR_HISTORY - 1} to last]'::jsonpath"
    )
    kept = func.jsonb_path_query_array(history.op("||")(func.jsonb_build_array(entry)), newest)
    return case((text.is_(None), work.c.error_history), else_=kept) if maybe_null else kept


def turn_added(turns: Table, source: CTE, *, grouped: bool) -> Any:
    """Upsert the turns rows of the items ``source`` put (back) in the queue.

    ``queued`` grows by their number, ``next_due_at`` can only move earlier
    (``LEAST``), ``checked_at`` only later, and ``additions`` counts the change
    so a concurrent claim can tell its snapshot missed it. Rows are written in
    ``(queue, tenant)`` order.
    """
    added = source.c.status == QUEUED
    if grouped:
        rows = (
            select(
                source.c.queue,
                source.c.tenant,
                literal_column("0", BigInteger),
                func.count().cast(BigInteger),
                func.min(source.c.available_at),
                param("now", TZ),
                func.count().cast(BigInteger),
            )
            .where(added)
            .group_by(source.c.queue, source.c.tenant)
            .order_by(source.c.queue, source.c.tenant)
        )
    else:
        rows = select(
            source.c.queue,
            source.c.tenant,
            literal_column("0", BigInteger),
            literal_column("1", BigInteger),
            source.c.available_at,
            param("now", TZ),
            literal_column("1", BigInteger),
        ).where(added)
    return turns_upsert(turns, rows)


def turns_upsert(turns: Table, rows: Any) -> Any:
    """Upsert the turns rows ``rows`` gives as ``(queue, tenant, last_turn, queued,
    next_due_at, checked_at, additions)``, in the order it gives them (see
    :func:`turn_added`)."""
    statement = pg_insert(turns).from_select(
        ["queue", "tenant", "last_turn", "queued", "next_due_at", "checked_at", "additions"], rows
    )
    return statement.on_conflict_do_update(
        index_elements=[turns.c.queue, turns.c.tenant],
        set_={
            "queued": turns.c.queued + statement.excluded.queued,
            "next_due_at": func.least(turns.c.next_due_at, statement.excluded.next_due_at),
            "checked_at": func.greatest(turns.c.checked_at, statement.excluded.checked_at),
            "additions": turns.c.additions + statement.excluded.additions,
        },
    )
