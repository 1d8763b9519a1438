"""What the state store's statements share: the statement type, the run counters, a
record's key and columns, the read of one record, and a write's answer as a run row.

Nothing here is a whole statement of a run write; each lives in the module of its seam.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    CompoundSelect,
    Insert,
    Select,
    Table,
    Text,
    Update,
    cast,
    null,
    select,
)
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.storage.postgres._sql import param, unseen_param

__all__ = [
    "COUNTERS",
    "CoreStatement",
    "S",
    "T",
    "as_run_row",
    "get_record",
    "json_param",
    "meta_columns",
    "record_key",
    "record_version",
    "row_columns",
]

#: A statement as built: a SELECT (with data-modifying CTEs, or a UNION), or DML.
CoreStatement = Select[Any] | CompoundSelect[Any] | Insert | Update | ReturningDelete[Any]

S = TypeVar("S")
T = TypeVar("T")

COUNTERS = ("input_tokens", "output_tokens", "cost", "iterations", "cursor")


def json_param(name: str) -> ColumnElement[Any]:
    # The front already encoded the blob: send that text and let the server
    # check it is JSON, rather than have SQLAlchemy serialize it a second time.
    return cast(param(name, Text()), JSON)


def row_columns(table: Table) -> list[ColumnElement[Any]]:
    """Every column, the JSON blob read back as its exact text."""
    return [
        cast(column, Text).label(column.name) if column.name == "data" else column
        for column in table.columns
    ]


def meta_columns(table: Table) -> list[ColumnElement[Any]]:
    """Every column but the blob: a write already holds the blob it sent."""
    return [column for column in table.columns if column.name != "data"]


def record_key(table: Table, id_column: str) -> list[ColumnElement[bool]]:
    """The record's primary key, unseen by the plan (:func:`unseen_param`): given it as
    constants, the planner planned a run's update and patch again on every call."""
    return [
        table.c.tenant == unseen_param("tenant", Text()),
        table.c[id_column] == unseen_param("record_id", Text()),
    ]


def get_record(table: Table, id_column: str) -> Select[Any]:
    return select(*row_columns(table)).where(*record_key(table, id_column))


def record_version(table: Table, id_column: str) -> Select[Any]:
    return select(table.c.version).where(*record_key(table, id_column))


def as_run_row(runs: Table, applied: CTE) -> list[ColumnElement[Any]]:
    """Every column of the run as a write returned it (``applied``); ``data`` is NULL
    where the write left it out (a write already holds the blob it sent)."""
    return [
        applied.c[column.name]
        if column.name in applied.c
        else cast(null(), Text).label(column.name)
        for column in runs.columns
    ]
