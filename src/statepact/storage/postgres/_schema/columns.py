"""The column types and check texts every table definition of ``_schema`` shares."""

from __future__ import annotations

import re

from sqlalchemy import DateTime, Text

__all__ = ["FINISHED", "IDENTIFIER", "check_in", "ident", "tz"]

# Lower case only: an unquoted name in a deployment's own DDL is folded to lower
# case, and a quoted mixed-case name would not be the same relation.
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


#: The statuses of a finished item (prune's, and the finished index's predicate).
FINISHED = ["done", "dead", "cancelled"]


def ident() -> Text:
    """An identifier column: compared byte by byte (collation C), as every backing does."""
    return Text(collation="C")


def tz() -> DateTime:
    """A time column: ``timestamptz``."""
    return DateTime(timezone=True)


def check_in(column: str, values: list[str]) -> str:
    """The SQL of ``column IN (values)``, for a check or an index predicate."""
    listed = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({listed})"
