"""The floors of ``statepact bench`` on real servers do what they say.

Each floor checks itself after every repetition (tests/unit/test_cli_bench_floors.py
shows a lossy design failing that check); here the servers' own state is read back
independently of that check, a write from outside between a repetition and its
check makes the check fail, the global-lock design really waits on one lock, and
every key and table a floor makes is where the bench's cleanup finds it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.cli._bench.floors import FLOOR_TABLE
from statepact.cli._bench.seed import SEED_TABLE, PostgresTxn
from statepact.cli._bench.targets import Floors
from statepact.cli._common import CommandError

pytestmark = pytest.mark.integration

TAG = "bench0123abcd"
AGENTS, OPS = 4, 5


async def _spoiled(floors: Floors, name: str, spoil: Any) -> None:
    """One repetition of ``name`` by two callers, then ``spoil()`` from outside: the
    floor's check must refuse it."""
    floor = await floors.floor(name)
    await floor.hold(2)
    try:
        await floor.reset(2)
        for caller in (0, 1):
            await floor.op(caller, 0)
        await floor.check(2, 1)  # untouched, it passes
        await floor.reset(2)
        for caller in (0, 1):
            await floor.op(caller, 0)
        await spoil()
        with pytest.raises(CommandError, match=f"the floor {name} "):
            await floor.check(2, 1)
    finally:
        await floor.release()


async def test_the_redis_floors_do_what_they_say(redis_client: Any) -> None:
    """The hot key ends at agents x ops on the server; every floor's check sees a write
    from outside; every key the floors made is under the bench's namespace."""
    floors = Floors("redis", redis_client, OPS, TAG)
    try:
        await floors.measure("seed.redis.hot", AGENTS, "test")
        assert int(await redis_client.hget(f"{TAG}:seed:hot", "v")) == AGENTS * OPS
        await floors.measure("seed.redis.independent", AGENTS, "test")
        values = [int(await redis_client.hget(f"{TAG}:seed:a{a}", "v")) for a in range(AGENTS)]
        assert values == [OPS] * AGENTS
        for name in ("seed.redis.readonly", "redis.ping", "redis.hincrby_own"):
            await floors.measure(name, AGENTS, "test")
        for name in ("redis.evalsha_2r2w", "raw EVALSHA"):
            await floors.measure(name, AGENTS, "test")
        assert floors.samples[1].extra["retries"] == 0  # independent keys never conflict

        await _spoiled(floors, "raw EVALSHA", lambda: redis_client.incr(f"{{{TAG}:floor:0}}"))
        await _spoiled(
            floors, "redis.hincrby_own", lambda: redis_client.hincrby(f"{{{TAG}:floor:1}}:h", "c")
        )
        await _spoiled(
            floors, "redis.evalsha_2r2w", lambda: redis_client.incr(f"{{{TAG}:floor:0}}:b")
        )
        await _spoiled(
            floors, "seed.redis.independent", lambda: redis_client.hset(f"{TAG}:seed:a0", "v", 9)
        )

        keys = [bytes(k).decode() async for k in redis_client.scan_iter(match="*")]
        assert keys
        outside = [k for k in keys if not k.startswith((f"{TAG}:", f"{{{TAG}:", f"{{{TAG}}}"))]
        assert outside == []
    finally:
        await floors.close()
        # What the bench's own cleanup would delete (the database is the session's).
        await redis_client.flushdb()


@pytest.fixture
async def scratch(pg_engine: AsyncEngine) -> Any:
    """The bench's scratch schema in the test's database, dropped after."""
    async with pg_engine.begin() as conn:
        await conn.execute(text(f'CREATE SCHEMA "{TAG}"'))
    try:
        yield pg_engine
    finally:
        async with pg_engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{TAG}" CASCADE'))


async def _tables(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT schemaname, tablename FROM pg_tables WHERE tablename IN (:floor, :seed)"),
            {"floor": FLOOR_TABLE, "seed": SEED_TABLE},
        )
        return {(row[0], row[1]) for row in rows}


async def _values(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text(f'SELECT k, v FROM "{TAG}".{SEED_TABLE}'))
        return {row[0]: int(row[1]) for row in rows}


async def _outside(engine: AsyncEngine, statement: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(statement))


async def test_the_postgres_floors_do_what_they_say(scratch: AsyncEngine) -> None:
    """Each design leaves its keys where the scenario says; every floor's check sees a
    write from outside; the floors' tables live in the scratch schema and go at close."""
    floors = Floors("postgres", scratch, OPS, TAG)
    try:
        await floors.measure("seed.pg.cas.hot", AGENTS, "test")
        assert (await _values(scratch))["hot"] == AGENTS * OPS
        for name in ("seed.pg.txn.independent", "seed.pg.seedlock.independent"):
            await floors.measure(name, AGENTS, "test")
            values = await _values(scratch)
            assert [values[f"a{a}"] for a in range(AGENTS)] == [OPS] * AGENTS
            assert values["hot"] == 0
        for name in (
            "seed.pg.txn.readonly",
            "pg.sqla.autocommit.select1",
            "pg.sqla.autocommit.update_own",
            "raw one-row UPDATE",
        ):
            await floors.measure(name, AGENTS, "test")
        assert await _tables(scratch) == {(TAG, FLOOR_TABLE), (TAG, SEED_TABLE)}

        bump = f'UPDATE "{TAG}".{FLOOR_TABLE} SET n = n + 1 WHERE id = 0'
        await _spoiled(floors, "pg.sqla.autocommit.update_own", lambda: _outside(scratch, bump))
        await _spoiled(floors, "raw one-row UPDATE", lambda: _outside(scratch, bump))
        hot = f"UPDATE \"{TAG}\".{SEED_TABLE} SET v = 999 WHERE k = 'a1'"
        await _spoiled(floors, "seed.pg.txn.independent", lambda: _outside(scratch, hot))
    finally:
        await floors.close()
    assert await _tables(scratch) == set()


async def test_the_global_lock_design_waits_on_one_lock(scratch: AsyncEngine) -> None:
    """seed.pg.seedlock's commit waits while another session holds its advisory lock;
    seed.pg.txn's does not."""
    locked = PostgresTxn(scratch, TAG, seedlock=True)
    plain = PostgresTxn(scratch, TAG)
    await locked.setup()
    await locked.hold(1)
    await plain.hold(1)
    try:
        await locked.reset(["a0", "a1"])
        async with scratch.connect() as outside:
            await outside.execute(text("SELECT pg_advisory_lock(:k)"), {"k": locked.lock_key})
            waiting = asyncio.ensure_future(locked.commit(0, "a0", 0, 1))
            assert await plain.commit(0, "a1", 0, 1) is True  # not behind the lock
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await outside.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": locked.lock_key})
            assert await asyncio.wait_for(waiting, 10) is True
        assert await locked.values(["a0", "a1"]) == [1, 1]
        assert await locked.commit(0, "a0", 0, 2) is False  # the version moved: refused
    finally:
        await plain.release()
        await locked.release()
        await locked.close()
