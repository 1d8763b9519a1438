"""Fenced writes of a leased item (heartbeat, ack, fail, release), the reaper, and the
writes that move an item out of band (requeue, cancel).

A fenced write matches only the lease's exact token: a stale lease matches no row and
writes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    Table,
    Text,
    Update,
    case,
    cast,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    DEAD,
    DONE,
    LEASED,
    ONE,
    QUEUED,
    ZERO,
    fenced,
    item_columns,
    item_key,
    lease_ended,
    queue_name,
    turn_added,
)
from statepact.storage.postgres.schema import Tables


def heartbeat(tables: Tables) -> Update:
    work = tables.work
    return (
        update(work)
        .where(*fenced(work))
        .values(token=tables.token_seq.next_value(), expires_at=param("expires_at", TZ))
        .returning(*item_columns(work))
    )


def ack(work: Table) -> Update:
    return (
        update(work)
        .where(*fenced(work))
        .values(
            status=DONE,
            **lease_ended(),
        )
        .returning(*item_columns(work))
    )


def ack_many(work: Table) -> Update:
    """``ack`` for every lease of the batch (parallel arrays) still holding its item; a
    stale lease matches no row and is left out of the answer."""
    held = (
        func.unnest(
            cast(param("tenants"), ARRAY(Text)),
            cast(param("item_ids"), ARRAY(Text)),
            cast(param("tokens"), ARRAY(BigInteger)),
        )
        .table_valued("tenant", "item_id", "token")
        .render_derived(name="held")
    )
    return (
        update(work)
        .where(
            work.c.queue == queue_name(),
            work.c.tenant == held.c.tenant,
            work.c.item_id == held.c.item_id,
            work.c.status == LEASED,
            work.c.token == held.c.token,
        )
        .values(
            status=DONE,
            **lease_ended(),
        )
        .returning(*item_columns(work))
    )


def _notified_if_queued(rows: Any) -> Any:
    """A column that sends the queue's ``NOTIFY`` for a row put back in the queue (due now
    or later: a watcher asks ``next_due`` and sleeps until then), and is NULL. It sits in
    the outer select: a CTE that no one reads is never run."""
    return case(
        (rows.c.status == QUEUED, func.pg_notify(param("channel"), literal_column("''")))
    ).label("notified")


def _settled(tables: Tables, settle: Update) -> Select[Any]:
    """Run a fenced settle that may put the item back in the queue, wake its tenant, and
    wake the queue's watchers if it did."""
    settled = settle.returning(*item_columns(tables.work)).cte("settled")
    woken = turn_added(tables.queue_turns, settled, grouped=False).cte("woken")
    return select(
        *(settled.c[c.name] for c in item_columns(tables.work)), _notified_if_queued(settled)
    ).add_cte(woken)


def fail(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*fenced(work))
        .values(
            status=param("status"),
            last_error=param("error", Text()),
            available_at=param("available_at", TZ),
            **lease_ended(),
        ),
    )


def release(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*fenced(work))
        .values(
            status=QUEUED,
            attempts=work.c.attempts - ONE,
            available_at=param("now", TZ),
            **lease_ended(),
        ),
    )


def requeue(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*item_key(work), work.c.status == DEAD)
        .values(
            status=QUEUED,
            attempts=ZERO,
            available_at=param("now", TZ),
            updated_at=param("now", TZ),
        ),
    )


def reap(tables: Tables) -> Select[Any]:
    """Up to ``p_batch`` lapsed leases back to the queue, or dead from ``p_dead_at`` attempts
    on, each with ``last_error = p_error``: the front's decision (``LapseOutcome``)."""
    work = tables.work
    expired = (
        select(work.c.id, work.c.expires_at, work.c.token)
        .where(
            work.c.queue == param("queue"),
            work.c.status == LEASED,
            work.c.expires_at <= param("now", TZ),
        )
        .order_by(work.c.expires_at, work.c.token)
        .limit(param("batch", BigInteger()))
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    moved = (
        update(work)
        .where(
            work.c.id == expired.c.id,
            work.c.status == LEASED,
            work.c.expires_at <= param("now", TZ),
        )
        .values(
            status=case((work.c.attempts >= param("dead_at", Integer()), DEAD), else_=QUEUED),
            last_error=param("error", Text()),
            available_at=param("now", TZ),
            **lease_ended(),
        )
        .returning(
            *item_columns(work),
            expired.c.expires_at.label("lapsed_at"),
            expired.c.token.label("lapsed_token"),
        )
        .cte("moved")
    )
    woken = turn_added(tables.queue_turns, moved, grouped=True).cte("woken")
    names = [c.name for c in item_columns(work)] + ["lapsed_at", "lapsed_token"]
    return select(*(moved.c[name] for name in names), _notified_if_queued(moved)).add_cte(woken)
