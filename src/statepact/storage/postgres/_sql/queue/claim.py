"""Claim statements: the lazy walk of the tenant rotation and the ``FOR UPDATE SKIP
LOCKED`` probes of ``claim`` and ``claim_many``. Why each step is where it is, and how
claims and settles avoid deadlocks: docs/backings.md#the-claim.

These statements must never use a window function over the backlog or scan it in a
claim (``claim_many`` numbers only the rows its tenants offered, at most ``limit``
each), and never wait on an advisory lock (they only try one).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    Table,
    Update,
    any_,
    case,
    cast,
    func,
    literal_column,
    null,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    ONE,
    QUEUED,
    ZERO,
    Tid,
    ctid_of,
    item_columns,
    lease_taken,
    queue_name,
)
from statepact.storage.postgres.schema import Tables


def _next_turn(
    turns: Table, after: Any = None, *, held: ColumnElement[bool] | None = None
) -> Select[Any]:
    """The first tenant in turn order ``(last_turn, tenant)`` after ``after`` that may have work.

    Two index probes, each LIMIT 1: the ``ready`` index in order, and the
    ``waking`` tenants whose delayed work has come due (few: any write to the
    tenant moves it to ``ready``), the earlier of the two winning.
    """
    columns = (turns.c.tenant, turns.c.last_turn, turns.c.additions)
    past: list[ColumnElement[bool]] = [] if held is None else [held]
    if after is not None:
        past.append(
            tuple_(turns.c.last_turn, turns.c.tenant) > tuple_(after.c.last_turn, after.c.tenant)
        )
    ready = (
        select(*columns)
        .where(
            turns.c.queue == queue_name(),
            turns.c.queued > ZERO,
            turns.c.next_due_at <= turns.c.checked_at,
            *past,
        )
        .order_by(turns.c.last_turn, turns.c.tenant)
        .limit(ONE)
    )
    waking = (
        select(*columns)
        .where(
            turns.c.queue == queue_name(),
            turns.c.queued > ZERO,
            turns.c.next_due_at > turns.c.checked_at,
            turns.c.next_due_at <= param("now", TZ),
            *past,
        )
        .order_by(turns.c.last_turn, turns.c.tenant)
        .limit(ONE)
    )
    if after is not None:
        # The previous tenant comes from the enclosing walk, not a FROM of its own.
        ready, waking = ready.correlate(after), waking.correlate(after)
    both = union_all(ready, waking).subquery("candidates")
    return (
        select(both.c.tenant, both.c.last_turn, both.c.additions)
        .order_by(both.c.last_turn, both.c.tenant)
        .limit(ONE)
    )


def _not_held(control: Table, *, limited: bool) -> ColumnElement[bool]:
    """The queue is not paused (and, unless ``limited``, has no ``QueueLimits``): one
    probe of its control row by primary key, evaluated once per statement (an InitPlan)
    before the walk reads any tenant. The plain claims yield nothing under limits: the
    queue then claims through ``flow`` (``PostgresWorkQueue._claim``)."""
    held = control.c.paused if limited else control.c.paused | control.c.limits.isnot(None)
    return ~(select(control.c.queue).where(control.c.queue == queue_name(), held).exists())


def rotation(turns: Table, control: Table, *, limited: bool = False) -> CTE:
    """Tenants that may have due work, served longest ago first (ties: tenant, byte order).

    A recursive walk, one index probe per tenant, read lazily: the claim pulls
    tenants only until one yields an item, so its cost does not grow with the
    number of tenants waiting behind that one. A paused queue yields no tenant: the walk
    never starts; nor does one with limits set unless ``limited`` (the limited claim's walk).
    """
    walk = _next_turn(turns, held=_not_held(control, limited=limited)).cte(
        "rotation", recursive=True
    )
    previous = walk.alias("previous")
    step = _next_turn(turns, after=previous).lateral("step")
    return walk.union_all(
        select(step.c.tenant, step.c.last_turn, step.c.additions).select_from(
            previous.join(step, true())
        )
    )


def _turn_lock_class(turns: Table) -> int:
    """The first key of the tenant locks of claims on ``turns``: a signed 32-bit hash of its name.

    Queues of two table namings in one database then take different locks.
    """
    name = f"{turns.schema}.{turns.name}" if turns.schema else turns.name
    unsigned = zlib.crc32(name.encode("utf-8"))
    return unsigned - (1 << 32) if unsigned >= 1 << 31 else unsigned


def _try_tenant_lock(turns: Table, tenant: Any) -> ColumnElement[bool]:
    """Try, without waiting, the transaction-scoped advisory lock of ``(queue, tenant)``.

    The two-key form ``(int4, int4)``: a lock space apart from the one-bigint
    keys (the migrations' lock among them). Key one mixes the table naming and
    the queue, key two is the tenant. Two tenants whose keys collide only keep
    each other's concurrent claimers apart, which costs fairness, never
    correctness: the item's row lock, not this one, makes a claim exclusive.
    """
    table_key = literal_column(str(_turn_lock_class(turns)), Integer)
    queue_key = func.hashtext(param("queue")).op("#")(table_key)
    return func.pg_try_advisory_xact_lock(queue_key, func.hashtext(tenant), type_=Boolean)


def _due_items(
    work: Table, tenant: Any, limit: Any, name: str, *more: Any, row_ctid: bool = False
) -> Any:
    """The tenant's best due items (``priority DESC, id``: the claim index), up to ``limit``,
    ``FOR UPDATE SKIP LOCKED`` with every predicate on the locked relation; a LATERAL
    probe of each tenant the rotation yields. ``row_ctid``: each locked row's ``ctid`` too,
    as column ``row_ctid``, which the update finds it by."""
    candidate = work.alias("candidate")
    ctid: list[ColumnElement[Any]] = (
        [literal_column("candidate.ctid").label("row_ctid")] if row_ctid else []
    )
    return (
        select(candidate.c.id, *(candidate.c[column] for column in more), *ctid)
        .where(
            candidate.c.queue == queue_name(),
            candidate.c.tenant == tenant,
            candidate.c.status == QUEUED,
            candidate.c.available_at <= param("now", TZ),
        )
        .order_by(candidate.c.priority.desc(), candidate.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .lateral(name)
    )


def _served(
    tables: Tables,
    leaving: Callable[[Any], ColumnElement[bool]],
    *,
    last_turn: Any,
    taken: Any,
    seen_additions: Any,
) -> Update:
    """The turns row of a tenant a claim served: ``last_turn``, ``queued`` minus ``taken``,
    and ``next_due_at`` the earliest queued item but those ``leaving`` the queue, the old
    bound kept when an addition raced the claim (``seen_additions``)."""
    work, turns = tables.work, tables.queue_turns
    rest = work.alias("rest")
    next_due = (
        select(rest.c.available_at)
        .where(
            rest.c.queue == turns.c.queue,
            rest.c.tenant == turns.c.tenant,
            rest.c.status == QUEUED,
            leaving(rest),
        )
        .order_by(rest.c.available_at)
        .limit(ONE)
        .scalar_subquery()
    )
    return update(turns).values(
        last_turn=last_turn,
        queued=turns.c.queued - taken,
        # LEAST ignores NULL: keep the old bound only when an addition raced us.
        next_due_at=func.least(
            next_due,
            case(
                (turns.c.additions == seen_additions, null()),
                else_=turns.c.next_due_at,
            ),
        ),
        checked_at=func.greatest(turns.c.checked_at, param("now", TZ)),
    )


def claim(tables: Tables) -> Select[Any]:
    """Lease the best due item of the tenant served longest ago, and send that tenant back."""
    work, turns = tables.work, tables.queue_turns
    order = rotation(turns, tables.queue_control)
    best = _due_items(work, order.c.tenant, ONE, "best", row_ctid=True)
    # No ORDER BY in either branch: the rotation's order drives the nested loop,
    # and LIMIT 1 stops it at the first tenant whose probe locked an item. The
    # lock filter references the rotation alone, so it runs on each tenant as
    # the walk yields it, before that tenant's item probe.
    found = (best.c.id, best.c.row_ctid, order.c.additions)
    free = (
        select(*found)
        .select_from(order.join(best, true()))
        .where(_try_tenant_lock(turns, order.c.tenant))
        .limit(ONE)
    )
    # Every tenant at the front is being claimed by someone else: take work
    # anyway, from the first tenant that still has an unlocked due item.
    anyone = select(*found).select_from(order.join(best, true())).limit(ONE)
    # The Append runs its branches in order and the LIMIT stops it at the
    # first row: the fallback runs only when the first branch found nothing.
    branches = union_all(free, anyone).subquery("branches")
    picked = (
        select(branches.c.id, branches.c.row_ctid, branches.c.additions).limit(ONE).cte("picked")
    )
    return lease_picked(tables, picked)


def lease_picked(tables: Tables, picked: CTE) -> Select[Any]:
    """Lease the one row ``picked`` locked (columns ``id``, ``row_ctid``, ``additions``: its
    tenant's turns row as read), and send its tenant to the back of the rotation."""
    work, turns = tables.work, tables.queue_turns
    # The row is found by the ctid ``best`` locked it at (a TID scan), as claim_many's are
    # (see there): by primary key, a generic plan made while the table was small joined
    # ``picked`` to a scan of every queued row (docs/benchmarks.md#queue-statement-plans).
    claimed = (
        update(work)
        .where(
            ctid_of(work) == cast(select(picked.c.row_ctid).scalar_subquery(), Tid()),
            work.c.id == picked.c.id,
            work.c.status == QUEUED,
        )
        .values(**lease_taken(work, tables.token_seq.next_value()))
        .returning(*item_columns(work), work.c.id, picked.c.additions.label("seen_additions"))
        .cte("claimed")
    )
    turn = (
        _served(
            tables,
            lambda rest: rest.c.id != claimed.c.id,
            last_turn=claimed.c.token,
            taken=ONE,
            seen_additions=claimed.c.seen_additions,
        )
        .where(turns.c.queue == claimed.c.queue, turns.c.tenant == claimed.c.tenant)
        .cte("turn")
    )
    return select(*(claimed.c[c.name] for c in item_columns(work))).add_cte(turn)


def claim_many(tables: Tables) -> Select[Any]:
    """Lease up to ``p_limit`` due items across tenants in rotation, in one statement.

    What ``p_limit`` successive ``claim`` statements would take, in their order:
    the first ``p_limit`` tenants of the rotation (the lazy walk, read no further)
    each offer their best due items (``priority DESC, id``, ``FOR UPDATE SKIP
    LOCKED``; the tenant at place ``p`` of ``k`` offers ``(limit - p + k) / k``, what
    ``limit`` claims round by round give it), and the items go round by round, in turn order
    within a round: the 1st item of each tenant, then the 2nd, and so on. That is
    the rotation successive claims walk, since each claim sends its tenant to the
    back behind every tenant ahead of it. Tokens are drawn in that order, and
    each tenant's turn becomes the token of its last item, so the rotation after
    the batch is the one after the claims. A tenant with fewer due items than its
    share (or whose items other claims hold) leaves the batch short: the caller
    then claims the rest one by one (``PostgresWorkQueue._claim``), which is what
    successive claims would have taken.

    The turns rows are locked in ``(queue, tenant)`` order before they are
    written, like reap's, so concurrent batches cannot deadlock on them. The
    tenant try-locks of ``claim`` are not taken: a batch already spreads over
    the tenants at the front, and two batches at once share them item by item
    (SKIP LOCKED), never taking one item twice.
    """
    work, turns = tables.work, tables.queue_turns
    order = rotation(turns, tables.queue_control)
    front = (
        select(order.c.tenant, order.c.last_turn, order.c.additions)
        .limit(param("limit", BigInteger()))
        .subquery("front")
    )
    ranked_front = select(
        front.c.tenant,
        front.c.additions,
        func.row_number().over(order_by=(front.c.last_turn, front.c.tenant)).label("pos"),
        func.count().over().label("tenants"),
    ).subquery("ranked_front")
    # The items the tenant at ``pos`` of ``tenants`` gets in ``limit`` claims round by round
    # (when each has enough): it offers that many and locks no more, so rows this batch does
    # not take are never hidden from concurrent claims.
    quota = (param("limit", BigInteger()) - ranked_front.c.pos + ranked_front.c.tenants) // (
        ranked_front.c.tenants
    )
    offered = _due_items(work, ranked_front.c.tenant, quota, "offered", "priority", row_ctid=True)
    # FOR UPDATE and a window cannot share a level: the rounds are numbered above it.
    round_ = (
        func.row_number()
        .over(
            partition_by=ranked_front.c.pos,
            order_by=(offered.c.priority.desc(), offered.c.id),
        )
        .label("round")
    )
    picked = (
        select(
            offered.c.id, offered.c.row_ctid, ranked_front.c.additions, round_, ranked_front.c.pos
        )
        .select_from(ranked_front.join(offered, true()))
        .order_by(literal_column("round"), ranked_front.c.pos)
        .limit(param("limit", BigInteger()))
        .subquery("picked")
    )
    # Tokens are drawn as the ordered rows come out: in claim order.
    tokens = select(
        picked.c.id,
        picked.c.row_ctid,
        picked.c.additions,
        tables.token_seq.next_value().label("token"),
    ).cte("tokens")
    # The rows are found by the ctid ``picked`` locked them at (a TID scan), whatever the
    # statistics say: by primary key, a generic plan made while the table was small kept
    # a sequential scan of the whole table, and a ``status`` condition let a planner that
    # thinks few items are queued scan every queued row through the due index. ``picked``
    # locked the rows and checked ``status`` in this statement; a locked row keeps its ctid
    # until this statement updates it. One a concurrent update moved after this
    # statement's snapshot is not seen at its new ctid and is left queued (the batch
    # comes back short).
    ctids = select(func.array_agg(tokens.c.row_ctid)).scalar_subquery()
    claimed = (
        update(work)
        .where(ctid_of(work) == any_(cast(ctids, ARRAY(Tid()))), work.c.id == tokens.c.id)
        .values(**lease_taken(work, tokens.c.token))
        .returning(*item_columns(work), work.c.id, tokens.c.additions.label("seen_additions"))
        .cte("claimed")
    )
    served = (
        select(
            claimed.c.queue,
            claimed.c.tenant,
            func.max(claimed.c.token).label("last_token"),
            func.count().label("taken"),
            func.min(claimed.c.seen_additions).label("seen_additions"),
        )
        .group_by(claimed.c.queue, claimed.c.tenant)
        .cte("served")
    )
    locked_turns = (
        select(turns.c.queue, turns.c.tenant)
        .where(turns.c.queue == served.c.queue, turns.c.tenant == served.c.tenant)
        .order_by(turns.c.queue, turns.c.tenant)
        .with_for_update(of=turns)
        .cte("locked_turns")
    )
    gone = claimed.alias("gone")
    turn = (
        _served(
            tables,
            lambda rest: ~select(gone.c.id).where(gone.c.id == rest.c.id).exists(),
            last_turn=served.c.last_token,
            taken=served.c.taken,
            seen_additions=served.c.seen_additions,
        )
        .where(
            turns.c.queue == served.c.queue,
            turns.c.tenant == served.c.tenant,
            turns.c.queue == locked_turns.c.queue,
            turns.c.tenant == locked_turns.c.tenant,
        )
        .cte("turn")
    )
    return (
        select(*(claimed.c[c.name] for c in item_columns(work)))
        .order_by(claimed.c.token)
        .add_cte(turn)
    )
