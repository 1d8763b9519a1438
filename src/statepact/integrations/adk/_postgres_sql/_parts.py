"""What the service's statements share: the run counters an append moves, the bound
parameter and timestamp type, a session's key, and a scope's state merged and read.

Nothing here is a whole statement; each lives in the module of its seam.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, Table, Text, bindparam, cast, exists, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

__all__ = [
    "COUNTERS",
    "TZ",
    "jsonb",
    "merge",
    "p",
    "scope_state",
    "session_key",
    "state_upsert",
]

#: The run counters an append moves, in the order a refusal names the first to overflow.
COUNTERS = ("input_tokens", "output_tokens", "iterations", "cursor")


#: The type of every timestamp parameter: ``timestamptz``, the caller's clock.
TZ = DateTime(timezone=True)


def p(name: str, type_: Any = None) -> Any:
    """A bound parameter; every name starts with ``p_`` so none shadows a column."""
    return bindparam(f"p_{name}", type_=type_)


def jsonb(name: str) -> Any:
    return cast(p(name, Text()), JSONB)


def merge(column: Any, delta: Any) -> Any:
    """``column || delta``: a scope's keys replaced one by one, never deep-merged."""
    return column.op("||", return_type=JSONB)(delta)


def session_key(table: Any) -> list[ColumnElement[bool]]:
    return [
        table.c.app_name == p("app", Text()),
        table.c.user_id == p("user", Text()),
        table.c.session_id == p("session", Text()),
    ]


def state_upsert(table: Table, keys: tuple[str, ...], after: CTE, delta: str) -> CTE:
    """Merge ``delta`` into a scope's row (made if missing), when ``after`` wrote a row."""
    values = [p(key, Text()) for key in keys]
    columns = [table.c[name] for name in ("app_name", "user_id")[: len(keys)]]
    fresh = select(*values, jsonb(delta), p("now", TZ)).where(exists(select(after)))
    upsert = pg_insert(table).from_select([*columns, table.c.state, table.c.updated_at], fresh)
    return (
        upsert.on_conflict_do_update(
            index_elements=columns,
            set_={
                "state": merge(table.c.state, upsert.excluded.state),
                "updated_at": upsert.excluded.updated_at,
            },
        )
        .returning(table.c.state)
        .cte(f"{table.name}_merged")
    )


def scope_state(table: Table, keys: tuple[str, ...], merged: CTE | None) -> Any:
    """A scope's state as the statement leaves it: what it merged, else what was there."""
    stored = select(table.c.state).where(
        *(
            table.c[name] == p(key, Text())
            for name, key in zip(("app_name", "user_id"), keys, strict=False)
        )
    )
    if merged is None:
        return stored.scalar_subquery()
    return func.coalesce(select(merged.c.state).scalar_subquery(), stored.scalar_subquery())
