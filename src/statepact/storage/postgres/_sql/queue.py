"""The statements of ``PostgresWorkQueue``: ``adk_work`` items, the ``adk_queue_turns`` rotation.

A claim (``claim``, ``claim_many``) is one statement: a lazy walk of the
rotation, a ``FOR UPDATE SKIP LOCKED`` probe per tenant with every predicate
on the locked relation, the lease and the tenant's new turn. Why each step is
where it is, and how claims and settles avoid deadlocks:
docs/backings.md#the-claim.

These statements must never use a window function over the backlog or scan it
in a claim (``claim_many`` numbers only the rows its tenants offered, at most
``limit`` each), and never wait on an advisory lock (they only try one).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Integer,
    Select,
    Table,
    Text,
    Update,
    any_,
    case,
    cast,
    column,
    delete,
    func,
    literal_column,
    null,
    select,
    text,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import dialect as _postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement, Grouping
from sqlalchemy.sql.selectable import CTE
from sqlalchemy.types import UserDefinedType

from statepact.storage.postgres._sql import TZ, param, unseen_param
from statepact.storage.postgres.schema import Tables

__all__ = ["QueueStatements", "statements"]

# Status constants are rendered as SQL literals, not bound: the planner matches
# a partial index (WHERE status = 'queued') only against a constant.
QUEUED: ColumnElement[str] = literal_column("'queued'")
LEASED: ColumnElement[str] = literal_column("'leased'")
DONE: ColumnElement[str] = literal_column("'done'")
DEAD: ColumnElement[str] = literal_column("'dead'")
# A constant LIMIT, so a generic plan of the prepared claim knows it is one row.
_ONE = literal_column("1", Integer)
# Every other number in a statement is a literal too, never a bound parameter: a prepared
# statement's generic plan (the one PostgreSQL caches after five executions, instead of
# planning each call again) matches a partial index (WHERE queued > 0) only against a
# constant, so a bound 0 left the claim planned anew on every call.
_ZERO = literal_column("0", BigInteger)


class _Tid(UserDefinedType[Any]):
    """PostgreSQL's ``tid``: a row version's place (``ctid``)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "TID"


# Quotes a table's name where a statement names its ctid.
_PREPARER = _postgresql().identifier_preparer  # type: ignore[no-untyped-call]


def _ctid(work: Table) -> ColumnElement[Any]:
    """The ``ctid`` of the row an UPDATE of ``work`` targets (its own, not an alias's)."""
    return literal_column(f"{_PREPARER.quote(work.name)}.ctid")


class _Regclass(UserDefinedType[Any]):
    """PostgreSQL's ``regclass``, for a cast only (``nextval`` takes one)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "REGCLASS"


def _identity_sequence(work: Table) -> ColumnElement[Any]:
    """The sequence of ``work.id``'s identity, looked up once per statement (an InitPlan)."""
    name = _PREPARER.format_table(work).replace("'", "''")
    lookup = func.pg_get_serial_sequence(literal_column(f"'{name}'"), literal_column("'id'"))
    return select(cast(lookup, _Regclass())).scalar_subquery()


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


def _queue_name() -> Any:
    """The queue's name where a worker's statements (claims, acks, heartbeats, settles)
    compare to it, unseen by their plans (:func:`unseen_param`).

    Its statistics rarely hold a queue's name (ANALYZE saw other queues, or the
    queue empty), so the planner rated every custom plan cheaper and planned the
    worker's statements on each call. Prepared and rolled back on 5,000 queued items,
    that was about half of each call: ``claim_many`` of 10 took 1.98 ms against
    1.12 ms, ``ack_many`` of 9 0.62 ms against 0.31 ms; a worker draining 5,000
    items at concurrency 10 went from about 2,650 to 3,850 a second (in the harness,
    1.11x pgqueuer's 10-way drain, 0.86x before: docs/benchmarks.md). The plans kept
    are safe whatever the table holds: each finds its rows by key (``ack_many``, the
    fenced settles), by ``ctid`` (both claims: a claim that joined its pick by primary
    key kept, from a small table, a scan of every queued row) or through the partial
    claim index (each tenant's probe). ``reap`` keeps the constant: its batch is a
    ``LIMIT`` parameter, which a generic plan would guess.
    """
    return unseen_param("queue", Text())


def _item_key(work: Table) -> list[ColumnElement[bool]]:
    return [
        work.c.queue == _queue_name(),
        work.c.tenant == param("tenant"),
        work.c.item_id == param("item_id"),
    ]


def _fenced(work: Table) -> list[ColumnElement[bool]]:
    """The item is leased under exactly the lease's token."""
    return [*_item_key(work), work.c.status == LEASED, work.c.token == param("token", BigInteger())]


def _lease_ended() -> dict[str, Any]:
    """The columns of a lease that ended (settled or reaped): no holder, no token, no expiry."""
    return {
        "token": null(),
        "worker_id": null(),
        "expires_at": null(),
        "updated_at": param("now", TZ),
    }


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
                param("now", TZ),
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
            param("now", TZ),
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


def enqueue(tables: Tables) -> Select[Any]:
    """Insert the item unless ``(queue, tenant, item_id)`` exists, and wake its tenant."""
    work, turns = tables.work, tables.queue_turns
    inserted = (
        pg_insert(work)
        .values(
            queue=param("queue"),
            tenant=param("tenant"),
            item_id=param("item_id"),
            payload=cast(param("payload", Text()), JSON),
            priority=param("priority", Integer()),
            status=QUEUED,
            attempts=_ZERO,
            available_at=param("available_at", TZ),
            created_at=param("now", TZ),
            updated_at=param("now", TZ),
        )
        .on_conflict_do_nothing(index_elements=[work.c.queue, work.c.tenant, work.c.item_id])
        .returning(work.c.queue, work.c.tenant, work.c.available_at, work.c.status)
        .cte("inserted")
    )
    woken = _turn_added(turns, inserted, grouped=False).cte("woken")
    # Watchers LISTEN on the queue's channel; PostgreSQL delivers at commit (the caller's,
    # for a bound enqueue), once per transaction and channel.
    return (
        select(func.count(), func.pg_notify(param("channel"), literal_column("''")))
        .select_from(inserted)
        .add_cte(woken)
    )


# The columns of a batch, each a JSON array of one value per item, in this order.
_BATCH_COLUMNS = ("tenants", "item_ids", "payloads", "priorities", "available", "created")


def _batch_insert(tables: Tables, *, skip_stored: bool) -> tuple[CTE, CTE]:
    """The batch (parallel JSON arrays, one bind each whatever its length) and the insert of
    its items, in ``(tenant, item_id)`` byte order (so two batches sharing ids wait on
    each other in one order, never in a cycle), returning what the turns upsert needs.

    ``skip_stored`` inserts only the items whose ``(queue, tenant, item_id)`` is new
    (``ON CONFLICT DO NOTHING``); without it an item already stored fails the statement
    (a unique violation: nothing is written), and the insert skips the probe of the
    unique index ``ON CONFLICT`` makes for every row before inserting it (a fifth to a
    quarter of a bulk load's statement).
    """
    work = tables.work
    # The batch's moments, each once (a batch's items share one or two): every item names
    # its ``available_at`` and ``created_at`` by place in ``p_times`` (from 1).
    times = Grouping(cast(param("times"), ARRAY(TZ)))  # (CAST(...))[i]: a subscript needs it
    # Each column of the batch is one JSON array, read in step with the others (ROWS FROM
    # zips the functions' rows): asyncpg checks every element of an array parameter for
    # nesting, in Python (13 ms for the six arrays of 5,000 items, against 2.5 ms to build
    # the six JSON texts, which it sends as they are).
    elements = ", ".join(
        f"json_array_elements{'' if name == 'payloads' else '_text'}(CAST(:p_{name} AS JSON))"
        for name in _BATCH_COLUMNS
    )
    batch = (
        text(
            f"SELECT * FROM ROWS FROM ({elements}) WITH ORDINALITY AS unnested("
            "tenant, item_id, payload, priority, available_place, created_place, ord)"
        )
        .bindparams(*(param(name, Text()) for name in _BATCH_COLUMNS))
        .columns(
            column("tenant", Text),
            column("item_id", Text),
            column("payload", JSON),
            column("priority", Text),
            column("available_place", Text),
            column("created_place", Text),
            column("ord", BigInteger),
        )
        # Read by the insert and by the anti-join of the skipped items: unnested once.
        .cte("batch")
        .prefix_with("MATERIALIZED")
    )
    created = times[cast(batch.c.created_place, Integer)]
    # Each item's id drawn in the batch's order (its enqueue order: a tenant's items are
    # claimed by id), before the rows are inserted in key order; the ids are the column's
    # own identity sequence's, given explicitly (OVERRIDING SYSTEM VALUE).
    numbered = (
        select(
            func.nextval(_identity_sequence(work)).label("id"),
            param("queue", work.c.queue.type).label("queue"),
            batch.c.tenant,
            batch.c.item_id,
            batch.c.payload,
            cast(batch.c.priority, Integer).label("priority"),
            times[cast(batch.c.available_place, Integer)].label("available_at"),
            created.label("created_at"),
        )
        .order_by(batch.c.ord)
        .cte("numbered")
        .prefix_with("MATERIALIZED")
    )
    names = ("id", "queue", "tenant", "item_id", "payload", "priority", "available_at")
    rows = text(
        f"OVERRIDING SYSTEM VALUE SELECT {', '.join(names)}, {QUEUED}, {_ZERO}, "
        "created_at, created_at FROM numbered "
        'ORDER BY tenant COLLATE "C", item_id COLLATE "C"'
    ).columns(*(numbered.c[name] for name in names))
    insert = (
        pg_insert(work)
        .from_select(
            [
                *names,
                "status",
                "attempts",
                "created_at",
                "updated_at",
            ],
            rows,
        )
        .add_cte(numbered)  # the text above reads it: named here, so that WITH holds it
    )
    if skip_stored:
        insert = insert.on_conflict_do_nothing(
            index_elements=[work.c.queue, work.c.tenant, work.c.item_id]
        )
    inserted = insert.returning(
        work.c.queue, work.c.tenant, work.c.item_id, work.c.available_at, work.c.status
    ).cte("inserted")
    return batch, inserted


def enqueue_new(tables: Tables) -> Select[Any]:
    """Insert every item of the batch, wake their tenants and the queue's watchers, in one
    statement, or fail with a unique violation (writing nothing) if any is stored already:
    :func:`enqueue_many` without its ``ON CONFLICT``, for a batch expected to be new, sent
    first by a queue that can send ``enqueue_many`` after a failure (not in a caller's
    transaction, which the failure would abort). Answers one row, the insert's count.
    """
    _, inserted = _batch_insert(tables, skip_stored=False)
    woken = _turn_added(tables.queue_turns, inserted, grouped=True).cte("woken")
    return (
        select(func.count(), func.pg_notify(param("channel"), literal_column("''")))
        .select_from(inserted)
        .add_cte(woken)
    )


def enqueue_many(tables: Tables) -> Select[Any]:
    """Insert every item of the batch whose ``(queue, tenant, item_id)`` is new, wake
    their tenants and the queue's watchers, in one statement; answer the items that were
    not inserted, each with its place in the batch (``ord``); with none skipped, one row
    of NULLs (the notify's).

    The batch and its insert are ``_batch_insert``'s, and the turns rows are upserted
    in ``(queue, tenant)`` order like every other multi-row write here. The answer
    holds only the items the insert skipped: an item stored before the statement
    comes with its row, read by key (an index probe per skipped item, never a scan of
    the queue); one a concurrent enqueue inserted after the statement's snapshot
    comes with its place only (its columns NULL), and the caller reads it with a
    second statement. Every other item was stored as sent.
    """
    work, turns = tables.work, tables.queue_turns
    batch, inserted = _batch_insert(tables, skip_stored=True)
    woken = _turn_added(turns, inserted, grouped=True).cte("woken")
    # The items the insert skipped (usually none): an anti-join of two small sets, run only
    # when the insert stored fewer rows than the batch holds (a one-time filter).
    some_skipped = select(func.count()).select_from(
        inserted
    ).scalar_subquery() < func.json_array_length(cast(param("tenants", Text()), JSON))
    skipped = (
        select(batch.c.ord, batch.c.tenant, batch.c.item_id)
        .where(
            some_skipped,
            ~select(inserted.c.item_id)
            .where(inserted.c.tenant == batch.c.tenant, inserted.c.item_id == batch.c.item_id)
            .exists(),
        )
        .cte("skipped")
    )
    old = work.alias("old")
    stored = (
        select(*_item_columns(work, old))
        .where(
            old.c.queue == param("queue"),
            old.c.tenant == skipped.c.tenant,
            old.c.item_id == skipped.c.item_id,
        )
        # One row by key; the LIMIT keeps the lateral a probe per skipped item (unlimited,
        # the planner may flatten it into a join that reads every row of the queue).
        .limit(_ONE)
        .lateral("stored")
    )
    # Watchers LISTEN on the queue's channel. The notify is the outer side of the join, so
    # it runs whatever the one-time filter of ``skipped`` decides: with nothing skipped the
    # answer is its one row, ``ord`` NULL.
    notified = select(func.pg_notify(param("channel"), literal_column("''")).label("notified")).cte(
        "notified"
    )
    found = skipped.outerjoin(stored, true())
    return (
        select(skipped.c.ord, *stored.c)
        .select_from(notified.outerjoin(found, true()))
        .add_cte(woken)
    )


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
            turns.c.queue == _queue_name(),
            turns.c.queued > _ZERO,
            turns.c.next_due_at <= turns.c.checked_at,
            *past,
        )
        .order_by(turns.c.last_turn, turns.c.tenant)
        .limit(_ONE)
    )
    waking = (
        select(*columns)
        .where(
            turns.c.queue == _queue_name(),
            turns.c.queued > _ZERO,
            turns.c.next_due_at > turns.c.checked_at,
            turns.c.next_due_at <= param("now", TZ),
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
            candidate.c.queue == _queue_name(),
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
        .limit(_ONE)
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
    order = rotation(turns)
    best = _due_items(work, order.c.tenant, _ONE, "best", row_ctid=True)
    # No ORDER BY in either branch: the rotation's order drives the nested loop,
    # and LIMIT 1 stops it at the first tenant whose probe locked an item. The
    # lock filter references the rotation alone, so it runs on each tenant as
    # the walk yields it, before that tenant's item probe.
    found = (best.c.id, best.c.row_ctid, order.c.additions)
    free = (
        select(*found)
        .select_from(order.join(best, true()))
        .where(_try_tenant_lock(turns, order.c.tenant))
        .limit(_ONE)
    )
    # Every tenant at the front is being claimed by someone else: take work
    # anyway, from the first tenant that still has an unlocked due item.
    anyone = select(*found).select_from(order.join(best, true())).limit(_ONE)
    # The Append runs its branches in order and the LIMIT stops it at the
    # first row: the fallback runs only when the first branch found nothing.
    branches = union_all(free, anyone).subquery("branches")
    picked = (
        select(branches.c.id, branches.c.row_ctid, branches.c.additions).limit(_ONE).cte("picked")
    )
    # The row is found by the ctid ``best`` locked it at (a TID scan), as claim_many's are
    # (see there): by primary key, a generic plan made while the table was small joined
    # ``picked`` to a scan of every queued row (24 ms a claim at 100,000 queued).
    claimed = (
        update(work)
        .where(
            _ctid(work) == cast(select(picked.c.row_ctid).scalar_subquery(), _Tid()),
            work.c.id == picked.c.id,
            work.c.status == QUEUED,
        )
        .values(
            status=LEASED,
            attempts=work.c.attempts + _ONE,
            token=tables.token_seq.next_value(),
            worker_id=param("worker"),
            expires_at=param("expires_at", TZ),
            updated_at=param("now", TZ),
        )
        .returning(*_item_columns(work), work.c.id, picked.c.additions.label("seen_additions"))
        .cte("claimed")
    )
    turn = (
        _served(
            tables,
            lambda rest: rest.c.id != claimed.c.id,
            last_turn=claimed.c.token,
            taken=_ONE,
            seen_additions=claimed.c.seen_additions,
        )
        .where(turns.c.queue == claimed.c.queue, turns.c.tenant == claimed.c.tenant)
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
    # a sequential scan of the whole table (130 to 170 ms a claim once it held 20,000
    # rows), and a ``status`` condition let a planner that thinks few items are queued
    # scan every queued row through the due index. ``picked`` locked the rows and checked
    # ``status`` in this statement; a locked row keeps its ctid until this statement
    # updates it. One a concurrent update moved after this statement's snapshot is not
    # seen at its new ctid and is left queued (the batch comes back short).
    ctids = select(func.array_agg(tokens.c.row_ctid)).scalar_subquery()
    claimed = (
        update(work)
        .where(_ctid(work) == any_(cast(ctids, ARRAY(_Tid()))), work.c.id == tokens.c.id)
        .values(
            status=LEASED,
            attempts=work.c.attempts + _ONE,
            token=tokens.c.token,
            worker_id=param("worker"),
            expires_at=param("expires_at", TZ),
            updated_at=param("now", TZ),
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
        .values(token=tables.token_seq.next_value(), expires_at=param("expires_at", TZ))
        .returning(*_item_columns(work))
    )


def ack(work: Table) -> Update:
    return (
        update(work)
        .where(*_fenced(work))
        .values(
            status=DONE,
            **_lease_ended(),
        )
        .returning(*_item_columns(work))
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
            work.c.queue == _queue_name(),
            work.c.tenant == held.c.tenant,
            work.c.item_id == held.c.item_id,
            work.c.status == LEASED,
            work.c.token == held.c.token,
        )
        .values(
            status=DONE,
            **_lease_ended(),
        )
        .returning(*_item_columns(work))
    )


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
    settled = settle.returning(*_item_columns(tables.work)).cte("settled")
    woken = _turn_added(tables.queue_turns, settled, grouped=False).cte("woken")
    return select(
        *(settled.c[c.name] for c in _item_columns(tables.work)), _notified_if_queued(settled)
    ).add_cte(woken)


def fail(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*_fenced(work))
        .values(
            status=param("status"),
            last_error=param("error", Text()),
            available_at=param("available_at", TZ),
            **_lease_ended(),
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
            attempts=work.c.attempts - _ONE,
            available_at=param("now", TZ),
            **_lease_ended(),
        ),
    )


def requeue(tables: Tables) -> Select[Any]:
    work = tables.work
    return _settled(
        tables,
        update(work)
        .where(*_item_key(work), work.c.status == DEAD)
        .values(
            status=QUEUED,
            attempts=_ZERO,
            available_at=param("now", TZ),
            updated_at=param("now", TZ),
        ),
    )


def reap(tables: Tables) -> Select[Any]:
    """Up to ``p_batch`` lapsed leases back to the queue, or dead from ``p_dead_at`` attempts
    on, each with ``last_error = p_error``: the front's decision (``LapseOutcome``)."""
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
            last_error=param("error", Text()),
            available_at=param("now", TZ),
            **_lease_ended(),
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
    return select(*(moved.c[name] for name in names), _notified_if_queued(moved)).add_cte(woken)


def dead_letters(work: Table) -> Select[Any]:
    return (
        select(*_item_columns(work))
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
        turns.c.queued > _ZERO,
        turns.c.next_due_at > turns.c.checked_at,
        turns.c.next_due_at > param("now", TZ),
    )


@dataclass(frozen=True, slots=True)
class QueueStatements:
    enqueue: Select[Any]
    enqueue_many: Select[Any]
    enqueue_new: Select[Any]
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
    def build(cls, tables: Tables) -> QueueStatements:
        return cls(
            enqueue=enqueue(tables),
            enqueue_many=enqueue_many(tables),
            enqueue_new=enqueue_new(tables),
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


@cache
def statements(tables: Tables) -> QueueStatements:
    """The statements of one table naming, built on first use."""
    return QueueStatements.build(tables)
