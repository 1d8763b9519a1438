"""verify() and open() against real PostgreSQL settings: schema version, statement_timeout.

``open()`` runs ``verify()``, which reads ``adk_schema`` and refuses a version
this release was not written for, and refuses a connection whose
``statement_timeout`` is 0; a timeout set for the role or the database is
fine. It reads and never sets.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact.clock import ManualClock
from statepact.errors import PreflightError, SchemaVersionError
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue, verify
from statepact.storage.postgres.schema import SCHEMA_VERSION
from statepact.storage.postgres.verify import schema_differences
from tests.fixtures.postgres import admin_execute

pytestmark = pytest.mark.integration


@pytest.fixture
async def engine_without_timeout(pg_database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine whose connections run with statement_timeout = 0 (no limit)."""
    engine = create_async_engine(
        pg_database_url, connect_args={"server_settings": {"statement_timeout": "0"}}
    )
    yield engine
    await engine.dispose()


async def test_open_accepts_a_database_level_timeout(
    pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """The fixture database has ALTER DATABASE ... SET statement_timeout: open() accepts it."""
    report = await verify(pg_engine)
    assert report.version == SCHEMA_VERSION
    assert report.statement_timeout == "30s"
    store = await PostgresStateStore.open(pg_engine, clock=clock)
    assert await store.get_run("acme", "r1") is None
    queue = await PostgresWorkQueue.open(pg_engine, clock=clock)
    assert await queue.claim("w1", lease_for=1) is None


async def test_no_statement_timeout_is_refused_naming_the_setting_and_the_fix(
    engine_without_timeout: AsyncEngine, clock: ManualClock
) -> None:
    """A connection with statement_timeout = 0 is refused with PreflightError and the fix."""
    with pytest.raises(PreflightError) as caught:
        await PostgresStateStore.open(engine_without_timeout, clock=clock)
    message = str(caught.value)
    assert "statement_timeout" in message
    assert "ALTER ROLE" in message
    assert "ALTER DATABASE" in message
    with pytest.raises(PreflightError):
        await PostgresWorkQueue.open(engine_without_timeout, clock=clock)
    # The constructor does not check; verify never changed the setting either.
    async with engine_without_timeout.connect() as conn:
        assert (await conn.execute(text("SHOW statement_timeout"))).scalar_one() == "0"


async def test_a_role_level_timeout_is_accepted(
    pg_database_url: str, statepact_postgres_url: str
) -> None:
    """statement_timeout set with ALTER ROLE (the database's own reset) passes verify."""
    role = f"statepact_r_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    database = make_url(pg_database_url).database
    await admin_execute(
        statepact_postgres_url,
        f'CREATE ROLE "{role}" LOGIN',
        f"ALTER ROLE \"{role}\" SET statement_timeout = '5s'",
    )
    try:
        owner = create_async_engine(pg_database_url)
        async with owner.begin() as conn:
            await conn.execute(text(f'ALTER DATABASE "{database}" RESET statement_timeout'))
            await conn.execute(text(f'GRANT SELECT ON adk_schema TO "{role}"'))
        await owner.dispose()
        as_role = create_async_engine(make_url(pg_database_url).set(username=role))
        try:
            report = await verify(as_role)
        finally:
            await as_role.dispose()
        assert report.statement_timeout == "5s"
    finally:
        owner = create_async_engine(pg_database_url)
        async with owner.begin() as conn:
            await conn.execute(text(f'DROP OWNED BY "{role}"'))
        await owner.dispose()
        await admin_execute(statepact_postgres_url, f'DROP ROLE IF EXISTS "{role}"')


async def test_a_version_this_release_does_not_read_is_refused(
    pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """adk_schema at another version raises SchemaVersionError with both versions."""
    async with pg_engine.begin() as conn:
        await conn.execute(text("UPDATE adk_schema SET version = 99"))
    with pytest.raises(SchemaVersionError) as caught:
        await PostgresStateStore.open(pg_engine, clock=clock)
    assert caught.value.found == "99"
    assert caught.value.expected == str(SCHEMA_VERSION)
    assert "statepact db upgrade" in str(caught.value)
    with pytest.raises(SchemaVersionError):
        await PostgresWorkQueue.open(pg_engine, clock=clock)


async def test_a_missing_version_row_or_table_is_refused(pg_engine: AsyncEngine) -> None:
    """No statepact row in adk_schema, or no adk_schema at all, raises SchemaVersionError."""
    async with pg_engine.begin() as conn:
        await conn.execute(text("DELETE FROM adk_schema"))
    with pytest.raises(SchemaVersionError, match="no row"):
        await verify(pg_engine)
    async with pg_engine.begin() as conn:
        await conn.execute(text("DROP TABLE adk_schema"))
    with pytest.raises(SchemaVersionError, match="does not exist") as caught:
        await verify(pg_engine)
    assert caught.value.found is None


async def test_verify_only_reads(pg_database_url: str) -> None:
    """verify runs on a read-only connection: it never writes or sets anything."""
    engine = create_async_engine(
        pg_database_url,
        connect_args={"server_settings": {"default_transaction_read_only": "on"}},
    )
    try:
        report = await verify(engine)
        async with engine.connect() as conn:
            report_on_connection = await verify(conn)
            assert not conn.in_transaction(), "verify left a transaction open"
            await conn.begin()
            await verify(conn)
            assert conn.in_transaction(), "verify ended the caller's transaction"
            await conn.rollback()
    finally:
        await engine.dispose()
    assert report.version == report_on_connection.version == SCHEMA_VERSION


async def test_schema_differences_lists_what_drifted(pg_engine: AsyncEngine) -> None:
    """schema_differences is empty on a migrated database and names what was changed."""
    assert await schema_differences(pg_engine) == []
    async with pg_engine.begin() as conn:
        await conn.execute(text("ALTER TABLE adk_runs ADD COLUMN extra integer"))
        await conn.execute(text("DROP INDEX ix_adk_work_claim"))
        await conn.execute(text("ALTER TABLE adk_work RESET (autovacuum_vacuum_scale_factor)"))
        await conn.execute(text("DROP SEQUENCE adk_work_token_seq"))
    found = "\n".join(await schema_differences(pg_engine))
    assert "adk_runs.extra" in found
    assert "ix_adk_work_claim" in found
    assert "autovacuum_vacuum_scale_factor" in found
    assert "adk_work_token_seq" in found
