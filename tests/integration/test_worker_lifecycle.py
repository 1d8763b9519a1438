"""The Worker's part of the queue lifecycle (issue 33) on real Redis and PostgreSQL servers.

Each test runs on both (the ``{backing}_work_queue`` fixtures, on the test's
``ManualClock``): an operator's cancel reaches the running handler through the server's
control notice (PostgreSQL NOTIFY, Redis PUBLISH) in under a second and the worker settles
nothing; a handler past its timeout fails its attempt; ``Snooze`` gives the attempt back
and delays the item; an item that always hangs is dead after ``max_attempts`` across
worker restarts; the worker's prune service deletes finished items past their keep.
The memory queue's are in tests/unit/test_worker_lifecycle.py.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from statepact.clock import ManualClock, read_clock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import BaseWorkQueue
from statepact.worker import Job, Snooze, Worker
from tests.unit.test_worker import Recorder, until

pytestmark = pytest.mark.integration

FAST = {"poll_interval": 0.05, "reap_every": 0, "prune_every": 0}


@pytest.fixture(params=["redis", "postgres"])
def queue(request: pytest.FixtureRequest) -> BaseWorkQueue:
    work_queue: BaseWorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return work_queue


async def item_of(queue: BaseWorkQueue, item_id: str) -> WorkItem:
    item = await queue.get_item("t", item_id)
    assert item is not None
    return item


class Cancels(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.cancelled_items: list[str] = []

    def cancelled(self, job: Job, reason: str) -> None:
        self.cancelled_items.append(job.item.item_id)


async def test_an_operator_cancel_reaches_the_running_handler_within_a_second(
    queue: BaseWorkQueue,
) -> None:
    """The cancel's control notice cuts the handler in under a second (the heartbeat is
    minutes away); the item stays cancelled with the reason; nothing else is settled."""
    hooks = Cancels()
    started = asyncio.Event()
    cut_at: list[float] = []

    async def long(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cut_at.append(time.monotonic())
            raise

    await queue.enqueue(WorkItem(tenant="t", item_id="a", payload={}))
    worker = Worker(queue, default=long, hooks=hooks, lease_for=600, grace_period=0, **FAST)
    async with worker:
        await started.wait()
        await asyncio.sleep(0.2)  # the watch is listening
        asked = time.monotonic()
        await queue.cancel("t", "a", reason="stop it")
        await until(lambda: hooks.cancelled_items == ["a"], timeout=5)
        latency = cut_at[0] - asked
        print(f"\ncancel to handler stop on {type(queue).__name__}: {latency * 1000:.1f} ms")
        assert latency < 1.0
    item = await item_of(queue, "a")
    assert (item.status, item.last_error) == (ItemStatus.CANCELLED, "stop it")
    assert hooks.kinds("a") == ["started"]


async def test_a_timeout_fails_the_attempt_saying_after_how_long(queue: BaseWorkQueue) -> None:
    hooks = Recorder()

    async def hang(job: Job) -> None:
        await asyncio.sleep(3600)

    await queue.enqueue(WorkItem(tenant="t", item_id="a", payload={}, timeout=0.2))
    async with Worker(queue, default=hang, hooks=hooks, **FAST):
        await until(lambda: "failed" in hooks.kinds("a"))
    item = await item_of(queue, "a")
    assert item.attempts == 1 and item.status == ItemStatus.QUEUED
    assert item.last_error == "TimeoutError: the handler timed out after 0.2 s"


async def test_snooze_delays_the_item_and_gives_the_attempt_back(
    queue: BaseWorkQueue, clock: ManualClock
) -> None:
    hooks = Recorder()

    async def snoozy(job: Job) -> None:
        raise Snooze(90)

    await queue.enqueue(WorkItem(tenant="t", item_id="a", payload={}))
    now = read_clock(clock)
    async with Worker(queue, default=snoozy, hooks=hooks, **FAST):
        await until(lambda: "released" in hooks.kinds("a"))
    item = await item_of(queue, "a")
    assert (item.status, item.attempts, item.last_error) == (ItemStatus.QUEUED, 0, None)
    assert item.available_at == now + timedelta(seconds=90)


async def test_a_hanging_item_is_dead_after_max_attempts_across_restarts(
    queue: BaseWorkQueue,
) -> None:
    """Stopped mid-hang, each worker's release keeps the attempt; the run that times out on
    the last attempt dead-letters it (the fixture's policy: max_attempts 3)."""
    max_attempts = queue.policy.max_attempts
    started = asyncio.Event()

    async def hang(job: Job) -> None:
        started.set()
        await asyncio.sleep(3600)

    await queue.enqueue(WorkItem(tenant="t", item_id="a", payload={}))
    for restart in range(max_attempts - 1):
        started.clear()
        worker = Worker(queue, default=hang, timeout=60, grace_period=0, **FAST)
        await worker.start()
        await started.wait()
        await worker.stop()
        item = await item_of(queue, "a")
        assert (item.status, item.attempts) == (ItemStatus.QUEUED, restart + 1)
    hooks = Recorder()
    async with Worker(queue, default=hang, timeout=0.1, hooks=hooks, **FAST):
        await until(lambda: "failed" in hooks.kinds("a"))
    item = await item_of(queue, "a")
    assert (item.status, item.attempts) == (ItemStatus.DEAD, max_attempts)
    assert item.last_error == "TimeoutError: the handler timed out after 0.1 s"


async def test_the_prune_service_deletes_finished_items_past_their_keep(
    queue: BaseWorkQueue, clock: ManualClock
) -> None:
    hooks = Recorder()

    async def ok(job: Job) -> None:
        return None

    await queue.enqueue(WorkItem(tenant="t", item_id="a", payload={}))
    settings = {**FAST, "prune_every": 0.05}
    async with Worker(queue, default=ok, hooks=hooks, **settings):
        await until(lambda: "succeeded" in hooks.kinds("a"))
        await asyncio.sleep(0.2)
        assert (await item_of(queue, "a")).status == ItemStatus.DONE
        keep = queue.policy.keep_done
        assert keep is not None
        clock.advance(keep.total_seconds() + 1)

        async def gone() -> bool:
            return await queue.get_item("t", "a") is None

        await until(gone)
