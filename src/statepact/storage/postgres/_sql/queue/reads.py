"""Reads and maintenance: one item, dead letters, stats, the next due time, purge,
prune, and the queue's control row (pause, the pruner's try-lock).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    Table,
    delete,
    func,
    select,
)

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    DEAD,
    LEASED,
    QUEUED,
    ZERO,
    item_columns,
    item_key,
)


def get_item(work: Table) -> Select[Any]:
    return select(*item_columns(work)).where(*item_key(work))


def dead_letters(work: Table) -> Select[Any]:
    return (
        select(*item_columns(work))
        .where(
            work.c.queue == param("queue"), work.c.tenant == param("tenant"), work.c.status == DEAD
        )
        .order_by(work.c.updated_at, work.c.item_id)
        .limit(param("limit", BigInteger()))
    )


def purge_dead(work: Table) -> Select[Any]:
    """Delete the tenant's dead items (the ``dead`` partial index finds them) and count them.

    No ``adk_queue_turns`` row changes: it counts queued items only.
    """
    purged = (
        delete(work)
        .where(
            work.c.queue == param("queue"), work.c.tenant == param("tenant"), work.c.status == DEAD
        )
        .returning(work.c.id)
        .cte("purged")
    )
    return select(func.count()).select_from(purged)


def stats(work: Table) -> Select[Any]:
    return (
        select(work.c.tenant, work.c.status, func.count())
        .where(work.c.queue == param("queue"), work.c.status.in_([QUEUED, LEASED, DEAD]))
        .group_by(work.c.tenant, work.c.status)
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
