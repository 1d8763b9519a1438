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

from sqlalchemy import DateTime, bindparam

__all__ = ["TZ", "param"]

#: The type of every timestamp parameter: ``timestamptz``, the injected clock's reading.
TZ = DateTime(timezone=True)


def param(name: str, type_: Any = None) -> Any:
    """A named bound parameter; every name starts with ``p_`` so none shadows a column."""
    return bindparam(f"p_{name}", type_=type_)
