"""Reads: one item, its error history, a unique slot's holder, dead letters, stats, the
next due time.

``stats`` must never read done rows: its cost is the open and exceptional items,
whatever the number of finished items (docs/backings.md#stats-without-done-items).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    CompoundSelect,
    Double,
    Integer,
    Select,
    Table,
    Text,
    cast,
    extract,
    func,
    or_,
    select,
    tuple_,
    union_all,
)

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    CANCELLED,
    DEAD,
    DONE,
    LEASED,
    QUEUED,
    ZERO,
    item_columns,
    item_key,
)


def get_item(work: Table) -> Select[Any]:
    return select(*item_columns(work)).where(*item_key(work))


def error_history(work: Table) -> Select[Any]:
    """The item's ``error_history`` as JSON text (NULL: none), one row when the item exists:
    the only statement that reads the column (the item's others never select it)."""
    return select(cast(work.c.error_history, Text).label("history")).where(*item_key(work))


def slot_holder(work: Table) -> Select[Any]:
    """The item holding unique slot ``p_unique_slot`` of the tenant, if any (a probe of
    the unique slot index)."""
    return select(*item_columns(work)).where(
        work.c.queue == param("queue"),
        work.c.tenant == param("tenant"),
        work.c.unique_slot == param("unique_slot", Text()),
    )


def dead_letters(work: Table) -> Select[Any]:
    return (
        select(*item_columns(work))
        .where(
            work.c.queue == param("queue"), work.c.tenant == param("tenant"), work.c.status == DEAD
        )
        .order_by(work.c.updated_at, work.c.item_id)
        .limit(param("limit", BigInteger()))
    )


def next_due(turns: Table, control: Table) -> Select[Any]:
    """The earliest ``next_due_at`` after now of the tenants whose queued work is all delayed.

    One probe of the ``waking`` index (its predicate is repeated here). A tenant's
    ``next_due_at`` is never later than its earliest queued item, so the answer may
    be early, never late, except for a tenant that still has due work (a claim is
    taking it, and its turn moves on then).
    """
    delayed = (
        select(func.min(turns.c.next_due_at))
        .where(
            turns.c.queue == param("queue"),
            turns.c.queued > ZERO,
            turns.c.next_due_at > turns.c.checked_at,
            turns.c.next_due_at > param("now", TZ),
        )
        .scalar_subquery()
    )
    # Under QueueLimits: when the earliest item a rate held back in the last claim fits.
    wake = (
        select(control.c.rate_wake)
        .where(
            control.c.queue == param("queue"),
            control.c.limits.isnot(None),
            control.c.rate_wake > param("now", TZ),
        )
        .scalar_subquery()
    )
    # LEAST ignores NULL: either alone, or the earlier of the two.
    return select(func.least(delayed, wake))


def stats(work: Table) -> CompoundSelect[Any]:
    """``(tenant, status, count)`` rows for queued, leased, dead and cancelled items, each
    status an arm of its own with the status a literal, so each is counted through its
    partial index (dead and cancelled through the finished index, its ``tenant``
    included, without the heap). No done row is read."""

    def counted(status: Any) -> Select[Any]:
        return (
            select(work.c.tenant, status, func.count())
            .where(work.c.queue == param("queue"), work.c.status == status)
            .group_by(work.c.tenant)
        )

    return union_all(counted(QUEUED), counted(LEASED), counted(DEAD), counted(CANCELLED))


def count_prunable(work: Table) -> Select[Any]:
    """How many done, cancelled and dead items are older than their cutoffs
    (``p_done_before``, ``p_cancelled_before``, ``p_dead_before``; NULL counts none): one
    range count of the finished index per status, each status a literal."""

    def older(status: Any, cutoff: str) -> Any:
        return (
            select(func.count())
            .where(
                work.c.queue == param("queue"),
                work.c.status == status,
                work.c.updated_at < param(cutoff, TZ),
            )
            .scalar_subquery()
        )

    return select(
        older(DONE, "done_before").label("done"),
        older(CANCELLED, "cancelled_before").label("cancelled"),
        older(DEAD, "dead_before").label("dead"),
    )


def dead_letters_all(work: Table) -> Select[Any]:
    """Up to ``p_limit`` dead items of every tenant by ``(tenant, item_id)``, after
    ``(p_after_tenant, p_after_item_id)`` (both NULL: from the first), read through the
    dead index."""
    after = tuple_(work.c.tenant, work.c.item_id) > tuple_(
        param("after_tenant", Text()), param("after_item_id", Text())
    )
    return (
        select(*item_columns(work))
        .where(
            work.c.queue == param("queue"),
            work.c.status == DEAD,
            or_(param("after_tenant", Text()).is_(None), after),
        )
        .order_by(work.c.tenant, work.c.item_id)
        .limit(param("limit", BigInteger()))
    )


def queue_names(work: Table) -> Select[Any]:
    """The name of every queue with items in ``work``, in order: a walk of the unique key's
    index, one probe per queue (never a scan of the items)."""
    first = select(func.min(work.c.queue).label("queue")).cte("names", recursive=True)
    nearer = work.alias("nearer")
    following = (
        select(func.min(nearer.c.queue)).where(nearer.c.queue > first.c.queue).scalar_subquery()
    )
    walk = first.union_all(select(following).where(first.c.queue.is_not(None)))
    return select(walk.c.queue).where(walk.c.queue.is_not(None)).order_by(walk.c.queue)


def oldest_ready(turns: Table, work: Table) -> Select[Any]:
    """``(tenant, oldest)``: per tenant with queued items (its turn row says so), the
    earliest ``available_at`` at or before ``p_now`` of its queued items, NULL when none
    is due. One ``min`` per tenant, each the first entry of the ``due`` index past
    ``(queue, tenant)``: never more than one index entry read per tenant."""
    oldest = (
        select(func.min(work.c.available_at))
        .where(
            work.c.queue == turns.c.queue,
            work.c.tenant == turns.c.tenant,
            work.c.status == QUEUED,
            work.c.available_at <= param("now", TZ),
        )
        .scalar_subquery()
    )
    return (
        select(turns.c.tenant, oldest.label("oldest"))
        .where(turns.c.queue == param("queue"), turns.c.queued > ZERO)
        .order_by(turns.c.tenant)
    )


def finished_counts(work: Table) -> CompoundSelect[Any]:
    """``(status, bucket, count)``: items finished (``updated_at``) in
    ``[p_since, p_until)``, by status and by ``p_width``-second bucket from ``p_since``.
    Each status an arm with the status a literal, a range of the finished index read
    without the heap: it reads the items finished in the range, no other."""
    offset = extract("epoch", work.c.updated_at - param("since", TZ))
    bucket = cast(func.floor(offset / param("width", Double())), Integer).label("bucket")

    def counted(status: Any) -> Select[Any]:
        return (
            select(status, bucket, func.count())
            .where(
                work.c.queue == param("queue"),
                work.c.status == status,
                work.c.updated_at >= param("since", TZ),
                work.c.updated_at < param("until", TZ),
            )
            .group_by(bucket)
        )

    return union_all(counted(DONE), counted(CANCELLED), counted(DEAD))
