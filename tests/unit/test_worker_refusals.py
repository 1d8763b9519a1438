"""What the Worker refuses before anything runs, and the rules it shares with the queue (issue 32).

Each test here failed on the worker before the rebuild: settings the queue would
refuse later were accepted (7), ``async def`` hooks were accepted and never
awaited (8), a schedule that could never be enqueued was accepted (6), and the
worker spelled the queue's rules a second time, differently (9). Also: a handler
raising ``SystemExit`` or ``KeyboardInterrupt`` releases its item before the
exception goes on (5), and a concurrency above what one claim takes still drains.
The defects that need a queue round trip are in
tests/integration/test_worker_defects.py, on every backing.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

import statepact._limits
import statepact.worker
from statepact._codec import require_seconds
from statepact.errors import StatePersistenceError
from statepact.models import ItemStatus, WorkItem
from statepact.queue import MAX_BATCH
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import Job, Retry, Worker, WorkerHooks
from tests.unit.test_worker import until

FAST = {"poll_interval": 0.01, "reap_every": 0}


async def noop(job: Job) -> None:
    pass


# -- 7. settings the queue would refuse ---------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"lease_for": 4e8}, "lease_for"),
        ({"lease_for": 4e8, "heartbeat_every": 1}, "lease_for"),
        ({"poll_interval": 1e9}, "poll_interval"),
        ({"reap_every": 1e9}, "reap_every"),
        ({"grace_period": timedelta(days=5000)}, "grace_period"),
        ({"worker_id": "w" * 1025}, "worker_id"),
    ],
)
def test_settings_the_queue_would_refuse_are_refused_at_construction(
    options: dict[str, Any], field: str
) -> None:
    """``lease_for=4e8`` made every claim refused and ``poll_interval=1e9`` every idle wait
    (the loop spun); each is refused when the worker is built, naming the field."""
    with pytest.raises(ValueError, match=rf"^{field}: "):
        Worker(MemoryWorkQueue(), **options)


@pytest.mark.parametrize("value", [4e8, -1, 0, float("inf"), "30", True])
async def test_lease_for_is_refused_in_the_words_claim_batch_refuses_it(value: object) -> None:
    """One rule: the worker reads its durations as the queue's calls read theirs."""
    queue = MemoryWorkQueue()
    with pytest.raises((ValueError, TypeError)) as by_worker:
        Worker(queue, lease_for=value)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError)) as by_queue:
        await queue.claim_batch("w", lease_for=value, limit=1)  # type: ignore[arg-type]
    assert type(by_worker.value) is type(by_queue.value)
    assert str(by_worker.value) == str(by_queue.value)


@pytest.mark.parametrize("value", [1e9, float("inf"), float("nan")])
async def test_poll_interval_is_refused_as_watch_wait_refuses_its_timeout(value: float) -> None:
    queue = MemoryWorkQueue()
    with pytest.raises(ValueError) as by_worker:
        Worker(queue, poll_interval=value)
    async with queue.watch() as watch:
        with pytest.raises(ValueError) as by_queue:
            await watch.wait(value)
    assert str(by_worker.value).removeprefix("poll_interval") == str(by_queue.value).removeprefix(
        "timeout"
    )


async def test_a_concurrency_above_one_claims_limit_still_drains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Claims ask for at most what one ``claim_batch`` takes, whatever the free slots: none
    is refused (the worker used to ask for more, be refused, and start again from one)."""
    queue = MemoryWorkQueue()
    gate = asyncio.Event()
    started = 0

    async def wait(job: Job) -> None:
        nonlocal started
        started += 1
        await gate.wait()

    # Claims double while they come back full: 1, 2, ... 1,024 in flight, then 1,024 more
    # asked for, over the 1,000 one claim_batch takes.
    count = 2 * MAX_BATCH + 200
    await queue.enqueue_many([WorkItem(tenant="t", item_id=f"i{n}") for n in range(count)])
    worker = Worker(queue, default=wait, concurrency=2 * count, **FAST)
    async with worker:
        await until(lambda: started == count, timeout=30)
        gate.set()
        await until(lambda: worker.in_flight == 0, timeout=30)
    stats = await queue.stats()
    assert (stats.queued, stats.leased) == (0, 0)
    assert "claim failed" not in caplog.text


# -- 8. async hooks -----------------------------------------------------------------------


class AsyncFailed(WorkerHooks):
    async def failed(self, job: Job, item: WorkItem, error: str) -> None:  # type: ignore[override]
        pass


class AsyncGenStarted(WorkerHooks):
    async def started(self, job: Job) -> Any:  # type: ignore[override]
        yield None


def test_an_async_hook_is_refused_naming_it() -> None:
    """An ``async def`` hook used to be accepted and never awaited ("coroutine ... was never
    awaited"): it is refused when the hooks are given or added, naming class and hook."""
    queue = MemoryWorkQueue()
    with pytest.raises(TypeError, match=r"^hooks: AsyncFailed\.failed is async"):
        Worker(queue, hooks=AsyncFailed())
    with pytest.raises(TypeError, match=r"^hooks: AsyncFailed\.failed is async"):
        Worker(queue, hooks=[WorkerHooks(), AsyncFailed()])
    worker = Worker(queue, default=noop)
    with pytest.raises(TypeError, match=r"^hooks: AsyncGenStarted\.started is async"):
        worker.add_hooks(AsyncGenStarted())
    with pytest.raises(TypeError, match=r"^hooks: must be a WorkerHooks, got object"):
        worker.add_hooks(object())  # type: ignore[arg-type]


async def test_a_hook_returning_an_awaitable_is_not_run_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plain ``def`` returning a coroutine: the coroutine is closed (no "never awaited"
    warning, which this suite turns into an error), the hook is logged, the item acked."""
    ran: list[str] = []

    async def later() -> None:
        ran.append("later")

    class Sneaky(WorkerHooks):
        def started(self, job: Job) -> Any:
            return later()

    queue = MemoryWorkQueue()
    await queue.enqueue(WorkItem(tenant="t", item_id="x"))
    worker = Worker(queue, default=noop, hooks=Sneaky(), **FAST)
    async with worker:
        await until(lambda: worker.in_flight == 0 and "Sneaky.started returned" in caplog.text)
    assert ran == []
    item = await queue.get_item("t", "x")
    assert item is not None and item.status == ItemStatus.DONE


# -- 6. schedules that could never be enqueued --------------------------------------------


def test_a_schedule_name_making_the_item_id_too_long_is_refused() -> None:
    """A 1,000-character name made every tick's id (``schedule:<name>:<tick>``) longer than
    an id may be: refused, naming ``name``; a name that fits with any tick is taken."""
    worker = Worker(MemoryWorkQueue(), default=noop)
    with pytest.raises(ValueError, match=r"^name: makes each tick's item id"):
        worker.every(5, task="beat", tenant="ops", name="n" * 1000)
    fits = 1024 - len("schedule::9999-12-31T23:59:59.999999Z")
    with pytest.raises(ValueError, match=r"^name: "):
        worker.every(5, task="beat", tenant="ops", name="n" * (fits + 1))
    assert worker.schedules == ()
    worker.every(5, task="beat", tenant="ops", name="n" * fits)


@pytest.mark.parametrize("interval", [1e12, timedelta(days=20 * 365)])
def test_an_interval_whose_ticks_overflow_is_refused(interval: float | timedelta) -> None:
    """``every(1e12)`` ran one tick dated 1970, then its loop died (``OverflowError``) and
    ``stop()`` raised it: refused, naming ``interval``; ten years is the longest."""
    worker = Worker(MemoryWorkQueue(), default=noop)
    with pytest.raises(ValueError, match=r"^interval: .* s is more than"):
        worker.every(interval, task="beat", tenant="ops")
    worker.every(timedelta(days=3650), task="beat", tenant="ops")


async def test_a_schedule_payload_too_large_for_the_queue_bound_later_is_refused_at_start() -> None:
    """Registered on a worker with no queue yet, a schedule's size is checked at ``start()``
    against the queue it was bound to, before anything runs."""
    worker = Worker(handlers={"beat": noop}, **FAST)
    worker.every(60, task="beat", tenant="ops", name="big", payload={"x": "y" * 2000})
    queue = MemoryWorkQueue(max_value_bytes=1024)
    worker.bind(queue)
    with pytest.raises(StatePersistenceError, match=r"^payload of schedule 'big'"):
        await worker.start()
    assert worker._loops == [] and (await queue.stats()).queued == 0


# -- 9. one rule each ---------------------------------------------------------------------


def test_the_retry_delay_cap_is_one_number() -> None:
    assert statepact.worker.MAX_RETRY_DELAY is statepact._limits.MAX_RETRY_DELAY
    assert Retry(timedelta(days=30)).delay == 30 * 86_400
    with pytest.raises(ValueError, match=r"^delay: "):
        Retry(timedelta(days=40))
    with pytest.raises(ValueError, match=r"^delay: "):
        Retry(40 * 86_400)


@pytest.mark.parametrize(
    ("options", "field", "value", "zero"),
    [
        ({"lease_for": -1}, "lease_for", -1, False),
        ({"heartbeat_every": 0}, "heartbeat_every", 0, False),
        ({"reap_every": -2}, "reap_every", -2, True),
        ({"grace_period": "5"}, "grace_period", "5", True),
    ],
)
def test_worker_durations_are_refused_in_require_seconds_words(
    options: dict[str, Any], field: str, value: object, zero: bool
) -> None:
    with pytest.raises((ValueError, TypeError)) as by_worker:
        Worker(MemoryWorkQueue(), **options)
    with pytest.raises((ValueError, TypeError)) as by_rule:
        require_seconds(field, value, allow_zero=zero)
    assert str(by_worker.value) == str(by_rule.value)


# -- 5. SystemExit and KeyboardInterrupt --------------------------------------------------


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_system_exit_from_a_handler_releases_the_item_then_goes_on(
    raised: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """The process is on its way out: the item is released (due now, the attempt not
    counted) before the exception leaves the event loop."""
    released: list[WorkItem] = []

    class Released(WorkerHooks):
        def released(self, job: Job, item: WorkItem) -> None:
            released.append(item)

    async def leaves(job: Job) -> None:
        raise raised

    async def main() -> None:
        queue = MemoryWorkQueue()
        await queue.enqueue(WorkItem(tenant="t", item_id="x"))
        worker = Worker(queue, default=leaves, hooks=Released(), **FAST)
        await worker.start()
        await asyncio.sleep(10)

    caplog.set_level(logging.CRITICAL, logger="asyncio")
    with pytest.raises(raised):
        asyncio.run(main())
    assert [(item.item_id, item.status, item.attempts) for item in released] == [
        ("x", ItemStatus.QUEUED, 1)
    ]
