"""The prune of runs: bounded steps over the ``(tenant, seq)`` index."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Select, Table, Text, any_, cast, delete, select, tuple_
from sqlalchemy.dialects.postgresql import ARRAY

from statepact.storage.postgres._sql import TZ, param, prune_step

__all__ = ["prune_runs"]


def prune_runs(runs: Table, writes: Table, *, one_tenant: bool) -> Select[Any]:
    """One bounded step of ``prune_runs``: look at the next ``p_limit`` runs in
    ``(tenant, seq)`` order after the cursor (``p_after_tenant``, ``p_after``; of
    ``p_tenant`` alone when ``one_tenant``) and delete, with their writes' rows, those
    in ``p_statuses`` whose ``updated_at`` is before ``p_cutoff``.

    The page is a range of the unique ``(tenant, seq)`` index, so a step reads at most
    ``p_limit`` rows however large the table is; there is no index on ``updated_at``
    (it would cost every ``patch_run`` its HOT update). The delete checks status and
    time again on the row it deletes, so a run written since the page was read is
    judged by its new state. Returns one row (``deleted``, ``looked``, and the cursor
    of the last run looked at), none when no run is left past the cursor.
    """
    statuses = any_(cast(param("statuses"), ARRAY(Text())))
    cutoff = param("cutoff", TZ)
    after = param("after", BigInteger())
    cursor = (
        [runs.c.tenant == param("tenant"), runs.c.seq > after]
        if one_tenant
        else [tuple_(runs.c.tenant, runs.c.seq) > tuple_(param("after_tenant"), after)]
    )
    page = (
        select(runs.c.tenant, runs.c.run_id, runs.c.seq, runs.c.status, runs.c.updated_at)
        .where(*cursor)
        .order_by(runs.c.tenant, runs.c.seq)
        .limit(param("limit", BigInteger()))
        .cte("page")
    )
    victims = (
        select(page.c.tenant, page.c.run_id)
        .where(page.c.status == statuses, page.c.updated_at < cutoff)
        .cte("victims")
    )
    gone = (
        delete(runs)
        .where(
            runs.c.tenant == victims.c.tenant,
            runs.c.run_id == victims.c.run_id,
            runs.c.status == statuses,
            runs.c.updated_at < cutoff,
        )
        .returning(runs.c.tenant, runs.c.run_id)
        .cte("gone")
    )
    forgotten = (
        delete(writes)
        .where(writes.c.tenant == gone.c.tenant, writes.c.run_id == gone.c.run_id)
        .cte("forgotten")
    )
    return prune_step(page, [page.c.tenant, page.c.seq], gone, forgotten)
