"""``bound(session)`` used out of turn, against a real PostgreSQL.

A bound adapter runs inside a transaction the caller began and never begins,
commits or retries one itself (docs/backings.md, "One transaction for both").
Given a connection or session that is not inside such a transaction (its
``begin()`` ended, it was committed, closed, its transaction failed, or another
task is using it), every call refuses with ``OutOfTurnError`` (a
``RuntimeError``, ``retryable=False``) saying what the caller did wrong, and
writes nothing: each test checks from another connection. Savepoints
(``begin_nested``) keep working inside the caller's transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

from statepact import OutOfTurnError
from statepact.models import RunRecord, WorkItem
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue

pytestmark = pytest.mark.integration

Target = AsyncConnection | AsyncSession
Call = Callable[[Target], Awaitable[Any]]


def _run(run_id: str) -> RunRecord:
    return RunRecord(tenant="acme", run_id=run_id)


def _item(item_id: str) -> WorkItem:
    return WorkItem(tenant="acme", item_id=item_id)


def _calls(state: PostgresStateStore, queue: PostgresWorkQueue) -> dict[str, Call]:
    """One call of each kind a bound adapter makes: writes of both stores, a read, a claim."""
    return {
        "put_run": lambda s: state.bound(s).put_run(_run("late")),
        "patch_run": lambda s: state.bound(s).patch_run("acme", "r0", iterations=1),
        "get_run": lambda s: state.bound(s).get_run("acme", "r0"),
        "enqueue": lambda s: queue.bound(s).enqueue(_item("late")),
        "enqueue_many": lambda s: queue.bound(s).enqueue_many([_item("late-1"), _item("late-2")]),
        "claim": lambda s: queue.bound(s).claim("w1", lease_for=30),
    }


async def _rows(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
    """Every run (id, version, iterations) and item (id, status), from a connection of its own."""
    async with engine.connect() as other:
        runs = await other.execute(
            text("SELECT run_id, version, iterations FROM adk_runs ORDER BY run_id")
        )
        items = await other.execute(text("SELECT item_id, status FROM adk_work ORDER BY item_id"))
        return [tuple(r) for r in runs], [tuple(i) for i in items]


async def _refused_each(calls: dict[str, Call], target: Target, says: str) -> None:
    for name, call in calls.items():
        with pytest.raises(OutOfTurnError) as caught:
            await call(target)
        assert isinstance(caught.value, RuntimeError), name
        assert caught.value.retryable is False, name
        assert says in str(caught.value), (name, str(caught.value))


@pytest.fixture
async def seeded(
    postgres_state_store: PostgresStateStore, postgres_work_queue: PostgresWorkQueue
) -> AsyncIterator[dict[str, Call]]:
    """A run r0 and a queued item i0, committed; the calls to make out of turn."""
    await postgres_state_store.put_run(_run("r0"))
    await postgres_work_queue.enqueue(_item("i0"))
    yield _calls(postgres_state_store, postgres_work_queue)


SEEDED = ([("r0", 1, 0)], [("i0", "queued")])


async def test_a_connection_whose_begin_ended_is_refused(
    seeded: dict[str, Call], pg_engine: AsyncEngine
) -> None:
    """After ``async with conn.begin():`` ended, every bound call refuses before sending
    (SQLAlchemy would autobegin a transaction nobody commits) and nothing is written."""
    async with pg_engine.connect() as conn:
        async with conn.begin():
            pass
        await _refused_each(seeded, conn, "not inside a transaction")
        assert not conn.in_transaction()  # nothing was sent: no transaction was autobegun
    assert await _rows(pg_engine) == SEEDED


async def test_a_session_after_commit_or_rollback_is_refused(
    seeded: dict[str, Call], pg_engine: AsyncEngine
) -> None:
    """An AsyncSession that was never begun, was committed or was rolled back is refused by
    every bound call, and nothing is written."""
    async with AsyncSession(pg_engine) as session:
        await _refused_each(seeded, session, "not inside a transaction")
        async with session.begin():
            await session.execute(text("SELECT 1"))
        await _refused_each(seeded, session, "not inside a transaction")
        await session.begin()
        await session.rollback()
        await _refused_each(seeded, session, "not inside a transaction")
        assert not session.in_transaction()
    assert await _rows(pg_engine) == SEEDED


async def test_a_closed_connection_is_refused(
    seeded: dict[str, Call], pg_engine: AsyncEngine
) -> None:
    """A closed AsyncConnection is refused by every bound call as closed, not as an outage."""
    conn = await pg_engine.connect()
    await conn.begin()
    await conn.close()
    await _refused_each(seeded, conn, "is closed")
    assert await _rows(pg_engine) == SEEDED


@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_a_failed_transaction_is_the_callers_to_roll_back(
    seeded: dict[str, Call], pg_engine: AsyncEngine, kind: str
) -> None:
    """Inside a transaction an earlier statement failed in (SQLSTATE 25P02), every bound call
    raises a non-retryable error saying to roll it back; after the rollback nothing is written."""
    async with pg_engine.connect() as conn, AsyncSession(bind=conn) as session:
        target: Target = conn if kind == "connection" else session
        await (conn.begin() if kind == "connection" else session.begin())
        with pytest.raises(Exception, match="division by zero"):
            await target.execute(text("SELECT 1/0"))
        await _refused_each(seeded, target, "roll")
        await target.rollback()
    assert await _rows(pg_engine) == SEEDED


@pytest.fixture
async def unpooled(pg_database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine that opens a new server connection per checkout, so a session's first
    statement awaits the connect and a second task can arrive while it does."""
    url = pg_database_url
    if "+asyncpg" not in url:
        url = url.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_two_tasks_on_one_session_are_refused(
    postgres_state_store: PostgresStateStore,
    postgres_work_queue: PostgresWorkQueue,
    unpooled: AsyncEngine,
    pg_engine: AsyncEngine,
    kind: str,
) -> None:
    """One AsyncSession (or AsyncConnection) serves one task at a time: a bound call that
    arrives while another task's is running there is refused, non-retryable, before it sends
    anything; the first call's write commits with the transaction and the refused ones leave
    nothing."""
    state = PostgresStateStore(unpooled, clock=postgres_state_store.clock)
    queue = PostgresWorkQueue(unpooled, clock=postgres_work_queue.clock)
    async with unpooled.connect() as conn, AsyncSession(unpooled) as session:
        target: Target = conn if kind == "connection" else session
        async with conn.begin() if kind == "connection" else session.begin():
            results = await asyncio.gather(
                state.bound(target).put_run(_run("first")),
                queue.bound(target).enqueue(_item("second")),
                state.bound(target).put_run(_run("third")),
                return_exceptions=True,
            )
            assert isinstance(results[0], RunRecord), results
            for refused in results[1:]:
                assert isinstance(refused, OutOfTurnError), results
                assert refused.retryable is False
                assert "one task at a time" in str(refused)
            # The transaction is still usable: the refused calls never reached it.
            assert await state.bound(target).get_run("acme", "first") == results[0]
    assert await _rows(pg_engine) == ([("first", 1, 0)], [])


@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_savepoints_commit_and_roll_back_with_the_transaction(
    postgres_state_store: PostgresStateStore,
    postgres_work_queue: PostgresWorkQueue,
    pg_engine: AsyncEngine,
    kind: str,
) -> None:
    """Inside the caller's transaction a savepoint (begin_nested) is a turn too: its writes go
    when it rolls back, stay when it is released, and land only if the outer one commits."""
    state, queue = postgres_state_store, postgres_work_queue
    async with pg_engine.connect() as conn, AsyncSession(bind=conn) as session:
        target: Target = conn if kind == "connection" else session
        async with conn.begin() if kind == "connection" else session.begin():
            await state.bound(target).put_run(_run("outer"))
            dropped = await target.begin_nested()
            await state.bound(target).put_run(_run("dropped"))
            await queue.bound(target).enqueue(_item("dropped"))
            await dropped.rollback()
            async with target.begin_nested():
                await state.bound(target).put_run(_run("kept"))
                await queue.bound(target).enqueue(_item("kept"))
            await state.bound(target).patch_run("acme", "kept", iterations=2)
        await (conn.begin() if kind == "connection" else session.begin())
        async with target.begin_nested():
            await state.bound(target).put_run(_run("undone"))
        await target.rollback()
    assert await _rows(pg_engine) == (
        [("kept", 2, 2), ("outer", 1, 0)],
        [("kept", "queued")],
    )


async def test_a_transaction_the_callers_own_statement_autobegan_is_used(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine
) -> None:
    """Commit-as-you-go: a transaction SQLAlchemy autobegan for the caller's own statement is
    the caller's; bound calls run in it and land when the caller commits."""
    async with pg_engine.connect() as conn, AsyncSession(pg_engine) as session:
        await conn.execute(text("SELECT 1"))
        await postgres_state_store.bound(conn).put_run(_run("by-connection"))
        await conn.commit()
        await session.execute(text("SELECT 1"))
        await postgres_state_store.bound(session).put_run(_run("by-session"))
        await session.commit()
    assert await _rows(pg_engine) == ([("by-connection", 1, 0), ("by-session", 1, 0)], [])


async def test_a_bound_enqueue_many_lands_with_the_callers_commit_only(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """enqueue_many inside the caller's transaction is one statement of it: rolled back, none
    of the batch is stored; committed, all of it is, with the tenants' turns woken."""
    queue = postgres_work_queue
    batch = [_item(f"batch-{i}") for i in range(5)]
    async with AsyncSession(pg_engine) as session:
        transaction = await session.begin()
        stored = await queue.bound(session).enqueue_many(batch)
        assert [s.item_id for s in stored] == [b.item_id for b in batch]
        await transaction.rollback()
    assert await _rows(pg_engine) == ([], [])
    assert await queue.claim("w1", lease_for=30) is None
    async with AsyncSession(pg_engine) as session, session.begin():
        await queue.bound(session).enqueue_many(batch)
    assert sorted(await _rows(pg_engine)) == sorted(([], [(b.item_id, "queued") for b in batch]))
    leases = await queue.claim_batch("w1", lease_for=30, limit=10)
    assert [lease.item.item_id for lease in leases] == [b.item_id for b in batch]
