"""Every PostgreSQL table statepact reads, as SQLAlchemy Core, in ONE ``MetaData``.

The single source of the schema: the Alembic revisions in the top-level
``alembic/`` are generated from :data:`metadata`, :data:`EXPECTED_SCHEMA` is
derived from it (so a deployment can own the migration), and the statements of
``_sql/`` are built on its ``Table`` objects (``adk_*`` names can be changed
with :class:`StateTables`). What each table holds and why:
docs/backings.md#tables. One row's first values are written here too
(:func:`insert_new_run`), since the state store and the ADK service both start runs.

It must never create, alter or drop anything itself: the kit reads and
refuses, migrations write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    MetaData,
    Table,
    UniqueConstraint,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import Insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.schema import CreateIndex, CreateSequence, CreateTable
from sqlalchemy.sql.elements import ColumnElement

from statepact.storage.postgres._schema.integrations import (
    AdkTables,
    LangGraphTables,
    define_adk_tables,
    define_langgraph_tables,
)
from statepact.storage.postgres._schema.state_queue import StateTables, Tables, define_state_tables
from statepact.storage.postgres._schema.transactions import define_backend_tables
from statepact.storage.postgres._schema.workers import define_worker_table

__all__ = [
    "ADK_TABLES",
    "COMPATIBLE_SCHEMA_VERSIONS",
    "EXPECTED_SCHEMA",
    "NAMING_CONVENTION",
    "SCHEMA_COMPONENT",
    "SCHEMA_VERSION",
    "WRITE_RETENTION",
    "AdkTables",
    "ColumnShape",
    "IndexShape",
    "LangGraphTables",
    "SchemaShape",
    "StateTables",
    "TableShape",
    "Tables",
    "adk_tables_for",
    "insert_new_run",
    "langgraph_tables",
    "metadata",
    "tables_for",
    "worker_table_for",
]

#: The version the head revision writes into ``adk_schema``; bump it in a new revision.
SCHEMA_VERSION = 3
#: Versions this release reads; ``verify()`` refuses anything else.
COMPATIBLE_SCHEMA_VERSIONS: frozenset[int] = frozenset({SCHEMA_VERSION})
#: The ``adk_schema.component`` of statepact's row.
SCHEMA_COMPONENT = "statepact"

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: How long a run write's row in ``adk_run_writes`` is kept (by the injected
#: clock of the writes that sweep it): far above any failover budget, so a
#: resend always finds the row of its first attempt. Writers' clocks must agree
#: to well within this.
WRITE_RETENTION = timedelta(minutes=10)


#: The one ``MetaData``: every table statepact reads, under the default names.
metadata = MetaData(naming_convention=NAMING_CONVENTION)
_DEFAULT = define_state_tables(metadata, StateTables(), None)
define_backend_tables(metadata)
#: The tables of the LangGraph checkpoint saver (``statepact.integrations.langgraph``).
langgraph_tables = define_langgraph_tables(metadata)


#: The ADK session service's tables under the default schema, in :data:`metadata`.
ADK_TABLES = define_adk_tables(metadata, None)


def insert_new_run(
    runs: Table,
    *,
    tenant: ColumnElement[Any],
    run_id: ColumnElement[Any],
    session_id: ColumnElement[Any],
    status: ColumnElement[Any],
    data: ColumnElement[Any],
    now: ColumnElement[Any],
    where: Sequence[ColumnElement[bool]] = (),
) -> Insert:
    """A new run row, if every ``where`` holds and ``(tenant, run_id)`` is not stored: these
    values at version 1, ``created_at`` = ``updated_at`` = ``now``, the counters at
    their defaults. The state store's ``create_run`` and the ADK service's session
    create both start a run with it."""
    values = {
        "tenant": tenant,
        "run_id": run_id,
        "session_id": session_id,
        "status": status,
        "data": data,
        "version": literal_column("1", BigInteger()),
        "created_at": now,
        "updated_at": now,
    }
    return (
        pg_insert(runs)
        .from_select(list(values), select(*values.values()).where(*where))
        .on_conflict_do_nothing(index_elements=[runs.c.tenant, runs.c.run_id])
    )


@lru_cache(maxsize=8)
def adk_tables_for(db_schema: str | None = None) -> AdkTables:
    """The ADK session service's tables in schema ``db_schema`` (default: the search_path)."""
    if db_schema is None:
        return ADK_TABLES
    return define_adk_tables(MetaData(naming_convention=NAMING_CONVENTION), db_schema)


@lru_cache(maxsize=32)
def tables_for(names: StateTables | None = None, db_schema: str | None = None) -> Tables:
    """The ``Table`` objects for ``names`` in schema ``db_schema`` (default: the search_path).

    The default naming returns the tables of :data:`metadata`; any other gets
    its own ``MetaData`` with the same definitions, so statements and DDL name
    the deployment's relations.
    """
    names = names or StateTables()
    if names == StateTables() and db_schema is None:
        return _DEFAULT
    return define_state_tables(MetaData(naming_convention=NAMING_CONVENTION), names, db_schema)


#: The worker registry's table under the default schema, in :data:`metadata`.
WORKER_TABLE = define_worker_table(metadata, None)


@lru_cache(maxsize=8)
def worker_table_for(db_schema: str | None = None) -> Table:
    """The worker registry's table in schema ``db_schema`` (default: the search_path)."""
    if db_schema is None:
        return WORKER_TABLE
    return define_worker_table(MetaData(naming_convention=NAMING_CONVENTION), db_schema)


# -- EXPECTED_SCHEMA -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnShape:
    name: str
    type: str
    nullable: bool
    default: str | None = None


@dataclass(frozen=True, slots=True)
class IndexShape:
    name: str
    columns: tuple[str, ...]
    unique: bool = False
    where: str | None = None


@dataclass(frozen=True, slots=True)
class TableShape:
    name: str
    columns: tuple[ColumnShape, ...]
    primary_key: tuple[str, ...]
    indexes: tuple[IndexShape, ...]
    checks: tuple[str, ...]
    options: Mapping[str, str] = field(default_factory=dict)

    def column(self, name: str) -> ColumnShape:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class SchemaShape:
    """The shape the adapters read: what a deployment's own migration must create.

    ``version`` is what ``adk_schema`` must hold; :meth:`ddl` is the PostgreSQL
    DDL of the whole shape (tables, indexes, sequences, storage options).
    """

    version: int
    tables: Mapping[str, TableShape]
    sequences: tuple[str, ...]

    def __getitem__(self, table: str) -> TableShape:
        return self.tables[table]

    def __iter__(self) -> Any:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    def ddl(self) -> str:
        return render_ddl(metadata)


_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _expr(clause: Any) -> str:
    if isinstance(clause, Column):
        return clause.name
    return str(
        clause.compile(
            dialect=_DIALECT, compile_kwargs={"literal_binds": True, "include_table": False}
        )
    )


def _shape_of(table: Table) -> TableShape:
    columns = tuple(
        ColumnShape(
            name=column.name,
            type=str(column.type.compile(dialect=_DIALECT)),
            nullable=bool(column.nullable),
            default=(
                "identity"
                if column.identity is not None
                else None
                if column.server_default is None
                else _expr(column.server_default.arg)  # type: ignore[attr-defined]
            ),
        )
        for column in table.columns
    )
    indexes = tuple(
        sorted(
            (
                IndexShape(
                    name=str(index.name),
                    columns=tuple(_expr(expr) for expr in index.expressions),
                    unique=bool(index.unique),
                    where=(
                        None
                        if index.dialect_options["postgresql"]["where"] is None
                        else _expr(index.dialect_options["postgresql"]["where"])
                    ),
                )
                for index in table.indexes
            ),
            key=lambda shape: shape.name,
        )
    )
    uniques = tuple(
        IndexShape(
            name=str(constraint.name),
            columns=tuple(column.name for column in constraint.columns),
            unique=True,
        )
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    )
    checks = tuple(
        sorted(
            _expr(constraint.sqltext)
            for constraint in table.constraints
            if isinstance(constraint, CheckConstraint)
        )
    )
    options = {
        key: str(value)
        for key, value in (table.dialect_options["postgresql"]["with"] or {}).items()
    }
    return TableShape(
        name=table.name,
        columns=columns,
        primary_key=tuple(column.name for column in table.primary_key.columns),
        indexes=uniques + indexes,
        checks=checks,
        options=options,
    )


def render_ddl(meta: MetaData) -> str:
    """The PostgreSQL DDL of every sequence, table and index in ``meta``."""
    statements: list[str] = [
        str(CreateSequence(sequence).compile(dialect=_DIALECT))
        for sequence in meta._sequences.values()
    ]
    for table in meta.sorted_tables:
        statements.append(str(CreateTable(table).compile(dialect=_DIALECT)).strip())
        statements.extend(
            str(CreateIndex(index).compile(dialect=_DIALECT))
            for index in sorted(table.indexes, key=lambda index: str(index.name))
        )
    return ";\n\n".join(statements) + ";\n"


def _derive(meta: MetaData) -> SchemaShape:
    return SchemaShape(
        version=SCHEMA_VERSION,
        tables={table.name: _shape_of(table) for table in meta.sorted_tables},
        sequences=tuple(sorted(sequence.name for sequence in meta._sequences.values())),
    )


#: The shape of every table under the default names, derived from :data:`metadata`.
EXPECTED_SCHEMA: SchemaShape = _derive(metadata)
