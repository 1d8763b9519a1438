"""Apply, undo and inspect statepact's Alembic revisions from Python (``statepact db`` too).

The revisions live once, in the repository's top-level ``alembic/``; the wheel
ships them as ``statepact/_migrations/``, and this module finds whichever copy
is there. :func:`upgrade_from_env` and :class:`AutogenerateFilter` fit them
into an application's own Alembic environment. How to run them:
docs/operations.md#migrations; inside an application: docs/adopting.md#migrations.

This module must never print or log a URL with its password, and never
reconfigure the application's logging.
"""

from __future__ import annotations

import asyncio
import io
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, TextIO, TypeVar

from sqlalchemy import pool
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from statepact.errors import (
    PoolExhaustedError,
    PreflightError,
    SchemaVersionError,
    StatepactError,
    StatePersistenceError,
)
from statepact.storage.postgres._client import (
    connect_refusal,
    is_connection_error,
    is_pool_exhausted,
    sqlstate_of,
)
from statepact.storage.postgres.schema import StateTables, metadata, tables_for

__all__ = [
    "BRANCH_LABEL",
    "FUNCTIONS",
    "LEGACY_REVISIONS",
    "OFFLINE_START_ARGUMENT",
    "VERSION_TABLE",
    "AutogenerateFilter",
    "alembic_config",
    "canonical_revision",
    "check",
    "current",
    "downgrade",
    "downgrade_sql",
    "head",
    "include_name",
    "include_object",
    "migrations_dir",
    "owned_table",
    "revisions",
    "upgrade",
    "upgrade_from_env",
    "upgrade_sql",
]

T = TypeVar("T")
VERSION_TABLE = "statepact_alembic_version"
#: The branch label of statepact's lineage: ``statepact@head`` names its head anywhere.
BRANCH_LABEL = "statepact"
#: The ids earlier releases recorded, and the ones they are now: read as the new ones
#: everywhere, and rewritten in the version table by the next migration run.
LEGACY_REVISIONS: Mapping[str, str] = {
    "0001": "statepact_0001",
    "0002": "statepact_0002",
    "0003": "statepact_0003",
}
#: The functions revision statepact_0002 creates (autogenerate does not see functions, but
#: extensions such as alembic_utils pass them to the filters).
FUNCTIONS = frozenset({"statepact_commit", "statepact_try_lock"})
#: The ``-x`` argument of an application's ``alembic upgrade A:B --sql`` that says where
#: statepact's lineage starts in the script (see :func:`upgrade_from_env`).
OFFLINE_START_ARGUMENT = "statepact_from"

EngineOrUrl = AsyncEngine | AsyncConnection | str


def migrations_dir() -> Path:
    """The directory holding ``alembic.ini`` and ``alembic/``: the wheel's copy, else the repo's."""
    packaged = resources.files("statepact") / "_migrations"
    if packaged.is_dir() and (packaged / "alembic.ini").is_file():
        return Path(str(packaged))
    # A source or editable checkout: src/statepact/storage/postgres/migrate.py -> repo root.
    root = Path(__file__).resolve().parents[4]
    if (root / "alembic.ini").is_file() and (root / "alembic" / "env.py").is_file():
        return root
    raise FileNotFoundError(
        "statepact's Alembic revisions were not found: neither statepact/_migrations "
        "(installed wheel) nor alembic/ beside the source tree"
    )


def alembic_config(
    connection: Connection | None = None,
    *,
    output_buffer: TextIO | None = None,
    within_application: bool = False,
) -> Any:
    """An Alembic ``Config`` for statepact's revisions.

    ``connection`` is handed to ``env.py`` (online runs); ``output_buffer`` takes
    the SQL of an offline (``--sql``) run; ``within_application`` tells an
    offline run that it is part of an application's script, inside the
    application's transaction, so it writes no ``BEGIN``/``COMMIT`` of its own.
    """
    from alembic.config import Config

    where = migrations_dir()
    config = Config(str(where / "alembic.ini"), output_buffer=output_buffer)
    config.set_main_option("script_location", str(where / "alembic"))
    config.attributes["configure_logger"] = False
    config.attributes["within_application"] = within_application
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def canonical_revision(revision: str | None) -> str | None:
    """``revision`` with an id of an earlier release (``0002``) replaced by today's."""
    if revision is None:
        return None
    return LEGACY_REVISIONS.get(revision, revision)


def _revision_argument(revision: str) -> str:
    """A revision argument (``REV`` or ``FROM:TO``) with earlier releases' ids replaced."""
    if not isinstance(revision, str) or not revision:
        raise ValueError(f"revision: must be a non-empty string, got {revision!r}")
    return ":".join(str(canonical_revision(part)) for part in revision.split(":"))


def _async_url(url: str) -> Any:
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed


@asynccontextmanager
async def _connection(target: EngineOrUrl) -> Any:
    if isinstance(target, AsyncConnection):
        yield target
        return
    engine = (
        target
        if isinstance(target, AsyncEngine)
        else create_async_engine(_async_url(target), poolclass=pool.NullPool)
    )
    try:
        async with engine.connect() as conn:
            yield conn
            if conn.in_transaction():
                await conn.commit()
    finally:
        if not isinstance(target, AsyncEngine):
            await engine.dispose()


# Alembic keeps its running environment in module globals (``alembic.context``),
# so two commands interleaving on one event loop would run on each other's
# connection: run them one at a time per loop. Across processes the advisory
# lock in env.py serialises them.
_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _loop_lock() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    lock = _LOCKS.get(loop)
    if lock is None:
        lock = _LOCKS[loop] = asyncio.Lock()
    return lock


@contextmanager
def _public_errors() -> Iterator[None]:
    """Driver and Alembic failures leave as statepact's public errors (see ``_translate``)."""
    try:
        yield
    except StatepactError:
        raise
    except Exception as exc:
        public = _translate(exc)
        if public is None:
            raise
        raise public from exc


async def _run(target: EngineOrUrl, command: Callable[[Connection], T]) -> T:
    with _public_errors():
        async with _loop_lock(), _connection(target) as conn:
            result: T = await conn.run_sync(command)
            return result


def _translate(exc: BaseException) -> StatepactError | None:
    """Migration failures as public errors; the message names no URL and no password."""
    from alembic.util import CommandError

    if isinstance(exc, CommandError):
        # e.g. the database is at a revision this release does not ship (a newer one).
        return SchemaVersionError(f"statepact migrations: {exc}")
    state = sqlstate_of(exc)
    if is_pool_exhausted(exc):
        return PoolExhaustedError("statepact migrations: no pooled connection was free")
    if is_connection_error(exc):
        return StatePersistenceError(
            f"statepact migrations: the server is unreachable ({type(exc).__name__})",
            reason="unavailable",
        )
    refusal = connect_refusal(exc)
    if refusal is not None:
        return PreflightError([refusal], server="PostgreSQL")
    if state == "42P07":
        return SchemaVersionError(
            "statepact migrations: statepact's tables already exist but "
            f"{VERSION_TABLE} does not record the revision that made them (SQLSTATE "
            "42P07); they were created another way, e.g. by an application's own Alembic "
            "environment with statepact's revisions in its version_locations. Apply them "
            "with statepact's environment only (docs: Adopting statepact, Migrations); "
            "nothing was applied"
        )
    if state == "42501":
        return PreflightError(
            [
                "the role may not create or alter statepact's tables (SQLSTATE 42501, "
                "permission denied); run the migrations as the schema's owner"
            ],
            server="PostgreSQL",
        )
    if isinstance(exc, SQLAlchemyError) or state is not None:
        return SchemaVersionError(
            f"statepact migrations failed ({type(exc).__name__}"
            f"{', SQLSTATE ' + state if state else ''}); nothing was applied"
        )
    return None


async def upgrade(target: EngineOrUrl, revision: str = "head") -> None:
    """Apply the revisions up to ``revision`` (``"head"``: all of them)."""
    from alembic import command

    wanted = _revision_argument(revision)

    def run(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), wanted)

    await _run(target, run)


async def downgrade(target: EngineOrUrl, revision: str = "base") -> None:
    """Undo the revisions down to ``revision`` (``"base"``: drop every statepact table)."""
    from alembic import command

    wanted = _revision_argument(revision)

    def run(connection: Connection) -> None:
        command.downgrade(alembic_config(connection), wanted)

    await _run(target, run)


async def current(target: EngineOrUrl) -> str | None:
    """The revision the database is at, or ``None`` when no revision was applied.

    Reads ``statepact_alembic_version`` only; an id an earlier release recorded
    (``0003``) is reported as today's (``statepact_0003``).
    """
    from alembic.migration import MigrationContext

    def run(connection: Connection) -> str | None:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return canonical_revision(context.get_current_revision())

    return await _run(target, run)


def _offline(command_name: str, revision: str) -> str:
    from alembic import command

    buffer = io.StringIO()
    config = alembic_config(output_buffer=buffer)
    with _public_errors():
        getattr(command, command_name)(config, revision, sql=True)
    return buffer.getvalue()


def upgrade_sql(revision: str = "head") -> str:
    """The SQL that upgrades to ``revision``, for a DBA to review; touches no database.

    ``revision`` is ``TO`` (from an empty database: the script creates
    ``statepact_alembic_version`` too) or ``FROM:TO`` (from a database at
    ``FROM``). The script is one transaction and takes the migrations' advisory
    lock first, like an online run.
    """
    return _offline("upgrade", _revision_argument(revision))


def downgrade_sql(revision: str = "base") -> str:
    """The SQL that undoes revisions down to ``revision``; touches no database.

    ``revision`` is ``FROM:TO``, or ``TO`` alone for a database at this
    release's head (``base``: every statepact table dropped).
    """
    wanted = _revision_argument(revision)
    if ":" not in wanted:
        wanted = f"{head()}:{wanted}"
    return _offline("downgrade", wanted)


def head() -> str:
    """The newest revision shipped with this release."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    found = script.get_current_head()
    if found is None:
        raise RuntimeError("statepact's Alembic revisions have no head")
    return found


async def check(target: EngineOrUrl) -> list[str]:
    """Everything that keeps the database from matching this release, one line each.

    Empty when the database is at the head revision and its tables match the
    metadata (Alembic's autogenerate comparison, storage options, sequences).
    """
    from statepact.storage.postgres.verify import schema_differences

    at = await current(target)
    wanted = head()
    problems = [] if at == wanted else [f"revision is {at or 'none'}, head is {wanted}"]
    async with _connection(target) as conn:
        if at is None and await _tables_exist(conn):
            problems[0] += (
                f": statepact's tables exist but {VERSION_TABLE} records no revision; were "
                "statepact's revisions applied by another Alembic environment (an "
                "application's version_locations)? See Adopting statepact: Migrations"
            )
        problems.extend(await schema_differences(conn))
    return problems


async def _tables_exist(conn: AsyncConnection) -> bool:
    from sqlalchemy import func, select

    found = await conn.execute(select(func.to_regclass("adk_schema").is_not(None)))
    return bool(found.scalar())


def revisions() -> Iterator[str]:
    """Every revision shipped, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    yield from reversed([rev.revision for rev in script.walk_revisions()])


# -- an application's own Alembic environment ---------------------------------------------

# What Alembic's name filters are called with for objects that belong to a table.
_TABLE_PARTS = frozenset({"column", "index", "unique_constraint", "foreign_key_constraint"})


class AutogenerateFilter:
    """Hides statepact's objects from an application's ``alembic revision --autogenerate``.

    An application's ``env.py`` passes :meth:`include_name` (or
    :meth:`include_object`) to ``context.configure``; both return ``False`` for
    what statepact's own revisions manage, so the application's autogenerate
    neither drops it nor proposes to alter it, and ``True`` for everything else
    (combine them with the application's own filter by ``and``):

    - the state and queue tables under ``tables`` (default names, or a
      deployment's own :class:`StateTables`), the ``statepact_*`` tables of the
      transaction backend, and the version table ``statepact_alembic_version``,
      with their columns, indexes and constraints;
    - the lease-token sequence and the functions ``statepact_commit`` and
      ``statepact_try_lock``, for extensions that compare those.

    Objects count as statepact's in the connection's default schema (where
    statepact's revisions create them, on the ``search_path``; Alembic names it
    ``None``) and, when ``db_schema`` is given (``PostgresStoreSettings.db_schema``),
    in that schema too, which an ``include_schemas=True`` autogenerate reflects.
    """

    __slots__ = ("_names", "_schemas", "_standalone")

    def __init__(self, *, tables: StateTables | None = None, db_schema: str | None = None) -> None:
        state = tables_for(tables, db_schema)
        names = {table.name for table in metadata.tables.values()}
        names |= {getattr(state.names, spec.name) for spec in fields(state.names)}
        names.add(VERSION_TABLE)
        self._names = frozenset(names)
        sequences = {sequence.name for sequence in metadata._sequences.values()}
        self._standalone = frozenset(sequences | {state.token_seq.name} | FUNCTIONS)
        self._schemas = frozenset({None, db_schema})

    def __repr__(self) -> str:
        schema = next((s for s in self._schemas if s is not None), None)
        return f"AutogenerateFilter(db_schema={schema!r})"

    def owns(self, name: str | None, type_: str, schema: str | None = None) -> bool:
        """Whether the object ``name`` of kind ``type_`` (in ``schema``) is statepact's."""
        if schema not in self._schemas or name is None:
            return False
        if type_ == "table":
            return name in self._names
        return name in self._standalone

    def include_name(self, name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
        """Alembic's ``include_name`` hook: ``False`` for statepact's objects."""
        if type_ == "schema":
            return True
        schema = parent_names.get("schema_name")
        if type_ in _TABLE_PARTS:
            return not self.owns(parent_names.get("table_name"), "table", schema)
        return not self.owns(name, type_, schema)

    def include_object(
        self,
        object_: Any,
        name: str | None,
        type_: str,
        reflected: bool,
        compare_to: Any,
    ) -> bool:
        """Alembic's ``include_object`` hook: ``False`` for statepact's objects."""
        if type_ in _TABLE_PARTS:
            table = getattr(object_, "table", None)
            return not self.owns(
                getattr(table, "name", None), "table", getattr(table, "schema", None)
            )
        return not self.owns(name, type_, getattr(object_, "schema", None))


_DEFAULT_FILTER = AutogenerateFilter()


def include_name(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
    """:meth:`AutogenerateFilter.include_name` for statepact's default table names."""
    return _DEFAULT_FILTER.include_name(name, type_, parent_names)


def include_object(
    object_: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """:meth:`AutogenerateFilter.include_object` for statepact's default table names."""
    return _DEFAULT_FILTER.include_object(object_, name, type_, reflected, compare_to)


def owned_table(name: str | None) -> bool:
    """Whether ``name`` is one of statepact's own tables (its own env.py compares only those)."""
    return _DEFAULT_FILTER.owns(name, "table")


def _is_upgrade(environment: Any) -> bool:
    # Alembic names the function its upgrade command hands the environment "upgrade"
    # (command.upgrade); downgrade, stamp, revision, check and current hand others.
    # tests/integration/test_app_migrations.py runs each command to hold this down.
    fn = environment.context_opts.get("fn")
    return getattr(fn, "__name__", None) == "upgrade"


def upgrade_from_env(revision: str = "head") -> None:
    """Apply statepact's revisions from inside an application's Alembic ``env.py``.

    Call it in both ``run_migrations_offline`` and ``do_run_migrations``, after
    ``context.configure(...)`` and inside ``with context.begin_transaction():``,
    just before ``context.run_migrations()``. When the application's command is
    ``alembic upgrade`` it runs statepact's own environment up to ``revision``
    (statepact's head by default, whatever revision the application targets):

    - online, on the application's connection and in its transaction (one
      commit for both lineages, after statepact's migration lock), recorded in
      ``statepact_alembic_version``, so ``statepact db current|check`` and
      ``statepact doctor`` read the result;
    - offline (``alembic upgrade --sql``), into the application's script, inside
      its ``BEGIN``/``COMMIT``. From an empty database the script creates
      statepact's version table; a script for a range (``alembic upgrade
      A:B --sql``) needs statepact's own start, ``-x statepact_from=REV``
      (``head`` for none of statepact's statements), or it is refused.

    Any other command (``downgrade``, ``stamp``, ``revision --autogenerate``,
    ``check``, ``current``) leaves statepact's tables alone: undo them with
    ``statepact db downgrade``. Alembic's ``context`` and ``op`` proxies are
    saved and restored around the nested run, so the application's environment
    carries on as before. Errors are the public ones of :func:`upgrade`.
    """
    from alembic import command
    from alembic import context as context_module
    from alembic import op as op_module

    outer = getattr(context_module, "_proxy", None)
    if outer is None:
        raise RuntimeError(
            "upgrade_from_env: no Alembic environment is running; call it from an "
            "application's env.py (elsewhere, use statepact.storage.postgres.migrate.upgrade)"
        )
    if not _is_upgrade(outer):
        return
    try:
        migration = outer.get_context()
    except Exception as exc:  # Alembic raises a bare Exception before configure()
        raise RuntimeError(
            "upgrade_from_env: call it after context.configure(...), inside "
            "`with context.begin_transaction():`"
        ) from exc
    wanted = _revision_argument(revision)
    saved_op = getattr(op_module, "_proxy", None)
    try:
        with _public_errors():
            if not outer.is_offline_mode():
                command.upgrade(alembic_config(outer.get_bind()), wanted)
                return
            start = outer.get_x_argument(as_dictionary=True).get(OFFLINE_START_ARGUMENT)
            if start is None and outer.get_starting_revision_argument() is not None:
                raise SchemaVersionError(
                    "statepact migrations: an offline script for a range of the "
                    "application's revisions needs statepact's own starting revision: "
                    f"pass -x {OFFLINE_START_ARGUMENT}=REV (the database's `statepact db "
                    "current`, or head for none of statepact's revisions)"
                )
            if start is not None and canonical_revision(start) == wanted:
                return  # statepact is where the script wants it: nothing of ours to write
            span = f"{_revision_argument(start)}:{wanted}" if start else wanted
            config = alembic_config(output_buffer=migration.output_buffer, within_application=True)
            command.upgrade(config, span, sql=True)
    finally:
        # The nested environment removed Alembic's module proxies on its way out.
        outer._install_proxy()
        if saved_op is not None:
            saved_op._install_proxy()
