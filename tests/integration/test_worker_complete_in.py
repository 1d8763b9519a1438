"""``job.complete_in(session)`` on a real PostgreSQL server (issue 39).

A handler writes a row and completes its item in one transaction: committed, the
row and ``done`` are visible together, the worker sends no ack of its own, logs
nothing and fires ``succeeded`` once; rolled back, the item stays leased and the
worker fails it as if the handler had raised; a process SIGKILLed between the
write and the commit leaves nothing visible, and the item runs again.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from statepact.clock import SystemClock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.postgres import PostgresWorkQueue
from statepact.worker import Job, Worker
from tests._processes import Worker as Process
from tests._processes import reap_all, spawn
from tests.unit.test_worker import Recorder, until

pytestmark = pytest.mark.integration

FAST = {"poll_interval": 0.01, "reap_every": 0}


@pytest.fixture
async def rows(pg_engine: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """The application's own table, beside statepact's, in the test's database."""
    async with pg_engine.begin() as conn:
        await conn.execute(
            text("CREATE TABLE complete_in_rows (item_id text NOT NULL, attempt int NOT NULL)")
        )
    yield pg_engine


async def visible(engine: AsyncEngine, item_id: str) -> list[int]:
    async with engine.connect() as conn:
        found = await conn.execute(
            text("SELECT attempt FROM complete_in_rows WHERE item_id = :i ORDER BY attempt"),
            {"i": item_id},
        )
        return [row[0] for row in found]


async def item_of(queue: PostgresWorkQueue, item_id: str) -> WorkItem:
    item = await queue.get_item("t", item_id)
    assert item is not None
    return item


async def test_committed_the_row_and_done_are_visible_together_and_no_ack_is_sent(
    postgres_work_queue: PostgresWorkQueue,
    rows: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row and done land in one commit; the worker sends no ack, logs no warning, and fires
    ``succeeded`` once, after the commit."""
    queue = postgres_work_queue
    hooks = Recorder()
    seen_inside: list[tuple[list[int], ItemStatus]] = []
    acks: list[int] = []
    real_ack_many = queue.ack_many

    async def counting(leases: list[object]) -> list[object]:
        acks.append(len(leases))
        return await real_ack_many(leases)  # type: ignore[arg-type]

    queue.ack_many = counting  # type: ignore[assignment,method-assign]

    async def handle(job: Job) -> None:
        async with AsyncSession(rows) as session, session.begin():
            await session.execute(
                text("INSERT INTO complete_in_rows (item_id, attempt) VALUES (:i, :a)"),
                {"i": job.item.item_id, "a": job.attempts},
            )
            done = await job.complete_in(session)
            assert done.status == ItemStatus.DONE
            # Not committed yet: another connection sees neither the row nor done.
            seen_inside.append(
                (await visible(rows, job.item.item_id), (await item_of(queue, "a")).status)
            )
            assert hooks.kinds("a") == ["started"]

    await queue.enqueue(WorkItem(tenant="t", item_id="a", payload={}))
    caplog.set_level(logging.INFO, logger="statepact")
    async with Worker(queue, default=handle, hooks=hooks, **FAST):
        await until(lambda: "succeeded" in hooks.kinds("a"))
    assert seen_inside == [([], ItemStatus.LEASED)]
    assert await visible(rows, "a") == [1]
    assert (await item_of(queue, "a")).status == ItemStatus.DONE
    assert hooks.kinds("a") == ["started", "succeeded"]
    assert acks == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


async def test_on_a_connection_the_ack_commits_with_the_row(
    postgres_work_queue: PostgresWorkQueue, rows: AsyncEngine
) -> None:
    queue = postgres_work_queue
    hooks = Recorder()

    async def handle(job: Job) -> None:
        async with rows.begin() as conn:
            await conn.execute(
                text("INSERT INTO complete_in_rows (item_id, attempt) VALUES (:i, 1)"),
                {"i": job.item.item_id},
            )
            await job.complete_in(conn)

    await queue.enqueue(WorkItem(tenant="t", item_id="c", payload={}))
    async with Worker(queue, default=handle, hooks=hooks, **FAST):
        await until(lambda: "succeeded" in hooks.kinds("c"))
    assert await visible(rows, "c") == [1]
    assert (await item_of(queue, "c")).status == ItemStatus.DONE
    assert hooks.kinds("c") == ["started", "succeeded"]


async def test_rolled_back_the_item_is_failed_as_if_the_handler_raised(
    postgres_work_queue: PostgresWorkQueue, rows: AsyncEngine
) -> None:
    """A rollback after complete_in leaves the item leased; the worker fails it with the
    handler's error; a handler that rolls back and returns is failed naming the rollback."""
    queue = postgres_work_queue
    hooks = Recorder()

    async def handle(job: Job) -> None:
        async with AsyncSession(rows) as session, session.begin():
            await session.execute(
                text("INSERT INTO complete_in_rows (item_id, attempt) VALUES (:i, 1)"),
                {"i": job.item.item_id},
            )
            await job.complete_in(session)
            if job.item.item_id == "raises":
                raise ValueError("the model said no")
            await session.rollback()

    await queue.enqueue(WorkItem(tenant="t", item_id="raises", payload={}))
    await queue.enqueue(WorkItem(tenant="t", item_id="quiet", payload={}))
    async with Worker(queue, default=handle, hooks=hooks, **FAST):
        await until(lambda: "failed" in hooks.kinds("raises") and "failed" in hooks.kinds("quiet"))
    raised = await item_of(queue, "raises")
    quiet = await item_of(queue, "quiet")
    assert raised.status == quiet.status == ItemStatus.QUEUED  # retried: attempts 1 < 5
    assert raised.last_error == "ValueError: the model said no"
    assert quiet.last_error == "the transaction job.complete_in joined was rolled back"
    assert await visible(rows, "raises") == await visible(rows, "quiet") == []


async def test_a_process_killed_before_commit_leaves_nothing_and_the_item_runs_again(
    postgres_work_queue: PostgresWorkQueue, rows: AsyncEngine, pg_database_url: str
) -> None:
    """SIGKILL between the write and the commit: no row, the item not done; once its lease
    lapses it runs again, and that commit makes the row and done visible together."""
    queue = postgres_work_queue
    await queue.enqueue(WorkItem(tenant="t", item_id="k", payload={}))
    spec = {
        "kind": "postgres",
        "url": pg_database_url,
        "queue": queue.name,
        "policy": {"max_attempts": 5},
        "lease": 1.0,
        "pool_size": 3,
    }
    processes: list[Process] = []
    try:
        child = await spawn(processes, "tests.integration._complete_in_process", spec)
        event = await child.expect("before_commit", timeout=60)
        assert event == {"event": "before_commit", "item_id": "k", "attempts": 1}
        child.process.send_signal(signal.SIGKILL)
        await child.process.wait()
    finally:
        await reap_all(processes)
    assert await visible(rows, "k") == []
    assert (await item_of(queue, "k")).status == ItemStatus.LEASED

    # The lease (1 s on the child's system clock) lapses; a worker on the system clock
    # (the fixture's queue runs on the test's ManualClock) reaps it and runs it again.
    queue = await PostgresWorkQueue.open(rows, clock=SystemClock(), policy=QueuePolicy())
    assert queue.name == postgres_work_queue.name

    hooks = Recorder()

    async def handle(job: Job) -> None:
        async with AsyncSession(rows) as session, session.begin():
            await session.execute(
                text("INSERT INTO complete_in_rows (item_id, attempt) VALUES (:i, :a)"),
                {"i": job.item.item_id, "a": job.attempts},
            )
            await job.complete_in(session)

    async with Worker(queue, default=handle, hooks=hooks, poll_interval=0.05, reap_every=0.2):
        await until(lambda: "succeeded" in hooks.kinds("k"), timeout=30)
    again = await item_of(queue, "k")
    assert again.status == ItemStatus.DONE
    assert again.attempts == 2
    assert await visible(rows, "k") == [2]


async def test_on_redis_complete_in_is_refused_saying_what_to_do(redis_work_queue: object) -> None:
    """Redis cannot join an SQL transaction: a TypeError naming the queue and the way out."""
    from statepact.storage.redis import RedisWorkQueue

    assert isinstance(redis_work_queue, RedisWorkQueue)
    errors: list[BaseException] = []

    async def handle(job: Job) -> None:
        try:
            await job.complete_in(object())
        except TypeError as exc:
            errors.append(exc)

    await redis_work_queue.enqueue(WorkItem(tenant="t", item_id="r", payload={}))
    async with Worker(redis_work_queue, default=handle, **FAST):
        await until(lambda: bool(errors))
    assert str(errors[0]).startswith(
        "job.complete_in: a RedisWorkQueue cannot join an SQL transaction (only "
        "PostgresWorkQueue can). Make the handler's writes idempotent"
    )
