"""Statements of the claim under ``QueueLimits`` (flow control), which
``storage/postgres/_flow.py`` runs in one transaction; docs/backings.md#flow-control.

A limited claim first locks the queue's control row (``state_locked``), so limited
claims of one queue run one at a time (the plain claims yield nothing while limits
are set), then reads a tenant, its candidates and their leased counts in one
statement (``pick``) and leases its choice and writes the rate buckets back in another
(``claim_item``): the lock is held over three round trips. Caps are counted from the
leased items themselves through the partial ``leased`` indexes, each count reading
at most ``cap`` entries; rate buckets live in the control row (``rate_spent``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    Table,
    Text,
    Update,
    cast,
    func,
    literal_column,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import LEASED, ONE, QUEUED, ZERO, queue_name
from statepact.storage.postgres._sql.queue.claim import lease_picked, rotation
from statepact.storage.postgres.schema import Tables

__all__ = [
    "claim_item",
    "flush",
    "pick_head",
    "pick_tenant",
    "save",
    "state",
    "state_locked",
    "turns_ahead",
]


def state(control: Table) -> Select[Any]:
    """The queue's pause flag, limits and rate buckets (one row when it has a control row)."""
    return select(control.c.paused, control.c.limits, control.c.rate_spent).where(
        control.c.queue == param("queue", Text())
    )


def state_locked(control: Table) -> Select[Any]:
    """``state``, the control row locked to the end of the transaction: the queue's flow
    lock. Waiting for it, the row read is the one the previous limited claim committed
    (READ COMMITTED reads a row it waited for again); a plain read of it (the plain
    claims' probe, ``next_due``) never waits.

    It also sets ``synchronous_commit`` for the rest of the transaction to ``p_commit``
    (NULL: left as it is): ``off`` lets the claim's commit release the lock without
    waiting for its WAL flush, which ``flush`` then waits for outside the lock
    (docs/backings.md#flow-control)."""
    setting: ColumnElement[str] = literal_column("'synchronous_commit'")
    commit = func.coalesce(param("commit", Text()), func.current_setting(setting))
    synchronous = func.set_config(setting, commit, true()).label("synchronous_commit")
    return (
        select(control.c.paused, control.c.limits, control.c.rate_spent, synchronous)
        .where(control.c.queue == param("queue", Text()))
        .with_for_update(key_share=True)  # FOR NO KEY UPDATE
    )


def flush() -> Select[Any]:
    """A transaction that writes WAL (an empty transactional logical message, prefix
    ``statepact``) and so, under ``synchronous_commit`` on, returns once the WAL up to
    its commit is flushed: every transaction committed before it is then durable."""
    message = func.pg_logical_emit_message(
        true(), literal_column("'statepact'"), literal_column("''")
    )
    return select(message)


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


def _cap(caps: Any, default: str, kind: str | None = None, name: Any = None) -> Any:
    """A cap from ``p_caps`` (JSON, ``_flow.caps_json``): ``name``'s under ``kind`` if it
    has one, else the one under ``default``, else 0 (a count nothing holds back reads
    nothing)."""
    fallback = cast(caps.op("->>")(literal_column(f"'{default}'")), BigInteger)
    if kind is None:
        return func.coalesce(fallback, ZERO)
    named = cast(caps.op("->")(literal_column(f"'{kind}'")).op("->>")(name), BigInteger)
    return func.coalesce(named, fallback, ZERO)


def _leased(work: Table, outer: Any, cap: Any, *where: ColumnElement[bool]) -> Any:
    """How many leased rows match, reading at most ``cap`` index entries (``outer``: the
    FROM of the enclosing select ``where`` and ``cap`` refer to)."""
    rows = (
        select(literal_column("1"))
        .select_from(work)
        .where(work.c.queue == queue_name(), work.c.status == LEASED, *where)
        .limit(cap)
        .correlate(outer)
        .subquery("leased")
    )
    return select(func.count()).select_from(rows).scalar_subquery()


def _picked(tables: Tables, head: Select[Any]) -> Select[Any]:
    """The tenant ``head`` yields, its leased count, its first ``p_lookahead`` due items
    best first (the claim index, unlocked), and per distinct limit key among them the
    key's and the (tenant, key)'s leased counts: what the limited claim decides on, in
    one statement. A tenant without a due item comes back as one row of NULL items."""
    work = tables.work
    caps = param("caps", JSONB)
    tenant = head.cte("head")
    candidates = (
        select(work.c.id, work.c.limit_key, work.c.weight, work.c.priority)
        .where(
            work.c.queue == queue_name(),
            work.c.tenant == select(tenant.c.tenant).scalar_subquery(),
            work.c.status == QUEUED,
            work.c.available_at <= param("now", TZ),
        )
        .order_by(work.c.priority.desc(), work.c.id)
        .limit(param("lookahead", BigInteger()))
        .cte("candidates")
    )
    keys = (
        select(candidates.c.limit_key)
        .where(candidates.c.limit_key.isnot(None))
        .distinct()
        .subquery("keys")
    )
    counted = select(
        keys.c.limit_key,
        _leased(
            work,
            keys,
            _cap(caps, "per_key", "key", keys.c.limit_key),
            work.c.limit_key.isnot(None),
            work.c.limit_key == keys.c.limit_key,
        ).label("key_leased"),
        _leased(
            work,
            keys,
            _cap(caps, "per_tenant_key"),
            work.c.tenant == select(tenant.c.tenant).scalar_subquery(),
            work.c.limit_key == keys.c.limit_key,
        ).label("pair_leased"),
    ).cte("counted")
    tenant_leased = _leased(
        work,
        tenant,
        _cap(caps, "per_tenant", "tenant", tenant.c.tenant),
        work.c.tenant == tenant.c.tenant,
    )
    return (
        select(
            tenant.c.tenant,
            tenant_leased.label("tenant_leased"),
            candidates.c.id,
            candidates.c.limit_key,
            candidates.c.weight,
            counted.c.key_leased,
            counted.c.pair_leased,
        )
        .select_from(
            tenant.outerjoin(candidates, true()).outerjoin(
                counted, counted.c.limit_key == candidates.c.limit_key
            )
        )
        .order_by(candidates.c.priority.desc(), candidates.c.id)
    )


def pick_head(tables: Tables) -> Select[Any]:
    """``_picked`` for the tenant at the head of the rotation (no row: none has work)."""
    order = rotation(tables.queue_turns, tables.queue_control, limited=True)
    return _picked(tables, select(order.c.tenant).limit(ONE))


def pick_tenant(tables: Tables) -> Select[Any]:
    """``_picked`` for tenant ``p_tenant``."""
    return _picked(tables, select(cast(param("tenant", Text()), Text).label("tenant")))


def claim_item(tables: Tables) -> Select[Any]:
    """Lease item ``p_id`` if it is still queued (and not locked by another writer), as
    ``claim`` leases its pick: token, attempt, and the tenant's turn to the back; and,
    when it does, write the rate buckets and wake hint (``save``) in the same statement."""
    work, turns, control = tables.work, tables.queue_turns, tables.queue_control
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
    saved = (
        save(control).where(select(picked.c.id).exists()).returning(control.c.queue).cte("saved")
    )
    return lease_picked(tables, picked).add_cte(saved)
