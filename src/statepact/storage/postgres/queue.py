"""``PostgresWorkQueue``: work items in ``adk_work``, the tenant rotation in ``adk_queue_turns``.

It implements only the ``_``-methods of :class:`~statepact.queue.BaseWorkQueue`
(the front validated, encoded, read the clock and asked ``QueuePolicy``), with
the semantics of the memory reference (``storage/memory/queue.py``). Every
statement is a small function of Core expressions built once per table naming.

The claim is ONE statement (one round trip on an engine):

1. ``rotation``: the tenants that may have due work, in turn order
   ``(last_turn, tenant)``, walked lazily by a recursive CTE: each step is one
   LIMIT-1 probe of the ``ready`` index (queued work that was due when last
   written) and one of the ``waking`` index (all work was delayed, and the
   earliest delay has passed since). Tenants with nothing queued are in
   neither index, so the claim never looks at idle tenants; and it stops at the
   first tenant that yields an item, so it does not read the tenants behind it.
2. ``picked``: for each tenant in that order, a LATERAL probe of its best due
   item (``priority DESC, id``: the claim index) ``FOR UPDATE SKIP LOCKED``;
   the first tenant that yields one wins, and only that row is locked. Every
   predicate (queue, tenant, status, due) is on the locked relation itself, as
   in River's ``JobGetAvailable``: under READ COMMITTED, PostgreSQL re-checks
   them against the newest row version when the row was claimed and committed
   underneath us, so two workers can never take one item. No window function,
   no scan of the backlog.

   Concurrent claims read the same snapshot of the rotation, so on their own
   they would all walk to the same front tenant and SKIP LOCKED would only
   hand them different items of it. So the walk first tries, without waiting,
   a transaction-scoped advisory lock per ``(queue, tenant)``
   (``pg_try_advisory_xact_lock``, as the Que job queue does in its walk) and
   passes over a tenant another claim holds: claims that overlap in time take
   the tenants at the front one each. The try sits in the filter of the
   rotation's scan, so it runs on each tenant as the walk reaches it, before
   that tenant's item probe, and LIMIT 1 stops the walk at the first tenant
   locked and served: a claim tries the tenants up to its own and holds the
   locks of the ones it got (its own, and any whose probe found nothing) until
   its transaction ends; a failed try holds nothing. When every tenant with due
   work is held, the second branch of a UNION ALL walks the rotation again
   without the try (the Append runs its branches in order and the LIMIT stops
   it at the first row, so that branch runs only then) and takes the best
   unlocked item of the first tenant that has one: a claim never comes back
   empty while an item it could take is due. Either walk reads only tenants
   with due work, and the first passes over only those other running claims
   hold (about one each): the cost grows with the claims in flight, not with
   the tenants.

   What this does not fix: a claim whose snapshot was taken before another
   claim of the front tenant committed, and which tries that tenant's lock
   after the commit released it, still takes the same tenant (rare, and the
   rotation sends that tenant to the back, so it evens out over the next
   claims). The key is two ``int4`` (a lock space apart from the one-bigint
   keys, the migrations' among them): a hash of the table naming and the
   queue, and ``hashtext(tenant)``. Two tenants whose keys collide keep each
   other's concurrent claims apart: that costs fairness, never correctness,
   since the item's row lock alone makes a claim exclusive. Inside ``bound``
   the locks last until the caller commits: a ``claim_batch`` there holds one
   per tenant it walked (mind ``max_locks_per_transaction`` for large batches
   over many tenants); on an engine each claim is its own transaction.
3. ``claimed``: the item becomes ``leased``, ``attempts + 1``, a new token from
   the sequence.
4. ``turn``: the tenant goes to the back (``last_turn`` = the claim's token),
   ``queued - 1``, and ``next_due_at`` becomes the earliest queued item but
   this one in our snapshot. That may count items other workers are claiming
   right now (too early: harmless, the next claim of the tenant corrects it);
   it misses items put back in the queue after our snapshot, but their writers
   bumped ``additions``, and when it moved the old bound is kept (``LEAST``).
   So ``next_due_at`` is never later than the truth: no item is stranded.
   (Locking the rows read here would hide them from concurrent claims.)

Claims lock one ``adk_work`` row, then one ``adk_queue_turns`` row; every
settle and enqueue writes in the same order (item, then turn), and the
multi-row writes (reap) take turns rows in ``(queue, tenant)`` order, so claims
and settles cannot deadlock each other. The advisory tenant locks add no wait:
a claim only tries them, and nothing here waits on one.

``claim_batch`` (``claim_many``) is the same walk read ``limit`` tenants deep,
each offering up to ``limit`` items, taken round by round in turn order: what
``limit`` successive claims take, in one statement (see its docstring).

Round trips on an engine: ``enqueue`` 1 (2 when the item already exists),
``enqueue_many`` 1 (more only for items a concurrent enqueue stored after its
snapshot), ``claim`` 1, ``claim_batch`` 1, ``ack_many`` 1,
``heartbeat``/``ack``/``fail``/``release`` 1, ``requeue`` 1
(2 when refused), ``reap`` 1 per 500 expired leases plus one, ``get_item``,
``dead_letters``, ``purge_dead``, ``stats`` 1.

This module must never read the server's clock, never use a window function
over the backlog or a scan of it in a claim (``claim_many`` numbers only the
rows its tenants offered, at most ``limit`` each), never wait on an advisory lock (try it
only), and never retry inside a caller's transaction (``bound``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self

import asyncpg
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    Select,
    Table,
    Text,
    Update,
    any_,
    bindparam,
    case,
    cast,
    delete,
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
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact._cancel import finish
from statepact._codec import decode_json
from statepact.clock import Clock
from statepact.errors import LeaseLostError, QueueUnavailableError
from statepact.models import ItemStatus, Lease, QueueStats, TenantQueueStats, WorkItem
from statepact.queue import (
    BaseWorkQueue,
    FailOutcome,
    QueuePolicy,
    SleepWatch,
    WorkWatch,
    lease_lost,
)
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres._client import BoundExecutor, EngineExecutor, Executor, Runner
from statepact.storage.postgres.schema import StateTables, Tables, tables_for

__all__ = ["PostgresWorkQueue"]

LEASE_EXPIRED = "lease expired"
REAP_BATCH = 500
_TZ = DateTime(timezone=True)

# Status constants are rendered as SQL literals, not bound: the planner matches
# a partial index (WHERE status = 'queued') only against a constant.
QUEUED: ColumnElement[str] = literal_column("'queued'")
LEASED: ColumnElement[str] = literal_column("'leased'")
DONE: ColumnElement[str] = literal_column("'done'")
DEAD: ColumnElement[str] = literal_column("'dead'")
# A constant LIMIT, so a generic plan of the prepared claim knows it is one row.
_ONE = literal_column("1", Integer)


def _p(name: str, type_: Any = None) -> Any:
    return bindparam(f"p_{name}", type_=type_)


def _item_columns(work: Table, source: Any = None) -> list[ColumnElement[Any]]:
    """The columns a ``WorkItem`` and a ``Lease`` need, the payload as its exact text."""
    source = work if source is None else source
    names = (
        "queue",
        "tenant",
        "item_id",
        "priority",
        "available_at",
        "attempts",
        "status",
        "last_error",
        "created_at",
        "updated_at",
        "token",
        "expires_at",
    )
    return [cast(source.c.payload, Text).label("payload"), *(source.c[name] for name in names)]


def _item_key(work: Table) -> list[ColumnElement[bool]]:
    return [
        work.c.queue == _p("queue"),
        work.c.tenant == _p("tenant"),
        work.c.item_id == _p("item_id"),
    ]


def _fenced(work: Table) -> list[ColumnElement[bool]]:
    """The item is leased under exactly the lease's token."""
    return [*_item_key(work), work.c.status == LEASED, work.c.token == _p("token", BigInteger())]


def _turn_added(turns: Table, source: CTE, *, grouped: bool) -> Any:
    """Upsert the turns rows of the items ``source`` put (back) in the queue.

    ``queued`` grows by their number, ``next_due_at`` can only move earlier
    (``LEAST``), ``checked_at`` only later, and ``additions`` counts the change
    so a concurrent claim can tell its snapshot missed it. Rows are written in
    ``(queue, tenant)`` order.
    """
    added = source.c.status == QUEUED
    if grouped:
        rows = (
            select(
                source.c.queue,
                source.c.tenant,
                literal_column("0", BigInteger),
                func.count().cast(BigInteger),
                func.min(source.c.available_at),
                _p("now", _TZ),
                func.count().cast(BigInteger),
            )
            .where(added)
            .group_by(source.c.queue, source.c.tenant)
            .order_by(source.c.queue, source.c.tenant)
        )
    else:
        rows = select(
            source.c.queue,
            source.c.tenant,
            literal_column("0", BigInteger),
            literal_column("1", BigInteger),
            source.c.available_at,
            _p("now", _TZ),
            literal_column("1", BigInteger),
        ).where(added)
    statement = pg_insert(turns).from_select(
        ["queue", "tenant", "last_turn", "queued", "next_due_at", "checked_at", "additions"], rows
    )
    return statement.on_conflict_do_update(
        index_elements=[turns.c.queue, turns.c.tenant],
        set_={
            "queued": turns.c.queued + statement.excluded.queued,
            "next_due_at": func.least(turns.c.next_due_at, statement.excluded.next_due_at),
            "checked_at": func.greatest(turns.c.checked_at, statement.excluded.checked_at),
            "additions": turns.c.additions + statement.excluded.additions,
        },
    )


# -- statements --------------------------------------------------------------


def enqueue(tables: Tables) -> Select[Any]:
    """Insert the item unless ``(queue, tenant, item_id)`` exists, and wake its tenant."""
    work, turns = tables.work, tables.queue_turns
    inserted = (
        pg_insert(work)
        .values(
            queue=_p("queue"),
            tenant=_p("tenant"),
            item_id=_p("item_id"),
            payload=cast(_p("payload", Text()), JSON),
            priority=_p("priority", Integer()),
            status=QUEUED,
            attempts=0,
            available_at=_p("available_at", _TZ),
            created_at=_p("now", _TZ),
            updated_at=_p("now", _TZ),
        )
        .on_conflict_do_nothing(index_elements=[work.c.queue, work.c.tenant, work.c.item_id])
        .returning(work.c.queue, work.c.tenant, work.c.available_at, work.c.status)
        .cte("inserted")
    )
    woken = _turn_added(turns, inserted, grouped=False).cte("woken")
    # Watchers LISTEN on the queue's channel; PostgreSQL delivers at commit (the caller's,
    # for a bound enqueue), once per transaction and channel.
    return (
        select(func.count(), func.pg_notify(_p("channel"), literal_column("''")))
        .select_from(inserted)
        .add_cte(woken)
    )


def enqueue_many(tables: Tables) -> Select[Any]:
    """Insert every item of the batch whose ``(queue, tenant, item_id)`` is new, and wake
    their tenants, in one statement; answer each item's row with its place in the batch.

    The batch arrives as parallel arrays (one bind each, whatever its length), is
    inserted in ``(tenant, item_id)`` order (so two batches sharing ids wait on
    each other in one order, never in a cycle), and the turns rows are upserted
    in ``(queue, tenant)`` order like every other multi-row write here. An item
    that existed before the statement is answered from the statement's snapshot;
    one a concurrent enqueue inserted after it is in neither answer, and the
    caller reads it with a second statement.
    """
    work, turns = tables.work, tables.queue_turns
    batch = (
        func.unnest(
            cast(_p("tenants"), ARRAY(Text)),
            cast(_p("item_ids"), ARRAY(Text)),
            cast(_p("payloads"), ARRAY(Text)),
            cast(_p("priorities"), ARRAY(Integer)),
            cast(_p("available"), ARRAY(_TZ)),
        )
        .table_valued(
            "tenant", "item_id", "payload", "priority", "available_at", with_ordinality="ord"
        )
        .render_derived(name="batch")
    )
    rows = select(
        _p("queue"),
        batch.c.tenant,
        batch.c.item_id,
        cast(batch.c.payload, JSON),
        batch.c.priority,
        QUEUED,
        literal_column("0", Integer),
        batch.c.available_at,
        _p("now", _TZ),
        _p("now", _TZ),
    ).order_by(batch.c.tenant, batch.c.item_id)
    inserted = (
        pg_insert(work)
        .from_select(
            [
                "queue",
                "tenant",
                "item_id",
                "payload",
                "priority",
                "status",
                "attempts",
                "available_at",
                "created_at",
                "updated_at",
            ],
            rows,
        )
        .on_conflict_do_nothing(index_elements=[work.c.queue, work.c.tenant, work.c.item_id])
        .returning(work.c.queue, work.c.tenant, work.c.item_id, work.c.available_at, work.c.status)
        .cte("inserted")
    )
    woken = _turn_added(turns, inserted, grouped=True).cte("woken")
    # Items stored before: their rows, whole. Items stored now: their place only (the
    # caller has their record already), so the answer stays small for a large batch.
    old = work.alias("old")
    existing = select(batch.c.ord, *_item_columns(work, old)).select_from(
        batch.join(
            old,
            (old.c.queue == _p("queue"))
            & (old.c.tenant == batch.c.tenant)
            & (old.c.item_id == batch.c.item_id),
        )
    )
    new = select(batch.c.ord, *(null().label(c.name) for c in _item_columns(work))).select_from(
        batch.join(
            inserted,
            (inserted.c.tenant == batch.c.tenant) & (inserted.c.item_id == batch.c.item_id),
        )
    )
    answer = union_all(existing, new).subquery("answer")
    notified = select(func.pg_notify(_p("channel"), literal_column("''")).label("notified")).cte(
        "notified"
    )
    return select(*answer.c).select_from(answer.join(notified, true())).add_cte(woken)


def _next_turn(turns: Table, after: Any = None) -> Select[Any]:
    """The first tenant in turn order ``(last_turn, tenant)`` after ``after`` that may have work.

    Two index probes, each LIMIT 1: the ``ready`` index in order, and the
    ``waking`` tenants whose delayed work has come due (few: any write to the
    tenant moves it to ``ready``), the earlier of the two winning.
    """
    columns = (turns.c.tenant, turns.c.last_turn, turns.c.additions)
    past: list[ColumnElement[bool]] = []
    if after is not None:
        past.append(
            tuple_(turns.c.last_turn, turns.c.tenant) > tuple_(after.c.last_turn, after.c.tenant)
        )
    ready = (
        select(*columns)
        .where(
            turns.c.queue == _p("queue"),
            turns.c.queued > 0,
            turns.c.next_due_at <= turns.c.checked_at,
            *past,
        )
        .order_by(turns.c.last_turn, turns.c.tenant)
        .limit(_ONE)
    )
    waking = (
        select(*columns)
        .where(
            turns.c.queue == _p("queue"),
            turns.c.queued > 0,
            turns.c.next_due_at > turns.c.checked_at,
            turns.c.next_due_at <= _p("now", _TZ),
            *past,
        )
        .order_by(turns.c.last_turn, turns.c.tenant)
        .limit(_ONE)
    )
    if after is not None:
        # The previous tenant comes from the enclosing walk, not a FROM of its own.
        ready, waking = ready.correlate(after), waking.correlate(after)
    both = union_all(ready, waking).subquery("candidates")
    return (
        select(both.c.tenant, both.c.last_turn, both.c.additions)
        .order_by(both.c.last_turn, both.c.tenant)
        .limit(_ONE)
    )


def rotation(turns: Table) -> CTE:
    """Tenants that may have due work, served longest ago first (ties: tenant, byte order).

    A recursive walk, one index probe per tenant, read lazily: the claim pulls
    tenants only until one yields an item, so its cost does not grow with the
    number of tenants waiting behind that one.
    """
    walk = _next_turn(turns).cte("rotation", recursive=True)
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
    queue_key = func.hashtext(_p("queue")).op("#")(table_key)
    return func.pg_try_advisory_xact_lock(queue_key, func.hashtext(tenant), type_=Boolean)


def claim(tables: Tables) -> Select[Any]:
    """Lease the best due item of the tenant served longest ago, and send that tenant back."""
    work, turns = tables.work, tables.queue_turns
    order = rotation(turns)
    candidate = work.alias("candidate")
    best = (
        select(candidate.c.id)
        .where(
            candidate.c.queue == _p("queue"),
            candidate.c.tenant == order.c.tenant,
            candidate.c.status == QUEUED,
            candidate.c.available_at <= _p("now", _TZ),
        )
        .order_by(candidate.c.priority.desc(), candidate.c.id)
        .limit(_ONE)
        .with_for_update(skip_locked=True)
        .lateral("best")
    )
    # No ORDER BY in either branch: the rotation's order drives the nested loop,
    # and LIMIT 1 stops it at the first tenant whose probe locked an item. The
    # lock filter references the rotation alone, so it runs on each tenant as
    # the walk yields it, before that tenant's item probe.
    free = (
        select(best.c.id, order.c.additions)
        .select_from(order.join(best, true()))
        .where(_try_tenant_lock(turns, order.c.tenant))
        .limit(_ONE)
    )
    # Every tenant at the front is being claimed by someone else: take work
    # anyway, from the first tenant that still has an unlocked due item.
    anyone = select(best.c.id, order.c.additions).select_from(order.join(best, true())).limit(_ONE)
    # The Append runs its branches in order and the LIMIT stops it at the
    # first row: the fallback runs only when the first branch found nothing.
    branches = union_all(free, anyone).subquery("branches")
    picked = select(branches.c.id, branches.c.additions).limit(_ONE).cte("picked")
    claimed = (
        update(work)
        .where(work.c.id == picked.c.id, work.c.status == QUEUED)
        .values(
            status=LEASED,
            attempts=work.c.attempts + 1,
            token=tables.token_seq.next_value(),
            worker_id=_p("worker"),
            expires_at=_p("expires_at", _TZ),
            updated_at=_p("now", _TZ),
        )
        .returning(*_item_columns(work), work.c.id, picked.c.additions.label("seen_additions"))
        .cte("claimed")
    )
    rest = work.alias("rest")
    next_due = (
        select(rest.c.available_at)
        .where(
            rest.c.queue == turns.c.queue,
            rest.c.tenant == turns.c.tenant,
            rest.c.status == QUEUED,
            rest.c.id != claimed.c.id,
        )
        .order_by(rest.c.available_at)
        .limit(_ONE)
        .scalar_subquery()
    )
    turn = (
        update(turns)
        .where(turns.c.queue == claimed.c.queue, turns.c.tenant == claimed.c.tenant)
        .values(
            last_turn=claimed.c.token,
            queued=turns.c.queued - 1,
            # LEAST ignores NULL: keep the old bound only when an addition raced us.
            next_due_at=func.least(
                next_due,
                case(
                    (turns.c.additions == claimed.c.seen_additions, null()),
                    else_=turns.c.next_due_at,
                ),
            ),
            checked_at=func.greatest(turns.c.checked_at, _p("now", _TZ)),
        )
        .cte("turn")
    )
    return select(*(claimed.c[c.name] for c in _item_columns(work))).add_cte(turn)


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
    order = rotation(turns)
    front = (
        select(order.c.tenant, order.c.last_turn, order.c.additions)
        .limit(_p("limit", BigInteger()))
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
    quota = (_p("limit", BigInteger()) - ranked_front.c.pos + ranked_front.c.tenants) // (
        ranked_front.c.tenants
    )
    candidate = work.alias("candidate")
    offered = (
        select(candidate.c.id, candidate.c.priority)
        .where(
            candidate.c.queue == _p("queue"),
            candidate.c.tenant == ranked_front.c.tenant,
            candidate.c.status == QUEUED,
            candidate.c.available_at <= _p("now", _TZ),
        )
        .order_by(candidate.c.priority.desc(), candidate.c.id)
        .limit(quota)
        .with_for_update(skip_locked=True)
        .lateral("offered")
    )
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
        select(offered.c.id, ranked_front.c.additions, round_, ranked_front.c.pos)
        .select_from(ranked_front.join(offered, true()))
        .order_by(literal_column("round"), ranked_front.c.pos)
        .limit(_p("limit", BigInteger()))
        .subquery("picked")
    )
    # Tokens are drawn as the ordered rows come out: in claim order.
    tokens = select(
        picked.c.id, picked.c.additions, tables.token_seq.next_value().label("token")
    ).cte("tokens")
    # The rows are found by primary key whatever the statistics say. ``picked`` locked
    # them and checked ``status`` in this statement, so the update repeats neither: a
    # ``status`` condition here let a planner that thinks few items are queued (a table
    # filled since its last ANALYZE) scan every queued row through the due index.
    ids = select(func.array_agg(tokens.c.id)).scalar_subquery()
    claimed = (
        update(work)
        .where(
            work.c.id == any_(cast(ids, ARRAY(BigInteger))),
            work.c.id == tokens.c.id,
        )
        .values(
            status=LEASED,
            attempts=work.c.attempts + 1,
            token=tokens.c.token,
            worker_id=_p("worker"),
            expires_at=_p("expires_at", _TZ),
            updated_at=_p("now", _TZ),
        )
        .returning(*_item_columns(work), work.c.id, tokens.c.additions.label("seen_additions"))
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
    rest = work.alias("rest")
    gone = claimed.alias("gone")
    next_due = (
        select(rest.c.available_at)
        .where(
            rest.c.queue == turns.c.queue,
            rest.c.tenant == turns.c.tenant,
            rest.c.status == QUEUED,
            ~select(gone.c.id).where(gone.c.id == rest.c.id).exists(),
        )
        .order_by(rest.c.available_at)
        .limit(_ONE)
        .scalar_subquery()
    )
    turn = (
        update(turns)
        .where(
            turns.c.queue == served.c.queue,
            turns.c.tenant == served.c.tenant,
            turns.c.queue == locked_turns.c.queue,
            turns.c.tenant == locked_turns.c.tenant,
        )
        .values(
            last_turn=served.c.last_token,
            queued=turns.c.queued - served.c.taken,
            # LEAST ignores NULL: keep the old bound only when an addition raced us.
            next_due_at=func.least(
                next_due,
                case(
                    (turns.c.additions == served.c.seen_additions, null()),
                    else_=turns.c.next_due_at,
                ),
            ),
            checked_at=func.greatest(turns.c.checked_at, _p("now", _TZ)),
        )
        .cte("turn")
    )
    return (
        select(*(claimed.c[c.name] for c in _item_columns(work)))
        .order_by(claimed.c.token)
        .add_cte(turn)
    )


def get_item(work: Table) -> Select[Any]:
    return select(*_item_columns(work)).where(*_item_key(work))


def heartbeat(tables: Tables) -> Update:
    work = tables.work
    return (
        update(work)
        .where(*_fenced(work))
        .values(token=tables.token_seq.next_value(), expires_at=_p("expires_at", _TZ))
        .returning(*_item_columns(work))
    )


def ack(work: Table) -> Update:
    return (
        update(work)
        .where(*_fenced(work))
        .values(
            status=DONE,
            token=null(),
            worker_id=null(),
            expires_at=null(),
            updated_at=_p("now", _TZ),
        )
        .returning(*_item_columns(work))
    )


def ack_many(work: Table) -> Update:
    """``ack`` for every lease of the batch (parallel arrays) still holding its item; a
    stale lease matches no row and is left out of the answer."""
    held = (
        func.unnest(
            cast(_p("tenants"), ARRAY(Text)),
            cast(_p("item_ids"), ARRAY(Text)),
            cast(_p("tokens"), ARRAY(BigInteger)),
        )
        .table_valued("tenant", "item_id", "token")
        .render_derived(name="held")
    )
    return (
        update(work)
        .where(
            work.c.queue == _p("queue"),
            work.c.tenant == held.c.tenant,
            work.c.item_id == held.c.item_id,
            work.c.status == LEASED,
            work.c.token == held.c.token,
        )
        .values(
            status=DONE,
            token=null(),
            worker_id=null(),
            expires_at=null(),
            updated_at=_p("now", _TZ),
        )
        .returning(*_item_columns(work))
    )


def _settled(tables: Tables, settle: Update) -> Select[Any]:
    """Run a fenced settle that may put the item back in the queue, and wake its tenant."""
    settled = settle.returning(*_item_columns(tables.work)).cte("settled")
    woken = _turn_added(tables.queue_turns, settled, grouped=False).cte("woken")
    return select(*(settled.c[c.name] for c in _item_columns(tables.work))).add_cte(woken)


def fail(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*_fenced(work))
        .values(
            status=_p("status"),
            last_error=_p("error", Text()),
            available_at=_p("available_at", _TZ),
            token=null(),
            worker_id=null(),
            expires_at=null(),
            updated_at=_p("now", _TZ),
        ),
    )


def release(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*_fenced(work))
        .values(
            status=QUEUED,
            attempts=work.c.attempts - 1,
            available_at=_p("now", _TZ),
            token=null(),
            worker_id=null(),
            expires_at=null(),
            updated_at=_p("now", _TZ),
        ),
    )


def requeue(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*_item_key(work), work.c.status == DEAD)
        .values(status=QUEUED, attempts=0, available_at=_p("now", _TZ), updated_at=_p("now", _TZ)),
    )


def reap(tables: Tables) -> Select[Any]:
    """Up to ``p_batch`` lapsed leases back to the queue, or dead per the policy's limit."""
    work = tables.work
    expired = (
        select(work.c.id, work.c.expires_at, work.c.token)
        .where(
            work.c.queue == _p("queue"),
            work.c.status == LEASED,
            work.c.expires_at <= _p("now", _TZ),
        )
        .order_by(work.c.expires_at, work.c.token)
        .limit(_p("batch", BigInteger()))
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    moved = (
        update(work)
        .where(
            work.c.id == expired.c.id,
            work.c.status == LEASED,
            work.c.expires_at <= _p("now", _TZ),
        )
        .values(
            # QueuePolicy.lapse_is_dead(attempts) is attempts >= max_attempts.
            status=case((work.c.attempts >= _p("max_attempts", Integer()), DEAD), else_=QUEUED),
            last_error=LEASE_EXPIRED,
            available_at=_p("now", _TZ),
            token=null(),
            worker_id=null(),
            expires_at=null(),
            updated_at=_p("now", _TZ),
        )
        .returning(
            *_item_columns(work),
            expired.c.expires_at.label("lapsed_at"),
            expired.c.token.label("lapsed_token"),
        )
        .cte("moved")
    )
    woken = _turn_added(tables.queue_turns, moved, grouped=True).cte("woken")
    names = [c.name for c in _item_columns(work)] + ["lapsed_at", "lapsed_token"]
    return select(*(moved.c[name] for name in names)).add_cte(woken)


def dead_letters(work: Table) -> Select[Any]:
    return (
        select(*_item_columns(work))
        .where(work.c.queue == _p("queue"), work.c.tenant == _p("tenant"), work.c.status == DEAD)
        .order_by(work.c.updated_at, work.c.item_id)
        .limit(_p("limit", BigInteger()))
    )


def purge_dead(work: Table) -> Select[Any]:
    """Delete the tenant's dead items (the ``dead`` partial index finds them) and count them.

    No ``adk_queue_turns`` row changes: it counts queued items only.
    """
    purged = (
        delete(work)
        .where(work.c.queue == _p("queue"), work.c.tenant == _p("tenant"), work.c.status == DEAD)
        .returning(work.c.id)
        .cte("purged")
    )
    return select(func.count()).select_from(purged)


def stats(work: Table) -> Select[Any]:
    return (
        select(work.c.tenant, work.c.status, func.count())
        .where(work.c.queue == _p("queue"), work.c.status.in_([QUEUED, LEASED, DEAD]))
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
        turns.c.queue == _p("queue"),
        turns.c.queued > 0,
        turns.c.next_due_at > turns.c.checked_at,
        turns.c.next_due_at > _p("now", _TZ),
    )


@dataclass(frozen=True, slots=True)
class _Statements:
    enqueue: Select[Any]
    enqueue_many: Select[Any]
    claim: Select[Any]
    claim_many: Select[Any]
    get_item: Select[Any]
    heartbeat: Update
    ack: Update
    ack_many: Update
    fail: Select[Any]
    release: Select[Any]
    requeue: Select[Any]
    reap: Select[Any]
    dead_letters: Select[Any]
    purge_dead: Select[Any]
    stats: Select[Any]
    next_due: Select[Any]

    @classmethod
    def build(cls, tables: Tables) -> _Statements:
        return cls(
            enqueue=enqueue(tables),
            enqueue_many=enqueue_many(tables),
            claim=claim(tables),
            claim_many=claim_many(tables),
            get_item=get_item(tables.work),
            heartbeat=heartbeat(tables),
            ack=ack(tables.work),
            ack_many=ack_many(tables.work),
            fail=fail(tables),
            release=release(tables),
            requeue=requeue(tables),
            reap=reap(tables),
            dead_letters=dead_letters(tables.work),
            purge_dead=purge_dead(tables.work),
            stats=stats(tables.work),
            next_due=next_due(tables.queue_turns),
        )


_STATEMENTS: dict[Tables, _Statements] = {}


def _statements(tables: Tables) -> _Statements:
    built = _STATEMENTS.get(tables)
    if built is None:
        built = _STATEMENTS[tables] = _Statements.build(tables)
    return built


def _channel(tables: Tables, queue: str) -> str:
    """The LISTEN/NOTIFY channel of ``queue`` on ``tables``: short, an identifier, and apart
    for every table naming and queue sharing a database."""
    work = tables.work
    name = f"{work.schema}.{work.name}" if work.schema else work.name
    return f"statepact_work_{zlib.crc32(f'{name}/{queue}'.encode()):08x}"


class _ListenWatch:
    """LISTEN on the queue's channel, on one connection of the engine held while watching.

    A notification sets an event the next ``wait`` returns on. The connection is
    opened on the first ``wait`` and again after it drops (a notification sent
    meanwhile is lost: the caller's timeout bounds the delay), and given back on
    ``close``.
    """

    def __init__(self, engine: AsyncEngine, channel: str) -> None:
        self._engine = engine
        self._channel = channel
        self._arrived = asyncio.Event()
        self._conn: AsyncConnection | None = None
        self._driver: Any = None

    def _notified(self, *_args: Any) -> None:
        self._arrived.set()

    def _dropped(self, *_args: Any) -> None:
        self._driver = None

    async def _listen(self) -> None:
        conn = await self._engine.connect()
        try:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            if driver is None:  # pragma: no cover - a checked-out connection has its driver's
                raise SQLAlchemyError("the pooled connection has no driver connection")
            await driver.add_listener(self._channel, self._notified)
            driver.add_termination_listener(self._dropped)
        except BaseException:
            await finish(conn.invalidate())
            raise
        self._conn, self._driver = conn, driver

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._driver is None or self._driver.is_closed():
            await finish(self.close())
            try:
                await self._listen()
            except (OSError, SQLAlchemyError, asyncpg.PostgresError):
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                return False
        if self._arrived.is_set():
            self._arrived.clear()
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - loop.time()))
        woken = self._arrived.is_set()
        self._arrived.clear()
        return woken

    async def close(self) -> None:
        conn, driver = self._conn, self._driver
        self._conn = self._driver = None
        if conn is None:
            return
        try:
            if driver is not None and not driver.is_closed():
                await driver.remove_listener(self._channel, self._notified)
            await conn.close()
        except (OSError, SQLAlchemyError, asyncpg.PostgresError):
            await conn.invalidate()


def _item(row: RowMapping) -> WorkItem:
    return WorkItem(
        queue=row["queue"],
        tenant=row["tenant"],
        item_id=row["item_id"],
        payload=decode_json(row["payload"]),
        priority=row["priority"],
        available_at=row["available_at"],
        attempts=row["attempts"],
        status=ItemStatus(row["status"]),
        last_error=row["last_error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class PostgresWorkQueue(BaseWorkQueue):
    """The ``WorkQueue`` on PostgreSQL, through SQLAlchemy Core (asyncpg).

    ``PostgresWorkQueue(engine, clock=, settings=, policy=, tables=)`` skips the
    schema check; ``await PostgresWorkQueue.open(engine, ...)`` runs ``verify()``
    first. The queue's name is ``settings.queue_name``. ``bound(session)`` runs
    inside a transaction the caller opened (enqueue beside the state change it
    belongs to). Size the engine's pool to the worker count: a worker holds a
    connection only for the statement, but every in-flight call needs one.
    """

    def __init__(
        self,
        engine: AsyncEngine | AsyncConnection,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        policy: QueuePolicy | None = None,
        tables: StateTables | None = None,
    ) -> None:
        self._settings = settings or PostgresStoreSettings()
        super().__init__(
            clock=clock,
            policy=policy,
            name=self._settings.queue_name,
            max_value_bytes=self._settings.max_value_bytes,
        )
        self._tables = tables_for(tables, self._settings.db_schema)
        self._sql = _statements(self._tables)
        self._executor: Executor = EngineExecutor(
            engine, policy=self._settings.retry_policy, unavailable=_unavailable, what="queue"
        )
        # watch() listens on its own connection of the engine (a bound clone keeps it).
        self._listen_on = engine if isinstance(engine, AsyncEngine) else None
        self._channel = _channel(self._tables, self.name)

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine | AsyncConnection,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        policy: QueuePolicy | None = None,
        tables: StateTables | None = None,
    ) -> Self:
        """Run ``verify()`` (schema version, ``statement_timeout``), then build the queue."""
        from statepact.storage.postgres.verify import verify

        settings = settings or PostgresStoreSettings()
        await verify(engine, tables=tables, db_schema=settings.db_schema)
        return cls(engine, clock=clock, settings=settings, policy=policy, tables=tables)

    def bound(self, session: AsyncSession | AsyncConnection) -> Self:
        """This queue, inside the transaction ``session`` already opened; it retries nothing."""
        clone = copy.copy(self)
        clone._executor = BoundExecutor(session, unavailable=_unavailable, what="queue")
        return clone

    @property
    def tables(self) -> Tables:
        return self._tables

    def __repr__(self) -> str:
        mode = "bound" if self._executor.bound else "engine"
        return f"PostgresWorkQueue(name={self.name!r}, work={self._tables.work.name!r}, {mode})"

    def _key(self, tenant: str, item_id: str) -> dict[str, Any]:
        return {"p_queue": self.name, "p_tenant": tenant, "p_item_id": item_id}

    @asynccontextmanager
    async def _watch(self) -> AsyncIterator[WorkWatch]:
        if self._listen_on is None:
            yield SleepWatch()
            return
        watch = _ListenWatch(self._listen_on, self._channel)
        try:
            yield watch
        finally:
            await finish(watch.close())

    # -- enqueue and claim ------------------------------------------------

    async def _enqueue(self, item: WorkItem, payload: bytes) -> WorkItem:
        params = {
            **self._key(item.tenant, item.item_id),
            "p_channel": self._channel,
            "p_payload": payload.decode("utf-8"),
            "p_priority": item.priority,
            "p_available_at": item.available_at,
            "p_now": item.created_at,
        }

        async def work(conn: Runner) -> WorkItem:
            inserted = (await conn.execute(self._sql.enqueue, params)).scalar()
            if inserted:
                return item.model_copy(update={"payload": decode_json(payload)})
            row = (await conn.execute(self._sql.get_item, params)).mappings().first()
            if row is None:  # pragma: no cover - the conflicting row cannot vanish: no deletes
                raise QueueUnavailableError(
                    f"enqueue of item {item.item_id!r}: it existed, then could not be read"
                )
            return _item(row)

        return await self._executor.run(work, idempotent=True)

    async def _enqueue_many(self, batch: list[tuple[WorkItem, bytes]]) -> list[WorkItem]:
        first = batch[0][0]
        params = {
            "p_queue": self.name,
            "p_channel": self._channel,
            "p_now": first.created_at,
            "p_tenants": [item.tenant for item, _ in batch],
            "p_item_ids": [item.item_id for item, _ in batch],
            "p_payloads": [payload.decode("utf-8") for _, payload in batch],
            "p_priorities": [item.priority for item, _ in batch],
            "p_available": [item.available_at for item, _ in batch],
        }

        async def work(conn: Runner) -> list[WorkItem]:
            rows = (await conn.execute(self._sql.enqueue_many, params)).mappings().all()
            found = {
                row["ord"]: batch[row["ord"] - 1][0] if row["status"] is None else _item(row)
                for row in rows
            }
            if len(found) < len(batch):
                # Inserted by a concurrent enqueue after this statement's snapshot.
                for place, (item, _) in enumerate(batch, start=1):
                    if place not in found:
                        key = self._key(item.tenant, item.item_id)
                        row = (await conn.execute(self._sql.get_item, key)).mappings().first()
                        if row is None:  # pragma: no cover - no deletes: it cannot vanish
                            raise QueueUnavailableError(
                                f"enqueue of item {item.item_id!r}: it existed, then could "
                                "not be read"
                            )
                        found[place] = _item(row)
            return [found[place] for place in range(1, len(batch) + 1)]

        return await self._executor.run(work, idempotent=True)

    async def _claim(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        expires_at = now + timedelta(seconds=seconds)
        params = {
            "p_queue": self.name,
            "p_now": now,
            "p_worker": worker_id,
            "p_expires_at": expires_at,
        }

        async def work(conn: Runner) -> list[Lease]:
            rows: list[RowMapping] = []
            if limit > 1:
                batch = {**params, "p_limit": limit}
                rows = list((await conn.execute(self._sql.claim_many, batch)).mappings().all())
            # A short batch (a tenant with less than its share, items other claims hold):
            # claim the rest one by one until the limit or until nothing is due.
            while len(rows) < limit:
                row = (await conn.execute(self._sql.claim, params)).mappings().first()
                if row is None:
                    break
                rows.append(row)
            return [
                Lease(
                    item=_item(row),
                    worker_id=worker_id,
                    token=row["token"],
                    expires_at=expires_at,
                    lease_seconds=seconds,
                )
                for row in rows
            ]

        return await self._executor.run(work, idempotent=False)

    # -- settle -----------------------------------------------------------

    def _fence(self, lease: Lease) -> dict[str, Any] | None:
        """The parameters of a fenced write, or ``None`` when the lease names another queue."""
        if lease.item.queue != self.name:
            return None
        return {**self._key(lease.item.tenant, lease.item.item_id), "p_token": lease.token}

    def _lost(self, lease: Lease, action: str) -> LeaseLostError:
        return lease_lost(self.name, lease, action)

    async def _settle(
        self, lease: Lease, action: str, statement: Any, extra: Mapping[str, Any]
    ) -> RowMapping:
        fence = self._fence(lease)
        if fence is None:
            raise self._lost(lease, action)
        params = {**fence, **extra}

        async def work(conn: Runner) -> RowMapping | None:
            return (await conn.execute(statement, params)).mappings().first()

        row = await self._executor.run(work, idempotent=False)
        if row is None:
            raise self._lost(lease, action)
        return row

    async def _heartbeat(self, lease: Lease, now: datetime, expires_at: datetime) -> Lease:
        row = await self._settle(
            lease, "heartbeat", self._sql.heartbeat, {"p_expires_at": expires_at}
        )
        return Lease(
            item=_item(row),
            worker_id=lease.worker_id,
            token=row["token"],
            expires_at=expires_at,
            lease_seconds=lease.lease_seconds,
        )

    async def _ack(self, lease: Lease, now: datetime) -> WorkItem:
        return _item(await self._settle(lease, "ack", self._sql.ack, {"p_now": now}))

    async def _ack_many(
        self, leases: list[Lease], now: datetime
    ) -> list[WorkItem | LeaseLostError]:
        # A lease of another queue is lost at once; the rest go in one statement.
        mine = [lease for lease in leases if lease.item.queue == self.name]
        acked: dict[tuple[str, str], WorkItem] = {}
        if mine:
            params = {
                "p_queue": self.name,
                "p_now": now,
                "p_tenants": [lease.item.tenant for lease in mine],
                "p_item_ids": [lease.item.item_id for lease in mine],
                "p_tokens": [lease.token for lease in mine],
            }

            async def work(conn: Runner) -> list[RowMapping]:
                return list((await conn.execute(self._sql.ack_many, params)).mappings().all())

            for row in await self._executor.run(work, idempotent=False):
                acked[(row["tenant"], row["item_id"])] = _item(row)
        done: list[WorkItem | LeaseLostError] = []
        for lease in leases:
            item = None
            if lease.item.queue == self.name:
                item = acked.get((lease.item.tenant, lease.item.item_id))
            done.append(self._lost(lease, "ack") if item is None else item)
        return done

    async def _fail(
        self, lease: Lease, now: datetime, error: str, outcome: FailOutcome
    ) -> WorkItem:
        status = ItemStatus.DEAD if outcome.dead else ItemStatus.QUEUED
        extra = {
            "p_status": status.value,
            "p_error": error,
            "p_available_at": outcome.available_at,
            "p_now": now,
        }
        return _item(await self._settle(lease, "fail", self._sql.fail, extra))

    async def _release(self, lease: Lease, now: datetime) -> WorkItem:
        return _item(await self._settle(lease, "release", self._sql.release, {"p_now": now}))

    async def _reap(self, now: datetime) -> list[WorkItem]:
        params = {
            "p_queue": self.name,
            "p_now": now,
            "p_batch": REAP_BATCH,
            "p_max_attempts": self.policy.max_attempts,
        }

        async def work(conn: Runner) -> list[RowMapping]:
            rows: list[RowMapping] = []
            while True:
                batch = list((await conn.execute(self._sql.reap, params)).mappings())
                rows.extend(batch)
                if len(batch) < REAP_BATCH:
                    return rows

        rows = await self._executor.run(work, idempotent=False)
        # In the order the leases lapsed, as the memory reference returns them.
        rows.sort(key=lambda row: (row["lapsed_at"], row["lapsed_token"]))
        return [_item(row) for row in rows]

    # -- inspect and recover ----------------------------------------------

    async def _dead_letters(self, tenant: str, limit: int) -> list[WorkItem]:
        params = {"p_queue": self.name, "p_tenant": tenant, "p_limit": limit}

        async def work(conn: Runner) -> list[WorkItem]:
            result = await conn.execute(self._sql.dead_letters, params)
            return [_item(row) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True)

    async def _requeue(self, tenant: str, item_id: str, now: datetime) -> WorkItem:
        params = {**self._key(tenant, item_id), "p_now": now}

        async def work(conn: Runner) -> WorkItem:
            row = (await conn.execute(self._sql.requeue, params)).mappings().first()
            if row is not None:
                return _item(row)
            found = (await conn.execute(self._sql.get_item, params)).mappings().first()
            state = "does not exist" if found is None else f"is {found['status']}, not dead"
            raise ValueError(
                f"item_id: {item_id!r} of tenant {tenant!r} in queue {self.name!r} {state}; "
                "only a dead item can be requeued"
            )

        return await self._executor.run(work, idempotent=False)

    async def _purge_dead(self, tenant: str) -> int:
        params = {"p_queue": self.name, "p_tenant": tenant}

        async def work(conn: Runner) -> int:
            return int((await conn.execute(self._sql.purge_dead, params)).scalar_one())

        # Not retried once sent: a resend after a lost reply would report only what the
        # first attempt left. Purging again is harmless, so the caller may just call again.
        return await self._executor.run(work, idempotent=False)

    async def _get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        params = self._key(tenant, item_id)

        async def work(conn: Runner) -> WorkItem | None:
            row = (await conn.execute(self._sql.get_item, params)).mappings().first()
            return None if row is None else _item(row)

        return await self._executor.run(work, idempotent=True)

    async def _stats(self) -> QueueStats:
        async def work(conn: Runner) -> list[Any]:
            return list(await conn.execute(self._sql.stats, {"p_queue": self.name}))

        counts: dict[str, dict[str, int]] = {}
        for tenant, status, count in await self._executor.run(work, idempotent=True):
            counts.setdefault(tenant, {})[status] = int(count)
        tenants = {
            tenant: TenantQueueStats(
                queued=found.get("queued", 0),
                leased=found.get("leased", 0),
                dead=found.get("dead", 0),
            )
            for tenant, found in sorted(counts.items())
        }
        return QueueStats(queue=self.name, tenants=tenants)

    async def _next_due(self, now: datetime) -> datetime | None:
        async def work(conn: Runner) -> datetime | None:
            due: datetime | None = (
                await conn.execute(self._sql.next_due, {"p_queue": self.name, "p_now": now})
            ).scalar_one()
            return due

        return await self._executor.run(work, idempotent=True)


def _unavailable(message: str) -> QueueUnavailableError:
    return QueueUnavailableError(message)
