"""Several calls' run writes of different runs in one statement (``patch_runs``,
``update_runs``): the store sends concurrent callers' writes together
(docs/backings.md#run-writes-sent-again), each still recording its call's row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Select,
    Table,
    Text,
    cast,
    delete,
    exists,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import TZ, param, shared_lock_timeout
from statepact.storage.postgres._sql.state._parts import (
    COUNTERS,
    as_run_row,
    meta_columns,
    row_columns,
)

__all__ = ["patch_runs", "update_runs"]


def _many(
    runs: Table, writes: Table, columns: Mapping[str, Any]
) -> tuple[CTE, list[ColumnElement[bool]]]:
    """Several run writes of one statement (``patch_runs``, ``update_runs``): the batch
    (parallel arrays, one bind each: ``p_each_<name>`` for ``tenant``, ``run_id``,
    ``op_id``, ``at`` and ``cutoff`` and for ``columns``, name to element type), each write's
    run row locked, and the join of a locked write to its run.

    The rows are locked in ``(tenant, run_id)`` byte order (``FOR NO KEY UPDATE`` above
    a sort), so two batches sharing runs wait on each other in one order, never in a
    cycle, and a single write holds one row only; under ``shared_lock_timeout``, so a
    row another session holds fails the batch at once instead of holding it. A write
    whose call id's row is there (a resend whose first attempt applied) is left out, as
    a resend's ``_done`` does (:mod:`.runs`).
    """
    arrays: dict[str, Any] = {
        "tenant": Text(),
        "run_id": Text(),
        "op_id": Text(),
        "at": TZ,
        "cutoff": TZ,
        **columns,
    }
    batch = (
        func.unnest(*[cast(param(f"each_{name}"), ARRAY(type_)) for name, type_ in arrays.items()])
        .table_valued(*arrays, with_ordinality="ord")
        .render_derived(name="batch")
    )
    done = exists().where(
        writes.c.tenant == batch.c.tenant,
        writes.c.run_id == batch.c.run_id,
        writes.c.applied_at == batch.c.at,
        writes.c.op_id == batch.c.op_id,
    )
    locked = (
        select(*batch.c)
        .select_from(shared_lock_timeout())
        .join_from(
            batch, runs, (runs.c.tenant == batch.c.tenant) & (runs.c.run_id == batch.c.run_id)
        )
        .where(~done)
        .order_by(runs.c.tenant.collate("C"), runs.c.run_id.collate("C"))
        .with_for_update(of=runs, key_share=True)
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    return locked, [runs.c.tenant == locked.c.tenant, runs.c.run_id == locked.c.run_id]


def _many_once(runs: Table, writes: Table, locked: CTE, write: ReturningUpdate[Any]) -> Select[Any]:
    """A batch's writes applied, each recording its call's row and sweeping its run's old
    ones (as ``_recorded`` and ``_swept`` of :mod:`.runs` do for one); a row per applied
    write, with its place in the batch (``ord``, from 1). A write that is not answered
    applied nothing."""
    applied = write.returning(locked.c.ord, locked.c.at, locked.c.cutoff, locked.c.op_id).cte(
        "applied"
    )
    recorded = insert(writes).from_select(
        ["tenant", "run_id", "applied_at", "op_id"],
        select(applied.c.tenant, applied.c.run_id, applied.c.at, applied.c.op_id),
    )
    swept = delete(writes).where(
        writes.c.tenant == applied.c.tenant,
        writes.c.run_id == applied.c.run_id,
        writes.c.applied_at < applied.c.cutoff,
    )
    return select(applied.c.ord, *as_run_row(runs, applied)).add_cte(
        recorded.cte("recorded"), swept.cte("swept")
    )


def patch_runs(runs: Table, writes: Table) -> Select[Any]:
    """Several ``patch_run`` calls of different runs in one statement, see ``_many``: each
    adds its deltas (``p_each_<counter>``) unless a counter would pass its limit
    (``p_each_max_<counter>``); the rows of the writes that applied, ``data`` as text."""
    columns: dict[str, Any] = {}
    for name in COUNTERS:
        columns[name] = runs.c[name].type
        columns[f"max_{name}"] = runs.c[name].type
    locked, joined = _many(runs, writes, columns)
    write = (
        update(runs)
        .where(*joined, *[runs.c[name] <= locked.c[f"max_{name}"] for name in COUNTERS])
        .values(
            {
                **{name: runs.c[name] + locked.c[name] for name in COUNTERS},
                "version": runs.c.version + 1,
                "updated_at": locked.c.at,
            }
        )
        .returning(*row_columns(runs))
    )
    return _many_once(runs, writes, locked, write)


def update_runs(runs: Table, writes: Table) -> Select[Any]:
    """Several ``put_run`` calls of existing runs in one statement, see ``_many``: each
    writes its blob, status and session if its run is at the version it expects
    (``p_each_expected``); the rows of the writes that applied, without ``data``."""
    locked, joined = _many(
        runs,
        writes,
        {"session_id": Text(), "status": Text(), "data": Text(), "expected": BigInteger()},
    )
    write = (
        update(runs)
        .where(*joined, runs.c.version == locked.c.expected)
        .values(
            session_id=locked.c.session_id,
            status=locked.c.status,
            data=cast(locked.c.data, JSON),
            version=runs.c.version + 1,
            updated_at=locked.c.at,
        )
        .returning(*meta_columns(runs))
    )
    return _many_once(runs, writes, locked, write)
