"""The Worker's part of the queue lifecycle (issue 33), on the memory queue: handler
timeouts (per item, per task, per worker) failing the attempt with heartbeats stopped at
the deadline; a hanging item reaching the dead letter across restarts (shutdown release
keeps the attempt); ``Snooze``; an operator's cancel cutting the running handler within a
second and settling nothing; the prune service. The same on Redis and PostgreSQL is in
tests/integration/test_worker_lifecycle.py."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import pytest

from statepact.clock import ManualClock, read_clock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import Job, Snooze, Worker
from statepact.worker._maintenance import services
from statepact.worker._runtime import Runtime
from tests.unit.test_worker import FAST, Recorder, put, status, until

POLICY = QueuePolicy(max_attempts=3, jitter=0, backoff_base=60)


@pytest.fixture
def queue(clock: ManualClock) -> MemoryWorkQueue:
    return MemoryWorkQueue(clock=clock, policy=POLICY)


# -- timeouts ---------------------------------------------------------------------------------


async def test_a_handler_past_its_timeout_is_cancelled_and_the_attempt_failed(
    queue: MemoryWorkQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker(timeout=): the handler is cancelled at the deadline, the attempt failed through
    the policy (retried: 1 < 3) with last_error saying how long, one WARNING line."""
    hooks = Recorder()
    cut = asyncio.Event()

    async def hang(job: Job) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cut.set()
            raise

    caplog.set_level(logging.INFO, logger="statepact.worker")
    await put(queue, "a")
    began = time.monotonic()
    async with Worker(queue, default=hang, timeout=0.2, hooks=hooks, **FAST):
        await until(lambda: "failed" in hooks.kinds("a"))
    assert cut.is_set()
    assert 0.2 <= time.monotonic() - began < 2
    item = await status(queue, "a")
    assert (item.status, item.attempts) == (ItemStatus.QUEUED, 1)
    assert item.last_error == "TimeoutError: the handler timed out after 0.2 s"
    lines = [r for r in caplog.records if "timed out" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert getattr(lines[0], "item_id", None) == "a"


async def test_the_item_timeout_beats_the_task_timeout_beats_the_worker_timeout(
    queue: MemoryWorkQueue,
) -> None:
    hooks = Recorder()
    worker = Worker(queue, timeout=0.4, hooks=hooks, **FAST)

    @worker.task("t", timeout=0.1)
    async def with_task_timeout(job: Job) -> None:
        await asyncio.sleep(3600)

    @worker.set_default
    async def without(job: Job) -> None:
        await asyncio.sleep(3600)

    await queue.enqueue(WorkItem(tenant="t", item_id="by-item", payload={"task": "t"}, timeout=0.2))
    await queue.enqueue(WorkItem(tenant="t", item_id="by-task", payload={"task": "t"}))
    await queue.enqueue(WorkItem(tenant="t", item_id="by-worker", payload={}))
    async with worker:
        await until(
            lambda: all("failed" in hooks.kinds(i) for i in ("by-item", "by-task", "by-worker"))
        )
    errors = {i: (await status(queue, i)).last_error for i in ("by-item", "by-task", "by-worker")}
    assert errors == {
        "by-item": "TimeoutError: the handler timed out after 0.2 s",
        "by-task": "TimeoutError: the handler timed out after 0.1 s",
        "by-worker": "TimeoutError: the handler timed out after 0.4 s",
    }


async def test_heartbeats_stop_at_the_deadline(queue: MemoryWorkQueue) -> None:
    """A handler that keeps running after its cut (it swallowed the cancellation) is not
    heartbeaten past its deadline: its lease may lapse and be reaped."""
    hooks = Recorder()
    beats: list[float] = []
    deadline: list[float] = []

    class Beats(Recorder):
        def renewed(self, job: Job) -> None:
            beats.append(time.monotonic())

    async def stubborn(job: Job) -> None:
        started = time.monotonic()
        deadline.append(started + 0.2)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.4)  # goes on past its cut, then returns

    await put(queue, "a")
    worker = Worker(
        queue,
        default=stubborn,
        timeout=0.2,
        lease_for=30,
        heartbeat_every=0.05,
        hooks=[hooks, Beats()],
        **FAST,
    )
    async with worker:
        await until(lambda: "failed" in hooks.kinds("a"))
    assert beats, "no heartbeat landed before the deadline"
    assert max(beats) < deadline[0] + 0.03
    item = await status(queue, "a")
    assert item.last_error == "TimeoutError: the handler timed out after 0.2 s"


def test_timeouts_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^timeout"):
        Worker(timeout=0)
    with pytest.raises(ValueError, match=r"^prune_every"):
        Worker(prune_every=-1)
    worker = Worker()
    with pytest.raises(ValueError, match=r"^task 'x': timeout"):

        @worker.task("x", timeout=-1)
        async def handler(job: Job) -> None:
            return None


async def test_a_hanging_item_reaches_the_dead_letter_across_restarts(
    queue: MemoryWorkQueue,
) -> None:
    """Two workers stopped while it hangs (each release keeps the attempt), then one whose
    timeout cuts it: dead after max_attempts (3) tries, whatever the restarts."""
    started = asyncio.Event()

    async def hang(job: Job) -> None:
        started.set()
        await asyncio.sleep(3600)

    await put(queue, "a")
    for restart in range(2):
        started.clear()
        worker = Worker(queue, default=hang, timeout=30, grace_period=0, **FAST)
        await worker.start()
        await started.wait()
        await worker.stop()
        item = await status(queue, "a")
        assert (item.status, item.attempts) == (ItemStatus.QUEUED, restart + 1)
    hooks = Recorder()
    async with Worker(queue, default=hang, timeout=0.1, hooks=hooks, **FAST):
        await until(lambda: "failed" in hooks.kinds("a"))
    item = await status(queue, "a")
    assert (item.status, item.attempts) == (ItemStatus.DEAD, 3)
    assert item.last_error == "TimeoutError: the handler timed out after 0.1 s"


# -- snooze -----------------------------------------------------------------------------------


async def test_snooze_puts_the_item_back_for_that_long_with_the_attempt_given_back(
    queue: MemoryWorkQueue, clock: ManualClock
) -> None:
    hooks = Recorder()
    calls: list[int] = []

    async def snoozy(job: Job) -> None:
        calls.append(job.attempts)
        if len(calls) == 1:
            raise Snooze(timedelta(seconds=60))

    await put(queue, "a")
    before = read_clock(clock)
    async with Worker(queue, default=snoozy, hooks=hooks, **FAST):
        await until(lambda: "released" in hooks.kinds("a"))
        item = await status(queue, "a")
        assert (item.status, item.attempts, item.last_error) == (ItemStatus.QUEUED, 0, None)
        assert item.available_at == before + timedelta(seconds=60)
        await asyncio.sleep(0.05)
        assert calls == [1]  # not due yet
        clock.advance(61)
        await until(lambda: "succeeded" in hooks.kinds("a"))
    assert calls == [1, 1]
    assert (await status(queue, "a")).status == ItemStatus.DONE


def test_snooze_is_checked_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^seconds"):
        Snooze(-1)
    with pytest.raises(ValueError, match=r"^seconds"):
        Snooze(timedelta(days=31))


# -- operator cancel ----------------------------------------------------------------------------


async def test_an_operator_cancel_cuts_the_running_handler_and_settles_nothing(
    queue: MemoryWorkQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """queue.cancel of a leased item: its handler is cancelled within a second; the item
    stays cancelled (the worker settles nothing), one INFO line, the ``cancelled`` hook."""
    hooks = Recorder()
    cancelled_hook: list[str] = []
    started = asyncio.Event()
    cut_at: list[float] = []

    class Cancels(Recorder):
        def cancelled(self, job: Job, reason: str) -> None:
            cancelled_hook.append(job.item.item_id)

    async def long(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cut_at.append(time.monotonic())
            raise

    caplog.set_level(logging.INFO, logger="statepact.worker")
    await put(queue, "a")
    await put(queue, "b")
    worker = Worker(queue, default=long, hooks=[hooks, Cancels()], grace_period=0, **FAST)
    async with worker:
        await started.wait()
        await until(lambda: len(hooks.kinds("a")) + len(hooks.kinds("b")) == 2)
        asked = time.monotonic()
        cancelled = await queue.cancel("t", "a", reason="the user gave up")
        assert cancelled is not None and cancelled.status == ItemStatus.CANCELLED
        await until(lambda: cancelled_hook == ["a"], timeout=1)
        assert cut_at and cut_at[0] - asked < 1
        assert (await status(queue, "b")).status == ItemStatus.LEASED  # the other runs on
    item = await status(queue, "a")
    assert (item.status, item.last_error) == (ItemStatus.CANCELLED, "the user gave up")
    assert hooks.kinds("a") == ["started"]  # no failed, no lease_lost, no released
    lines = [r for r in caplog.records if getattr(r, "item_id", None) == "a"]
    assert [(r.levelno, "cancelled" in r.getMessage()) for r in lines] == [(logging.INFO, True)]


async def test_a_cancel_notice_for_an_older_lease_is_ignored(queue: MemoryWorkQueue) -> None:
    """The notice names the voided lease's token: an executor holding a newer lease of the
    item (the old one lapsed and was claimed again) is not cut."""
    hooks = Recorder()
    started = asyncio.Event()

    async def handler(job: Job) -> None:
        started.set()
        await asyncio.sleep(0.2)

    await put(queue, "a")
    worker = Worker(queue, default=handler, hooks=hooks, **FAST)
    async with worker:
        await started.wait()
        (executor,) = worker._running
        assert executor.cancel(executor.job.lease.token - 1) is False
        await until(lambda: "succeeded" in hooks.kinds("a"))


# -- the prune service ------------------------------------------------------------------------


async def test_the_worker_prunes_finished_items_past_their_keep(clock: ManualClock) -> None:
    policy = QueuePolicy(keep_done=timedelta(seconds=10))
    queue = MemoryWorkQueue(clock=clock, policy=policy)
    hooks = Recorder()

    async def ok(job: Job) -> None:
        return None

    await put(queue, "a")
    async with Worker(queue, default=ok, hooks=hooks, prune_every=0.05, **FAST):
        await until(lambda: "succeeded" in hooks.kinds("a"))
        await asyncio.sleep(0.15)
        assert (await status(queue, "a")).status == ItemStatus.DONE  # kept 10 s
        clock.advance(11)

        async def gone() -> bool:
            return await queue.get_item("t", "a") is None

        await until(gone)


async def test_prune_every_zero_runs_no_pruner(queue: MemoryWorkQueue) -> None:
    async def ok(job: Job) -> None:
        return None

    names = []
    for every in (0, 60):
        worker = Worker(queue, default=ok, prune_every=every, reap_every=0)
        rt = Runtime(queue, "w", worker._settings, queue.clock, worker._hooks)
        names.append([service.name for service in services(rt)])
    assert names == [[], ["prune"]]
