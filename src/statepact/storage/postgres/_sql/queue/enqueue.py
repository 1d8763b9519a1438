"""Enqueue statements: one item (``enqueue``) and a batch (``enqueue_many``,
``enqueue_new``), each inserting, waking its tenants' turns and the queue's watchers
in one statement.

They must never read before they write: an existing item (same id, or holding the
same unique slot) is found by the insert's own conflict, then read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    Integer,
    Interval,
    Select,
    Text,
    cast,
    column,
    func,
    literal_column,
    or_,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, Insert, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement, Grouping
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.queue._parts import (
    ONE,
    QUEUED,
    ZERO,
    identity_sequence,
    item_columns,
    turn_added,
    turns_upsert,
)
from statepact.storage.postgres.schema import Tables


def enqueue(tables: Tables) -> Select[Any]:
    """Insert the item unless ``(queue, tenant, item_id)`` exists or another item holds its
    unique slot, and wake its tenant (a new tenant's turns row counts the insert)."""
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
            attempts=ZERO,
            available_at=param("available_at", TZ),
            created_at=param("now", TZ),
            updated_at=param("now", TZ),
            unique_key=param("unique_key", Text()),
            unique_for=param("unique_for", Interval()),
            timeout=param("timeout", Double()),
            unique_slot=param("unique_slot", Text()),
            limit_key=param("limit_key", Text()),
            weight=param("weight", Integer()),
        )
        # No conflict target: the item's key or its unique slot, whichever is held.
        .on_conflict_do_nothing()
        .returning(work.c.queue, work.c.tenant, work.c.available_at, work.c.status)
        .cte("inserted")
    )
    woken = turn_added(turns, inserted, grouped=False).cte("woken")
    # Watchers LISTEN on the queue's channel; PostgreSQL delivers at commit (the caller's,
    # for a bound enqueue), once per transaction and channel.
    return (
        select(func.count(), func.pg_notify(param("channel"), literal_column("''")))
        .select_from(inserted)
        .add_cte(woken)
    )


# The columns of a batch, each a JSON array of one value per item, in this order; the
# batch's rows come in ``(tenant, item_id)`` byte order, ``places`` giving each its place
# in the caller's batch. A column that would hold only its default is sent as NULL
# (no array to read): ``places`` when the batch came in key order, ``priorities``,
# ``available`` and ``created`` when every item is at the first, and each optional one.
_BATCH_COLUMNS = (
    "tenants",
    "item_ids",
    "payloads",
    "priorities",
    "available",
    "created",
    "unique_keys",
    "unique_fors",
    "timeouts",
    "slots",
    "limit_keys",
    "weights",
    "places",
)


def _batch(*, materialized: bool) -> CTE:
    """The batch: parallel JSON arrays (one bind each whatever its length) read in step,
    each row with its place in the caller's batch (``ord``, from 1)."""
    # asyncpg checks every element of an array parameter for nesting, in Python, several
    # times the cost of building the JSON texts, which it sends as they are. ROWS FROM
    # zips the functions' rows, padding a NULL column's with NULLs.
    elements = ", ".join(
        f"json_array_elements{'' if name == 'payloads' else '_text'}(CAST(:p_{name} AS JSON))"
        for name in _BATCH_COLUMNS
    )
    batch = (
        text(
            "SELECT tenant, item_id, payload, priority, available_place, created_place, "
            "unique_key, unique_for, timeout, unique_slot, limit_key, weight, "
            f"COALESCE(CAST(place AS BIGINT), row) AS ord FROM ROWS FROM ({elements}) "
            "WITH ORDINALITY AS unnested(tenant, item_id, payload, priority, available_place, "
            "created_place, unique_key, unique_for, timeout, unique_slot, limit_key, weight, "
            "place, row)"
        )
        .bindparams(*(param(name, Text()) for name in _BATCH_COLUMNS))
        .columns(
            column("tenant", Text),
            column("item_id", Text),
            column("payload", JSON),
            column("priority", Text),
            column("available_place", Text),
            column("created_place", Text),
            column("unique_key", Text),
            column("unique_for", Text),
            column("timeout", Text),
            column("unique_slot", Text),
            column("limit_key", Text),
            column("weight", Text),
            column("ord", BigInteger),
        )
        .cte("batch")
    )
    # Read by the insert and by the anti-join of the skipped items: unnested once.
    return batch.prefix_with("MATERIALIZED") if materialized else batch


def _batch_insert(tables: Tables, *, skip_stored: bool) -> tuple[CTE, Insert]:
    """The batch and the insert of its items, in the ``(tenant, item_id)`` byte order the
    queue sent them in (so two batches sharing ids wait on each other in one order, never
    in a cycle: nothing is sorted here).

    Each item's id is the ``ord``-th of the ids drawn for the batch, in the batch's
    order (its enqueue order: a tenant's items are claimed by id); the ids are the
    column's own identity sequence's, given explicitly (OVERRIDING SYSTEM VALUE).

    ``skip_stored`` inserts only the items whose ``(queue, tenant, item_id)`` is new
    (``ON CONFLICT DO NOTHING``); without it an item already stored fails the statement
    (a unique violation: nothing is written), and the insert skips the probe of the
    unique index ``ON CONFLICT`` makes for every row before inserting it, a large part
    of a bulk load's statement (docs/benchmarks.md#queue-statement-plans).
    """
    work = tables.work
    batch = _batch(materialized=skip_stored)
    # The batch's moments, each once (a batch's items share one or two): every item names
    # its ``available_at`` and ``created_at`` by place in ``p_times`` (from 1; NULL is 1).
    times = Grouping(cast(param("times"), ARRAY(TZ)))  # (CAST(...))[i]: a subscript needs it
    created = times[func.coalesce(cast(batch.c.created_place, Integer), ONE)]
    # Drawn once, before the insert, one nextval a row in the batch's order.
    order: ColumnElement[int] = literal_column("drawn_place")
    drawn = (
        select(
            func.array_agg(aggregate_order_by(func.nextval(identity_sequence(work)), order)).label(
                "ids"
            )
        )
        .select_from(func.generate_series(ONE, param("count", Integer())).alias("drawn_place"))
        .cte("drawn")
    )
    names = (
        "id",
        "queue",
        "tenant",
        "item_id",
        "payload",
        "priority",
        "available_at",
        "unique_key",
        "unique_for",
        "timeout",
        "unique_slot",
        "limit_key",
        "weight",
        "created_at",
    )
    sent = (
        select(
            Grouping(drawn.c.ids)[batch.c.ord].label("id"),
            param("queue", work.c.queue.type).label("queue"),
            batch.c.tenant,
            batch.c.item_id,
            batch.c.payload,
            func.coalesce(cast(batch.c.priority, Integer), ZERO).label("priority"),
            times[func.coalesce(cast(batch.c.available_place, Integer), ONE)].label("available_at"),
            batch.c.unique_key,
            # Seconds, as the JSON number the queue sent.
            (cast(batch.c.unique_for, Double) * literal_column("INTERVAL '1 second'")).label(
                "unique_for"
            ),
            cast(batch.c.timeout, Double).label("timeout"),
            batch.c.unique_slot,
            batch.c.limit_key,
            func.coalesce(cast(batch.c.weight, Integer), literal_column("1")).label("weight"),
            created.label("created_at"),
        )
        .select_from(batch.join(drawn, true()))
        .cte("sent")
    )
    # Read once and free of volatile calls (nextval is in ``drawn``): PostgreSQL inlines it.
    rows = text(
        f"OVERRIDING SYSTEM VALUE SELECT {', '.join(names[:-1])}, {QUEUED}, {ZERO}, "
        "created_at, created_at FROM sent"
    ).columns(*(sent.c[name] for name in names[:-1]), sent.c.created_at, sent.c.created_at)
    insert = (
        pg_insert(work)
        .from_select([*names[:-1], "status", "attempts", "created_at", "updated_at"], rows)
        .add_cte(sent)  # the text above reads it: named here, so that WITH holds it
    )
    if skip_stored:
        # No conflict target: an item's key or its unique slot, whichever is held.
        insert = insert.on_conflict_do_nothing()
    return batch, insert


def enqueue_new(tables: Tables) -> Select[Any]:
    """Insert every item of the batch, wake their tenants and the queue's watchers, in one
    statement, or fail with a unique violation (writing nothing) if any is stored already:
    :func:`enqueue_many` without its ``ON CONFLICT``, for a batch expected to be new, sent
    first by a queue that can send ``enqueue_many`` after a failure (not in a caller's
    transaction, which the failure would abort). Answers one row, the notify's.

    Every item is inserted or none, so each tenant's count and earliest due moment are
    the queue's to send (``p_turn_tenants``, ``p_turn_counts``, ``p_turn_dues``: places
    in ``p_times``), in ``(queue, tenant)`` order like every other multi-row write here.
    """
    _, insert = _batch_insert(tables, skip_stored=False)
    inserted = insert.cte("inserted")
    counted = (
        text(
            "SELECT tenant, CAST(queued AS BIGINT) AS queued, CAST(due AS INTEGER) AS due "
            "FROM ROWS FROM (json_array_elements_text(CAST(:p_turn_tenants AS JSON)), "
            "json_array_elements_text(CAST(:p_turn_counts AS JSON)), "
            "json_array_elements_text(CAST(:p_turn_dues AS JSON))) AS counted(tenant, queued, due)"
        )
        .bindparams(*(param(name, Text()) for name in ("turn_tenants", "turn_counts", "turn_dues")))
        .columns(column("tenant", Text), column("queued", BigInteger), column("due", Integer))
        .cte("counted")
    )
    times = Grouping(cast(param("times"), ARRAY(TZ)))
    woken = turns_upsert(
        tables.queue_turns,
        select(
            param("queue", tables.work.c.queue.type),
            counted.c.tenant,
            ZERO,
            counted.c.queued,
            times[counted.c.due],
            param("now", TZ),
            counted.c.queued,
        ),
    ).cte("woken")
    return select(func.pg_notify(param("channel"), literal_column("''"))).add_cte(inserted, woken)


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
    batch, insert = _batch_insert(tables, skip_stored=True)
    inserted = insert.returning(
        work.c.queue, work.c.tenant, work.c.item_id, work.c.available_at, work.c.status
    ).cte("inserted")
    woken = turn_added(turns, inserted, grouped=True).cte("woken")
    # The items the insert skipped (usually none): an anti-join of two small sets, run only
    # when the insert stored fewer rows than the batch holds (a one-time filter).
    some_skipped = select(func.count()).select_from(inserted).scalar_subquery() < param(
        "count", Integer()
    )
    skipped = (
        select(batch.c.ord, batch.c.tenant, batch.c.item_id, batch.c.unique_slot)
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
        select(*item_columns(work, old))
        .where(
            old.c.queue == param("queue"),
            old.c.tenant == skipped.c.tenant,
            # Its own row first (item_id is the idempotency key), else its slot's holder.
            or_(old.c.item_id == skipped.c.item_id, old.c.unique_slot == skipped.c.unique_slot),
        )
        .order_by((old.c.item_id == skipped.c.item_id).desc())
        # One row by key; the LIMIT keeps the lateral a probe per skipped item (unlimited,
        # the planner may flatten it into a join that reads every row of the queue).
        .limit(ONE)
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
