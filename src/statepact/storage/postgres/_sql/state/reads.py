"""The reads of runs: a page of them, and their totals, each by the filters it takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import BigInteger, Select, Table, func, select
from sqlalchemy.sql.elements import ColumnElement

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.state._parts import row_columns

__all__ = ["by_filters", "list_runs", "run_totals"]


def list_runs(runs: Table, *, by_session: bool, by_status: bool) -> Select[Any]:
    """A page by ``seq``: each filter has an index ending in ``seq`` (see schema.py)."""
    criteria: list[ColumnElement[bool]] = [
        runs.c.tenant == param("tenant"),
        runs.c.seq > param("after", BigInteger()),
    ]
    if by_session:
        criteria.append(runs.c.session_id == param("session_id"))
    if by_status:
        criteria.append(runs.c.status == param("status"))
    return (
        select(*row_columns(runs))
        .where(*criteria)
        .order_by(runs.c.seq)
        .limit(param("limit", BigInteger()))
    )


def run_totals(runs: Table, *, by_session: bool, by_status: bool) -> Select[Any]:
    """``(status, runs, input_tokens, output_tokens, cost, iterations)`` of the tenant's
    runs created at or after ``p_since``, per status: a range of the ``(tenant,
    created_at)`` index (its rows fetched for the counters), bounded by the window."""
    criteria: list[ColumnElement[bool]] = [
        runs.c.tenant == param("tenant"),
        runs.c.created_at >= param("since", TZ),
    ]
    if by_session:
        criteria.append(runs.c.session_id == param("session_id"))
    if by_status:
        criteria.append(runs.c.status == param("status"))
    return (
        select(
            runs.c.status,
            func.count(),
            func.sum(runs.c.input_tokens),
            func.sum(runs.c.output_tokens),
            func.sum(runs.c.cost),
            func.sum(runs.c.iterations),
        )
        .where(*criteria)
        .group_by(runs.c.status)
    )


def by_filters(
    runs: Table, build: Callable[..., Select[Any]]
) -> dict[tuple[bool, bool], Select[Any]]:
    """One statement per (filters by session, filters by status)."""
    return {
        (by_session, by_status): build(runs, by_session=by_session, by_status=by_status)
        for by_session in (False, True)
        for by_status in (False, True)
    }
