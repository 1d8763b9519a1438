"""Fenced writes of a leased item (heartbeat, ack, fail, release), the reaper, and the
writes that move an item out of band (requeue, cancel).

A fenced write matches only the lease's exact token: a stale lease matches no row and
writes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CompoundSelect,
    Integer,
    Select,
    Table,
    Text,
    Update,
    any_,
    case,
    cast,
    func,
    literal_column,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    CANCELLED,
    DEAD,
    DONE,
    LEASED,
    ONE,
    QUEUED,
    ZERO,
    fenced,
    history_appended,
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
            unique_slot=_slot_kept_when_done(work),
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
            unique_slot=_slot_kept_when_done(work),
            **lease_ended(),
        )
        .returning(*item_columns(work))
    )


def _slot_kept_when_done(work: Table) -> Any:
    """A done item keeps blocking its slot only when its key is by period (``unique_for``):
    the slot names the period, which ends by itself."""
    return case((work.c.unique_for.is_(None), null()), else_=work.c.unique_slot)


def _slot_kept_unless_dead(work: Table, dead: Any) -> Any:
    """A dead item holds no slot (a new item of its key may be stored); a queued one keeps it."""
    return case((dead, null()), else_=work.c.unique_slot)


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
            error_history=history_appended(work, "error", "failed"),
            available_at=param("available_at", TZ),
            unique_slot=_slot_kept_unless_dead(work, param("status", Text()) == DEAD),
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
            # The attempt is given back unless the caller counts it (a shutdown's release).
            attempts=work.c.attempts - case((param("count_attempt", Boolean()), ZERO), else_=ONE),
            available_at=param("available_at", TZ),
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
    on, each with ``last_error = p_error`` (appended to its error history): the front's
    decision (``LapseOutcome``)."""
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
            unique_slot=_slot_kept_unless_dead(
                work, work.c.attempts >= param("dead_at", Integer())
            ),
            last_error=param("error", Text()),
            error_history=history_appended(work, "error", "lease_expired"),
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


def cancel_many(tables: Tables) -> CompoundSelect[Any]:
    """Cancel the tenant's queued, delayed and leased items named in ``p_item_ids``, in one
    statement: each becomes ``cancelled`` with ``last_error = p_reason`` (appended to its
    error history unless NULL), its lease void
    and its unique slot free; the tenant's turns row stops counting the queued ones; and
    each leased one is announced on the control channel ``p_ctl_channel`` as JSON
    ``{"tenant", "item_id", "token"}`` (the voided token), delivered at commit (the
    caller's, for a bound cancel).

    The answer is every named item that exists: the cancelled ones (``cancelled`` true)
    and, as the statement's snapshot saw them, the others. Rows are locked in ``id``
    order with every predicate on the locked relation, so a concurrent claim or settle
    either finishes first (and the item is cancelled from where it left it, or left
    unchanged if finished) or finds it cancelled.
    """
    work, turns = tables.work, tables.queue_turns
    names = cast(param("item_ids"), ARRAY(Text))
    target = (
        select(work.c.id, work.c.status, work.c.token)
        .where(
            work.c.queue == param("queue"),
            work.c.tenant == param("tenant"),
            work.c.item_id == any_(names),
            work.c.status.in_([QUEUED, LEASED]),
        )
        .order_by(work.c.id)
        .with_for_update()
        .cte("target")
    )
    cancelled = (
        update(work)
        .where(work.c.id == target.c.id)
        .values(
            status=CANCELLED,
            last_error=param("reason", Text()),
            error_history=history_appended(work, "reason", "cancelled", maybe_null=True),
            unique_slot=null(),
            **lease_ended(),
        )
        .returning(
            *item_columns(work),
            target.c.status.label("was"),
            target.c.token.label("voided"),
        )
        .cte("cancelled")
    )
    unqueued = (
        select(func.count())
        .select_from(cancelled)
        .where(cancelled.c.was == QUEUED)
        .scalar_subquery()
    )
    unturned = (
        update(turns)
        .where(
            turns.c.queue == param("queue"),
            turns.c.tenant == param("tenant"),
            unqueued > ZERO,
        )
        .values(queued=turns.c.queued - unqueued)
        .cte("unturned")
    )
    notice = func.json_build_object(
        literal_column("'tenant'"),
        cancelled.c.tenant,
        literal_column("'item_id'"),
        cancelled.c.item_id,
        literal_column("'token'"),
        cancelled.c.voided,
    )
    columns = [c.name for c in item_columns(work)]
    done = select(
        *(cancelled.c[name] for name in columns),
        literal_column("true").label("cancelled"),
        case(
            (
                cancelled.c.was == LEASED,
                func.pg_notify(param("ctl_channel"), cast(notice, Text)),
            )
        ).label("notified"),
    )
    other = work.alias("other")
    untouched = select(
        *item_columns(work, other),
        literal_column("false").label("cancelled"),
        null().label("notified"),
    ).where(
        other.c.queue == param("queue"),
        other.c.tenant == param("tenant"),
        other.c.item_id == any_(names),
        other.c.status.not_in([QUEUED, LEASED]),
    )
    return union_all(done, untouched).add_cte(unturned)
