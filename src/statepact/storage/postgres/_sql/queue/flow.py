"""Statements of the claim under ``QueueLimits`` (flow control), which
``storage/postgres/_flow.py`` runs in one transaction; docs/backings.md#flow-control.

A limited claim first takes the queue's transaction-scoped advisory lock, so limited
claims of one queue run one at a time (the plain claims yield nothing while limits
are set). Caps are counted from the leased items themselves through the partial
``leased`` indexes, each count reading at most ``cap`` entries; rate buckets live in
the control row (``rate_spent``), read once and written once per claim.
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
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import LEASED, QUEUED, queue_name
from statepact.storage.postgres._sql.queue.claim import (
    _turn_lock_class,
    lease_picked,
    rotation,
)
from statepact.storage.postgres.schema import Tables

__all__ = [
    "candidates",
    "claim_item",
    "leased_of_key",
    "leased_of_pair",
    "leased_of_tenant",
    "lock",
    "save",
    "state",
    "turns_ahead",
]

#: The second key of the queue's flow lock (the first is the tenant locks' queue key):
#: a constant apart from ``hashtext(tenant)`` but for a rare collision, which costs a
#: claim a wait, never correctness.
_FLOW_KEY = -1_811_111_111


def lock(tables: Tables) -> Select[Any]:
    """Wait for the queue's flow lock (held to the end of the transaction)."""
    table_key = literal_column(str(_turn_lock_class(tables.queue_turns)), Integer)
    queue_key = func.hashtext(param("queue", Text())).op("#")(table_key)
    flow_key = literal_column(str(_FLOW_KEY), Integer)
    return select(func.pg_advisory_xact_lock(queue_key, flow_key))


def state(control: Table) -> Select[Any]:
    """The queue's pause flag, limits and rate buckets (one row when it has a control row)."""
    return select(control.c.paused, control.c.limits, control.c.rate_spent).where(
        control.c.queue == param("queue", Text())
    )


def save(control: Table) -> Update:
    """Write the rate buckets and the wake hint back after a limited claim."""
    return (
        update(control)
        .where(control.c.queue == param("queue", Text()))
        .values(rate_spent=param("spent", Text()), rate_wake=param("wake", TZ))
    )


def turns_ahead(tables: Tables) -> Select[Any]:
    """The first ``p_limit`` tenants of the rotation (the lazy walk, read no further)."""
    order = rotation(tables.queue_turns, tables.queue_control, limited=True)
    return select(order.c.tenant).limit(param("limit", BigInteger()))


def _counted(work: Table, *where: ColumnElement[bool]) -> Select[Any]:
    """How many leased rows match, reading at most ``p_cap`` index entries."""
    rows = (
        select(literal_column("1"))
        .select_from(work)
        .where(work.c.queue == queue_name(), work.c.status == LEASED, *where)
        .limit(param("cap", BigInteger()))
        .subquery("leased")
    )
    return select(func.count()).select_from(rows)


def leased_of_tenant(work: Table) -> Select[Any]:
    return _counted(work, work.c.tenant == param("tenant", Text()))


def leased_of_key(work: Table) -> Select[Any]:
    return _counted(
        work, work.c.limit_key.isnot(None), work.c.limit_key == param("limit_key", Text())
    )


def leased_of_pair(work: Table) -> Select[Any]:
    return _counted(
        work,
        work.c.tenant == param("tenant", Text()),
        work.c.limit_key == param("limit_key", Text()),
    )


def candidates(work: Table) -> Select[Any]:
    """The tenant's first ``p_limit`` due items, best first (the claim index), unlocked:
    the limited claim picks among them and locks the one it takes."""
    return (
        select(work.c.id, work.c.limit_key, work.c.weight)
        .where(
            work.c.queue == queue_name(),
            work.c.tenant == param("tenant", Text()),
            work.c.status == QUEUED,
            work.c.available_at <= param("now", TZ),
        )
        .order_by(work.c.priority.desc(), work.c.id)
        .limit(param("limit", BigInteger()))
    )


def claim_item(tables: Tables) -> Select[Any]:
    """Lease item ``p_id`` if it is still queued (and not locked by another writer), as
    ``claim`` leases its pick: token, attempt, and the tenant's turn to the back."""
    work, turns = tables.work, tables.queue_turns
    candidate = work.alias("candidate")
    picked = (
        select(
            candidate.c.id,
            literal_column("candidate.ctid").label("row_ctid"),
            turns.c.additions,
        )
        .select_from(candidate)
        .join(turns, (turns.c.queue == candidate.c.queue) & (turns.c.tenant == candidate.c.tenant))
        .where(
            candidate.c.id == param("id", BigInteger()),
            candidate.c.queue == queue_name(),
            candidate.c.status == QUEUED,
        )
        .with_for_update(of=candidate, skip_locked=True)
        .cte("picked")
    )
    return lease_picked(tables, picked)
