"""Wake-ups on real servers: an idle Worker starts a new item within milliseconds, not at
its next poll, and a wake-up lost with its connection only delays an item to the poll.

On PostgreSQL the enqueue statement NOTIFYs the queue's channel (delivered at commit)
and the worker LISTENs on one connection; on Redis an item made ready pushes a token
on the queue's wake list and the worker blocks on it (BLPOP).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.clock import SystemClock
from statepact.models import WorkItem
from statepact.queue import BaseWorkQueue, QueuePolicy
from statepact.storage.memory import MemoryWorkQueue
from statepact.storage.postgres import PostgresWorkQueue
from statepact.storage.redis import RedisWorkQueue
from statepact.worker import Job, Retry, Worker

pytestmark = [pytest.mark.integration]

POLL = 10.0  # the fallback poll: any start under it came from a wake-up


@pytest.fixture(params=["memory", "redis", "postgres"])
def queue(request: pytest.FixtureRequest) -> BaseWorkQueue:
    work_queue: BaseWorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return work_queue


async def _starts(worker_queue: BaseWorkQueue, rounds: int, poll: float) -> list[float]:
    """Seconds from each enqueue to its handler's start, the worker idle before each."""
    started: asyncio.Queue[float] = asyncio.Queue()

    async def handler(job: Job) -> None:
        started.put_nowait(time.monotonic())

    worker = Worker(worker_queue, handlers={"t": handler}, poll_interval=poll, reap_every=0)
    latencies: list[float] = []
    async with worker:
        for n in range(rounds):
            await asyncio.sleep(0.05)  # idle: its last claim came back empty, it waits
            sent = time.monotonic()
            await worker_queue.enqueue(WorkItem(tenant="t", item_id=f"w{n}", payload={"task": "t"}))
            latencies.append(await asyncio.wait_for(started.get(), POLL) - sent)
    return latencies


async def test_an_idle_worker_starts_a_new_item_at_once(queue: BaseWorkQueue) -> None:
    """With the fallback poll at 10 s, 20 items enqueued one at a time to an idle worker each
    start in well under a second."""
    latencies = await _starts(queue, 20, POLL)
    p50 = statistics.median(latencies)
    worst = max(latencies)
    name = type(queue).__name__
    print(f"{name}: enqueue to start p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    assert worst < 1.0, latencies


async def test_a_notify_lost_with_the_listen_connection_waits_only_for_the_poll(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """The LISTEN connection is killed: the next item still starts, by the fallback poll
    (1 s here), and the worker listens again, so the one after starts at once."""
    queue = postgres_work_queue
    started: asyncio.Queue[float] = asyncio.Queue()

    async def handler(job: Job) -> None:
        started.put_nowait(time.monotonic())

    worker = Worker(queue, handlers={"t": handler}, poll_interval=1.0, reap_every=0)
    async with worker:
        await asyncio.sleep(0.2)
        async with pg_engine.connect() as conn:
            killed = (
                await conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
                    )
                )
            ).scalar()
        assert killed == 1
        await asyncio.sleep(0.1)
        sent = time.monotonic()
        await queue.enqueue(WorkItem(tenant="t", item_id="after-kill", payload={"task": "t"}))
        lost = await asyncio.wait_for(started.get(), 5) - sent
        await asyncio.sleep(0.3)
        sent = time.monotonic()
        await queue.enqueue(WorkItem(tenant="t", item_id="listening-again", payload={"task": "t"}))
        again = await asyncio.wait_for(started.get(), 5) - sent
    assert lost < 2.5, lost
    assert again < 0.5, again


@pytest.fixture(params=["memory", "redis", "postgres"])
def realtime_queue(request: pytest.FixtureRequest, queue_policy: QueuePolicy) -> BaseWorkQueue:
    """A queue of each backing on the system clock, so that delays come due as time passes."""
    if request.param == "memory":
        return MemoryWorkQueue(clock=SystemClock(), policy=queue_policy)
    if request.param == "redis":
        return RedisWorkQueue(
            request.getfixturevalue("redis_client"),
            clock=SystemClock(),
            settings=request.getfixturevalue("redis_settings"),
            policy=queue_policy,
        )
    engine: AsyncEngine = request.getfixturevalue("pg_engine")
    return PostgresWorkQueue(engine, clock=SystemClock(), policy=queue_policy)


async def test_delayed_items_start_when_they_come_due_not_at_the_poll(
    realtime_queue: BaseWorkQueue,
) -> None:
    """With the fallback poll at 10 s: an item delayed 0.5 s starts at about 0.5 s; an
    item delayed 0.3 s, enqueued while the worker sleeps toward an item due in a minute,
    starts at about 0.3 s (the delayed enqueue wakes it to ask again); a handler's
    ``Retry(0.4)`` runs again about 0.4 s later."""
    started: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    tries: dict[str, int] = {}

    async def handler(job: Job) -> None:
        started.put_nowait((job.item.item_id, time.monotonic()))
        tries[job.item.item_id] = tries.get(job.item.item_id, 0) + 1
        if job.item.item_id == "retried" and tries["retried"] == 1:
            raise Retry(0.4)

    def item(item_id: str) -> WorkItem:
        return WorkItem(tenant="t", item_id=item_id, payload={"task": "t"})

    async def started_after(sent: float) -> tuple[str, float]:
        item_id, at = await asyncio.wait_for(started.get(), POLL)
        return item_id, at - sent

    queue = realtime_queue
    worker = Worker(queue, handlers={"t": handler}, poll_interval=POLL, reap_every=0)
    async with worker:
        await asyncio.sleep(0.1)
        sent = time.monotonic()
        await queue.enqueue(item("half-second"), delay=0.5)
        first = await started_after(sent)

        await queue.enqueue(item("a-minute"), delay=60)
        await asyncio.sleep(0.2)  # the worker now sleeps toward the minute (capped at POLL)
        sent = time.monotonic()
        await queue.enqueue(item("third-second"), delay=0.3)
        second = await started_after(sent)

        sent = time.monotonic()
        await queue.enqueue(item("retried"))
        assert (await started_after(sent))[0] == "retried"
        sent = time.monotonic()
        retried = await started_after(sent)
    print(f"{type(queue).__name__}: delayed starts {first}, {second}, retry {retried}")
    assert first[0] == "half-second" and 0.45 <= first[1] < 1.0, first
    assert second[0] == "third-second" and 0.25 <= second[1] < 0.8, second
    assert retried[0] == "retried" and 0.35 <= retried[1] < 0.9, retried


async def test_a_retry_scheduled_while_the_worker_sleeps_starts_when_it_comes_due(
    realtime_queue: BaseWorkQueue,
) -> None:
    """The claim loop sleeps toward an item due in a minute (capped at the 10 s poll) when a
    handler, 0.3 s into its run, raises ``Retry(0.4)``: the fail wakes the queue's watchers
    (the conformance suite's ``test_watch_wakes_when_an_item_goes_back_to_the_queue``), so
    the loop reads the next due time again and the retry starts about 0.4 s later, not at
    the poll."""
    started: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    tries: dict[str, int] = {}

    async def handler(job: Job) -> None:
        started.put_nowait((job.item.item_id, time.monotonic()))
        tries[job.item.item_id] = tries.get(job.item.item_id, 0) + 1
        if tries[job.item.item_id] == 1:
            await asyncio.sleep(0.3)  # the claim loop is asleep by now
            raise Retry(0.4)

    queue = realtime_queue
    worker = Worker(queue, handlers={"t": handler}, poll_interval=POLL, reap_every=0)
    async with worker:
        await queue.enqueue(WorkItem(tenant="t", item_id="later", payload={"task": "t"}), delay=60)
        await queue.enqueue(WorkItem(tenant="t", item_id="flaky", payload={"task": "t"}))
        item_id, first = await asyncio.wait_for(started.get(), POLL)
        assert item_id == "flaky"
        item_id, second = await asyncio.wait_for(started.get(), POLL)
    assert item_id == "flaky" and tries == {"flaky": 2}
    # 0.3 s in the handler, then the 0.4 s retry delay.
    assert 0.65 <= second - first < 1.5, second - first
