"""Reads: one item, a unique slot's holder, dead letters, stats, the next due time.

``stats`` must never read done rows: its cost is the open and exceptional items,
whatever the number of finished items (docs/backings.md#stats-without-done-items).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    CompoundSelect,
    Select,
    Table,
    Text,
    func,
    select,
    union_all,
)

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    CANCELLED,
    DEAD,
    LEASED,
    QUEUED,
    ZERO,
    item_columns,
    item_key,
)


def get_item(work: Table) -> Select[Any]:
    return select(*item_columns(work)).where(*item_key(work))


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


def next_due(turns: Table) -> Select[Any]:
    """The earliest ``next_due_at`` after now of the tenants whose queued work is all delayed.

    One probe of the ``waking`` index (its predicate is repeated here). A tenant's
    ``next_due_at`` is never later than its earliest queued item, so the answer may
    be early, never late, except for a tenant that still has due work (a claim is
    taking it, and its turn moves on then).
    """
    return select(func.min(turns.c.next_due_at)).where(
        turns.c.queue == param("queue"),
        turns.c.queued > ZERO,
        turns.c.next_due_at > turns.c.checked_at,
        turns.c.next_due_at > param("now", TZ),
    )


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
