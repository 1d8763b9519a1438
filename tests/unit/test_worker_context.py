"""The Worker inside an application (issue 39), on the memory queue: the application
context (``startup``/``shutdown``, ``job.context``), ``Worker(policy=)`` and its one
precedence rule, ``job.complete_in`` refused where it cannot work, and the extras every
worker log line carries. ``complete_in`` on PostgreSQL is tested in
tests/integration/test_worker_complete_in.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import Job, Worker
from statepact.worker._policy import settle_policy
from tests.unit.test_worker import FAST, Recorder, put, status, until


@pytest.fixture
def queue(clock: ManualClock) -> MemoryWorkQueue:
    return MemoryWorkQueue(clock=clock, policy=QueuePolicy(max_attempts=3, jitter=0))


async def test_startup_opens_the_context_once_handlers_see_it_shutdown_closes_it(
    queue: MemoryWorkQueue,
) -> None:
    """startup runs once before any claim; every job.context is its result; shutdown gets it."""
    events: list[str] = []
    seen: list[Any] = []

    class App:
        pass

    app = App()

    async def startup() -> App:
        events.append("startup")
        return app

    async def shutdown(context: App) -> None:
        assert context is app
        events.append("shutdown")

    async def handle(job: Job) -> None:
        seen.append(job.context)

    worker = Worker(queue, default=handle, startup=startup, shutdown=shutdown, **FAST)
    for n in range(3):
        await put(queue, f"i{n}")
    async with worker:
        await until(lambda: len(seen) == 3)
        assert events == ["startup"]
    assert events == ["startup", "shutdown"]
    assert seen == [app, app, app]


async def test_without_startup_the_context_is_none(queue: MemoryWorkQueue) -> None:
    seen: list[Any] = ["unset"]

    async def handle(job: Job) -> None:
        seen[0] = job.context

    await put(queue, "a")
    async with Worker(queue, default=handle, **FAST):
        await until(lambda: seen[0] != "unset")
    assert seen == [None]


async def test_shutdown_runs_when_the_run_is_cancelled(queue: MemoryWorkQueue) -> None:
    """A cancelled run() still closes the context (stop(0) then shutdown)."""
    events: list[str] = []

    async def startup() -> str:
        events.append("startup")
        return "ctx"

    async def shutdown(context: str) -> None:
        await asyncio.sleep(0)  # an await inside shutdown is not cut by the cancellation
        events.append(f"shutdown {context}")

    async def handle(job: Job) -> None:
        return None

    worker = Worker(queue, default=handle, startup=startup, shutdown=shutdown, **FAST)
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await until(lambda: events == ["startup"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["startup", "shutdown ctx"]


async def test_shutdown_runs_when_what_follows_startup_fails(
    queue: MemoryWorkQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """startup succeeded, then starting the loops failed: the context is closed again."""
    events: list[str] = []

    async def startup() -> str:
        return "ctx"

    async def shutdown(context: str) -> None:
        events.append(f"shutdown {context}")

    async def handle(job: Job) -> None:
        return None

    worker = Worker(queue, default=handle, startup=startup, shutdown=shutdown, **FAST)

    def broken(rt: object) -> None:
        raise RuntimeError("no loops today")

    monkeypatch.setattr(worker, "_begin", broken)
    with pytest.raises(RuntimeError, match="no loops today"):
        await worker.start()
    assert events == ["shutdown ctx"]


async def test_a_failing_startup_starts_nothing(queue: MemoryWorkQueue) -> None:
    ran: list[str] = []

    async def startup() -> None:
        raise OSError("the database is away")

    async def handle(job: Job) -> None:
        ran.append(job.item.item_id)

    await put(queue, "a")
    worker = Worker(queue, default=handle, startup=startup, **FAST)
    with pytest.raises(OSError, match="away"):
        await worker.start()
    await asyncio.sleep(0.05)
    assert ran == []
    assert (await status(queue, "a")).status == ItemStatus.QUEUED


def test_sync_startup_and_shutdown_are_refused_naming_the_field() -> None:
    def startup() -> None:
        return None

    def shutdown(context: object) -> None:
        return None

    with pytest.raises(TypeError, match=r"^startup: must be an async callable"):
        Worker(startup=startup)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^shutdown: must be an async callable"):
        Worker(shutdown=shutdown)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^startup: must be an async callable"):
        Worker(startup="engine")  # type: ignore[arg-type]


# -- the policy -------------------------------------------------------------------------


def test_policy_is_checked_and_carried() -> None:
    policy = QueuePolicy(max_attempts=2)
    assert Worker(policy=policy).policy is policy
    assert Worker().policy is None
    with pytest.raises(TypeError, match=r"^policy: must be a QueuePolicy"):
        Worker(policy={"max_attempts": 2})  # type: ignore[arg-type]


def test_the_precedence_rule_is_option_then_worker_then_queue() -> None:
    queue_policy = QueuePolicy(max_attempts=9, backoff_base=3.0)
    worker_policy = QueuePolicy(max_attempts=2)
    assert settle_policy({}, None, queue_policy) == queue_policy
    assert settle_policy({}, worker_policy, queue_policy) == worker_policy
    assert settle_policy({"max_attempts": 4, "jitter": None}, worker_policy, queue_policy) == (
        worker_policy.model_copy(update={"max_attempts": 4})
    )
    assert settle_policy({}, None) == QueuePolicy()


def test_a_queue_running_another_policy_is_refused_at_bind(clock: ManualClock) -> None:
    """The queue applies its policy in every fail and reap: a Worker asking for another one
    is refused, naming the field, not silently run with the queue's."""
    queue = MemoryWorkQueue(clock=clock, policy=QueuePolicy(max_attempts=5))
    with pytest.raises(ValueError, match=r"^policy: this Worker's policy"):
        Worker(queue, policy=QueuePolicy(max_attempts=3))
    same = MemoryWorkQueue(clock=clock, policy=QueuePolicy(max_attempts=3))
    assert Worker(same, policy=QueuePolicy(max_attempts=3)).queue is same


async def test_the_worker_policy_decides_the_dead_letter(clock: ManualClock) -> None:
    """Worker(policy=max_attempts=2) on a queue opened with it: dead after 2 failures."""
    policy = QueuePolicy(max_attempts=2, backoff_base=0.001, backoff_cap=0.001, jitter=0)
    queue = MemoryWorkQueue(clock=clock, policy=policy)
    hooks = Recorder()

    async def boom(job: Job) -> None:
        raise ValueError("no")

    await put(queue, "a")
    async with Worker(queue, default=boom, policy=policy, hooks=hooks, **FAST):

        async def dead() -> bool:
            clock.advance(1)
            return (await status(queue, "a")).status == ItemStatus.DEAD

        await until(dead)
    assert (await status(queue, "a")).attempts == 2


# -- complete_in where it cannot work -----------------------------------------------------


async def test_complete_in_on_a_memory_queue_is_refused_saying_what_to_do(
    queue: MemoryWorkQueue,
) -> None:
    errors: list[BaseException] = []

    async def handle(job: Job) -> None:
        try:
            await job.complete_in(object())
        except TypeError as exc:
            errors.append(exc)

    await put(queue, "a")
    async with Worker(queue, default=handle, **FAST):
        await until(lambda: bool(errors))
        await until(lambda: status_is(queue, "a", ItemStatus.DONE))
    assert "MemoryWorkQueue cannot join an SQL transaction" in str(errors[0])
    assert "idempotent" in str(errors[0])


async def status_is(queue: MemoryWorkQueue, item_id: str, wanted: ItemStatus) -> bool:
    return (await status(queue, item_id)).status == wanted


async def test_complete_in_outside_a_handler_is_refused(queue: MemoryWorkQueue) -> None:
    await put(queue, "a")
    lease = await queue.claim("w", lease_for=30)
    assert lease is not None
    with pytest.raises(RuntimeError, match="not running in a Worker's handler"):
        await Job(lease=lease, task=None, worker_id="w").complete_in(object())


# -- log lines ------------------------------------------------------------------------------


async def test_worker_log_lines_carry_the_item_fields(
    queue: MemoryWorkQueue, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(job: Job) -> None:
        raise ValueError("bad input")

    await queue.enqueue(WorkItem(tenant="acme", item_id="a", payload={"task": "boom"}))
    caplog.set_level(logging.INFO, logger="statepact.worker")
    worker = Worker(queue, handlers={"boom": boom}, worker_id="w-1", **FAST)
    async with worker:
        await until(lambda: any("raised" in r.getMessage() for r in caplog.records))
    record = next(r for r in caplog.records if "raised" in r.getMessage())
    assert record.levelno == logging.WARNING
    fields = {k: getattr(record, k, None) for k in ("worker_id", "queue", "tenant", "item_id")}
    assert fields == {"worker_id": "w-1", "queue": queue.name, "tenant": "acme", "item_id": "a"}
    assert getattr(record, "task", None) == "boom"
    started = next(r for r in caplog.records if "starting" in r.getMessage())
    assert getattr(started, "worker_id", None) == "w-1"
    assert getattr(started, "queue", None) == queue.name
