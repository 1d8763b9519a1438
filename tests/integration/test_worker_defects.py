"""The ways the Worker lost track of an item (issue 32), each on memory, Redis and PostgreSQL.

Each test here failed on the worker before the rebuild (``statepact/worker.py``,
one class) and passes on the package by role:

1. a worker holding two leases of one item (the first lapsed, was reaped and the
   item claimed again) counts both in flight, and ``stop()`` waits for both;
2. an ack batch naming one item twice no longer drops the whole batch, and a batch
   the queue refuses is acked lease by lease;
3. ``stop()`` called right after a claim keeps its grace period and claims nothing more;
4. a handler whose cancellation raises at shutdown has its item released, not failed;
5. a ``BaseException`` that is not an ``Exception`` still settles the item;
6. one schedule the queue refuses no longer keeps the others from running, and a
   payload the queue would refuse is refused at registration;
9. ``fail(retry_in=)`` keeps the same 30-day cap as ``Retry``, and ``fail`` refuses a
   ``retryable`` that is not a bool.

What is refused without a server (7, 8, and the rest of 6 and 9) is in
tests/unit/test_worker_refusals.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

import pytest

from statepact.clock import Clock, ManualClock
from statepact.errors import LeaseLostError, StatePersistenceError
from statepact.models import ItemStatus, Lease, QueueStats, WorkItem
from statepact.queue import BaseWorkQueue, OnCancel, QueueLimits, QueuePolicy, WorkWatch
from statepact.worker import Job, Worker, WorkerHooks
from tests.unit.test_worker import Recorder, until

FAST = {"poll_interval": 0.01, "reap_every": 0}


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def queue(request: pytest.FixtureRequest) -> BaseWorkQueue:
    work_queue: BaseWorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return work_queue


async def put(queue: Any, item_id: str, tenant: str = "t", **payload: Any) -> None:
    await queue.enqueue(WorkItem(tenant=tenant, item_id=item_id, payload=payload))


async def record(queue: BaseWorkQueue, item_id: str, tenant: str = "t") -> WorkItem:
    item = await queue.get_item(tenant, item_id)
    assert item is not None
    return item


class Relay:
    """A ``WorkQueue`` handing every call to a real one (the test's server, or memory), that
    can hold ``ack_many`` calls until the test opens ``gate``, fail the next one, or refuse
    the enqueues of one tenant as the queue refuses a bad item."""

    def __init__(self, inner: BaseWorkQueue) -> None:
        self.inner = inner
        self.gate: asyncio.Event | None = None
        self.fail_next_ack_many = False
        self.refused_tenant: str | None = None
        self.ack_batches: list[list[str]] = []

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def clock(self) -> Clock:
        return self.inner.clock

    async def enqueue(self, item: WorkItem, *, delay: float | timedelta | None = None) -> WorkItem:
        return (await self.enqueue_many([item], delay=delay))[0]

    async def enqueue_many(
        self, items: Sequence[WorkItem], *, delay: float | timedelta | None = None
    ) -> list[WorkItem]:
        for index, item in enumerate(items):
            if item.tenant == self.refused_tenant:
                raise ValueError(f"items[{index}].tenant: refused by this test's queue")
        return await self.inner.enqueue_many(items, delay=delay)

    async def claim(self, worker_id: str, *, lease_for: float | timedelta) -> Lease | None:
        return await self.inner.claim(worker_id, lease_for=lease_for)

    async def claim_batch(
        self, worker_id: str, *, lease_for: float | timedelta, limit: int
    ) -> list[Lease]:
        return await self.inner.claim_batch(worker_id, lease_for=lease_for, limit=limit)

    async def heartbeat(self, lease: Lease) -> Lease:
        return await self.inner.heartbeat(lease)

    async def ack(self, lease: Lease) -> WorkItem:
        return await self.inner.ack(lease)

    async def ack_many(self, leases: Sequence[Lease]) -> list[WorkItem | LeaseLostError]:
        self.ack_batches.append([lease.item.item_id for lease in leases])
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next_ack_many:
            self.fail_next_ack_many = False
            raise RuntimeError("this batch is refused by the test")
        return await self.inner.ack_many(leases)

    async def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retryable: bool = True,
        retry_in: float | timedelta | None = None,
    ) -> WorkItem:
        return await self.inner.fail(lease, error, retryable=retryable, retry_in=retry_in)

    async def release(
        self,
        lease: Lease,
        *,
        delay: float | timedelta | None = None,
        count_attempt: bool = False,
    ) -> WorkItem:
        return await self.inner.release(lease, delay=delay, count_attempt=count_attempt)

    async def cancel(
        self, tenant: str, item_id: str, *, reason: str | None = None
    ) -> WorkItem | None:
        return await self.inner.cancel(tenant, item_id, reason=reason)

    async def cancel_many(
        self, tenant: str, item_ids: Sequence[str], *, reason: str | None = None
    ) -> list[WorkItem | None]:
        return await self.inner.cancel_many(tenant, item_ids, reason=reason)

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def paused(self) -> bool:
        return await self.inner.paused()

    async def prune(self) -> int:
        return await self.inner.prune()

    async def set_limits(self, limits: QueueLimits | None) -> None:
        await self.inner.set_limits(limits)

    async def limits(self) -> QueueLimits:
        return await self.inner.limits()

    async def reap(self) -> list[WorkItem]:
        return await self.inner.reap()

    async def dead_letters(self, tenant: str, *, limit: int = 100) -> list[WorkItem]:
        return await self.inner.dead_letters(tenant, limit=limit)

    async def requeue(self, item: WorkItem) -> WorkItem:
        return await self.inner.requeue(item)

    async def purge_dead(self, tenant: str) -> int:
        return await self.inner.purge_dead(tenant)

    async def get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        return await self.inner.get_item(tenant, item_id)

    def watch(self, *, on_cancel: OnCancel | None = None) -> AbstractAsyncContextManager[WorkWatch]:
        return self.inner.watch(on_cancel=on_cancel)

    async def stats(self) -> QueueStats:
        return await self.inner.stats()

    async def next_due(self) -> datetime | None:
        return await self.inner.next_due()


# -- 1. two leases of one item ----------------------------------------------------------


async def test_two_leases_of_one_item_are_both_in_flight_and_stop_waits_for_both(
    queue: BaseWorkQueue, clock: ManualClock
) -> None:
    """The first run's lease lapses while it holds the loop (the clock moves past it), the
    worker's reaper moves the item on and the worker claims it again while the first run is
    still cleaning up: ``in_flight`` counts both leases, then the second alone, and
    ``stop()`` returns only once its handler ended and its item was released."""
    hooks = Recorder()
    first_cleanup = asyncio.Event()
    second_running = asyncio.Event()
    running = 0

    async def work(job: Job) -> None:
        nonlocal running
        running += 1
        try:
            if job.attempts == 1:
                clock.advance(2)  # the 1 s lease lapses, as under 1.3 s of CPU-bound code
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    await first_cleanup.wait()  # a slow cleanup: the first run stays alive
                    raise
            second_running.set()
            await asyncio.sleep(3600)
        finally:
            running -= 1

    worker = Worker(
        queue,
        default=work,
        concurrency=2,
        lease_for=1,
        heartbeat_every=0.05,
        reap_every=0.02,
        poll_interval=0.01,
        hooks=hooks,
    )
    await put(queue, "x")
    await worker.start()
    try:
        await until(second_running.is_set)
        assert running == 2
        assert worker.in_flight == 2, "two leases of one item counted as one"
        first_cleanup.set()
        await until(lambda: running == 1)
        await until(lambda: "lease_lost" in hooks.kinds("x"))
        assert worker.in_flight == 1, "the first run's end took the second run's slot with it"
    finally:
        await worker.stop(grace_period=0.1)
    assert running == 0, "stop() returned while a handler ran"
    assert hooks.kinds("x") == ["started", "started", "lease_lost", "released"]
    item = await record(queue, "x")
    assert (item.status, item.attempts) == (ItemStatus.QUEUED, 2)  # the second run kept its try
    assert (await queue.stats()).leased == 0


# -- 2. the ack batch ---------------------------------------------------------------------


async def test_an_item_acked_twice_in_one_batch_costs_no_other_item_its_ack(
    queue: BaseWorkQueue,
) -> None:
    """Item ``a``'s first lease is released (as a reap would move it) after its handler
    returned, while its ack waits behind an ``ack_many`` in flight; the worker runs ``a``
    again. The next batch holds both of ``a``'s acks and ``b``'s: ``a``'s stale one is
    refused, ``a``'s new one and ``b``'s land, nothing is left leased."""
    relay = Relay(queue)
    relay.gate = asyncio.Event()
    hooks = Recorder()
    a1_done = asyncio.Event()
    b_done = asyncio.Event()

    async def work(job: Job) -> None:
        if job.item.item_id == "a" and len(hooks.kinds("a")) == 1:
            await a1_done.wait()
        elif job.item.item_id == "b":
            await b_done.wait()

    worker = Worker(relay, default=work, concurrency=3, hooks=hooks, **FAST)
    for item_id in ("x", "a", "b"):
        await put(queue, item_id)
    async with worker:
        await until(lambda: len(hooks.calls) == 3)  # x, a and b started; x's ack is held
        await until(lambda: relay.ack_batches == [["x"]])
        a1_done.set()
        await until(lambda: worker.in_flight == 1)  # a's first ack waits behind x's
        await queue.release(hooks.leases["a"][0])
        await until(lambda: hooks.kinds("a").count("started") == 2)
        await until(lambda: worker.in_flight == 1)  # a's second ack waits too; b runs
        b_done.set()
        await until(lambda: worker.in_flight == 0)
        relay.gate.set()
        await until(lambda: "succeeded" in hooks.kinds("b"))
        await until(lambda: "succeeded" in hooks.kinds("a"))
    assert all(len(batch) == len(set(batch)) for batch in relay.ack_batches), relay.ack_batches
    assert hooks.kinds("a") == ["started", "started", "lease_lost", "succeeded"]
    for item_id in ("x", "a", "b"):
        assert (await record(queue, item_id)).status == ItemStatus.DONE
    assert (await queue.stats()).leased == 0


async def test_a_refused_ack_batch_is_acked_lease_by_lease(queue: BaseWorkQueue) -> None:
    """An ``ack_many`` that raises (here: refused once) does not drop its acks: each lease is
    acked alone and every item is done."""
    relay = Relay(queue)
    relay.fail_next_ack_many = True
    relay.gate = asyncio.Event()
    hooks = Recorder()

    async def work(job: Job) -> None:
        pass

    worker = Worker(relay, default=work, concurrency=5, hooks=hooks, **FAST)
    for n in range(5):
        await put(queue, f"i{n}")
    async with worker:
        await until(lambda: len(relay.ack_batches) == 1)
        await until(lambda: worker.in_flight == 0)
        relay.gate.set()
        await until(lambda: sum(k == "succeeded" for k, _, _ in hooks.calls) == 5)
    for n in range(5):
        assert (await record(queue, f"i{n}")).status == ItemStatus.DONE
    assert (await queue.stats()).leased == 0


# -- 3. stop() right after a claim --------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_stop_right_after_a_claim_keeps_its_grace_and_claims_nothing_more(
    queue: BaseWorkQueue, concurrency: int
) -> None:
    """``stop(grace_period=0.2)`` called as the first handler starts (the claim loop between
    its claim and its next look at the free slots): it returns after the grace period, not
    the handler's 3 s, and no item is claimed after it was called."""
    events: list[str] = []
    stopping: list[asyncio.Task[float]] = []

    async def timed_stop() -> float:
        events.append("stop")
        began = time.monotonic()
        await worker.stop(grace_period=0.2)
        return time.monotonic() - began

    class StopAtFirstStart(WorkerHooks):
        def started(self, job: Job) -> None:
            events.append(f"started {job.item.item_id}")
            if not stopping:
                stopping.append(asyncio.get_running_loop().create_task(timed_stop()))

    async def slow(job: Job) -> None:
        await asyncio.sleep(3)

    worker = Worker(queue, default=slow, concurrency=concurrency, hooks=StopAtFirstStart(), **FAST)
    await put(queue, "a")
    await put(queue, "b")
    await worker.start()
    await until(lambda: bool(stopping))
    took = await stopping[0]
    assert events == ["started a", "stop"], "an item was claimed after stop()"
    assert took < 1.5, f"stop(grace_period=0.2) took {took:.2f} s"
    for item_id, attempts in (("a", 1), ("b", 0)):  # a ran: its attempt is kept
        item = await record(queue, item_id)
        assert (item.status, item.attempts) == (ItemStatus.QUEUED, attempts)


# -- 4. a cancellation that raises at shutdown ------------------------------------------


@pytest.mark.parametrize("queue_policy", [QueuePolicy(max_attempts=1)])
@pytest.mark.parametrize("raised", [RuntimeError, TimeoutError])
async def test_a_handler_whose_cancellation_raises_is_released_at_shutdown(
    queue: BaseWorkQueue, queue_policy: QueuePolicy, raised: type[Exception]
) -> None:
    """Past the grace period a handler is cancelled; its cleanup raising ``RuntimeError`` or
    ``TimeoutError`` does not make the item failed (dead, at ``max_attempts=1``): it is
    released, due now, the attempt kept (so a job that always hangs still reaches the dead
    letter: issue 33)."""
    assert queue_policy.max_attempts == 1
    hooks = Recorder()
    started = asyncio.Event()

    async def stubborn(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise raised("the cleanup failed") from None

    worker = Worker(queue, default=stubborn, hooks=hooks, **FAST)
    await put(queue, "x")
    await worker.start()
    await until(started.is_set)
    await worker.stop(grace_period=0.05)
    assert hooks.kinds("x") == ["started", "released"]
    item = await record(queue, "x")
    assert (item.status, item.attempts) == (ItemStatus.QUEUED, 1)


# -- 5. a BaseException that is not an Exception ----------------------------------------


class Abort(BaseException):
    """A user's own BaseException."""


@pytest.mark.parametrize(
    ("raised", "error"),
    [(Abort("abandon ship"), "Abort: abandon ship"), (GeneratorExit(), "GeneratorExit")],
)
async def test_a_base_exception_from_a_handler_fails_the_item(
    queue: BaseWorkQueue, raised: BaseException, error: str
) -> None:
    """A handler raising a ``BaseException`` that is not an ``Exception`` fails the item as
    any error does (retryable, the error kept); nothing is left leased after ``stop()``."""
    hooks = Recorder()

    async def aborts(job: Job) -> None:
        raise raised

    worker = Worker(queue, default=aborts, hooks=hooks, **FAST)
    await put(queue, "x")
    async with worker:
        await until(lambda: "failed" in hooks.kinds("x"))
        await until(lambda: worker.in_flight == 0)
    item = await record(queue, "x")
    assert (item.status, item.attempts, item.last_error) == (ItemStatus.QUEUED, 1, error)
    assert (await queue.stats()).leased == 0


# -- 6. schedules -----------------------------------------------------------------------


async def test_a_schedule_the_queue_refuses_does_not_hold_the_others_back(
    queue: BaseWorkQueue, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Two schedules due at once; the queue refuses every item of one of them. The other's
    ticks are enqueued and run, tick after tick; the refused one is logged and tried again."""
    relay = Relay(queue)
    relay.refused_tenant = "refused"
    ran: list[str] = []

    async def beat(job: Job) -> None:
        ran.append(job.item.item_id)

    worker = Worker(relay, handlers={"beat": beat}, clock=clock, **FAST)
    worker.every(60, task="beat", tenant="refused", name="a-refused")
    worker.every(60, task="beat", tenant="ops", name="b-good")
    async with worker:
        await until(lambda: len(ran) == 1)
        clock.advance(60)
        await until(lambda: len(ran) == 2)
    assert all(item_id.startswith("schedule:b-good:") for item_id in ran)
    refused = [r for r in caplog.records if "enqueueing scheduled items failed" in r.message]
    assert refused and all("'a-refused'" in r.message for r in refused)


async def test_a_schedule_payload_over_the_queues_limit_is_refused_at_registration(
    queue: BaseWorkQueue,
) -> None:
    """Every tick's item would be refused as too large: the schedule is refused when it is
    registered on a worker bound to the queue, naming the payload; nothing is registered."""

    async def beat(job: Job) -> None:
        pass

    worker = Worker(queue, handlers={"beat": beat}, **FAST)
    with pytest.raises(StatePersistenceError, match=r"^payload of schedule 'big'") as refused:
        worker.every(60, task="beat", tenant="ops", name="big", payload={"x": "y" * 300_000})
    assert refused.value.reason == "too_large"
    assert worker.schedules == ()


# -- 9. one cap on a retry's delay; fail's retryable is a bool -----------------------------


async def test_fail_refuses_a_retry_delay_over_thirty_days_as_retry_does(
    queue: BaseWorkQueue,
) -> None:
    """``fail(retry_in=40 days)`` is refused, naming ``retry_in``, as ``Retry(40 days)`` is;
    30 days is taken. The item is untouched by the refused call."""
    await put(queue, "x")
    lease = await queue.claim("w", lease_for=60)
    assert lease is not None
    with pytest.raises(ValueError, match=r"^retry_in: "):
        await queue.fail(lease, "boom", retry_in=timedelta(days=40))
    assert (await record(queue, "x")).status == ItemStatus.LEASED
    failed = await queue.fail(lease, "boom", retry_in=timedelta(days=30))
    assert failed.status == ItemStatus.QUEUED


@pytest.mark.parametrize("retryable", [None, 0, 1, "no", 1.0])
async def test_fail_refuses_a_retryable_that_is_not_a_bool(
    queue: BaseWorkQueue, retryable: object
) -> None:
    await put(queue, "x")
    lease = await queue.claim("w", lease_for=60)
    assert lease is not None
    with pytest.raises(TypeError, match=r"^retryable: must be a bool"):
        await queue.fail(lease, "boom", retryable=retryable)  # type: ignore[arg-type]
    item = await record(queue, "x")
    assert (item.status, item.last_error) == (ItemStatus.LEASED, None)
