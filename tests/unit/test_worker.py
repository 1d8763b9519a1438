"""The Worker on the memory backing, time driven by a ManualClock where it matters.

Routing, settling by outcome (ack, policy retry, ``Retry``, ``DoNotRetry``, the
dead letter for an unknown task), heartbeats, lease loss, shutdown (drain,
release after the grace period, cancellation), hooks, and what construction
and registration refuse. The same promises on Redis and PostgreSQL are in
tests/integration/test_worker_servers.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, Lease, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import DoNotRetry, Job, Retry, Worker, WorkerHooks

FAST = {"poll_interval": 0.01, "reap_every": 0}


class Recorder(WorkerHooks):
    """Every hook call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.leases: dict[str, list[Lease]] = {}

    def started(self, job: Job) -> None:
        self.calls.append(("started", job.item.item_id, job.lease.token))
        self.leases.setdefault(job.item.item_id, []).append(job.lease)

    def succeeded(self, job: Job, item: WorkItem) -> None:
        self.calls.append(("succeeded", item.item_id, job.lease.token))

    def failed(self, job: Job, item: WorkItem, error: str) -> None:
        self.calls.append(("failed", item.item_id, error))

    def lease_lost(self, job: Job, reason: str) -> None:
        self.calls.append(("lease_lost", job.item.item_id, reason))

    def released(self, job: Job, item: WorkItem) -> None:
        self.calls.append(("released", item.item_id, item.status))

    def kinds(self, item_id: str) -> list[str]:
        return [kind for kind, key, _ in self.calls if key == item_id]


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


@pytest.fixture
def queue(clock: ManualClock) -> MemoryWorkQueue:
    return MemoryWorkQueue(clock=clock, policy=QueuePolicy(max_attempts=3, jitter=0))


async def put(queue: MemoryWorkQueue, item_id: str, tenant: str = "t", **payload: Any) -> None:
    await queue.enqueue(WorkItem(tenant=tenant, item_id=item_id, payload=payload))


async def status(queue: MemoryWorkQueue, item_id: str, tenant: str = "t") -> WorkItem:
    item = await queue.get_item(tenant, item_id)
    assert item is not None
    return item


# -- routing and settling -----------------------------------------------------------------


async def test_handlers_are_routed_by_the_task_field_and_a_return_acks(
    queue: MemoryWorkQueue,
) -> None:
    """@worker.task and a mapping register by name; the payload's task field routes; return acks."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def echo(job: Job) -> None:
        seen.append(("echo", job.payload))

    worker = Worker(queue, handlers={"echo": echo}, **FAST)

    @worker.task("shout")
    async def shout(job: Job) -> str:
        seen.append(("shout", job.payload))
        return "done"

    @worker.set_default
    async def fallback(job: Job) -> None:
        seen.append(("default", job.payload))

    await put(queue, "a", task="echo", n=1)
    await put(queue, "b", task="shout", n=2)
    await put(queue, "c", n=3)
    async with worker:
        await until(lambda: len(seen) == 3)
        await until(lambda: worker.in_flight == 0)
    assert sorted(seen, key=lambda s: s[1]["n"]) == [
        ("echo", {"task": "echo", "n": 1}),
        ("shout", {"task": "shout", "n": 2}),
        ("default", {"n": 3}),
    ]
    for item_id in "abc":
        assert (await status(queue, item_id)).status == ItemStatus.DONE
    assert worker.tasks == ("echo", "shout")


async def test_the_task_field_is_configurable(queue: MemoryWorkQueue) -> None:
    """Worker(task_field=...) routes on that field instead of "task"."""
    ran: list[str] = []

    async def job_kind(job: Job) -> None:
        ran.append(job.task or "")

    worker = Worker(queue, handlers={"x": job_kind}, task_field="kind", **FAST)
    await put(queue, "a", kind="x", task="ignored")
    async with worker:
        await until(lambda: ran == ["x"])
    await until(lambda: worker.in_flight == 0)
    assert (await status(queue, "a")).status == ItemStatus.DONE


async def test_an_unknown_task_is_dead_lettered_at_once_with_its_name(
    queue: MemoryWorkQueue,
) -> None:
    """A payload naming no registered task is dead-lettered on its first try, naming the task."""
    hooks = Recorder()

    async def known(job: Job) -> None:
        pass

    worker = Worker(queue, handlers={"known": known}, hooks=hooks, **FAST)
    await put(queue, "a", task="summarize")
    await put(queue, "b", task=7)
    async with worker:
        await until(lambda: len(hooks.calls) == 2)
    for item_id, shown in (("a", "'summarize'"), ("b", "7")):
        item = await status(queue, item_id)
        assert item.status == ItemStatus.DEAD
        assert item.attempts == 1
        assert item.last_error is not None
        assert f"unknown task {shown}" in item.last_error
        assert "payload field 'task'" in item.last_error
        assert "tasks registered: known" in item.last_error
    assert [c[0] for c in hooks.calls] == ["failed", "failed"]


async def test_no_task_field_and_no_default_is_dead_lettered(queue: MemoryWorkQueue) -> None:
    """Without a default handler, an item with no task field is dead-lettered, saying so."""

    async def known(job: Job) -> None:
        pass

    worker = Worker(queue, handlers={"known": known}, **FAST)
    await put(queue, "a", n=1)
    async with worker:
        await until(lambda: queue_status_is(queue, "a", ItemStatus.DEAD))
    item = await status(queue, "a")
    assert item.last_error is not None and "no 'task' field" in item.last_error


async def queue_status_is(queue: MemoryWorkQueue, item_id: str, wanted: ItemStatus) -> bool:
    item = await queue.get_item("t", item_id)
    return item is not None and item.status == wanted


async def test_an_exception_fails_through_the_policy_then_dead_letters(
    queue: MemoryWorkQueue, clock: ManualClock
) -> None:
    """A raised exception is a retryable failure with the policy's backoff; past max_attempts,
    dead with the last error kept."""
    tries: list[int] = []

    async def flaky(job: Job) -> None:
        tries.append(job.attempts)
        raise RuntimeError(f"boom {job.attempts}")

    worker = Worker(queue, handlers={"flaky": flaky}, **FAST)
    await put(queue, "a", task="flaky")
    async with worker:
        await until(lambda: tries == [1])
        await until(lambda: queue_status_is(queue, "a", ItemStatus.QUEUED))
        item = await status(queue, "a")
        # backoff_base 1 s, jitter 0: due 1 s after the failure, and not before.
        assert item.available_at is not None
        assert (item.available_at - clock.now()).total_seconds() == pytest.approx(1.0)
        assert item.last_error == "RuntimeError: boom 1"
        await asyncio.sleep(0.05)
        assert tries == [1], "retried before its backoff ran out"
        clock.advance(1.0)
        await until(lambda: tries == [1, 2])
        clock.advance(2.0)
        await until(lambda: tries == [1, 2, 3])
        await until(lambda: queue_status_is(queue, "a", ItemStatus.DEAD))
    item = await status(queue, "a")
    assert item.last_error == "RuntimeError: boom 3"
    assert item.attempts == 3


async def test_retry_sets_the_delay_and_do_not_retry_dead_letters(
    queue: MemoryWorkQueue, clock: ManualClock
) -> None:
    """Retry(delay) makes the item due again in delay seconds; DoNotRetry dead-letters it now."""
    tries: list[str] = []

    async def later(job: Job) -> None:
        tries.append(job.item.item_id)
        if job.attempts == 1:
            raise Retry(30, "rate limited")

    async def never(job: Job) -> None:
        raise DoNotRetry("the document is gone")

    worker = Worker(queue, handlers={"later": later, "never": never}, **FAST)
    await put(queue, "a", task="later")
    await put(queue, "b", task="never")
    async with worker:
        await until(lambda: queue_status_is(queue, "b", ItemStatus.DEAD))
        await until(lambda: queue_status_is(queue, "a", ItemStatus.QUEUED))
        item = await status(queue, "a")
        assert item.available_at is not None
        assert (item.available_at - clock.now()).total_seconds() == pytest.approx(30.0)
        assert item.last_error == "Retry: retry in 30 s: rate limited"
        clock.advance(29.0)
        await asyncio.sleep(0.05)
        assert tries == ["a"]
        clock.advance(1.0)
        await until(lambda: queue_status_is(queue, "a", ItemStatus.DONE))
    dead = await status(queue, "b")
    assert dead.attempts == 1
    assert dead.last_error == "DoNotRetry: the document is gone"


async def test_a_handler_cancelled_by_itself_is_a_retryable_failure(
    queue: MemoryWorkQueue,
) -> None:
    """A handler that raises CancelledError of its own (not the worker's doing) fails the item,
    retryable; the worker goes on."""
    hooks = Recorder()

    async def quits(job: Job) -> None:
        raise asyncio.CancelledError

    worker = Worker(queue, handlers={"q": quits}, hooks=hooks, **FAST)
    await put(queue, "a", task="q")
    async with worker:
        await until(lambda: "failed" in hooks.kinds("a"))
    item = await status(queue, "a")
    assert (item.status, item.attempts) == (ItemStatus.QUEUED, 1)
    assert item.last_error == "CancelledError: the handler was cancelled"


def test_retry_refuses_a_bad_delay() -> None:
    """Retry(delay) takes 0 to 30 days of seconds, named in the error."""
    with pytest.raises(ValueError, match="delay"):
        Retry(-1)
    with pytest.raises(TypeError, match="delay"):
        Retry("5")  # type: ignore[arg-type]


# -- heartbeats and lease loss ------------------------------------------------------------


async def test_heartbeats_keep_the_lease_and_the_ack_uses_the_latest_token(
    queue: MemoryWorkQueue, clock: ManualClock
) -> None:
    """A handler running past several heartbeat intervals keeps its lease; the ack lands."""
    hooks = Recorder()
    tokens: list[int] = []
    release = asyncio.Event()

    async def slow(job: Job) -> None:
        tokens.append(job.lease.token)
        await release.wait()
        tokens.append(job.lease.token)

    worker = Worker(
        queue, handlers={"slow": slow}, lease_for=3, heartbeat_every=0.02, hooks=hooks, **FAST
    )
    await put(queue, "a", task="slow")
    async with worker:
        await until(lambda: len(tokens) == 1)
        for _ in range(4):  # 8 s of the clock's time: the lease lives only by its heartbeats
            clock.advance(2.0)
            await asyncio.sleep(0.06)
        release.set()
        await until(lambda: "succeeded" in hooks.kinds("a"))
    assert tokens[1] != tokens[0]
    assert (await status(queue, "a")).status == ItemStatus.DONE


async def test_a_lost_lease_cancels_the_handler_and_settles_nothing(
    queue: MemoryWorkQueue, clock: ManualClock
) -> None:
    """Past its expiry with no heartbeat in between, the handler is cancelled; another worker
    finishes the item; the first lease's ack is refused."""
    hooks_a, hooks_b = Recorder(), Recorder()
    cancelled = asyncio.Event()

    async def stuck(job: Job) -> None:
        if job.worker_id == "a":
            # Between two heartbeats the clock passes the lease's expiry: the heartbeats
            # were frozen, as a paused process's are.
            clock.advance(61)
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    a = Worker(
        queue,
        handlers={"stuck": stuck},
        worker_id="a",
        lease_for=60,
        heartbeat_every=0.05,
        hooks=hooks_a,
        **FAST,
    )
    await put(queue, "x", task="stuck")
    async with a:
        await until(lambda: "started" in hooks_a.kinds("x"))
        first = hooks_a.leases["x"][0]
        await until(cancelled.is_set)
        await until(lambda: a.in_flight == 0)
    # a is stopped first, so that b, not a, claims the item once it is reaped.
    assert [moved.item_id for moved in await queue.reap()] == ["x"]
    b = Worker(queue, handlers={"stuck": stuck}, worker_id="b", hooks=hooks_b, **FAST)
    async with b:
        await until(lambda: "succeeded" in hooks_b.kinds("x"))
    with pytest.raises(LeaseLostError):
        await queue.ack(first)
    assert hooks_a.kinds("x") == ["started", "lease_lost"]
    assert "lease expired" in hooks_a.calls[-1][2]
    item = await status(queue, "x")
    assert (item.status, item.attempts) == (ItemStatus.DONE, 2)


async def test_a_refused_heartbeat_cancels_the_handler(
    queue: MemoryWorkQueue, clock: ManualClock
) -> None:
    """A heartbeat raising LeaseLostError cancels the handler; nothing is settled by it."""
    hooks = Recorder()
    cancelled = asyncio.Event()

    async def stuck(job: Job) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    # The worker's own clock stands still: only the queue's refusal can tell it the lease moved.
    worker = Worker(
        queue,
        handlers={"stuck": stuck},
        lease_for=10,
        heartbeat_every=0.05,
        hooks=hooks,
        clock=ManualClock(clock.now()),
        **FAST,
    )
    await put(queue, "x", task="stuck")
    async with worker:
        await until(lambda: "started" in hooks.kinds("x"))
        clock.advance(11)
        await queue.reap()
        other = await queue.claim("other", lease_for=100)
        assert other is not None
        await until(cancelled.is_set)
        await until(lambda: worker.in_flight == 0)
    assert hooks.kinds("x") == ["started", "lease_lost"]
    assert "heartbeat refused" in hooks.calls[-1][2]
    item = await status(queue, "x")
    assert item.status == ItemStatus.LEASED  # still "other"'s: nothing of ours landed
    await queue.ack(other)


# -- shutdown -----------------------------------------------------------------------------


async def test_stop_lets_handlers_finish_within_the_grace_period(queue: MemoryWorkQueue) -> None:
    """stop() stops claiming and waits for in-flight handlers; they ack."""
    started = asyncio.Event()

    async def short(job: Job) -> None:
        started.set()
        await asyncio.sleep(0.1)

    worker = Worker(queue, handlers={"short": short}, concurrency=2, grace_period=5, **FAST)
    await put(queue, "a", task="short")
    await worker.start()
    await started.wait()
    await put(queue, "b", task="short")  # enqueued while draining: must stay queued
    await worker.stop()
    assert (await status(queue, "a")).status == ItemStatus.DONE
    b = await status(queue, "b")
    assert (b.status, b.attempts) in ((ItemStatus.QUEUED, 0), (ItemStatus.DONE, 1))
    assert (await queue.stats()).leased == 0


async def test_past_the_grace_period_handlers_are_cancelled_and_items_released(
    queue: MemoryWorkQueue,
) -> None:
    """After the grace period, what is left is cancelled and released: due now, nothing
    leased; the attempt of a handler that ran is kept (issue 33: an item that always hangs
    still reaches the dead letter), one never claimed has none."""
    hooks = Recorder()
    running = 0

    async def forever(job: Job) -> None:
        nonlocal running
        running += 1
        await asyncio.sleep(3600)

    worker = Worker(queue, handlers={"f": forever}, concurrency=3, hooks=hooks, **FAST)
    for n in range(5):
        await put(queue, f"i{n}", task="f")
    await worker.start()
    await until(lambda: running == 3)
    began = time.monotonic()
    await worker.stop(grace_period=0.2)
    assert 0.2 <= time.monotonic() - began < 2
    stats = await queue.stats()
    assert (stats.queued, stats.leased) == (5, 0)
    released = [c for c in hooks.calls if c[0] == "released"]
    assert len(released) == 3
    ran = {item_id for _, item_id, _ in released}
    for n in range(5):
        item = await status(queue, f"i{n}")
        kept = 1 if f"i{n}" in ran else 0
        assert (item.status, item.attempts) == (ItemStatus.QUEUED, kept)


async def test_cancelling_run_releases_what_is_in_flight(queue: MemoryWorkQueue) -> None:
    """A CancelledError reaching run() leaks no lease: the handlers go and items are released."""
    running = asyncio.Event()

    async def forever(job: Job) -> None:
        running.set()
        await asyncio.sleep(3600)

    worker = Worker(queue, handlers={"f": forever}, **FAST)
    await put(queue, "a", task="f")
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await running.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    item = await status(queue, "a")
    assert (item.status, item.attempts) == (ItemStatus.QUEUED, 1)  # released, the attempt kept


async def test_sigterm_drains_and_a_second_signal_ends_the_grace_period(
    queue: MemoryWorkQueue,
) -> None:
    """Under run(), SIGTERM stops claiming and waits; a second SIGTERM (or SIGINT) cancels what
    is left at once and releases it; run() returns."""
    running = asyncio.Event()

    async def forever(job: Job) -> None:
        running.set()
        await asyncio.sleep(3600)

    worker = Worker(queue, handlers={"f": forever}, grace_period=60, **FAST)
    await put(queue, "a", task="f")
    task = asyncio.create_task(worker.run())
    await running.wait()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(0.1)
    assert not task.done()  # draining: the grace period is 60 s
    assert (await status(queue, "a")).status == ItemStatus.LEASED
    began = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.wait_for(task, 5)
    assert time.monotonic() - began < 1
    item = await status(queue, "a")
    assert (item.status, item.attempts) == (ItemStatus.QUEUED, 1)  # released, the attempt kept


async def test_a_raising_hook_does_not_stop_the_worker(queue: MemoryWorkQueue) -> None:
    """A hook that raises is logged; the item is still acked."""

    class Broken(WorkerHooks):
        def started(self, job: Job) -> None:
            raise RuntimeError("hook bug")

    done = Recorder()

    async def fine(job: Job) -> None:
        pass

    worker = Worker(queue, handlers={"fine": fine}, hooks=[Broken(), done], **FAST)
    await put(queue, "a", task="fine")
    async with worker:
        await until(lambda: "succeeded" in done.kinds("a"))
    assert (await status(queue, "a")).status == ItemStatus.DONE


# -- fairness -----------------------------------------------------------------------------


async def test_fair_tenants_under_the_worker(queue: MemoryWorkQueue) -> None:
    """A 1,000 / B 10 / C 10 with concurrency 10: B and C finish within the first 60 starts."""
    starts: list[str] = []
    finished: dict[str, int] = {"B": 0, "C": 0}

    async def work(job: Job) -> None:
        starts.append(job.item.tenant)
        await asyncio.sleep(0)
        if job.item.tenant in finished:
            finished[job.item.tenant] += 1

    for n in range(1000):
        await put(queue, f"a{n}", tenant="A", task="w")
    for tenant in ("B", "C"):
        for n in range(10):
            await put(queue, f"{tenant}{n}", tenant=tenant, task="w")
    worker = Worker(queue, handlers={"w": work}, concurrency=10, **FAST)
    async with worker:
        await until(lambda: finished == {"B": 10, "C": 10})
    first = starts[:60]
    assert first.count("B") == 10 and first.count("C") == 10, first


# -- what is refused ----------------------------------------------------------------------


def test_handlers_must_be_coroutine_functions(queue: MemoryWorkQueue) -> None:
    """A plain function, a lambda or a non-callable is refused at registration, by task name."""
    worker = Worker(queue)

    def plain(job: Job) -> None:
        pass

    with pytest.raises(TypeError, match=r"task 'sync': must be a coroutine function.*plain"):
        worker.add_task("sync", plain)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="coroutine function"):
        Worker(queue, handlers={"x": lambda job: None})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="coroutine function"):
        worker.set_default("not a function")  # type: ignore[arg-type]
    assert worker.tasks == ()


def test_duplicate_names_and_a_second_default_are_refused(queue: MemoryWorkQueue) -> None:
    worker = Worker(queue)

    @worker.task("a")
    async def first(job: Job) -> None:
        pass

    with pytest.raises(ValueError, match="task 'a': a handler is already registered"):
        worker.add_task("a", first)
    with pytest.raises(ValueError, match="task name"):
        worker.add_task("", first)
    worker.set_default(first)
    with pytest.raises(ValueError, match="default handler: one is already registered"):
        worker.set_default(first)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"concurrency": 0}, ValueError, "concurrency: must be 1 or more, got 0"),
        ({"concurrency": -3}, ValueError, "concurrency"),
        ({"concurrency": True}, TypeError, "concurrency: must be an int"),
        ({"concurrency": 2.5}, TypeError, "concurrency: must be an int"),
        ({"lease_for": 0}, ValueError, "lease_for"),
        ({"lease_for": 6, "heartbeat_every": 6}, ValueError, "heartbeat_every.*not below"),
        ({"poll_interval": -1}, ValueError, "poll_interval"),
        ({"grace_period": float("nan")}, ValueError, "grace_period"),
        ({"task_field": ""}, ValueError, "task_field"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(
    queue: MemoryWorkQueue, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Worker(queue, **options)


async def test_no_queue_or_no_handlers_is_refused_at_start(queue: MemoryWorkQueue) -> None:
    async def h(job: Job) -> None:
        pass

    with pytest.raises(RuntimeError, match="no queue"):
        await Worker(handlers={"h": h}).start()
    with pytest.raises(RuntimeError, match="no handlers"):
        await Worker(queue).start()
    with pytest.raises(TypeError, match="queue: must be a WorkQueue"):
        Worker("redis://x")  # type: ignore[arg-type]
    worker = Worker(handlers={"h": h}).bind(queue)
    assert worker.queue is queue
    with pytest.raises(RuntimeError, match="already has a queue"):
        worker.bind(MemoryWorkQueue())


def test_the_module_exports_are_sorted_and_exist() -> None:
    import statepact.worker

    exported = statepact.worker.__all__
    assert list(exported) == sorted(exported)
    assert [name for name in exported if not hasattr(statepact.worker, name)] == []


class SlowAcks(MemoryWorkQueue):
    """A memory queue whose ack_many takes a moment, as a round trip would, and counts."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[int] = []

    async def ack_many(self, leases: Any) -> list[WorkItem | LeaseLostError]:
        self.batches.append(len(leases))
        await asyncio.sleep(0.02)
        return await super().ack_many(leases)


async def test_acks_arriving_while_one_is_sent_go_together_in_one_ack_many(
    clock: ManualClock,
) -> None:
    """Group commit: the acks waiting go at once in one ack_many; the acks of handlers
    finishing while it is in flight go in the next one, each fenced on its own token; all
    land."""
    queue = SlowAcks(clock=clock, policy=QueuePolicy(max_attempts=3, jitter=0))
    gate = asyncio.Event()

    async def work(job: Job) -> None:
        await gate.wait()

    worker = Worker(queue, handlers={"w": work}, concurrency=20, **FAST)
    for n in range(20):
        await put(queue, f"i{n:02d}", task="w")
    async with worker:
        await until(lambda: len(worker._running) == 20)
        gate.set()
        await until(lambda: sum(queue.batches) == 20)
    assert len(queue.batches) < 20
    assert max(queue.batches) > 1
    for n in range(20):
        assert (await status(queue, f"i{n:02d}")).status is ItemStatus.DONE


async def test_an_ack_in_flight_lands_when_run_is_cancelled(clock: ManualClock) -> None:
    """Cancelling run() while an ack_many is on its way cuts nothing off: the items are done,
    none is left leased or released."""
    queue = SlowAcks(clock=clock, policy=QueuePolicy(max_attempts=3, jitter=0))

    async def work(job: Job) -> None:
        return None

    worker = Worker(queue, handlers={"w": work}, concurrency=5, **FAST)
    for n in range(5):
        await put(queue, f"i{n}", task="w")
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await until(lambda: sum(queue.batches) == 5)  # every ack sent, the first still sleeping
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for n in range(5):
        assert (await status(queue, f"i{n}")).status is ItemStatus.DONE
    stats = await queue.stats()
    assert (stats.queued, stats.leased) == (0, 0)
