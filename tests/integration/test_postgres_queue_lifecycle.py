"""The queue lifecycle's PostgreSQL specifics (issue 33), on a real server.

- revision ``statepact_0008`` upgrades a database holding items of 0007 and
  downgrades again, the schema version following;
- prune of 200,000 finished items: every statement it sends is timed (printed)
  and under 100 ms, and it deletes exactly what is past its keep;
- a prune's own steps commit with ``synchronous_commit`` off, one inside a caller's
  transaction leaves the caller's setting alone;
- ``stats()`` with 200,000 done items costs what it costs without them (medians
  printed; within 2x plus a millisecond of loopback noise) and its plan scans no
  done row;
- a cancel in another process reaches this process's watch in under a second,
  and a cancel in a caller's transaction is announced only at its commit.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact.clock import read_clock
from statepact.models import ItemStatus, WorkItem
from statepact.storage.postgres import PostgresWorkQueue, _direct, migrate
from statepact.storage.postgres._queue_support import PRUNE_MAX_BATCH
from statepact.storage.postgres._sql.queue import statements as _statements
from statepact.storage.postgres.queue import _prepared

pytestmark = pytest.mark.integration

LEASE = 30.0
FINISHED = 200_000


async def _old_done_rows(engine: AsyncEngine, queue: PostgresWorkQueue, count: int) -> None:
    """``count`` done items over ten tenants, finished two days before the queue's clock,
    written in one statement (as prune and stats would find a long-running queue)."""
    old = read_clock(queue.clock) - timedelta(days=2)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO adk_work (queue, tenant, item_id, payload, priority, status, "
                "attempts, available_at, created_at, updated_at) "
                "SELECT :queue, 't' || (g % 10), 'old' || g, '{}'::json, 0, 'done', 1, "
                ":old, :old, CAST(:old AS timestamptz) + g * interval '1 millisecond' "
                "FROM generate_series(1, :count) AS g"
            ),
            {"queue": queue.name, "old": old, "count": count},
        )
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE adk_work"))


def _timed(monkeypatch: pytest.MonkeyPatch, sql: str) -> list[float]:
    """The seconds each driver call of the statement ``sql`` took, as they happen."""
    seen: list[float] = []
    direct = _direct.Statements.execute

    async def execute(self: _direct.Statements, statement: Any, parameters: Any = None) -> Any:
        started = time.perf_counter()
        try:
            return await direct(self, statement, parameters)
        finally:
            if statement.sql == sql:
                seen.append(time.perf_counter() - started)

    monkeypatch.setattr(_direct.Statements, "execute", execute)
    return seen


async def _count(engine: AsyncEngine, sql: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(sql))).scalar_one())


async def test_revision_0008_upgrades_items_of_0007_and_downgrades(empty_database_url: str) -> None:
    """0007 -> 0008 keeps the items and allows 'cancelled' (schema version 3); back to 0007
    drops the cancelled items and the new columns (version 2)."""
    await migrate.upgrade(empty_database_url, "statepact_0007")
    engine = create_async_engine(empty_database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO adk_work (queue, tenant, item_id, payload, status, attempts, "
                    "available_at, created_at, updated_at) VALUES "
                    "('q', 't', 'a', '{}', 'done', 1, now(), now(), now()), "
                    "('q', 't', 'b', '{}', 'queued', 0, now(), now(), now())"
                )
            )
        await migrate.upgrade(empty_database_url, "statepact_0008")
        version = "SELECT version FROM adk_schema WHERE component = 'statepact'"
        assert await _count(engine, version) == 3
        assert await _count(engine, "SELECT count(*) FROM adk_work WHERE unique_slot IS NULL") == 2
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE adk_work SET status = 'cancelled' WHERE item_id = 'b'"))
            await conn.execute(text("INSERT INTO adk_queue_control (queue) VALUES ('q')"))
        await migrate.downgrade(empty_database_url, "statepact_0007")
        assert await _count(engine, version) == 2
        assert await _count(engine, "SELECT count(*) FROM adk_work") == 1
        columns = (
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'adk_work' "
            "AND column_name IN ('unique_key', 'unique_for', 'timeout', 'unique_slot')"
        )
        assert await _count(engine, columns) == 0
        assert (
            await _count(
                engine, "SELECT count(*) FROM pg_tables WHERE tablename = 'adk_queue_control'"
            )
            == 0
        )
        await migrate.upgrade(empty_database_url)
        assert await _count(engine, version) == 3
    finally:
        await engine.dispose()


async def test_prune_of_200k_finished_items_sends_only_short_statements(
    postgres_work_queue: PostgresWorkQueue,
    pg_engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every prune statement over 200,000 finished items takes under 100 ms (printed), and
    prune deletes them all, keeping what is within its keep and every open item."""
    queue = postgres_work_queue
    await _old_done_rows(pg_engine, queue, FINISHED)
    await queue.enqueue_many([WorkItem(tenant="t1", item_id=f"open{i}") for i in range(20)])
    lease = await queue.claim("w1", lease_for=LEASE)
    assert lease is not None
    await queue.ack(lease)  # done now: within keep_done, kept
    durations = _timed(monkeypatch, _prepared(queue.tables).prune.sql)
    started = time.perf_counter()
    pruned = await queue.prune()
    elapsed = time.perf_counter() - started
    ms = sorted(d * 1000 for d in durations)
    print(
        f"\nprune of {FINISHED:,} finished items: {len(ms)} statements in {elapsed:.2f} s; "
        f"per statement median {statistics.median(ms):.1f} ms, p99 "
        f"{ms[int(len(ms) * 0.99)]:.1f} ms, max {ms[-1]:.1f} ms"
    )
    assert pruned == FINISHED
    assert max(ms) < 100, ms[-5:]
    assert len(ms) >= FINISHED // PRUNE_MAX_BATCH
    assert await _count(pg_engine, "SELECT count(*) FROM adk_work") == 20
    assert await queue.get_item("t1", lease.item.item_id) is not None
    assert await queue.prune() == 0


async def test_prune_commits_unflushed_only_in_its_own_transactions(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """A prune step of its own commits with synchronous_commit off; one inside a caller's
    transaction (bound) leaves the caller's setting as it was, since the commit is theirs."""
    queue = postgres_work_queue
    await _old_done_rows(pg_engine, queue, 10)
    async with pg_engine.connect() as conn, conn.begin():
        setting = text("SHOW synchronous_commit")
        await conn.execute(text("SET LOCAL synchronous_commit = local"))
        assert await queue.bound(conn).prune() == 10
        assert (await conn.execute(setting)).scalar() == "local"
        step = {
            "p_queue": queue.name,
            "p_pruner": "nobody",
            "p_until": read_clock(queue.clock),
            "p_batch": 1,
            "p_after": read_clock(queue.clock),
            "p_done_before": None,
            "p_cancelled_before": None,
            "p_dead_before": None,
            "p_commit": "off",
        }
        row = (await conn.execute(_statements(queue.tables).prune, step)).one()
        assert tuple(row) == (0, 0, None)  # no lease held: nothing deleted
        assert (await conn.execute(setting)).scalar() == "off"


async def _median_stats_ms(queue: PostgresWorkQueue, calls: int = 40) -> float:
    for _ in range(5):  # warm: the prepared statement's plan, the connection
        await queue.stats()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await queue.stats()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def test_stats_does_not_grow_with_done_items(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """stats() with 200,000 done items costs what it costs without them (within 2x, plus
    1 ms for a shared machine's loopback noise), and its plan reads no done row."""
    queue = postgres_work_queue
    await queue.enqueue_many(
        [WorkItem(tenant=f"t{i % 10}", item_id=f"open{i}") for i in range(100)]
    )
    for _ in range(5):
        lease = await queue.claim("w1", lease_for=LEASE)
        assert lease is not None
    async with pg_engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE adk_work"))
    before = await queue.stats()
    empty = await _median_stats_ms(queue)
    await _old_done_rows(pg_engine, queue, FINISHED)
    after = await queue.stats()
    full = await _median_stats_ms(queue)
    print(f"\nstats(): median {empty:.2f} ms without done items, {full:.2f} ms with {FINISHED:,}")
    assert after == before
    assert (after.queued, after.leased) == (95, 5)
    assert full <= 2 * empty + 1.0
    sql = _prepared(queue.tables).stats.sql
    async with pg_engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        plan = "\n".join(
            row[0] for row in await driver.fetch(f"EXPLAIN (COSTS OFF) {sql}", queue.name)
        )
    assert "Seq Scan" not in plan, plan


_CANCEL_ELSEWHERE = """
import asyncio, sys, time
from sqlalchemy.ext.asyncio import create_async_engine
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import PostgresWorkQueue

async def main() -> None:
    engine = create_async_engine(sys.argv[1])
    queue = PostgresWorkQueue(engine, settings=PostgresStoreSettings(queue_name=sys.argv[2]))
    await queue.cancel(sys.argv[3], sys.argv[4], reason="stopped from elsewhere")
    print(time.time(), flush=True)
    await engine.dispose()

asyncio.run(main())
"""


async def _wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.01)
    return check()


async def test_a_cancel_in_another_process_reaches_the_watch_within_a_second(
    postgres_work_queue: PostgresWorkQueue, pg_database_url: str
) -> None:
    """A leased item cancelled by another process: this process's watch hears of it (tenant,
    item, the voided token) in under a second from the cancel's return."""
    queue = postgres_work_queue
    await queue.enqueue(WorkItem(tenant="acme", item_id="long"))
    lease = await queue.claim("w1", lease_for=LEASE)
    assert lease is not None
    heard: list[tuple[str, str, int, float]] = []

    def on_cancel(tenant: str, item_id: str, token: int) -> None:
        heard.append((tenant, item_id, token, time.time()))

    async with queue.watch(on_cancel=on_cancel):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CANCEL_ELSEWHERE,
            pg_database_url,
            queue.name,
            "acme",
            "long",
            stdout=subprocess.PIPE,
        )
        out, _ = await process.communicate()
        assert process.returncode == 0
        cancelled_at = float(out.decode().strip())
        assert await _wait_for(lambda: bool(heard), 5.0)
    tenant, item_id, token, heard_at = heard[0]
    print(f"\ncancel notice across processes: {(heard_at - cancelled_at) * 1000:.1f} ms")
    assert (tenant, item_id, token) == ("acme", "long", lease.token)
    assert heard_at - cancelled_at < 1.0
    item = await queue.get_item("acme", "long")
    assert item is not None and item.status is ItemStatus.CANCELLED


async def test_a_bound_cancel_is_announced_at_commit_only(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """A cancel inside the caller's transaction is heard when it commits, never before."""
    queue = postgres_work_queue
    await queue.enqueue(WorkItem(tenant="acme", item_id="held"))
    lease = await queue.claim("w1", lease_for=LEASE)
    assert lease is not None
    heard: list[tuple[str, str, int]] = []
    watch = queue.watch(on_cancel=lambda *notice: heard.append(notice))
    async with watch, pg_engine.connect() as conn:
        transaction = await conn.begin()
        cancelled = await queue.bound(conn).cancel("acme", "held", reason="why")
        assert cancelled is not None and cancelled.status is ItemStatus.CANCELLED
        assert not await _wait_for(lambda: bool(heard), 0.3)
        await transaction.commit()
        assert await _wait_for(lambda: bool(heard), 2.0)
    assert heard == [("acme", "held", lease.token)]


async def test_a_bulk_load_naming_one_unique_key_twice_stores_one_of_them(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """A batch of 1,000 items (sent first without ON CONFLICT) in which two items share a
    unique key: the first is stored and the second answered as that item; the rest once."""
    queue = postgres_work_queue
    batch = [WorkItem(tenant="t", item_id=f"b{i}") for i in range(998)]
    batch.insert(10, WorkItem(tenant="t", item_id="first", unique_key="k"))
    batch.insert(500, WorkItem(tenant="t", item_id="second", unique_key="k"))
    answer = await queue.enqueue_many(batch)
    assert answer[10].item_id == "first"
    assert answer[500].item_id == "first"
    assert await _count(pg_engine, "SELECT count(*) FROM adk_work") == 999
    assert await _count(pg_engine, "SELECT sum(queued) FROM adk_queue_turns") == 999
