"""Reads: one item, a unique slot's holder, dead letters, stats, the next due time.

``stats`` must never read done rows: its cost is the open and exceptional items (and
a row per tenant), whatever the number of finished items (docs/backings.md#stats).
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
    literal_column,
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
from statepact.storage.postgres.schema import Tables


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


def stats(tables: Tables) -> CompoundSelect[Any]:
    """``(tenant, kind, count)`` rows: ``queued``, ``leased``, ``dead`` and ``cancelled``
    counted per tenant, each through its partial index (dead and cancelled from the
    finished index's ``tenant``, without the heap), then each tenant's ``enqueued`` (turns)
    and ``removed`` totals. The caller derives ``done`` as enqueued - removed - the rest:
    no done row is read."""
    work, turns, removed = tables.work, tables.queue_turns, tables.queue_removed

    def counted(status: Any, kind: str) -> Select[Any]:
        return (
            select(work.c.tenant, literal_column(f"'{kind}'"), func.count().cast(BigInteger))
            .where(work.c.queue == param("queue"), work.c.status == status)
            .group_by(work.c.tenant)
        )

    return union_all(
        counted(QUEUED, "queued"),
        counted(LEASED, "leased"),
        counted(DEAD, "dead"),
        counted(CANCELLED, "cancelled"),
        select(turns.c.tenant, literal_column("'enqueued'"), turns.c.enqueued).where(
            turns.c.queue == param("queue"), turns.c.enqueued > ZERO
        ),
        select(removed.c.tenant, literal_column("'removed'"), removed.c.removed).where(
            removed.c.queue == param("queue")
        ),
    )
