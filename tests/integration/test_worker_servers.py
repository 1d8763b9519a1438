"""The Worker's promises on real Redis and PostgreSQL servers, in this process.

Each test runs on both servers (the ``{backing}_work_queue`` fixtures, on the
test's ``ManualClock``): lease loss (a handler whose heartbeats were frozen past
its lease is cancelled, another worker finishes the item, the first lease's ack
is refused), fairness under the worker (A 1,000 / B 10 / C 10), bad input (an
unknown task is dead-lettered at once, naming it, while the rest are done; bad
handlers and settings are refused before anything runs), and on PostgreSQL that
a worker never holds more than ``concurrency + 2`` connections at once (one of them its
LISTEN once it is idle). Crashing processes are
in test_worker_crash.py, SIGTERM through the CLI in test_worker_cli.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, WorkItem
from statepact.queue import BaseWorkQueue
from statepact.worker import Job, Worker
from tests.unit.test_worker import Recorder, until

pytestmark = pytest.mark.integration

FAST = {"poll_interval": 0.01, "reap_every": 0}


@pytest.fixture(params=["redis", "postgres"])
def queue(request: pytest.FixtureRequest) -> BaseWorkQueue:
    work_queue: BaseWorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return work_queue


async def put_many(queue: BaseWorkQueue, items: list[WorkItem]) -> None:
    for start in range(0, len(items), 8):
        await asyncio.gather(*(queue.enqueue(item) for item in items[start : start + 8]))


async def test_a_handler_past_its_lease_is_cancelled_and_its_ack_refused(
    queue: BaseWorkQueue, clock: ManualClock
) -> None:
    """A handler stalled past its lease with no heartbeat in between is cancelled; another
    worker finishes the item; an ack with the first lease is refused."""
    hooks_a, hooks_b = Recorder(), Recorder()
    cancelled = asyncio.Event()

    async def stall(job: Job) -> None:
        if job.worker_id != "a":
            return
        clock.advance(31)  # past the 30 s lease before the next heartbeat: frozen heartbeats
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await queue.enqueue(WorkItem(tenant="t", item_id="x", payload={"task": "stall"}))
    a = Worker(
        queue, handlers={"stall": stall}, worker_id="a", heartbeat_every=0.05, hooks=hooks_a, **FAST
    )
    async with a:
        await until(cancelled.is_set)
        await until(lambda: a.in_flight == 0)
    first = hooks_a.leases["x"][0]
    assert hooks_a.kinds("x") == ["started", "lease_lost"]
    assert "lease expired" in hooks_a.calls[-1][2]
    record = await queue.get_item("t", "x")
    assert record is not None and record.status == ItemStatus.LEASED  # a settled nothing
    assert [moved.item_id for moved in await queue.reap()] == ["x"]
    b = Worker(queue, handlers={"stall": stall}, worker_id="b", hooks=hooks_b, **FAST)
    async with b:
        await until(lambda: "succeeded" in hooks_b.kinds("x"))
    with pytest.raises(LeaseLostError):
        await queue.ack(first)
    record = await queue.get_item("t", "x")
    assert record is not None and (record.status, record.attempts) == (ItemStatus.DONE, 2)


async def test_small_tenants_finish_early_beside_a_backlog(queue: BaseWorkQueue) -> None:
    """A 1,000 / B 10 / C 10, concurrency 10: B and C finish within the first 60 handler starts."""
    starts: list[str] = []
    finished = {"B": 0, "C": 0}

    async def work(job: Job) -> None:
        starts.append(job.item.tenant)
        await asyncio.sleep(0.001)
        if job.item.tenant in finished:
            finished[job.item.tenant] += 1

    items = [WorkItem(tenant="A", item_id=f"a{n:04d}") for n in range(1000)]
    items += [WorkItem(tenant=t, item_id=f"{t}{n}") for t in ("B", "C") for n in range(10)]
    await put_many(queue, items)
    worker = Worker(queue, default=work, concurrency=10, **FAST)
    async with worker:
        await until(lambda: finished == {"B": 10, "C": 10}, timeout=60)
        finished_at = len(starts)
    print(f"\nfairness [{type(queue).__name__}]: B and C done after {finished_at} handler starts")
    first = starts[:60]
    assert (first.count("B"), first.count("C")) == (10, 10), first


async def test_an_unknown_task_is_dead_lettered_and_the_rest_is_done(
    queue: BaseWorkQueue,
) -> None:
    """An unknown task name is dead-lettered on its first try with an error naming it, never
    retried; the other items are all done: nothing lost."""
    hooks = Recorder()

    async def known(job: Job) -> None:
        pass

    items = [WorkItem(tenant="t", item_id=f"k{n}", payload={"task": "known"}) for n in range(10)]
    items.append(WorkItem(tenant="t", item_id="bad", payload={"task": "sumarise"}))
    await put_many(queue, items)
    worker = Worker(queue, handlers={"known": known}, hooks=hooks, **FAST)
    async with worker:
        await until(lambda: len(hooks.calls) >= 21)  # 10 started + 10 succeeded + 1 failed
        await asyncio.sleep(0.1)  # time for a retry, were there one
    dead = await queue.dead_letters("t")
    assert [item.item_id for item in dead] == ["bad"]
    assert dead[0].attempts == 1
    assert dead[0].last_error is not None
    assert "unknown task 'sumarise'" in dead[0].last_error
    stats = await queue.stats()
    assert (stats.queued, stats.leased, stats.dead) == (0, 0, 1)
    for n in range(10):
        record = await queue.get_item("t", f"k{n}")
        assert record is not None and record.status == ItemStatus.DONE


def test_bad_handlers_and_concurrency_are_refused_before_anything_runs(
    queue: BaseWorkQueue,
) -> None:
    """A handler that is not a coroutine function and concurrency 0 are refused with errors
    naming them; the queue is untouched."""

    def sync_handler(job: Job) -> None:
        pass

    with pytest.raises(TypeError, match="task 'x': must be a coroutine function"):
        Worker(queue, handlers={"x": sync_handler})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="concurrency: must be 1 or more, got 0"):
        Worker(queue, concurrency=0)


async def test_a_worker_needs_at_most_concurrency_plus_two_connections(
    clock: ManualClock, pg_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """8 slots heartbeating every 10 ms, settling, claiming and reaping at once never hold more
    than concurrency + 2 connections (one is the LISTEN, once it waits for work) of a pool that
    is not the limit."""
    from sqlalchemy import event

    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresWorkQueue, create_engine

    concurrency = 8
    settings = PostgresStoreSettings(dsn=pg_database_url, pool_size=40)
    engine = create_engine(settings)
    held = peak = done = 0

    def checkout(*_: object) -> None:
        nonlocal held, peak
        held += 1
        peak = max(peak, held)

    def checkin(*_: object) -> None:
        nonlocal held
        held -= 1

    try:
        queue = await PostgresWorkQueue.open(engine, clock=clock, settings=settings)
        event.listen(engine.sync_engine, "checkout", checkout)
        event.listen(engine.sync_engine, "checkin", checkin)

        async def busy(job: Job) -> None:
            nonlocal done
            await asyncio.sleep(0.1)
            done += 1

        await put_many(queue, [WorkItem(tenant=f"t{n % 4}", item_id=f"i{n}") for n in range(80)])
        worker = Worker(
            queue,
            default=busy,
            concurrency=concurrency,
            heartbeat_every=0.01,
            poll_interval=0.01,
            reap_every=0.01,
        )
        with caplog.at_level(logging.WARNING, logger="statepact.worker"):
            async with worker:
                await until(lambda: done == 80, timeout=60)
        stats = await queue.stats()
    finally:
        await engine.dispose()
    problems: list[Any] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert problems == []
    assert (stats.queued, stats.leased) == (0, 0)
    print(f"\npool: at most {peak} connections held at once (bound {concurrency + 2})")
    assert concurrency // 2 < peak <= concurrency + 2
