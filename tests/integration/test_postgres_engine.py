"""``create_engine(settings)`` on a database left as PostgreSQL makes it: statement_timeout 0.

``verify()`` (what ``open()`` runs) refuses a connection with no
``statement_timeout``, so the engine the package builds sets
``PostgresStoreSettings.statement_timeout`` (30 s by default) on each new
connection that would otherwise have none, and keeps any the user set: in the
connection options (``connect_args``), for the role, or for the database.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact.clock import ManualClock, read_clock
from statepact.errors import PreflightError
from statepact.models import RunRecord, WorkItem
from statepact.queue import QueuePolicy
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue, create_engine
from statepact.storage.postgres.queue import _prepared
from tests.fixtures.postgres import admin_execute

pytestmark = pytest.mark.integration


def _settings(url: str, **fields: Any) -> PostgresStoreSettings:
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return PostgresStoreSettings(dsn=SecretStr(plain), **fields)


async def _shown(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(text("SHOW statement_timeout"))).scalar())


async def test_the_default_database_has_no_statement_timeout(default_database_url: str) -> None:
    """The premise: a plain engine on the test's default database sees statement_timeout 0."""
    engine = create_async_engine(default_database_url)
    try:
        assert await _shown(engine) == "0"
    finally:
        await engine.dispose()


async def test_open_passes_on_a_default_database(
    default_database_url: str, clock: ManualClock
) -> None:
    """create_engine(settings) sets the 30 s default, so the stores' open() (verify) passes and
    they work."""
    settings = _settings(default_database_url)
    engine = create_engine(settings)
    try:
        state = await PostgresStateStore.open(engine, clock=clock, settings=settings)
        queue = await PostgresWorkQueue.open(
            engine, clock=clock, settings=settings, policy=QueuePolicy()
        )
        assert await _shown(engine) == "30s"
        assert settings.statement_timeout == 30.0
        await state.put_run(RunRecord(tenant="acme", run_id="r1"))
        await queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
        assert await state.get_run("acme", "r1") is not None
    finally:
        await engine.dispose()


async def test_every_new_pooled_connection_gets_it(default_database_url: str) -> None:
    """Each connection of the pool is set, not only the first one."""
    engine = create_engine(_settings(default_database_url, pool_size=3, statement_timeout=2.5))
    try:
        async with engine.connect() as a, engine.connect() as b, engine.connect() as c:
            shown = [
                str((await conn.execute(text("SHOW statement_timeout"))).scalar())
                for conn in (a, b, c)
            ]
        assert shown == ["2500ms"] * 3
        assert await _shown(engine) == "2500ms"  # a connection back from the pool keeps it
    finally:
        await engine.dispose()


async def test_the_timeout_cancels_a_statement_that_runs_too_long(
    default_database_url: str,
) -> None:
    """The setting is the server's own: a statement past it is cancelled (SQLSTATE 57014)."""
    engine = create_engine(_settings(default_database_url, statement_timeout=0.2))
    try:
        async with engine.connect() as conn:
            with pytest.raises(sa_exc.DBAPIError) as caught:
                await conn.execute(text("SELECT pg_sleep(3)"))
        assert getattr(caught.value.orig, "sqlstate", None) == "57014"
    finally:
        await engine.dispose()


async def test_none_sets_nothing_and_open_refuses(
    default_database_url: str, clock: ManualClock
) -> None:
    """statement_timeout=None leaves the connection as the server made it: open() refuses."""
    settings = _settings(default_database_url, statement_timeout=None)
    engine = create_engine(settings)
    try:
        assert await _shown(engine) == "0"
        with pytest.raises(PreflightError, match="statement_timeout"):
            await PostgresStateStore.open(engine, clock=clock, settings=settings)
    finally:
        await engine.dispose()


async def test_a_timeout_set_for_the_database_is_kept(
    statepact_postgres_url: str, default_database_url: str
) -> None:
    """ALTER DATABASE ... SET statement_timeout wins over the settings' value."""
    name = make_url(default_database_url).database
    await admin_execute(
        statepact_postgres_url, f"ALTER DATABASE \"{name}\" SET statement_timeout = '7s'"
    )
    engine = create_engine(_settings(default_database_url))
    try:
        assert await _shown(engine) == "7s"
    finally:
        await engine.dispose()


async def test_a_timeout_set_for_the_role_is_kept(
    statepact_postgres_url: str, default_database_url: str
) -> None:
    """ALTER ROLE ... SET statement_timeout wins over the settings' value."""
    role = f"sp_role_{make_url(default_database_url).database}"[:63]
    await admin_execute(
        statepact_postgres_url,
        f'CREATE ROLE "{role}" LOGIN',
        f"ALTER ROLE \"{role}\" SET statement_timeout = '11s'",
    )
    try:
        url = make_url(default_database_url).set(username=role, password=None)
        engine = create_engine(_settings(url.render_as_string(hide_password=False)))
        try:
            assert await _shown(engine) == "11s"
        finally:
            await engine.dispose()
    finally:
        await admin_execute(statepact_postgres_url, f'DROP ROLE "{role}"')


async def test_a_timeout_in_the_connection_options_is_kept(default_database_url: str) -> None:
    """connect_args={"server_settings": {"statement_timeout": ...}} wins over the settings."""
    engine = create_engine(
        _settings(default_database_url),
        connect_args={"server_settings": {"statement_timeout": "9s"}},
    )
    try:
        assert await _shown(engine) == "9s"
    finally:
        await engine.dispose()


async def test_the_setting_costs_no_round_trip_per_call(default_database_url: str) -> None:
    """The timeout is set when a connection is opened, never again when it is checked out."""
    engine = create_engine(_settings(default_database_url, pool_size=1))
    try:
        assert await _shown(engine) == "30s"
        sent: list[str] = []
        async with engine.connect() as conn:
            raw: Any = (await conn.get_raw_connection()).driver_connection
        raw.add_query_logger(lambda record: sent.append(record.query))
        for _ in range(3):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        # The logger sees what asyncpg sends as simple queries, as the timeout's own is:
        # the three checkouts' BEGINs, and nothing about the timeout.
        assert sent.count("BEGIN;") == 3, sent
        assert not [query for query in sent if "statement_timeout" in query], sent
    finally:
        await engine.dispose()


def test_a_zero_or_negative_timeout_is_refused_naming_the_field() -> None:
    """0 would mean no limit, which open() refuses anyway: the settings refuse it first."""
    for bad in (0, -1, 0.0001):
        with pytest.raises(ValidationError, match="statement_timeout"):
            PostgresStoreSettings(statement_timeout=bad)


async def _jit_shown(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(text("SHOW jit"))).scalar())


async def test_jit_is_off_unless_the_caller_chose(default_database_url: str) -> None:
    """Each new connection of the engine has PostgreSQL's JIT off, set when it opens
    (no startup option, which a pooler may refuse); a ``jit`` passed in
    ``server_settings`` or set for the database wins, and the caller's other
    settings are kept beside it."""
    settings = _settings(default_database_url)
    chosen = {"server_settings": {"jit": "on", "application_name": "mine"}}
    other = {"server_settings": {"application_name": "mine"}}
    for connect_args, expected in ((None, "off"), (chosen, "on"), (other, "off")):
        kwargs = {} if connect_args is None else {"connect_args": connect_args}
        engine = create_engine(settings, **kwargs)
        try:
            assert await _jit_shown(engine) == expected, connect_args
            if connect_args is not None:
                async with engine.connect() as conn:
                    name = (await conn.execute(text("SHOW application_name"))).scalar()
                assert name == "mine"
        finally:
            await engine.dispose()
    plain = create_async_engine(default_database_url)
    try:
        async with plain.connect() as conn:
            database = (await conn.execute(text("SELECT current_database()"))).scalar()
            await conn.execute(text(f'ALTER DATABASE "{database}" SET jit = on'))
            await conn.commit()
    finally:
        await plain.dispose()
    engine = create_engine(settings)
    try:
        assert await _jit_shown(engine) == "on"  # the database's choice
    finally:
        await engine.dispose()


async def test_a_claim_is_never_compiled_by_jit(default_database_url: str) -> None:
    """On a server that compiles every statement whose estimate passes ``jit_above_cost``
    (here 0: every one), a claim on the engine's connections runs without JIT. On a queue
    of 10,000 tenants a claim's estimate passed the default 100,000 and LLVM compiled
    each claim before it ran, about 30 ms against 1 ms (docs/backings.md)."""
    settings = _settings(default_database_url)
    eager = {"jit_above_cost": "0", "jit_inline_above_cost": "-1", "jit_optimize_above_cost": "-1"}
    plans: dict[str, str] = {}
    for label, server_settings in (("jit on", {**eager, "jit": "on"}), ("ours", eager)):
        engine = create_engine(settings, connect_args={"server_settings": server_settings})
        try:
            queue = PostgresWorkQueue(engine, settings=settings, policy=QueuePolicy())
            await queue.enqueue(WorkItem(tenant="acme", item_id=f"i-{label}"))
            claim = _prepared(queue.tables).claim
            moment = read_clock(queue.clock)
            params = {
                "p_queue": queue.name,
                "p_now": moment,
                "p_worker": "w1",
                "p_expires_at": moment + timedelta(seconds=60),
                "p_limit": 1,
            }
            async with engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver = raw.driver_connection
                assert driver is not None
                # (pg_jit_available() is also false where the session has jit off.)
                if label == "jit on" and not await driver.fetchval("SELECT pg_jit_available()"):
                    pytest.skip("this PostgreSQL was built without JIT: nothing to compile")
                # EXPLAIN ANALYZE runs the claim: in a transaction rolled back.
                transaction = driver.transaction()
                await transaction.start()
                try:
                    rows = await driver.fetch(
                        f"EXPLAIN (ANALYZE) {claim.sql}", *claim.arguments(params)
                    )
                finally:
                    await transaction.rollback()
            plans[label] = "\n".join(row[0] for row in rows)
        finally:
            await engine.dispose()
    assert "JIT:" in plans["jit on"], plans["jit on"]  # the premise: this server compiles
    assert "JIT:" not in plans["ours"], plans["ours"]
