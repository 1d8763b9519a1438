"""Maintenance: purge a tenant's dead items, prune finished items in bounded batches
under the queue's pruner lease, and the queue's control row (pause).

A prune statement deletes at most ``p_batch`` rows, found oldest first through the
finished index from where the step before reached, and only while the caller still holds
the pruner lease; no statement here waits on another's rows (``SKIP LOCKED``), and none
scans done rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Select,
    Table,
    Text,
    any_,
    case,
    cast,
    delete,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import CANCELLED, DEAD, DONE, Tid, ctid_of
from statepact.storage.postgres.schema import Tables


def purge_dead(tables: Tables) -> Select[Any]:
    """Delete the tenant's dead items (the ``dead`` partial index finds them) and count them.

    No ``adk_queue_turns`` row changes: it counts queued items only.
    """
    work = tables.work
    purged = (
        delete(work)
        .where(
            work.c.queue == param("queue"), work.c.tenant == param("tenant"), work.c.status == DEAD
        )
        .returning(work.c.id)
        .cte("purged")
    )
    return select(func.count()).select_from(purged)


def prune_lock(control: Table) -> Select[Any]:
    """Take the queue's pruner lease for ``p_pruner`` until ``p_until`` unless another
    pruner holds it past ``p_now``; one row when taken, none when not."""
    statement = pg_insert(control).values(
        queue=param("queue", Text()),
        pruner=param("pruner", Text()),
        pruner_until=param("until", TZ),
    )
    taken = (
        statement.on_conflict_do_update(
            index_elements=[control.c.queue],
            set_={
                "pruner": statement.excluded.pruner,
                "pruner_until": statement.excluded.pruner_until,
            },
            where=or_(
                control.c.pruner_until.is_(None),
                control.c.pruner_until <= param("now", TZ),
                control.c.pruner == statement.excluded.pruner,
            ),
        )
        .returning(control.c.queue)
        .cte("taken")
    )
    return select(taken.c.queue)


def prune_unlock(control: Table) -> Select[Any]:
    """Give the pruner lease back, if ``p_pruner`` still holds it."""
    freed = (
        update(control)
        .where(control.c.queue == param("queue", Text()), control.c.pruner == param("pruner"))
        .values(pruner=null(), pruner_until=null())
        .returning(control.c.queue)
        .cte("freed")
    )
    return select(func.count()).select_from(freed)


def prune(tables: Tables) -> Select[Any]:
    """Delete up to ``p_batch`` finished items past their status's cutoff
    (``p_done_before``, ``p_cancelled_before``, ``p_dead_before``; NULL keeps that status)
    that finished at ``p_after`` or later, oldest first, ``FOR UPDATE SKIP LOCKED``, while
    ``p_pruner`` holds the lease (extended to ``p_until``), committing with
    ``synchronous_commit`` set to ``p_commit`` (NULL: unchanged). Answers ``(deleted, held,
    reached)``: held 0 means the lease was lost and nothing was deleted; ``reached`` is
    the latest ``updated_at`` of the rows found (NULL: none), the next step's ``p_after``.

    Each status is its own arm with the status a literal, so every arm is a range scan
    of the finished index; the arms run in order and stop at the batch. The caller sends
    one status's cutoff at a time, each step from where the last one reached: the
    entries of the rows deleted before stay in the index until vacuum, and a scan from
    the oldest entry stepped over all of them again, each step dearer than the last
    (docs/benchmarks.md#retention-under-load).
    """
    work, control = tables.work, tables.queue_control
    held = (
        update(control)
        .where(control.c.queue == param("queue", Text()), control.c.pruner == param("pruner"))
        .values(pruner_until=param("until", TZ))
        .returning(control.c.queue)
        .cte("held")
    )

    def arm(status: Any, cutoff: str) -> Any:
        old = work.alias(f"old_{cutoff}")
        return (
            select(old.c.updated_at, literal_column(f"old_{cutoff}.ctid").label("row_ctid"))
            .where(
                old.c.queue == param("queue", Text()),
                old.c.status == status,
                old.c.updated_at >= param("after", TZ),
                old.c.updated_at < param(cutoff, TZ),
            )
            .order_by(old.c.updated_at)
            .limit(param("batch", BigInteger()))
            .with_for_update(skip_locked=True)
            .subquery(f"arm_{cutoff}")
        )

    arms = [arm(DONE, "done_before"), arm(CANCELLED, "cancelled_before"), arm(DEAD, "dead_before")]
    found = union_all(*(select(a.c.updated_at, a.c.row_ctid) for a in arms)).subquery("found")
    doomed = (
        select(found.c.updated_at, found.c.row_ctid)
        .limit(param("batch", BigInteger()))
        .cte("doomed")
    )
    # The rows are found by the ctid the arm locked them at (a TID scan), not by primary
    # key: no index descent per row. A locked row keeps its ctid until this statement
    # deletes it; one a concurrent update moved after this statement's snapshot is not
    # seen at its new ctid and is kept (the step comes back short), as claim_many's.
    ctids = select(func.array_agg(doomed.c.row_ctid)).scalar_subquery()
    deleted = (
        delete(work)
        .where(
            ctid_of(work) == any_(cast(ctids, ARRAY(Tid()))),
            select(held.c.queue).exists(),
        )
        .returning(work.c.id)
        .cte("deleted")
    )
    # The step's commit does not wait for its WAL to reach the disk (``p_commit`` 'off'):
    # lost in a crash, it leaves rows still past their keep, which the next prune deletes.
    # So the step holds no flush of its own. NULL (inside a caller's transaction, whose
    # commit it would be) keeps the setting as it is.
    setting: ColumnElement[str] = literal_column("'synchronous_commit'")
    unflushed = select(
        func.set_config(
            setting,
            func.coalesce(param("commit", Text()), func.current_setting(setting)),
            true(),
        ).label("unflushed")
    ).subquery("unflushed")
    return select(
        select(func.count()).select_from(deleted).scalar_subquery().label("deleted"),
        select(func.count()).select_from(held).scalar_subquery().label("held"),
        select(func.max(doomed.c.updated_at)).scalar_subquery().label("reached"),
    ).select_from(unflushed)


def set_paused(control: Table) -> Select[Any]:
    """Store whether the queue is paused (``p_paused``); a resume wakes the queue's
    watchers (``NOTIFY`` on ``p_channel``, as an enqueue does)."""
    statement = pg_insert(control).values(
        queue=param("queue", Text()), paused=param("paused", Boolean())
    )
    stored = (
        statement.on_conflict_do_update(
            index_elements=[control.c.queue], set_={"paused": statement.excluded.paused}
        )
        .returning(control.c.paused)
        .cte("stored")
    )
    return select(
        case(
            (~stored.c.paused, func.pg_notify(param("channel"), literal_column("''"))),
        ).label("notified")
    )


def set_limits(control: Table) -> Select[Any]:
    """Store the queue's ``QueueLimits`` (``p_limits``, JSON text; NULL removes them) in
    its control row, and wake its watchers (a raised limit may free held-back items)."""
    statement = pg_insert(control).values(
        queue=param("queue", Text()), limits=param("limits", Text())
    )
    stored = (
        statement.on_conflict_do_update(
            index_elements=[control.c.queue], set_={"limits": statement.excluded.limits}
        )
        .returning(control.c.queue)
        .cte("stored")
    )
    return select(func.pg_notify(param("channel"), literal_column("''"))).select_from(stored)


def limits(control: Table) -> Select[Any]:
    """The queue's stored limits: one row (NULL: none) when it has a control row."""
    return select(control.c.limits).where(control.c.queue == param("queue", Text()))


def paused(control: Table) -> Select[Any]:
    """Whether the queue is paused: one row when it has a control row."""
    return select(control.c.paused).where(control.c.queue == param("queue", Text()))
