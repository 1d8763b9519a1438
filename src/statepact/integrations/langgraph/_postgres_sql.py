"""The statements of the PostgreSQL checkpoint store, built once from ``schema.langgraph_tables``.

Every call of the store is one statement: a write and everything it implies (a
put's blobs and the thread's write time; a delete's writes and freed blobs) go
together, so nothing is left half-written and a failover may send any of them
again (each is idempotent). Every value is a bound parameter, every timestamp
the injected clock's. Why each is shaped so: docs/agent-frameworks.md#langgraph-on-postgresql.

Nothing here executes a statement or reads a clock.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    DateTime,
    Integer,
    LargeBinary,
    Select,
    Text,
    bindparam,
    cast,
    delete,
    exists,
    func,
    literal,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, distinct_on
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres.schema import langgraph_tables

__all__ = [
    "CHECK",
    "COPY",
    "DELETE_FOR_RUNS",
    "DELETE_THREADS",
    "DELTA_THREADS",
    "PRUNE",
    "PUT",
    "PUT_WRITES",
    "SWEEP",
    "TABLES",
    "read",
]

_checkpoints = langgraph_tables.checkpoints
_blobs = langgraph_tables.blobs
_writes = langgraph_tables.writes
_threads = langgraph_tables.threads

#: Timestamps are ``timestamptz``: the injected clock's readings.
TZ = DateTime(timezone=True)

#: The tables ``open()`` looks for, in the order its check reports them.
TABLES = tuple(t.name for t in (_checkpoints, _blobs, _writes, _threads))


def p(name: str, type_: Any = None) -> Any:
    """A named bound parameter (text unless ``type_`` says otherwise); every name starts
    with ``p_`` so none shadows a column."""
    return bindparam(f"p_{name}", type_=Text() if type_ is None else type_)


def _texts(name: str) -> Any:
    return p(name, ARRAY(Text()))


def _tenant() -> Any:
    return p("tenant")


def _check() -> Select[Any]:
    """Which of the saver's tables are missing (``to_regclass`` is NULL)."""
    return select(*(func.to_regclass(literal(name)).label(name) for name in TABLES))


def _put() -> Any:
    """The checkpoint (replacing one of the same id), its new blobs (one stored already is
    kept: a version's value never changes) and the thread's write time (never moved back)."""
    new = (
        func.unnest(
            _texts("blob_channels"),
            _texts("blob_versions"),
            _texts("blob_types"),
            p("blob_data", ARRAY(LargeBinary())),
        )
        .table_valued("channel", "version", "type", "blob")
        .render_derived(name="b")
    )
    blobs = (
        pg_insert(_blobs)
        .from_select(
            ["tenant", "thread_id", "checkpoint_ns", "channel", "version", "type", "blob"],
            select(_tenant(), p("thread_id"), p("checkpoint_ns"), *new.c),
        )
        .on_conflict_do_nothing()
        .cte("blobs")
    )
    values = {
        "tenant": _tenant(),
        "thread_id": p("thread_id"),
        "checkpoint_ns": p("checkpoint_ns"),
        "checkpoint_id": p("checkpoint_id"),
        "parent_checkpoint_id": p("parent_id"),
        "run_id": p("run_id"),
        "type": p("type"),
        "checkpoint": p("data", LargeBinary()),
        "metadata": cast(p("metadata"), JSONB),
        "channels": _texts("channels"),
        "versions": _texts("versions"),
        "created_at": p("at", TZ),
    }
    insert = pg_insert(_checkpoints).values(values)
    checkpoint = insert.on_conflict_do_update(
        constraint=_checkpoints.primary_key,
        set_={name: insert.excluded[name] for name in values if name not in _KEY},
    ).cte("checkpoint")
    return _touch(p("thread_id"), p("at", TZ)).add_cte(blobs, checkpoint)


_KEY = ("tenant", "thread_id", "checkpoint_ns", "checkpoint_id")


def _touch(thread_id: Any, at: Any) -> Any:
    """Note ``thread_id`` as written at ``at`` (a later reading stays)."""
    insert = pg_insert(_threads).values(tenant=_tenant(), thread_id=thread_id, written_at=at)
    return insert.on_conflict_do_update(
        constraint=_threads.primary_key,
        set_={"written_at": func.greatest(_threads.c.written_at, insert.excluded.written_at)},
    )


def _put_writes() -> Any:
    """A task's writes: one stored already is kept, unless its index is negative (a special
    channel: errors, interrupts), whose latest write wins."""
    new = (
        func.unnest(
            p("idx", ARRAY(Integer())),
            _texts("channels"),
            _texts("types"),
            p("data", ARRAY(LargeBinary())),
        )
        .table_valued("idx", "channel", "type", "blob")
        .render_derived(name="w")
    )
    insert = pg_insert(_writes).from_select(
        [
            "tenant",
            "thread_id",
            "checkpoint_ns",
            "checkpoint_id",
            "task_id",
            "task_path",
            "idx",
            "channel",
            "type",
            "blob",
        ],
        select(
            _tenant(),
            p("thread_id"),
            p("checkpoint_ns"),
            p("checkpoint_id"),
            p("task_id"),
            p("task_path"),
            *new.c,
        ),
    )
    excluded = insert.excluded
    return insert.on_conflict_do_update(
        constraint=_writes.primary_key,
        set_={
            "channel": excluded.channel,
            "type": excluded.type,
            "blob": excluded.blob,
            "task_path": excluded.task_path,
        },
        where=excluded.idx < 0,
    )


@cache
def read(
    *, thread: bool, namespace: bool, checkpoint: bool, before: bool, below: bool, filtered: bool
) -> Any:
    """One page of checkpoints, with their blobs and writes, in one statement: a row
    per checkpoint (:func:`_page_rows`). The page is ``WHERE tenant = ... ORDER BY checkpoint_id,
    thread_id, checkpoint_ns DESC LIMIT``: with a thread and a namespace given,
    a backward scan of the primary key; with a filter, the GIN index on
    ``metadata`` when the planner finds it the cheaper way. The flags say which
    conditions the query has; each combination is its own statement.
    """
    c = _checkpoints.c
    where: list[ColumnElement[bool]] = [c.tenant == _tenant()]
    scope: list[Any] = [c.checkpoint_id]
    if thread:
        where.append(c.thread_id == p("thread_id"))
    else:
        scope.append(c.thread_id)
    if namespace:
        where.append(c.checkpoint_ns == p("checkpoint_ns"))
    else:
        scope.append(c.checkpoint_ns)
    if checkpoint:
        where.append(c.checkpoint_id == p("checkpoint_id"))
    if before:
        where.append(c.checkpoint_id < p("before"))
    if below:
        bound = {
            c.checkpoint_id: p("below_id"),
            c.thread_id: p("below_thread"),
            c.checkpoint_ns: p("below_ns"),
        }
        where.append(tuple_(*scope) < tuple_(*(bound[column] for column in scope)))
    if filtered:
        where.append(c.metadata.op("@>")(cast(p("filter"), JSONB)))
    page = (
        select(
            c.thread_id,
            c.checkpoint_ns,
            c.checkpoint_id,
            c.parent_checkpoint_id,
            c.type,
            c.checkpoint,
            c.metadata,
            c.channels,
            c.versions,
        )
        .where(*where)
        .order_by(c.checkpoint_id.desc(), c.thread_id.desc(), c.checkpoint_ns.desc())
        .limit(p("limit", Integer()))
        .subquery("page")
    )
    return _page_rows(page)


def _page_rows(page: Any) -> Any:
    """Each checkpoint of ``page`` as one row: its columns, then its blobs and its writes
    as arrays, each gathered by a lateral subquery that reads the table's primary key
    (a nested loop per checkpoint, whatever the table's statistics say)."""
    k = page.c
    versions = (
        func.unnest(k.channels, k.versions)
        .table_valued("channel", "version")
        .render_derived(name="v")
    )
    b, w = _blobs.c, _writes.c
    blobs = (
        select(
            func.array_agg(versions.c.channel).label("blob_channels"),
            func.array_agg(b.type).label("blob_types"),
            func.array_agg(b.blob).label("blob_data"),
        )
        .select_from(versions, _blobs)
        .where(
            b.tenant == _tenant(),
            b.thread_id == k.thread_id,
            b.checkpoint_ns == k.checkpoint_ns,
            b.channel == versions.c.channel,
            b.version == versions.c.version,
        )
        .lateral("blobs")
    )
    writes = (
        select(
            func.array_agg(w.task_id).label("write_tasks"),
            func.array_agg(w.idx).label("write_idx"),
            func.array_agg(w.channel).label("write_channels"),
            func.array_agg(w.type).label("write_types"),
            func.array_agg(w.blob).label("write_data"),
            func.array_agg(w.task_path).label("write_paths"),
        )
        .where(
            w.tenant == _tenant(),
            w.thread_id == k.thread_id,
            w.checkpoint_ns == k.checkpoint_ns,
            w.checkpoint_id == k.checkpoint_id,
        )
        .lateral("writes")
    )
    return select(
        k.thread_id,
        k.checkpoint_ns,
        k.checkpoint_id,
        k.parent_checkpoint_id,
        k.type,
        k.checkpoint,
        cast(k.metadata, Text).label("metadata"),
        *blobs.c,
        *writes.c,
    ).select_from(page.join(blobs, true()).join(writes, true()))


def _forget(gone: CTE) -> Any:
    """Given ``gone`` (checkpoints a CTE deleted, with their blob references): delete their
    writes and the blobs no checkpoint left in their namespace reads.

    The statement reads one snapshot, in which the deleted rows are still there:
    each remaining checkpoint is checked not to be among ``gone``.
    """
    g, b = gone.c, _blobs.c
    writes = (
        delete(_writes)
        .where(
            _writes.c.tenant == _tenant(),
            _writes.c.thread_id == g.thread_id,
            _writes.c.checkpoint_ns == g.checkpoint_ns,
            _writes.c.checkpoint_id == g.checkpoint_id,
        )
        .cte("gone_writes")
    )
    used = (
        func.unnest(g.channels, g.versions).table_valued("channel", "version").render_derived("u")
    )
    freed = (
        select(g.thread_id, g.checkpoint_ns, used.c.channel, used.c.version)
        .select_from(gone, used)
        .distinct()
        .cte("freed")
    )
    f = freed.c
    kept = _checkpoints.alias("kept")
    reads = (
        func.unnest(kept.c.channels, kept.c.versions)
        .table_valued("channel", "version")
        .render_derived("r")
    )
    still_read = (
        exists()
        .select_from(kept, reads)
        .where(
            kept.c.tenant == _tenant(),
            kept.c.thread_id == f.thread_id,
            kept.c.checkpoint_ns == f.checkpoint_ns,
            reads.c.channel == f.channel,
            reads.c.version == f.version,
            ~exists().where(
                g.thread_id == kept.c.thread_id,
                g.checkpoint_ns == kept.c.checkpoint_ns,
                g.checkpoint_id == kept.c.checkpoint_id,
            ),
        )
    )
    return (
        delete(_blobs)
        .where(
            b.tenant == _tenant(),
            b.thread_id == f.thread_id,
            b.checkpoint_ns == f.checkpoint_ns,
            b.channel == f.channel,
            b.version == f.version,
            ~still_read,
        )
        .add_cte(writes)
    )


def _gone(statement: Any) -> CTE:
    c = _checkpoints.c
    gone: CTE = statement.returning(
        c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.channels, c.versions
    ).cte("gone")
    return gone


def _delete_for_runs() -> Any:
    c = _checkpoints.c
    gone = _gone(
        delete(_checkpoints).where(c.tenant == _tenant(), c.run_id == func.any(_texts("run_ids")))
    )
    return _forget(gone)


def _prune() -> Any:
    """Keep each namespace's newest checkpoint of the threads; delete the others, their
    writes and the blobs only they read; a kept checkpoint whose parent went loses it."""
    c = _checkpoints.c
    threads = c.thread_id == func.any(_texts("thread_ids"))
    heads = (
        select(c.thread_id, c.checkpoint_ns, c.checkpoint_id)
        .where(c.tenant == _tenant(), threads)
        .ext(distinct_on(c.thread_id, c.checkpoint_ns))
        .order_by(c.thread_id, c.checkpoint_ns, c.checkpoint_id.desc())
        .cte("heads")
    )
    h = heads.c
    gone = _gone(
        delete(_checkpoints).where(
            c.tenant == _tenant(),
            threads,
            ~exists().where(
                h.thread_id == c.thread_id,
                h.checkpoint_ns == c.checkpoint_ns,
                h.checkpoint_id == c.checkpoint_id,
            ),
        )
    )
    g = gone.c
    orphans = (
        update(_checkpoints)
        .where(
            c.tenant == _tenant(),
            tuple_(c.thread_id, c.checkpoint_ns, c.checkpoint_id).in_(
                select(h.thread_id, h.checkpoint_ns, h.checkpoint_id)
            ),
            exists().where(
                g.thread_id == c.thread_id,
                g.checkpoint_ns == c.checkpoint_ns,
                g.checkpoint_id == c.parent_checkpoint_id,
            ),
        )
        .values(parent_checkpoint_id=None)
        .cte("orphans")
    )
    return _forget(gone).add_cte(orphans)


def _delete_threads() -> Any:
    """Every row of the threads, in all four tables."""
    ids = _texts("thread_ids")
    parts = [
        delete(table)
        .where(table.c.tenant == _tenant(), table.c.thread_id == func.any(ids))
        .cte(f"gone_{table.name}")
        for table in (_checkpoints, _blobs, _writes)
    ]
    return (
        delete(_threads)
        .where(_threads.c.tenant == _tenant(), _threads.c.thread_id == func.any(ids))
        .add_cte(*parts)
    )


def _delta_threads() -> Select[Any]:
    c = _checkpoints.c
    return (
        select(c.thread_id)
        .where(
            c.tenant == _tenant(),
            c.thread_id == func.any(_texts("thread_ids")),
            c.metadata.has_key("counters_since_delta_snapshot"),
        )
        .distinct()
    )


def _copy() -> Any:
    """Every checkpoint, blob and write of the source thread, onto the target."""
    parts = []
    for table, replace in (
        (_checkpoints, True),
        (_blobs, False),
        (_writes, True),
    ):
        columns = [column.name for column in table.columns]
        source = select(
            *(
                p("target").label(name)
                if name == "thread_id"
                else p("at", TZ).label(name)
                if name == "created_at"
                else table.c[name]
                for name in columns
            )
        ).where(table.c.tenant == _tenant(), table.c.thread_id == p("source"))
        insert = pg_insert(table).from_select(columns, source)
        key = {column.name for column in table.primary_key.columns}
        parts.append(
            (
                insert.on_conflict_do_update(
                    constraint=table.primary_key,
                    set_={name: insert.excluded[name] for name in columns if name not in key},
                )
                if replace
                else insert.on_conflict_do_nothing()
            ).cte(f"copied_{table.name}")
        )
    c = _checkpoints.c
    touched = pg_insert(_threads).from_select(
        ["tenant", "thread_id", "written_at"],
        select(_tenant(), p("target"), p("at", TZ)).where(
            exists().where(c.tenant == _tenant(), c.thread_id == p("source"))
        ),
    )
    return touched.on_conflict_do_update(
        constraint=_threads.primary_key,
        set_={"written_at": func.greatest(_threads.c.written_at, touched.excluded.written_at)},
    ).add_cte(*parts)


def _sweep() -> Any:
    """Up to ``p_batch`` threads last written before ``p_cutoff``, oldest first, deleted
    whole; the threads rows another sweep holds are skipped. Returns how many went."""
    t = _threads.c
    idle = (
        select(t.thread_id)
        .where(t.tenant == _tenant(), t.written_at < p("cutoff", TZ))
        .order_by(t.written_at)
        .limit(p("batch", Integer()))
        .with_for_update(skip_locked=True)
        .cte("idle")
    )
    gone = (
        delete(_threads)
        .where(
            t.tenant == _tenant(),
            t.thread_id == idle.c.thread_id,
            t.written_at < p("cutoff", TZ),
        )
        .returning(t.thread_id)
        .cte("gone_threads")
    )
    parts = [
        delete(table)
        .where(table.c.tenant == _tenant(), table.c.thread_id == gone.c.thread_id)
        .cte(f"swept_{table.name}")
        for table in (_checkpoints, _blobs, _writes)
    ]
    return select(func.count()).select_from(gone).add_cte(*parts)


CHECK = _check()
PUT = _put()
PUT_WRITES = _put_writes()
DELETE_THREADS = _delete_threads()
DELETE_FOR_RUNS = _delete_for_runs()
PRUNE = _prune()
DELTA_THREADS = _delta_threads()
COPY = _copy()
SWEEP = _sweep()
