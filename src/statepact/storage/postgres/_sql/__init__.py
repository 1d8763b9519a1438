"""The statements of the PostgreSQL backings, apart from the classes that run them.

One module per protocol: :mod:`.state` (``PostgresStateStore``), :mod:`.queue`
(``PostgresWorkQueue``) and :mod:`.tx` (``PostgresBackend``). Each statement is
a small function of Core expressions on the tables of ``schema.py``, built once
(per table naming for the state and queue tables), every value a bound
parameter. Why each statement is shaped as it is: docs/backings.md#postgresql.

Nothing here executes a statement, opens a connection or reads a clock; the
store classes do that, and they build no SQL of their own.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import CTE, DateTime, Select, Subquery, bindparam, func, literal, select, true
from sqlalchemy.sql.elements import ColumnElement

from statepact._shared import PATIENCE

__all__ = [
    "LOCK_NOT_AVAILABLE",
    "TZ",
    "param",
    "prune_step",
    "shared_lock_timeout",
    "unseen_param",
]

#: SQLSTATE of a lock wait past ``lock_timeout``: a shared statement then applied nothing.
LOCK_NOT_AVAILABLE = "55P03"

#: The type of every timestamp parameter: ``timestamptz``, the injected clock's reading.
TZ = DateTime(timezone=True)


def param(name: str, type_: Any = None) -> Any:
    """A named bound parameter; every name starts with ``p_`` so none shadows a column."""
    return bindparam(f"p_{name}", type_=type_)


def unseen_param(name: str, type_: Any) -> Any:
    """``(SELECT :p_name)``: a bound parameter read through an InitPlan, whose value no
    plan of the statement can see.

    For the keys a hot statement compares to (a queue's name, a record's tenant and
    id), where the plan cannot depend on the value (a unique key, or the leading
    column of every index read) but the estimate does: given them as constants the
    planner rates each custom plan cheaper than the generic one and, with
    ``plan_cache_mode = auto``, plans the prepared statement again on every call.
    Unseen, the value costs every plan alike, and from its sixth call on a
    connection the statement runs the plan made once. Each use is measured and
    tested (tests/integration/test_postgres_queue.py, test_postgres_state.py).
    """
    return select(param(name, type_)).scalar_subquery()


def shared_lock_timeout() -> Subquery:
    """A one-row FROM item that sets ``lock_timeout`` to ``statepact._shared.PATIENCE`` for
    the rest of its statement (``set_config(..., is_local => true)``: an autocommit
    statement is its own transaction). A statement sharing several callers' writes joins
    it before it locks anything, so that one caller's row held by another session makes
    it fail at once (``LOCK_NOT_AVAILABLE``, nothing applied) rather than hold every
    caller of the batch; the store then sends each write alone, where it may wait.
    """
    milliseconds = f"{round(PATIENCE * 1000)}ms"
    return select(
        func.set_config(literal("lock_timeout"), literal(milliseconds), true()).label(
            "lock_timeout"
        )
    ).subquery("shared")


def prune_step(page: CTE, cursor: list[ColumnElement[Any]], gone: CTE, *also: CTE) -> Select[Any]:
    """The one row a bounded prune step returns (``prune_runs``, ``prune_history``):
    ``deleted`` (rows of ``gone``), ``looked`` (rows of ``page``) and the ``cursor``
    columns of the page's last row, the next step's start; no row when the page is
    empty. ``also`` are data-modifying CTEs the row does not read, rendered all the same.
    """
    last = select(*cursor).order_by(*(column.desc() for column in cursor)).limit(1).subquery("last")
    step = select(
        select(func.count()).select_from(gone).scalar_subquery().label("deleted"),
        select(func.count()).select_from(page).scalar_subquery().label("looked"),
        *last.c,
    ).select_from(last)
    return step.add_cte(*also) if also else step
