"""Periodic jobs on the Worker, on the memory backing, time driven by a ManualClock.

Tick alignment (intervals at multiples since the epoch, cron by croniter, in
UTC), the item a tick makes (id, payload), the missed-tick rule (after a gap
only the latest tick is enqueued; ``catch_up=False`` none), three workers on
one queue sharing a cron schedule (exactly one item per tick), ``stop()``
ending the schedule loop, and what registration refuses. The same on Redis and
PostgreSQL, and on the real clock, is in tests/integration/test_worker_periodic.py.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import SCHEDULED_FOR_FIELD, Job, Schedule, Worker
from tests.unit.test_worker import until

FAST = {"poll_interval": 0.01, "reap_every": 0}
START = datetime(2026, 3, 2, 9, 3, 7, 300_000, tzinfo=UTC)


class Ran:
    """A handler recording the id of every item it ran, in order."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, job: Job) -> None:
        self.ids.append(job.item.item_id)


def schedule_id(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.isoformat().replace('+00:00', 'Z')}"


@pytest.fixture(autouse=True)
def worker_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="statepact.worker")


@pytest.fixture
def manual() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def queue(manual: ManualClock) -> MemoryWorkQueue:
    return MemoryWorkQueue(clock=manual)


async def settle() -> None:
    """Let every worker's schedule loop read the clock again (each does so every 0.01 s)."""
    await asyncio.sleep(0.06)


# -- ticks --------------------------------------------------------------------------------


def test_interval_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    every_10 = Schedule(name="s", task="t", tenant="x", payload={}, interval=10.0)
    assert every_10.latest_tick(START) == datetime(2026, 3, 2, 9, 3, 0, tzinfo=UTC)
    assert every_10.next_tick(START) == datetime(2026, 3, 2, 9, 3, 10, tzinfo=UTC)
    on_tick = datetime(2026, 3, 2, 9, 3, 10, tzinfo=UTC)
    assert every_10.latest_tick(on_tick) == on_tick  # a tick is its own latest
    assert every_10.next_tick(on_tick) == on_tick + timedelta(seconds=10)
    hourly = Schedule(name="s", task="t", tenant="x", payload={}, interval=3600.0)
    assert hourly.latest_tick(START) == datetime(2026, 3, 2, 9, tzinfo=UTC)
    half = Schedule(name="s", task="t", tenant="x", payload={}, interval=0.25)
    assert half.latest_tick(START) == datetime(2026, 3, 2, 9, 3, 7, 250_000, tzinfo=UTC)


def test_cron_ticks_come_from_croniter_in_utc() -> None:
    five = Schedule(name="s", task="t", tenant="x", payload={}, cron="*/5 * * * *")
    assert five.latest_tick(START) == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert five.next_tick(START) == datetime(2026, 3, 2, 9, 5, tzinfo=UTC)
    on_tick = datetime(2026, 3, 2, 9, 5, tzinfo=UTC)
    assert five.latest_tick(on_tick) == on_tick
    assert five.next_tick(on_tick) == datetime(2026, 3, 2, 9, 10, tzinfo=UTC)
    weekly = Schedule(name="s", task="t", tenant="x", payload={}, cron="30 6 * * mon")
    assert weekly.latest_tick(START) == datetime(2026, 3, 2, 6, 30, tzinfo=UTC)  # a Monday
    assert weekly.next_tick(START) == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)


async def test_an_interval_enqueues_one_item_per_tick_naming_schedule_and_tick(
    queue: MemoryWorkQueue, manual: ManualClock
) -> None:
    ran = Ran()
    worker = Worker(queue, handlers={"beat": ran}, clock=manual, **FAST)
    schedule = worker.every(timedelta(seconds=10), task="beat", tenant="ops", payload={"n": 1})
    assert schedule.name == "beat" and worker.schedules == (schedule,)
    first = datetime(2026, 3, 2, 9, 3, 0, tzinfo=UTC)
    async with worker:
        await until(lambda: len(ran.ids) == 1)  # catch_up: the tick at 09:03:00, at start
        await settle()
        assert len(ran.ids) == 1  # nothing more until the clock reaches the next tick
        manual.advance(2.7)  # 09:03:10.000
        await until(lambda: len(ran.ids) == 2)
        manual.advance(9.999)
        await settle()
        assert len(ran.ids) == 2
        manual.advance(0.001)  # 09:03:20
        await until(lambda: len(ran.ids) == 3)
    ticks = [first + timedelta(seconds=10 * n) for n in range(3)]
    assert ran.ids == [schedule_id("beat", tick) for tick in ticks]
    item = await queue.get_item("ops", ran.ids[1])
    assert item is not None and item.status == ItemStatus.DONE
    assert item.payload == {"n": 1, "task": "beat", SCHEDULED_FOR_FIELD: "2026-03-02T09:03:10Z"}


# -- the missed-tick rule -----------------------------------------------------------------


async def test_after_every_worker_was_down_only_the_latest_missed_tick_is_enqueued(
    queue: MemoryWorkQueue, manual: ManualClock
) -> None:
    """A worker ran 09:00's tick and stopped; an hour (12 ticks) later a new one starts: it
    enqueues 10:00's tick at once, and none of the 11 ticks between."""
    ran = Ran()
    first = Worker(queue, handlers={"report": ran}, clock=manual, **FAST)
    first.cron("*/5 * * * *", task="report", tenant="ops")
    async with first:
        await until(lambda: len(ran.ids) == 1)
    manual.advance(timedelta(hours=1))  # 10:03:07, every worker down
    second = Worker(queue, handlers={"report": ran}, clock=manual, **FAST)
    second.cron("*/5 * * * *", task="report", tenant="ops")
    async with second:
        await until(lambda: len(ran.ids) == 2)
        await settle()
    assert ran.ids == [
        schedule_id("report", datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        schedule_id("report", datetime(2026, 3, 2, 10, 0, tzinfo=UTC)),
    ]
    stats = await queue.stats()
    assert stats.queued == stats.leased == 0  # nothing else was enqueued


async def test_a_restart_within_a_tick_adds_nothing(
    queue: MemoryWorkQueue, manual: ManualClock
) -> None:
    """The latest tick was enqueued (and done) already: a worker starting again stores it once."""
    ran = Ran()
    for _ in range(2):
        worker = Worker(queue, handlers={"report": ran}, clock=manual, **FAST)
        worker.cron("*/5 * * * *", task="report", tenant="ops")
        async with worker:
            await settle()
    assert ran.ids == [schedule_id("report", datetime(2026, 3, 2, 9, 0, tzinfo=UTC))]


async def test_catch_up_false_skips_the_missed_ticks_and_waits_for_the_next(
    queue: MemoryWorkQueue, manual: ManualClock
) -> None:
    ran = Ran()
    worker = Worker(queue, handlers={"report": ran}, clock=manual, **FAST)
    worker.cron("*/5 * * * *", task="report", tenant="ops", catch_up=False)
    async with worker:
        await settle()
        assert ran.ids == []
        manual.advance(timedelta(minutes=1, seconds=53))  # 09:05:00
        await until(lambda: len(ran.ids) == 1)
    assert ran.ids == [schedule_id("report", datetime(2026, 3, 2, 9, 5, tzinfo=UTC))]


async def test_a_clock_jump_past_several_ticks_while_running_enqueues_only_the_latest(
    queue: MemoryWorkQueue, manual: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    ran = Ran()
    worker = Worker(queue, handlers={"beat": ran}, clock=manual, **FAST)
    worker.every(60, task="beat", tenant="ops")
    async with worker:
        await until(lambda: len(ran.ids) == 1)
        manual.advance(timedelta(minutes=5))  # 09:08:07: ticks 09:04 .. 09:08 are due
        await until(lambda: len(ran.ids) == 2)
        await settle()
    assert ran.ids == [
        schedule_id("beat", datetime(2026, 3, 2, 9, 3, tzinfo=UTC)),
        schedule_id("beat", datetime(2026, 3, 2, 9, 8, tzinfo=UTC)),
    ]
    assert any(
        "schedule 'beat' skipped the ticks after 2026-03-02T09:03:00Z before 2026-03-02T09:08:00Z"
        in record.getMessage()
        for record in caplog.records
    )


class FailsOnce(MemoryWorkQueue):
    """A memory queue whose first enqueue_many fails, as a server away would."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.calls = 0

    async def enqueue_many(self, items: Sequence[WorkItem], **kwargs: Any) -> list[WorkItem]:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("server away")
        return await super().enqueue_many(items, **kwargs)


async def test_a_failed_enqueue_is_tried_again_for_the_latest_tick(
    manual: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = FailsOnce(manual)
    ran = Ran()
    worker = Worker(queue, handlers={"beat": ran}, clock=manual, **FAST)
    worker.every(60, task="beat", tenant="ops")
    async with worker:
        await until(lambda: len(ran.ids) == 1)
    assert queue.calls == 2
    assert ran.ids == [schedule_id("beat", datetime(2026, 3, 2, 9, 3, tzinfo=UTC))]
    assert any("enqueueing scheduled items failed" in r.getMessage() for r in caplog.records)


# -- several workers ------------------------------------------------------------------------


async def test_three_workers_sharing_a_cron_schedule_make_exactly_one_item_per_tick(
    queue: MemoryWorkQueue, manual: ManualClock
) -> None:
    ran = Ran()
    workers = []
    for n in range(3):
        worker = Worker(queue, handlers={"report": ran}, clock=manual, worker_id=f"w{n}", **FAST)
        worker.cron("*/5 * * * *", task="report", tenant="ops", payload={"kind": "daily"})
        workers.append(worker)
    await asyncio.gather(*(worker.start() for worker in workers))
    try:
        await until(lambda: len(ran.ids) == 1)  # 09:00, caught up at start
        await settle()
        manual.advance(timedelta(minutes=1, seconds=52, microseconds=700_000))  # 09:05:00
        for count in range(2, 12):
            if count > 2:
                manual.advance(timedelta(minutes=5))
            await until(lambda count=count: len(ran.ids) == count)  # type: ignore[misc]
            await settle()  # every worker has read the clock since this tick came due
    finally:
        await asyncio.gather(*(worker.stop() for worker in workers))
    nine = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    expected = [nine + timedelta(minutes=5 * n) for n in range(11)]
    assert ran.ids == [schedule_id("report", tick) for tick in expected]
    stats = await queue.stats()
    assert stats.queued == stats.leased == 0


async def test_stop_ends_the_schedule_loop(queue: MemoryWorkQueue, manual: ManualClock) -> None:
    ran = Ran()
    worker = Worker(queue, handlers={"beat": ran}, clock=manual, **FAST)
    worker.every(1, task="beat", tenant="ops")
    await worker.start()
    await until(lambda: len(ran.ids) == 1)
    await worker.stop()
    assert all(loop.done() for loop in worker._loops)
    manual.advance(10)
    await settle()
    assert (await queue.stats()).queued == 0


async def test_cancelling_run_ends_the_schedule_loop(
    queue: MemoryWorkQueue, manual: ManualClock
) -> None:
    ran = Ran()
    worker = Worker(queue, handlers={"beat": ran}, clock=manual, **FAST)
    worker.every(1, task="beat", tenant="ops")
    running = asyncio.ensure_future(worker.run(install_signal_handlers=False))
    await until(lambda: len(ran.ids) == 1)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert worker._loops and all(loop.done() for loop in worker._loops)


# -- what is refused ----------------------------------------------------------------------


async def noop(job: Job) -> None:
    pass


def test_bad_schedules_are_refused_naming_the_field(queue: MemoryWorkQueue) -> None:
    worker = Worker(queue, handlers={"beat": noop}, **FAST)
    with pytest.raises(ValueError, match=r"^cron: 'bad' is not a valid cron expression"):
        worker.cron("bad", task="beat", tenant="ops")
    with pytest.raises(ValueError, match=r"^cron: '61 \* \* \* \*' is not a valid"):
        worker.cron("61 * * * *", task="beat", tenant="ops")
    with pytest.raises(ValueError, match=r"^cron: must be a non-empty"):
        worker.cron("", task="beat", tenant="ops")
    # The one wording of every duration (statepact._codec.require_seconds).
    for interval in (0, -1, timedelta(0)):
        with pytest.raises(ValueError, match=r"^interval: must be positive, got"):
            worker.every(interval, task="beat", tenant="ops")
    with pytest.raises(ValueError, match=r"^interval: must be finite"):
        worker.every(float("nan"), task="beat", tenant="ops")
    with pytest.raises(TypeError, match=r"^interval: must be seconds or a timedelta"):
        worker.every("5", task="beat", tenant="ops")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^tenant: must not be empty"):
        worker.every(5, task="beat", tenant="")
    with pytest.raises(ValueError, match=r"^task: must be a non-empty str"):
        worker.every(5, task="", tenant="ops")
    with pytest.raises(ValueError, match=r"^name: must not contain ':'"):
        worker.every(5, task="beat", tenant="ops", name="a:b")
    with pytest.raises(ValueError, match=r"^payload: must not hold 'task'"):
        worker.every(5, task="beat", tenant="ops", payload={"task": "other"})
    with pytest.raises(ValueError, match=r"^payload: must not hold 'scheduled_for'"):
        worker.every(5, task="beat", tenant="ops", payload={"scheduled_for": 1})
    with pytest.raises(ValueError, match=r"^priority: must be between"):
        worker.every(5, task="beat", tenant="ops", priority=5000)
    assert worker.schedules == ()  # nothing half-registered
    worker.every(5, task="beat", tenant="ops")
    with pytest.raises(ValueError, match=r"^name: a schedule named 'beat' is already registered"):
        worker.cron("* * * * *", task="beat", tenant="ops")
    worker.cron("* * * * *", task="beat", tenant="ops", name="beat-cron")
    assert [s.name for s in worker.schedules] == ["beat", "beat-cron"]


async def test_a_schedule_for_an_unknown_task_is_refused_at_start(queue: MemoryWorkQueue) -> None:
    worker = Worker(queue, handlers={"beat": noop}, **FAST)
    worker.every(5, task="report", tenant="ops")
    with pytest.raises(ValueError, match=r"^schedule 'report': task: 'report' has no handler"):
        await worker.start()
    assert worker._loops == [] and (await queue.stats()).queued == 0


async def test_schedules_are_added_before_start(queue: MemoryWorkQueue) -> None:
    worker = Worker(queue, handlers={"beat": noop}, **FAST)
    async with worker:
        with pytest.raises(RuntimeError, match="before start"):
            worker.every(5, task="beat", tenant="ops")


def test_cron_without_croniter_names_the_extra(
    queue: MemoryWorkQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "croniter", None)  # import croniter now fails
    worker = Worker(queue, handlers={"beat": noop}, **FAST)
    with pytest.raises(ImportError, match=r"statepact\[cron\]"):
        worker.cron("* * * * *", task="beat", tenant="ops")
    worker.every(5, task="beat", tenant="ops")  # intervals need no library
