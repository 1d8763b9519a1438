"""Read-only checks of a PostgreSQL database before the stores use it.

:func:`verify` is what ``open()`` runs: the ``adk_schema`` version and a
non-zero ``statement_timeout`` (docs/operations.md#postgresql-verify);
:func:`schema_differences` lists how a database differs from the metadata, for
``statepact db check``.

This module reads and refuses; it must never set a setting, create or alter
anything, or leave a transaction open.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import Table, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statepact.errors import (
    PoolExhaustedError,
    PreflightError,
    SchemaVersionError,
    StatepactError,
)
from statepact.storage.postgres._client import (
    connect_refusal,
    is_connection_error,
    is_pool_exhausted,
    lacking_privilege,
    sqlstate_of,
)
from statepact.storage.postgres.schema import (
    COMPATIBLE_SCHEMA_VERSIONS,
    SCHEMA_COMPONENT,
    SCHEMA_VERSION,
    StateTables,
    metadata,
    tables_for,
)

__all__ = ["SchemaReport", "missing_privileges", "schema_differences", "verify"]

T = TypeVar("T")

_log = logging.getLogger("statepact.postgres")

STATEMENT_TIMEOUT_FIX = (
    "statement_timeout is 0 (no limit) on this connection: a statement that never ends "
    "holds a pooled connection until the process dies. Set one for the role or the "
    "database, e.g. ALTER ROLE <role> SET statement_timeout = '30s' or "
    "ALTER DATABASE <db> SET statement_timeout = '30s' (new connections pick it up), "
    "or pass it in the connection options"
)


class SchemaReport:
    """What ``verify`` read: the schema version and the effective ``statement_timeout``."""

    __slots__ = ("statement_timeout", "version")

    def __init__(self, version: int, statement_timeout: str) -> None:
        self.version = version
        self.statement_timeout = statement_timeout

    def __repr__(self) -> str:
        return f"SchemaReport(version={self.version}, statement_timeout={self.statement_timeout!r})"


async def _with_connection(
    engine: AsyncEngine | AsyncConnection, work: Callable[[AsyncConnection], Awaitable[T]]
) -> T:
    try:
        if isinstance(engine, AsyncEngine):
            async with engine.connect() as conn:
                try:
                    return await work(conn)
                finally:
                    await conn.rollback()
        if isinstance(engine, AsyncConnection):
            # Leave the caller's transaction as it was: ours, autobegun, is ended.
            was_open = engine.in_transaction()
            try:
                return await work(engine)
            finally:
                if not was_open and engine.in_transaction():
                    await engine.rollback()
    except StatepactError:
        raise
    except sa_exc.SQLAlchemyError as exc:
        if is_pool_exhausted(exc):
            raise PoolExhaustedError(
                "PostgreSQL verify: no pooled connection was free within the pool timeout"
            ) from exc
        state = sqlstate_of(exc)
        if state == "42501":
            raise PreflightError([lacking_privilege("verify", exc)], server="PostgreSQL") from exc
        refusal = connect_refusal(exc)
        if refusal is not None:
            raise PreflightError([refusal], server="PostgreSQL") from exc
        what = "unreachable" if is_connection_error(exc) else "refused"
        detail = type(exc).__name__ + (f", SQLSTATE {state}" if state else "")
        raise PreflightError([f"the server is {what} ({detail})"], server="PostgreSQL") from exc
    except OSError as exc:
        raise PreflightError(
            [f"the server is unreachable ({type(exc).__name__})"], server="PostgreSQL"
        ) from exc
    raise TypeError(
        f"engine: must be an SQLAlchemy AsyncEngine or AsyncConnection, got {type(engine).__name__}"
    )


async def verify(
    engine: AsyncEngine | AsyncConnection,
    *,
    tables: StateTables | None = None,
    db_schema: str | None = None,
) -> SchemaReport:
    """Refuse a database the stores must not run on; return what was read.

    Raises ``SchemaVersionError`` when the schema table is missing or holds a
    version outside ``COMPATIBLE_SCHEMA_VERSIONS``, and ``PreflightError``
    naming ``statement_timeout`` and the fix when it is 0. Reads only.
    """
    schema_table: Table = tables_for(tables, db_schema).schema

    async def work(conn: AsyncConnection) -> SchemaReport:
        present = (
            await conn.execute(select(func.to_regclass(_qualified(schema_table)).is_not(None)))
        ).scalar()
        if not present:
            raise SchemaVersionError(
                f"table {_qualified(schema_table)!r} does not exist: the statepact tables "
                "have not been created; run `statepact db upgrade` (or `alembic upgrade "
                "head` where the application's Alembic environment applies statepact's "
                "revisions, docs/adopting.md), or apply EXPECTED_SCHEMA in your own migration",
                found=None,
                expected=str(SCHEMA_VERSION),
            )
        version = (
            await conn.execute(
                select(schema_table.c.version).where(schema_table.c.component == SCHEMA_COMPONENT)
            )
        ).scalar()
        if version is None or int(version) not in COMPATIBLE_SCHEMA_VERSIONS:
            found = "no row" if version is None else str(version)
            readable = ", ".join(str(v) for v in sorted(COMPATIBLE_SCHEMA_VERSIONS))
            raise SchemaVersionError(
                f"{_qualified(schema_table)} holds schema version {found} for "
                f"{SCHEMA_COMPONENT!r}; this release reads version(s) {readable}: "
                "upgrade the database (`statepact db upgrade`) or statepact to match",
                found=None if version is None else str(version),
                expected=str(SCHEMA_VERSION),
            )
        timeout = str((await conn.execute(text("SHOW statement_timeout"))).scalar())
        if timeout.strip() in ("0", "0ms", "0s"):
            raise PreflightError([STATEMENT_TIMEOUT_FIX], server="PostgreSQL")
        return SchemaReport(int(version), timeout)

    try:
        return await _with_connection(engine, work)
    except (PreflightError, SchemaVersionError) as exc:
        _log.warning(
            "PostgreSQL verify refused the database: %s",
            exc,
            extra={"backing": "postgres", "error_type": type(exc).__name__},
        )
        raise


def _qualified(table: Table) -> str:
    return f"{table.schema}.{table.name}" if table.schema else table.name


#: What statepact's calls do to each kind of object (docs/operations.md#the-applications-role).
_TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
_SEQUENCE_PRIVILEGES = ("USAGE", "SELECT")

# Each wanted privilege a row: (object, kind, privilege), answered in the order asked;
# the objects that do not exist are left to the schema checks. CASE evaluates only its
# matching branch.
_LACKING = text(
    "SELECT wanted.name, wanted.kind, wanted.privilege "
    "FROM unnest(CAST(:names AS text[]), CAST(:kinds AS text[]), CAST(:privileges AS text[])) "
    "WITH ORDINALITY AS wanted(name, kind, privilege, place) "
    "WHERE to_regclass(wanted.name) IS NOT NULL AND NOT CASE wanted.kind "
    "WHEN 'table' THEN has_table_privilege(wanted.name, wanted.privilege) "
    "ELSE has_sequence_privilege(wanted.name, wanted.privilege) END "
    "ORDER BY wanted.place"
)
_IDENTITY_SEQUENCES = text(
    "SELECT pg_get_serial_sequence(identity.name, identity.column_name) "
    "FROM unnest(CAST(:tables AS text[]), CAST(:columns AS text[])) "
    "AS identity(name, column_name) WHERE to_regclass(identity.name) IS NOT NULL"
)
# The schemas holding statepact's tables that the role may not enter: ``db_schema``, or the
# search_path's as configured ("$user" is the role's own). The catalogs are readable by
# every role; a relation in a schema without USAGE is invisible (unqualified) or refused
# (qualified), so this comes first.
_SCHEMAS_LACKING = text(
    "SELECT DISTINCT n.nspname FROM pg_class AS c JOIN pg_namespace AS n "
    "ON n.oid = c.relnamespace WHERE c.relname = ANY(CAST(:tables AS text[])) "
    "AND n.nspname = ANY(COALESCE(CAST(:schemas AS text[]), ARRAY(SELECT CASE "
    "WHEN btrim(part) = '\"$user\"' THEN CAST(current_user AS text) ELSE btrim(btrim(part), '\"') "
    "END FROM unnest(string_to_array(current_setting('search_path'), ',')) AS part))) "
    "AND NOT has_schema_privilege(n.oid, 'USAGE') ORDER BY n.nspname"
)
_FUNCTIONS_LACKING = text(
    "SELECT p.proname FROM pg_proc AS p WHERE p.proname = ANY(CAST(:names AS text[])) "
    "AND pg_function_is_visible(p.oid) AND NOT has_function_privilege(p.oid, 'EXECUTE') "
    "ORDER BY p.proname"
)


async def missing_privileges(
    engine: AsyncEngine | AsyncConnection,
    *,
    tables: StateTables | None = None,
    db_schema: str | None = None,
) -> list[str]:
    """What the connected role may not do that statepact's calls do, one line per object
    (``"adk_work: INSERT, UPDATE"``, ``"sequence adk_work_id_seq: USAGE"``); empty when
    it may do everything. The tables want DML (``adk_schema`` only ``SELECT``), the
    sequences ``USAGE`` and ``SELECT``, the functions ``EXECUTE``; a schema holding them
    that the role may not enter is answered alone (``"schema public: USAGE"``), since
    nothing in it can be checked. An object that does not exist is the schema checks' to
    report. Reads only.
    """
    from statepact.storage.postgres._sql.tx import VERSION_SEQUENCE
    from statepact.storage.postgres.migrate import FUNCTIONS

    state = tables_for(tables, db_schema)
    state_tables = [state.runs, state.sessions, state.work, state.queue_turns, state.run_writes]
    state_tables.append(state.queue_control)
    defaults = tables_for()
    own = {defaults.runs, defaults.sessions, defaults.work, defaults.queue_turns}
    own.add(defaults.queue_control)
    own |= {defaults.run_writes, defaults.schema}
    # The transaction backend's tables: the rest of the metadata (always default-named).
    backend_tables = [table for table in metadata.tables.values() if table not in own]
    wanted: list[tuple[str, str, str]] = [
        (_qualified(state.schema), "table", "SELECT"),
        *(
            (_qualified(table), "table", privilege)
            for table in (*state_tables, *backend_tables)
            for privilege in _TABLE_PRIVILEGES
        ),
    ]
    identities = [
        (_qualified(table), column.name)
        for table in (*state_tables, *backend_tables)
        for column in table.columns
        if column.identity is not None
    ]

    async def work(conn: AsyncConnection) -> list[str]:
        closed = await conn.execute(
            _SCHEMAS_LACKING,
            {
                "tables": sorted({table.name for table in (state.schema, *state_tables)}),
                "schemas": None if db_schema is None else [db_schema],
            },
        )
        schemas = [f"schema {name}: USAGE" for name in closed.scalars()]
        if schemas:
            return schemas
        found = await conn.execute(
            _IDENTITY_SEQUENCES,
            {"tables": [t for t, _ in identities], "columns": [c for _, c in identities]},
        )
        token_seq = state.token_seq
        sequences = [
            f"{token_seq.schema}.{token_seq.name}" if token_seq.schema else token_seq.name,
            VERSION_SEQUENCE,
            *found.scalars(),
        ]
        rows = wanted + [
            (sequence, "sequence", privilege)
            for sequence in sequences
            for privilege in _SEQUENCE_PRIVILEGES
        ]
        lacking = (
            await conn.execute(
                _LACKING,
                {
                    "names": [name for name, _, _ in rows],
                    "kinds": [kind for _, kind, _ in rows],
                    "privileges": [privilege for _, _, privilege in rows],
                },
            )
        ).all()
        functions = (
            (await conn.execute(_FUNCTIONS_LACKING, {"names": sorted(FUNCTIONS)})).scalars().all()
        )
        by_object: dict[str, list[str]] = {}
        for name, kind, privilege in lacking:
            label = name if kind == "table" else f"sequence {name}"
            by_object.setdefault(label, []).append(privilege)
        return [f"{label}: {', '.join(privileges)}" for label, privileges in by_object.items()] + [
            f"function {name}: EXECUTE" for name in functions
        ]

    return await _with_connection(engine, work)


def _compare(connection: Connection) -> list[str]:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    own = frozenset(metadata.tables)

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        return name in own if type_ == "table" else True

    context = MigrationContext.configure(
        connection,
        opts={
            "include_name": include_name,
            "compare_type": True,
            "compare_server_default": True,
        },
    )
    found = [_render(diff) for diff in compare_metadata(context, metadata)]
    for table in metadata.sorted_tables:
        wanted = table.dialect_options["postgresql"]["with"] or {}
        if not wanted:
            continue
        row = connection.execute(
            text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:name)"),
            {"name": table.name},
        ).first()
        if row is None:
            continue
        have = dict(option.split("=", 1) for option in (row[0] or []))
        for key, value in wanted.items():
            if have.get(key) != str(value):
                found.append(
                    f"table {table.name}: storage option {key} is "
                    f"{have.get(key, 'unset')}, expected {value}"
                )
    for sequence in metadata._sequences.values():
        exists = connection.execute(
            text("SELECT to_regclass(:name) IS NOT NULL"), {"name": sequence.name}
        ).scalar()
        if not exists:
            found.append(f"sequence {sequence.name} is missing")
    return found


def _render(diff: Any) -> str:
    """One line per Alembic difference tuple (or group of column modifications)."""
    if isinstance(diff, list):
        return "; ".join(_render(item) for item in diff)
    kind = diff[0]
    subjects = []
    for part in diff[1:]:
        name = getattr(part, "name", None)
        if name is not None:
            table = getattr(part, "table", None)
            table_name = getattr(table, "name", None)
            subjects.append(f"{table_name}.{name}" if table_name and table_name != name else name)
        elif isinstance(part, str):
            subjects.append(part)
    return f"{kind}: {', '.join(str(s) for s in subjects if s)}"


async def schema_differences(engine: AsyncEngine | AsyncConnection) -> list[str]:
    """How the database differs from the metadata, one line each; empty when it matches."""

    async def work(conn: AsyncConnection) -> list[str]:
        return await conn.run_sync(_compare)

    return await _with_connection(engine, work)
