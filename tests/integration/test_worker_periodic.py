"""Periodic jobs on real Redis and PostgreSQL: three workers, one schedule, one item per tick.

Each test runs on both servers with three ``Worker`` objects, each on its own
queue object over its own connection (a Redis client, a PostgreSQL engine) to
the same server queue, all registering the same schedule:

- a one-second interval on the real clock for ~10 s: every tick from the first
  to the last is stored once and run once (no second id for a tick, no item run
  twice, no gap); the edges are bounded: the first tick is the one at or just
  before the workers started (the start catches up on it), the last one at
  most a second before ``stop()`` began;
- a cron schedule driven by a ``ManualClock`` (queues and workers on it), moved
  a tick at a time: exactly one item per tick, and a jump over three ticks
  makes one item (the latest).

The memory-backed rules (alignment, the missed-tick rule, refusals) are in
tests/unit/test_worker_periodic.py.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.clock import Clock, ManualClock, SystemClock
from statepact.queue import BaseWorkQueue, QueuePolicy
from statepact.storage.postgres import PostgresWorkQueue
from statepact.storage.redis import RedisWorkQueue
from statepact.worker import Job, Worker
from tests.unit.test_worker import until

pytestmark = pytest.mark.integration

QueueFactory = Callable[[Clock], BaseWorkQueue]
SETTINGS = {"poll_interval": 0.1, "reap_every": 0}


class Ran:
    """A handler recording the id of every item it ran, across every worker."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, job: Job) -> None:
        self.ids.append(job.item.item_id)


def tick_of(item_id: str) -> datetime:
    prefix, name, tick = item_id.split(":", 2)
    assert (prefix, name) == ("schedule", "beat")
    return datetime.fromisoformat(tick)


def schedule_id(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.isoformat().replace('+00:00', 'Z')}"


@pytest.fixture(params=["redis", "postgres"])
def server(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The backing and the URL of this test's server queue (the Redis database emptied,
    the PostgreSQL database the test's own)."""
    if request.param == "redis":
        request.getfixturevalue("redis_client")
        return "redis", str(request.getfixturevalue("statepact_redis_url"))
    return "postgres", str(request.getfixturevalue("pg_database_url"))


@pytest.fixture
async def new_queue(
    server: tuple[str, str], queue_policy: QueuePolicy
) -> AsyncIterator[QueueFactory]:
    """Makes queue objects on one server queue, each over a connection of its own."""
    backing, url = server
    closers: list[Callable[[], Awaitable[object]]] = []

    def make(clock: Clock) -> BaseWorkQueue:
        if backing == "redis":
            client = Redis.from_url(url)
            closers.append(client.aclose)
            return RedisWorkQueue(client, clock=clock, policy=queue_policy)
        engine = create_async_engine(url, pool_size=6, max_overflow=0)
        closers.append(engine.dispose)
        return PostgresWorkQueue(engine, clock=clock, policy=queue_policy)

    try:
        yield make
    finally:
        for close in closers:
            await close()


async def drain(queue: BaseWorkQueue, ran: Ran) -> None:
    """Run what the schedule workers enqueued but had not claimed when they stopped."""

    async def run() -> None:
        async with Worker(queue, handlers={"beat": ran}, worker_id="drain", **SETTINGS):
            await until(lambda: idle(queue), timeout=10)

    await bounded("the drain worker", run())


async def stop_all(workers: list[Worker]) -> None:
    await bounded("stop()", asyncio.gather(*(worker.stop() for worker in workers)))


async def bounded(what: str, work: Awaitable[object], seconds: float = 60) -> None:
    """Fail in ``seconds`` naming every task's stack (what each waits on), rather than hang
    until the suite's timeout: ``stop()`` finishes its drain through a cancellation, so a
    timeout that cancels it would wait as long."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done:
        task.result()
        return
    stacks = io.StringIO()
    for each in asyncio.all_tasks():
        each.print_stack(file=stacks)
    pytest.fail(f"{what} did not finish in {seconds} s; the tasks:\n{stacks.getvalue()}")


async def idle(queue: BaseWorkQueue) -> bool:
    stats = await queue.stats()
    return stats.queued == stats.leased == 0


async def test_three_workers_sharing_a_one_second_interval_make_one_item_per_tick(
    new_queue: QueueFactory,
) -> None:
    clock = SystemClock()
    ran = Ran()
    queues = [new_queue(clock) for _ in range(3)]
    workers = []
    for n, queue in enumerate(queues):
        worker = Worker(queue, handlers={"beat": ran}, worker_id=f"w{n}", **SETTINGS)
        worker.every(1, task="beat", tenant="ops", payload={"from": "test"})
        workers.append(worker)
    started = clock.now()
    await asyncio.gather(*(worker.start() for worker in workers))
    begun = time.monotonic()
    try:
        await asyncio.sleep(10)
    finally:
        stopping = clock.now()
        await stop_all(workers)
    elapsed = time.monotonic() - begun
    await drain(queues[0], ran)

    assert len(ran.ids) == len(set(ran.ids)), "an item ran twice"
    ticks = sorted(tick_of(item_id) for item_id in ran.ids)
    assert all(tick.microsecond == 0 for tick in ticks)  # aligned on whole seconds
    steps = {(later - earlier).total_seconds() for earlier, later in itertools.pairwise(ticks)}
    assert steps == {1.0}, f"a gap or a second item for a tick: {steps}"
    # Edges: the first tick is the one at (or, had the start straddled a second, just
    # after) the start; the last one is at most a second (and the loop's wake-up) before
    # stop() began, and never after it.
    assert started.replace(microsecond=0) <= ticks[0] <= started + timedelta(seconds=1)
    assert stopping - timedelta(seconds=1.5) <= ticks[-1] <= stopping
    assert 10 <= len(ticks) <= 12, (len(ticks), elapsed)
    # Counted by id in the store too: each tick's item is done, the ticks just outside
    # the run were never stored.
    for tick in ticks:
        item = await queues[1].get_item("ops", schedule_id("beat", tick))
        assert item is not None and item.status == "done"
        assert item.payload["scheduled_for"] == tick.isoformat().replace("+00:00", "Z")
    for outside in (ticks[0] - timedelta(seconds=1), ticks[-1] + timedelta(seconds=1)):
        assert await queues[2].get_item("ops", schedule_id("beat", outside)) is None
    assert await idle(queues[0]) and (await queues[0].stats()).tenants.get("ops") is None


async def test_three_workers_sharing_a_cron_schedule_on_a_manual_clock(
    new_queue: QueueFactory,
) -> None:
    clock = ManualClock(datetime(2026, 3, 2, 9, 3, 7, tzinfo=UTC))
    ran = Ran()
    queues = [new_queue(clock) for _ in range(3)]
    workers = []
    for n, queue in enumerate(queues):
        worker = Worker(queue, handlers={"beat": ran}, worker_id=f"w{n}", **SETTINGS)
        worker.cron("*/5 * * * *", task="beat", tenant="ops")
        workers.append(worker)

    async def after_every_worker_looked(count: int) -> None:
        await until(lambda: len(ran.ids) == count, timeout=10)
        await until(lambda: idle(queues[0]), timeout=10)
        await asyncio.sleep(0.4)  # each schedule loop reads the clock every 0.1 s

    await asyncio.gather(*(worker.start() for worker in workers))
    try:
        await after_every_worker_looked(1)  # 09:00, caught up at start
        clock.advance(timedelta(minutes=1, seconds=53))  # 09:05:00
        await after_every_worker_looked(2)
        for count in range(3, 7):  # 09:10 .. 09:25
            clock.advance(timedelta(minutes=5))
            await after_every_worker_looked(count)
        clock.advance(timedelta(minutes=15))  # 09:40: 09:30 and 09:35 are skipped
        await after_every_worker_looked(7)
    finally:
        await stop_all(workers)

    nine = datetime(2026, 3, 2, 9, tzinfo=UTC)
    minutes = [0, 5, 10, 15, 20, 25, 40]
    assert ran.ids == [schedule_id("beat", nine + timedelta(minutes=m)) for m in minutes]
    for skipped in (30, 35):
        assert (
            await queues[1].get_item("ops", schedule_id("beat", nine.replace(minute=skipped)))
            is None
        )
    assert await idle(queues[2])
