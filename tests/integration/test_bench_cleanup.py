"""``statepact bench`` on PostgreSQL leaves the database as it found it.

The bench runs against a database of the test's own, so a before/after
inventory of its schemas and relations shows exactly what the run left behind
(nothing); on Redis, against a database of the test's own, emptied first. The
floors' tables are created in the bench's scratch schema by name, whatever the
connection's ``search_path`` says. The scratch schema (and, on Redis, the scratch
namespace) that ``demo`` and ``bench`` share goes even when the command is
cancelled again and again while it cleans up.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from typing import Any

import pytest
from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.cli import bench
from statepact.cli._bench.floors import PostgresUpdate, qualified
from statepact.cli._bench.seed import SEED_TABLE, PostgresTxn

pytestmark = pytest.mark.integration

# Everything in a database that is not PostgreSQL's own.
INVENTORY = text(
    "SELECT n.nspname, coalesce(c.relname, '') "
    "FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid "
    "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
    "AND n.nspname NOT LIKE 'pg_temp_%' AND n.nspname NOT LIKE 'pg_toast_temp_%' "
    "ORDER BY 1, 2"
)


async def _inventory(url: str) -> list[tuple[str, str]]:
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            return [(row[0], row[1]) for row in await conn.execute(INVENTORY)]
    finally:
        await engine.dispose()


TINY = [
    *("--concurrency", "2", "--ops", "2", "--tenants", "2", "--queued", "4", "--claims", "2"),
    *("--finished", "10"),
]


async def _bench(*argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([*argv, *TINY, "--json"])
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(lambda: bench.command(args, out=out, err=err))
    assert code == 0, err.getvalue()
    payload: dict[str, Any] = json.loads(out.getvalue())
    return payload


async def test_a_bench_run_leaves_no_table_or_schema_behind(empty_database_url: str) -> None:
    """After a tiny bench run (floors included) the database holds what it held before."""
    before = await _inventory(empty_database_url)
    payload = await _bench("--backend", "postgres", "--postgres", empty_database_url)
    floors = {f["floor"] for f in payload["floors"]}
    # the floors with tables did run: the updates (bench_floor) and the designs (bench_seed)
    assert {"raw one-row UPDATE", "pg.sqla.autocommit.update_own"} <= floors
    assert {"seed.pg.txn.independent", "seed.pg.seedlock.independent", "seed.pg.cas.hot"} <= floors
    after = await _inventory(empty_database_url)
    assert after == before
    assert not [rel for _, rel in after if rel in (bench.FLOOR_TABLE, SEED_TABLE)]
    assert not [schema for schema, _ in after if schema.startswith("bench")]


async def test_a_bench_run_leaves_no_redis_key_behind(statepact_redis_url: str) -> None:
    """After a tiny bench run on Redis (floors included) the database is empty again."""
    from redis.asyncio import Redis

    client = Redis.from_url(statepact_redis_url)
    try:
        await client.flushdb()
        payload = await _bench("--backend", "redis", "--redis", statepact_redis_url)
        floors = {f["floor"] for f in payload["floors"]}
        assert {
            "raw EVALSHA",
            "redis.hincrby_own",
            "redis.evalsha_2r2w",
            "seed.redis.hot",
        } <= floors
        assert await client.dbsize() == 0
    finally:
        await client.aclose()


async def test_the_floor_tables_live_in_the_scratch_schema_by_name(
    empty_database_url: str,
) -> None:
    """With ``search_path`` at its default (``public`` first), the floors still create their
    tables in the bench's schema, and closing them leaves the schema empty."""
    tag = "bench0123abcd"
    engine = create_async_engine(empty_database_url, poolclass=pool.NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{tag}"'))
        update = PostgresUpdate(engine, tag, held=False)
        design = PostgresTxn(engine, tag)
        await update.setup()
        await design.setup()
        await update.hold(1)
        await update.op(0, 0)
        tables = await _inventory(empty_database_url)
        assert {(tag, bench.FLOOR_TABLE), (tag, SEED_TABLE)} <= set(tables)
        assert not [(s, r) for s, r in tables if s == "public" and r.startswith("bench")]
        await update.close()
        await design.close()
        assert [(s, r) for s, r in await _inventory(empty_database_url) if s == tag] == [(tag, "")]
        with pytest.raises(ValueError, match="not a plain schema name"):
            qualified('x"; DROP SCHEMA public; --', bench.FLOOR_TABLE)
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE'))
        await engine.dispose()


async def _cancel_twice_while_cleaning(kind: str, url: str) -> None:
    """Open the CLI's scratch backings, then cancel the command, and cancel it again and
    again while its cleanup runs (a second Ctrl-C, a TaskGroup cancelling a task that an
    ``asyncio.timeout`` already cancelled)."""
    from statepact.cli import _common
    from statepact.clock import SystemClock
    from statepact.models import RunRecord
    from statepact.queue import QueuePolicy

    entered = asyncio.Event()

    async def command() -> None:
        async with _common.open_backings(
            kind, url, clock=SystemClock(), policy=QueuePolicy(), notes=io.StringIO()
        ) as b:
            await b.state.put_run(RunRecord(tenant="t", run_id="r"))
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(command())
    await entered.wait()
    task.cancel()
    while not task.done():
        await asyncio.sleep(0)
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


async def test_a_command_cancelled_twice_still_drops_its_scratch_schema(
    empty_database_url: str,
) -> None:
    """The scratch schema is dropped even when cancellations keep arriving during cleanup."""
    before = await _inventory(empty_database_url)
    await _cancel_twice_while_cleaning("postgres", empty_database_url)
    assert await _inventory(empty_database_url) == before


async def test_a_command_cancelled_twice_still_deletes_its_redis_namespace(
    statepact_redis_url: str,
) -> None:
    """The scratch namespace is deleted even when cancellations keep arriving during cleanup."""
    from redis.asyncio import Redis

    client = Redis.from_url(statepact_redis_url)
    try:
        await client.flushdb()
        await _cancel_twice_while_cleaning("redis", statepact_redis_url)
        assert await client.dbsize() == 0
    finally:
        await client.aclose()
