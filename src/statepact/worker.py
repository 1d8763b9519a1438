"""The ``Worker``: runs handlers for the items of any ``WorkQueue``, in the user's own process.

A worker claims items while it has free slots (``concurrency``), routes each to
the handler registered under the payload's task field, heartbeats the lease
every ``heartbeat_every`` seconds while the handler runs, and settles the item
by what the handler did: a return acks it, :class:`Retry` fails it to be tried
again in N seconds, :class:`DoNotRetry` dead-letters it, any other exception
fails it through the queue's ``QueuePolicy``. A lease lost on the way (a
heartbeat refused, or the lease's expiry passed on the worker's clock) cancels
the handler and settles nothing. ``stop()`` (or SIGTERM/SIGINT under ``run()``)
stops claiming, lets handlers finish within ``grace_period``, then cancels and
*releases* the rest. Schedules registered with :meth:`Worker.every` and
:meth:`Worker.cron` enqueue one item per tick, however many workers run them
(the item id names the schedule and the tick). Every queue call that must
finish (a claim whose leases the worker then owns, a heartbeat whose new token
it needs, a settle) runs through
:func:`statepact._cancel.finish`, so no cancellation leaks a lease.

See docs/worker.md. This module must never settle an item whose lease it lost,
never settle an item twice, and never read time except through the one clock
(lease expiry) and the event loop (sleeps and timeouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

from statepact._cancel import finish
from statepact._codec import plain_json, require_id
from statepact.clock import Clock, SystemClock, from_micros, read_clock, to_micros
from statepact.errors import LeaseLostError
from statepact.models import Lease, WorkItem
from statepact.queue import MAX_ERROR_CHARS, MAX_PRIORITY, WorkQueue, WorkWatch

__all__ = [
    "DEFAULT_TASK_FIELD",
    "DoNotRetry",
    "Handler",
    "Job",
    "Retry",
    "Schedule",
    "Worker",
    "WorkerHooks",
]

logger = logging.getLogger("statepact.worker")

# The most acks one of the worker's ack_many calls carries (the queue takes up to 1,000).
_ACK_BATCH = 200

# Steps of the event loop the claim loop lets pass after a slot is freed, so the other items
# ending at the same moment free theirs too and one claim_batch asks for all of them (an
# item goes from its handler's return to its ack in about four steps).
_GATHER_STEPS = 6

# The shortest idle sleep: a due time already past (a clock a little ahead of another's)
# is claimed again after this, not in a tight loop.
_MIN_IDLE = 0.005

#: The payload field naming an item's task, unless ``Worker(task_field=...)`` says otherwise.
DEFAULT_TASK_FIELD = "task"

#: The payload field a schedule's item carries its tick in (ISO 8601, UTC).
SCHEDULED_FOR_FIELD = "scheduled_for"

MAX_RETRY_DELAY = 30 * 86_400.0  # seconds; the same ceiling as QueuePolicy.backoff_cap


@dataclass
class Job:
    """What a handler is given: the claimed item and its current lease.

    ``lease`` is replaced by each heartbeat (the token changes), so a handler that
    fences its own writes on the lease reads ``job.lease.token`` when it writes.
    """

    lease: Lease
    task: str | None
    worker_id: str

    @property
    def item(self) -> WorkItem:
        return self.lease.item

    @property
    def payload(self) -> dict[str, Any]:
        return self.lease.item.payload

    @property
    def attempts(self) -> int:
        """Tries so far, this one included (an attempt is counted at claim)."""
        return self.lease.item.attempts


Handler: TypeAlias = Callable[[Job], Awaitable[object]]


class Retry(Exception):
    """Raised by a handler: fail this try and make the item due again in ``delay`` seconds.

    The attempt still counts: past ``QueuePolicy.max_attempts`` the item is
    dead-lettered as any failure is. Control flow, not an error, so it lives here
    and not in ``statepact.errors``.
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise TypeError(f"delay: must be a number of seconds, got {type(delay).__name__}")
        if not (math.isfinite(delay) and 0 <= delay <= MAX_RETRY_DELAY):
            raise ValueError(f"delay: must be between 0 and {MAX_RETRY_DELAY:g} s, got {delay}")
        self.delay = float(delay)
        self.reason = reason
        super().__init__(f"retry in {self.delay:g} s" + (f": {reason}" if reason else ""))


class DoNotRetry(Exception):
    """Raised by a handler: this item can never succeed; dead-letter it now with ``reason``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class WorkerHooks:
    """Observer of a worker; override what you need (every method here does nothing).

    Called synchronously on the worker's event loop, so a hook must be quick and
    must not block; an exception a hook raises is logged and otherwise ignored.
    ``started``: the handler is about to run. ``succeeded``: the ack landed.
    ``renewed``: a heartbeat landed (``job.lease`` holds the new token).
    ``failed``: the item was failed (``item.status`` says retried or dead).
    ``lease_lost``: the lease moved on; the handler was cancelled (or had
    finished) and nothing was settled. ``released``: given back at shutdown.
    """

    def started(self, job: Job) -> None:
        pass

    def renewed(self, job: Job) -> None:
        pass

    def succeeded(self, job: Job, item: WorkItem) -> None:
        pass

    def failed(self, job: Job, item: WorkItem, error: str) -> None:
        pass

    def lease_lost(self, job: Job, reason: str) -> None:
        pass

    def released(self, job: Job, item: WorkItem) -> None:
        pass


def _is_coroutine_function(handler: object) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 -- an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _check_handler(name: str, handler: object) -> Handler:
    if not callable(handler) or not _is_coroutine_function(handler):
        raise TypeError(
            f"handler for task {name!r}: must be a coroutine function (async def), got "
            f"{type(handler).__name__} {getattr(handler, '__name__', handler)!r}"
        )
    return handler


def _seconds(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "more than 0"
        raise ValueError(f"{name}: must be {bound} seconds, got {value}")
    return seconds


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


@dataclass(slots=True)
class _Running:
    """One item in flight: its job, the task running its handler, and why it may be cut short.

    The handler runs in the item's own task (no second task per item); the heartbeat is
    a timer beside it, which starts a task only when a beat is due.
    """

    job: Job
    task: asyncio.Task[None] | None = None
    # True while the handler runs in ``task``: only then does a cancellation reach it.
    in_handler: bool = False
    # Set once a settle (or the decision that the lease is lost) has begun: never a second one.
    settled: bool = False
    # Set when shutdown's grace ran out: the handler is cancelled and the item released.
    abandoned: bool = False
    # Why the lease was lost (a heartbeat refused, or the expiry passed): the handler is
    # cancelled and nothing is settled.
    lost: str | None = None
    # The next heartbeat's timer, and the heartbeat in flight.
    timer: asyncio.TimerHandle | None = None
    beat: asyncio.Task[None] | None = None
    # Set once cut() cancelled the handler (once at most).
    cut_sent: bool = False

    def cut(self, reason: str) -> None:
        """Cancel the handler, if it runs, for ``reason`` (the worker's own cancellation)."""
        if self.in_handler and not self.cut_sent and self.task is not None:
            self.cut_sent = True
            self.task.cancel(reason)


def _iso(moment: datetime) -> str:
    """A tick as text for item ids: ISO 8601 in UTC with ``Z``, microseconds only if any."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError as exc:
        raise ImportError("cron schedules need croniter: pip install 'statepact[cron]'") from exc
    return croniter


@dataclass(frozen=True)
class Schedule:
    """A periodic job: one item of ``task`` for ``tenant`` per tick; see :meth:`Worker.every`.

    Exactly one of ``interval`` (seconds; ticks at whole multiples of it since the
    Unix epoch) and ``cron`` (an expression, read by croniter, in UTC) is set. The
    item of the tick at ``t`` has id ``schedule:<name>:<t>`` (``t`` as
    :data:`SCHEDULED_FOR_FIELD` holds it), so every worker enqueueing the same tick
    stores one item.
    """

    name: str
    task: str
    tenant: str
    payload: Mapping[str, Any]
    interval: float | None = None
    cron: str | None = None
    catch_up: bool = True
    priority: int = 0

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        if self.interval is not None:
            step = _interval_micros(self.interval)
            micros = to_micros(now)
            return from_micros(micros - micros % step)
        assert self.cron is not None
        # croniter's get_prev is strictly before its start: start a microsecond later.
        start = now.astimezone(UTC) + timedelta(microseconds=1)
        tick: datetime = _croniter()(self.cron, start).get_prev(datetime)
        return tick.astimezone(UTC)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after``."""
        if self.interval is not None:
            step = _interval_micros(self.interval)
            return from_micros((to_micros(after) // step + 1) * step)
        assert self.cron is not None
        tick: datetime = _croniter()(self.cron, after.astimezone(UTC)).get_next(datetime)
        return tick.astimezone(UTC)

    def item_id(self, tick: datetime) -> str:
        return f"schedule:{self.name}:{_iso(tick)}"

    def item(self, tick: datetime, task_field: str) -> WorkItem:
        payload = {**self.payload, task_field: self.task, SCHEDULED_FOR_FIELD: _iso(tick)}
        return WorkItem(
            tenant=self.tenant, item_id=self.item_id(tick), payload=payload, priority=self.priority
        )


def _interval_micros(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


class Worker:
    """Runs registered handlers for a queue's items; see the module docstring and docs/worker.md.

    ``queue`` may be given later (:meth:`bind`), so a module can define a worker
    for ``statepact worker MODULE:OBJECT`` to bind to the queue it opens.
    """

    def __init__(
        self,
        queue: WorkQueue | None = None,
        *,
        concurrency: int = 10,
        lease_for: float | timedelta = 30.0,
        heartbeat_every: float | timedelta | None = None,
        poll_interval: float | timedelta = 1.0,
        reap_every: float | timedelta | None = None,
        grace_period: float | timedelta = 30.0,
        worker_id: str | None = None,
        task_field: str = DEFAULT_TASK_FIELD,
        handlers: Mapping[str, Handler] | None = None,
        default: Handler | None = None,
        hooks: WorkerHooks | Iterable[WorkerHooks] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.lease_for = _seconds("lease_for", lease_for)
        every = self.lease_for / 3 if heartbeat_every is None else heartbeat_every
        self.heartbeat_every = _seconds("heartbeat_every", every)
        if self.heartbeat_every >= self.lease_for:
            raise ValueError(
                f"heartbeat_every: {self.heartbeat_every:g} s is not below lease_for "
                f"{self.lease_for:g} s; a lease would lapse between heartbeats"
            )
        self.poll_interval = _seconds("poll_interval", poll_interval)
        # reap_every=0 turns the reaper off (another process reaps).
        reap = self.lease_for if reap_every is None else reap_every
        self.reap_every = _seconds("reap_every", reap, allow_zero=True)
        self.grace_period = _seconds("grace_period", grace_period, allow_zero=True)
        if not isinstance(task_field, str) or not task_field:
            raise ValueError(f"task_field: must be a non-empty str, got {task_field!r}")
        self.task_field = task_field
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        if not isinstance(self.worker_id, str):
            raise TypeError(f"worker_id: must be a str, got {type(self.worker_id).__name__}")
        self._handlers: dict[str, Handler] = {}
        self._default: Handler | None = None
        self._schedules: dict[str, Schedule] = {}
        for name, handler in (handlers or {}).items():
            self.add_task(name, handler)
        if default is not None:
            self.set_default(default)
        if hooks is None:
            self._hooks: list[WorkerHooks] = []
        elif isinstance(hooks, WorkerHooks):
            self._hooks = [hooks]
        else:
            self._hooks = list(hooks)
        self._clock_given = clock
        self._queue: WorkQueue | None = None
        if queue is not None:
            self.bind(queue)
        self._running: dict[tuple[str, str], _Running] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        # Jobs whose ack waits for the next ack_many, and the task sending them (None: idle).
        self._acks: list[Job] = []
        self._acker: asyncio.Task[None] | None = None
        self._watcher: WorkWatch | None = None
        self._started = False
        self._stopped = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    # -- configuration --------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"concurrency: must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"concurrency: must be 1 or more, got {value}")
        self._concurrency = value

    @property
    def queue(self) -> WorkQueue:
        if self._queue is None:
            raise RuntimeError("this Worker has no queue yet; pass one or call bind(queue)")
        return self._queue

    @property
    def clock(self) -> Clock:
        """The clock lease expiry is read on: the one given, else the queue's own."""
        if self._clock_given is not None:
            return self._clock_given
        queue_clock = getattr(self._queue, "clock", None)
        return queue_clock if isinstance(queue_clock, Clock) else SystemClock()

    def bind(self, queue: WorkQueue) -> Worker:
        """Give the worker its queue (once, before it starts); returns the worker."""
        if not isinstance(queue, WorkQueue):
            raise TypeError(f"queue: must be a WorkQueue, got {type(queue).__name__}")
        if self._queue is not None and self._queue is not queue:
            raise RuntimeError("this Worker already has a queue")
        self._queue = queue
        return self

    @property
    def tasks(self) -> tuple[str, ...]:
        """The registered task names, sorted."""
        return tuple(sorted(self._handlers))

    def add_task(self, name: str, handler: Handler) -> None:
        """Register ``handler`` for items whose payload names task ``name``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"task name: must be a non-empty str, got {name!r}")
        checked = _check_handler(name, handler)
        if name in self._handlers:
            raise ValueError(f"task {name!r}: a handler is already registered under this name")
        self._handlers[name] = checked

    def task(self, name: str) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`add_task`: ``@worker.task("summarise")``."""

        def register(handler: Handler) -> Handler:
            self.add_task(name, handler)
            return handler

        return register

    def set_default(self, handler: Handler) -> Handler:
        """The handler for items whose payload names no task (one allowed); a decorator too."""
        checked = _check_handler("(default)", handler)
        if self._default is not None:
            raise ValueError("default handler: one is already registered")
        self._default = checked
        return handler

    def add_hooks(self, hooks: WorkerHooks) -> None:
        self._hooks.append(hooks)

    # -- schedules --------------------------------------------------------------------------

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The registered schedules, by name."""
        return tuple(self._schedules[name] for name in sorted(self._schedules))

    def every(
        self,
        interval: float | timedelta,
        *,
        task: str,
        tenant: str,
        payload: Mapping[str, Any] | None = None,
        name: str | None = None,
        catch_up: bool = True,
        priority: int = 0,
    ) -> Schedule:
        """Enqueue one item of ``task`` every ``interval`` (ticks at multiples of it since the
        Unix epoch on the worker's clock); see docs/worker.md, "Periodic jobs"."""
        seconds = _seconds("interval", interval)
        return self._add_schedule(
            name=name,
            task=task,
            tenant=tenant,
            payload=payload,
            catch_up=catch_up,
            priority=priority,
            interval=seconds,
            cron=None,
        )

    def cron(
        self,
        expression: str,
        *,
        task: str,
        tenant: str,
        payload: Mapping[str, Any] | None = None,
        name: str | None = None,
        catch_up: bool = True,
        priority: int = 0,
    ) -> Schedule:
        """Enqueue one item of ``task`` per tick of the cron ``expression`` (read by croniter,
        in UTC; needs the ``cron`` extra); see docs/worker.md, "Periodic jobs"."""
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"cron: must be a non-empty cron expression, got {expression!r}")
        croniter = _croniter()
        try:
            croniter(expression, datetime(2026, 1, 1, tzinfo=UTC)).get_next(datetime)
        except (ValueError, KeyError, TypeError) as exc:  # croniter's errors are ValueErrors
            raise ValueError(f"cron: {expression!r} is not a valid cron expression: {exc}") from exc
        return self._add_schedule(
            name=name,
            task=task,
            tenant=tenant,
            payload=payload,
            catch_up=catch_up,
            priority=priority,
            interval=None,
            cron=expression,
        )

    def _add_schedule(
        self,
        *,
        name: str | None,
        task: str,
        tenant: str,
        payload: Mapping[str, Any] | None,
        catch_up: bool,
        priority: int,
        interval: float | None,
        cron: str | None,
    ) -> Schedule:
        if self._started:
            raise RuntimeError("schedules are registered before start(); this Worker has started")
        if not isinstance(task, str) or not task:
            raise ValueError(f"task: must be a non-empty str naming a task, got {task!r}")
        name = require_id("name", task if name is None else name)
        if ":" in name:
            raise ValueError(
                f"name: must not contain ':' (it is part of the item id), got {name!r}"
            )
        if name in self._schedules:
            raise ValueError(f"name: a schedule named {name!r} is already registered")
        tenant = require_id("tenant", tenant)
        plain, _ = plain_json("payload", {} if payload is None else payload)
        for reserved in (self.task_field, SCHEDULED_FOR_FIELD):
            if reserved in plain:
                raise ValueError(
                    f"payload: must not hold {reserved!r}; the schedule sets it on each item"
                )
        if not isinstance(catch_up, bool):
            raise TypeError(f"catch_up: must be a bool, got {type(catch_up).__name__}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority: must be an int, got {type(priority).__name__}")
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise ValueError(f"priority: must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
        schedule = Schedule(
            name=name,
            task=task,
            tenant=tenant,
            payload=plain,
            interval=interval,
            cron=cron,
            catch_up=catch_up,
            priority=priority,
        )
        self._schedules[name] = schedule
        return schedule

    def _check_schedules(self) -> None:
        for schedule in self._schedules.values():
            if schedule.task not in self._handlers:
                raise ValueError(
                    f"schedule {schedule.name!r}: task: {schedule.task!r} has no handler on this "
                    f"worker; tasks registered: {', '.join(self.tasks) or 'none'}"
                )

    async def _schedule_loop(self) -> None:
        """Enqueue each schedule's ticks as they come due on the worker's clock.

        Every worker runs this; a tick's item id is the same in each, so the queue
        stores one item per tick. After a gap (start, a stalled loop, a clock moved
        on) only the latest tick due is enqueued; the ones before it are skipped.
        Nothing here needs cleaning up: an enqueue cut short by a cancellation either
        landed or did not, and the next worker's enqueue of that tick is the same item.
        """
        clock = self.clock
        schedules = list(self._schedules.values())
        start = read_clock(clock)
        # The last tick handled per schedule; None: the latest due is enqueued (catch_up).
        last: dict[str, datetime | None] = {
            s.name: None if s.catch_up else s.latest_tick(start) for s in schedules
        }
        while not self._stopping.is_set():
            now = read_clock(clock)
            due: list[tuple[Schedule, datetime]] = []
            for schedule in schedules:
                tick = schedule.latest_tick(now)
                previous = last[schedule.name]
                if previous is None or tick > previous:
                    due.append((schedule, tick))
            failed = False
            if due:
                try:
                    await self.queue.enqueue_many([s.item(t, self.task_field) for s, t in due])
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Tried again after the poll interval, for the latest tick due by then.
                    logger.warning(
                        "worker %s: enqueueing scheduled items failed: %s",
                        self.worker_id,
                        _describe(exc),
                    )
                    failed = True
                else:
                    self._notify_work()
                    for schedule, tick in due:
                        self._log_skipped(schedule, last[schedule.name], tick)
                        last[schedule.name] = tick
            wait = self.poll_interval
            if not failed:
                upcoming = min(s.next_tick(last[s.name] or now) for s in schedules)
                # Re-read the clock at least every poll interval: it may be moved (a
                # ManualClock, a corrected wall clock) rather than run.
                until_next = (upcoming - read_clock(clock)).total_seconds()
                wait = min(max(until_next, 0.0), self.poll_interval)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), wait)
            else:
                await asyncio.sleep(0)

    def _log_skipped(self, schedule: Schedule, previous: datetime | None, tick: datetime) -> None:
        if previous is not None and schedule.next_tick(previous) < tick:
            logger.info(
                "worker %s: schedule %r skipped the ticks after %s before %s (one item for the "
                "latest, none for those missed)",
                self.worker_id,
                schedule.name,
                _iso(previous),
                _iso(tick),
            )

    # -- running --------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Items claimed and not yet settled by this worker: their handler runs, or a fail
        or release is on its way. An item counts no more once its ack is handed to the
        ack task (the ``succeeded`` hook says when the ack landed)."""
        return len(self._running)

    async def start(self) -> None:
        """Start claiming (and reaping) in background tasks; returns at once."""
        queue = self.queue
        if self._started:
            raise RuntimeError("this Worker was started already; a stopped one is not restarted")
        if not self._handlers and self._default is None:
            raise RuntimeError("this Worker has no handlers; register one with @worker.task")
        self._check_schedules()
        self._started = True
        logger.info(
            "worker %s starting on queue %r: concurrency %d, lease %g s, heartbeat every %g s",
            self.worker_id,
            queue.name,
            self._concurrency,
            self.lease_for,
            self.heartbeat_every,
        )
        self._loops.append(asyncio.create_task(self._claim_loop(), name="statepact-claim"))
        if self.reap_every > 0:
            self._loops.append(asyncio.create_task(self._reap_loop(), name="statepact-reap"))
        if self._schedules:
            self._loops.append(
                asyncio.create_task(self._schedule_loop(), name="statepact-schedules")
            )

    async def stop(self, grace_period: float | timedelta | None = None) -> None:
        """Stop claiming; wait up to the grace period for handlers, then cancel and release.

        Returns once nothing is leased by this worker any more (each item in flight
        was acked, failed, released, or its lease was found lost).
        """
        grace = (
            self.grace_period
            if grace_period is None
            else _seconds("grace_period", grace_period, allow_zero=True)
        )
        self._stopping.set()
        self._wake.set()
        self._slot_freed.set()
        try:
            # Not cut short by a cancellation: what is in flight is settled or released first.
            await finish(self._drain(grace))
        finally:
            self._stopped.set()
        logger.info("worker %s stopped", self.worker_id)

    async def _drain(self, grace: float) -> None:
        for loop in self._loops:
            await self._settled(loop)
        if self._running:
            logger.info(
                "worker %s stopping: %d in flight, grace %g s",
                self.worker_id,
                len(self._running),
                grace,
            )
            # Every handler done, the grace period over, or a second signal: whichever is first.
            # (Cancelling the wait below leaves the items' tasks running.)
            tasks = {r.task for r in self._running.values() if r.task is not None}
            everything: asyncio.Future[Any] = asyncio.ensure_future(asyncio.wait(tasks))
            hurry: asyncio.Future[Any] = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                {everything, hurry}, timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (everything, hurry):
                waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await everything
        for running in list(self._running.values()):
            running.abandoned = True
            running.cut("the grace period is over")
        for task in [r.task for r in self._running.values() if r.task is not None]:
            await self._settled(task)
        if self._acker is not None:
            await self._settled(self._acker)

    @staticmethod
    async def _settled(task: asyncio.Task[None]) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Start, then run until :meth:`stop` (SIGTERM or SIGINT, handled here) has finished."""
        await self.start()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    continue  # not the main thread, or a loop without signal support
                installed.append(sig)
        try:
            await self._stopped.wait()
        except asyncio.CancelledError:
            await finish(self.stop(0))
            raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping.is_set():
            logger.info("worker %s: %s again, cancelling what is left", self.worker_id, sig.name)
            self._hurry.set()
            return
        logger.info("worker %s: %s, draining", self.worker_id, sig.name)
        self._stop_task = asyncio.get_running_loop().create_task(self.stop(), name="statepact-stop")

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await finish(self.stop())

    # -- claiming ---------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        # The queue's wake-ups (LISTEN on PostgreSQL, a blocking pop on Redis) for as long
        # as this worker claims; on PostgreSQL that holds one connection of the pool.
        async with self.queue.watch() as watch:
            self._watcher = watch
            try:
                await self._claims()
            finally:
                self._watcher = None

    async def _claims(self) -> None:
        # Items asked for per claim_batch: doubled while every claim comes back full (a
        # backlog), back to what was found when one does not; never above the free slots.
        width = 1
        while not self._stopping.is_set():
            free = await self._more_free()
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            asked = min(free, width)
            # From here a _notify_work() counts: one made while this claim or the next_due
            # read is on its way (a schedule's tick, a reap) ends the wait below.
            self._wake.clear()
            try:
                leases = await self._claim_owned(asked)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("worker %s: claim failed: %s", self.worker_id, _describe(exc))
                width = 1
                await self._wait_for_work(self.poll_interval)
                continue
            for lease in leases:
                self._spawn(lease)
            width = min(self._concurrency, asked * 2) if len(leases) == asked else len(leases)
            if not leases:
                width = 1
                await self._wait_for_work(await self._idle_for())

    async def _more_free(self) -> int:
        """The free slots once the handlers finishing now have handed their items to the ack
        task: a slot freed wakes the claim loop at the first item, and the items that end in
        the same few steps of the event loop (a batch claimed together tends to end together)
        are claimed for in the same ``claim_batch`` instead of one claim each. Costs a few
        steps of the loop, no timer."""
        free = self._concurrency - self._busy()
        for _ in range(_GATHER_STEPS):
            # No item in flight: nothing is left to end (an ack in flight frees its slot
            # when it lands, which the claim loop does not wait for).
            if not self._running or self._stopping.is_set():
                break
            await asyncio.sleep(0)
            free = self._concurrency - self._busy()
        return free

    def _busy(self) -> int:
        """Slots taken: items in flight (an item whose ack was handed to the ack task is not),
        plus one for the ack task while it sends. So a worker claims again while its acks are on
        their way, and still holds at most one connection per slot."""
        return len(self._running) + (self._acker is not None)

    async def _claim(self, limit: int) -> list[Lease]:
        """The one claim seam: up to ``limit`` leases in one ``claim_batch`` (one round trip
        on every backing, in tenant rotation)."""
        return await self.queue.claim_batch(self.worker_id, lease_for=self.lease_for, limit=limit)

    async def _claim_owned(self, limit: int) -> list[Lease]:
        """:meth:`_claim`, and if a cancellation arrives meanwhile, release what it returns."""
        task = asyncio.ensure_future(self._claim(limit))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await finish(self._release_claimed(task))
            raise

    async def _release_claimed(self, task: asyncio.Future[list[Lease]]) -> None:
        with contextlib.suppress(Exception):
            for lease in await task:
                with contextlib.suppress(Exception):
                    await self.queue.release(lease)

    async def _idle_for(self) -> float:
        """How long an idle claimer sleeps: until the next delayed item comes due, at most
        the poll interval (which bounds a wake-up that is lost or a due time missed)."""
        try:
            due = await self.queue.next_due()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("worker %s: next_due failed: %s", self.worker_id, _describe(exc))
            return self.poll_interval
        if due is None:
            return self.poll_interval
        until = (due - read_clock(self.clock)).total_seconds()
        return min(self.poll_interval, max(until, _MIN_IDLE))

    async def _wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait up to ``timeout`` s for work to be worth claiming again: cut short by the
        queue's wake-ups (LISTEN/NOTIFY, a blocking Redis pop), :meth:`stop` and
        :meth:`_notify_work` (since the claim before it began: :meth:`_claims` clears it)."""
        if self._stopping.is_set():
            return
        watcher = self._watcher
        if watcher is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            return
        # Whichever is first: the queue says work arrived, stop()/a reap, or the timeout.
        arrived = asyncio.ensure_future(watcher.wait(timeout))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({arrived, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (arrived, woken):
                waiter.cancel()
            await asyncio.wait({arrived, woken})
            failed = None if arrived.cancelled() else arrived.exception()
            if failed is not None:
                logger.warning(
                    "worker %s: waiting for work failed: %s", self.worker_id, _describe(failed)
                )

    def _notify_work(self) -> None:
        """Something may be due now: end a :meth:`_wait_for_work` early."""
        self._wake.set()

    def _spawn(self, lease: Lease) -> None:
        item = lease.item
        task_name = item.payload.get(self.task_field)
        job = Job(
            lease=lease,
            task=task_name if isinstance(task_name, str) else None,
            worker_id=self.worker_id,
        )
        running = _Running(job)
        key = (item.tenant, item.item_id)
        self._running[key] = running
        running.task = asyncio.create_task(
            self._supervise(running), name=f"statepact-item-{item.item_id}"
        )

    # -- one item ---------------------------------------------------------------------------

    def _route(self, job: Job) -> Handler | str:
        """The handler for ``job``, or why there is none (the item is dead-lettered)."""
        raw = job.payload.get(self.task_field)
        if raw is None:
            if self._default is not None:
                return self._default
            return (
                f"payload has no {self.task_field!r} field and this worker has no default "
                f"handler; tasks registered: {', '.join(self.tasks) or 'none'}"
            )
        handler = self._handlers.get(raw) if isinstance(raw, str) else None
        if handler is not None:
            return handler
        return (
            f"unknown task {raw!r} (payload field {self.task_field!r}); "
            f"tasks registered: {', '.join(self.tasks) or 'none'}"
        )

    async def _supervise(self, running: _Running) -> None:
        job = running.job
        try:
            route = self._route(job)
            if isinstance(route, str):
                running.settled = True
                logger.error(
                    "worker %s: item %r dead-lettered: %s", self.worker_id, job.item.item_id, route
                )
                await finish(self._fail(job, route, retryable=False))
                return
            self._hook("started", job)
            outcome = await self._run_handler(running, route)
            if running.lost is not None:
                running.settled = True
                self._lost(job, running.lost)
                return
            await self._settle(running, outcome)
        except asyncio.CancelledError:
            # Cancelled from outside (the loop shutting down, run() cancelled): the handler is
            # gone with it, the item is given back; finish() keeps the release from being cut.
            if not running.settled:
                running.settled = True
                await finish(self._release(job))
            raise
        except Exception as exc:  # a bug here must not leave the slot taken
            logger.exception(
                "worker %s: supervising item %r failed: %s", self.worker_id, job.item.item_id, exc
            )
        finally:
            self._running.pop((job.item.tenant, job.item.item_id), None)
            self._slot_freed.set()

    async def _run_handler(self, running: _Running, handler: Handler) -> BaseException | None:
        """Run ``handler`` in this task, heartbeating beside it; what it raised, or ``None``.

        A cancellation of the worker's own (:meth:`_Running.cut`: the lease lost, the
        grace over) is answered as the ``CancelledError`` the handler raised, as is one the
        handler raised of itself; any other (this task cancelled from outside) propagates.
        A heartbeat in flight when the handler ends is waited for: the settle needs its
        token, or learns from it that the lease was lost.
        """
        task = running.task
        assert task is not None
        loop = asyncio.get_running_loop()
        running.timer = loop.call_later(self.heartbeat_every, self._beat_due, running)
        running.in_handler = True
        try:
            await handler(running.job)
        except asyncio.CancelledError as exc:
            if task.cancelling() > running.cut_sent:
                raise  # from outside
            return exc
        except Exception as exc:
            return exc
        finally:
            running.in_handler = False
            if running.cut_sent:
                task.uncancel()  # the worker's own cancellation, answered here
            if running.timer is not None:
                running.timer.cancel()
                running.timer = None
            if running.beat is not None:
                await finish(running.beat)
        return None

    def _beat_due(self, running: _Running) -> None:
        """The heartbeat timer: a beat (in a task of its own) while the handler runs."""
        running.timer = None
        if running.in_handler and running.beat is None:
            running.beat = asyncio.get_running_loop().create_task(
                self._heartbeat(running), name=f"statepact-beat-{running.job.item.item_id}"
            )

    async def _heartbeat(self, running: _Running) -> None:
        """One heartbeat (or the finding that the lease expired); a lost lease cuts the
        handler short. The next beat is due ``heartbeat_every`` after this one ends."""
        job = running.job
        try:
            lost = self._expired(job.lease)
            if lost is None:
                try:
                    await finish(self._beat(job))
                except LeaseLostError as exc:
                    lost = f"heartbeat refused: {exc}"
                except Exception as exc:
                    # The server may be back before the lease runs out; the expiry check decides.
                    logger.warning(
                        "worker %s: heartbeat of item %r failed: %s",
                        self.worker_id,
                        job.item.item_id,
                        _describe(exc),
                    )
                else:
                    self._hook("renewed", job)
            if lost is not None:
                running.lost = lost
                running.cut("the lease was lost")
            elif running.in_handler:
                running.timer = asyncio.get_running_loop().call_later(
                    self.heartbeat_every, self._beat_due, running
                )
        finally:
            running.beat = None

    def _expired(self, lease: Lease) -> str | None:
        now = read_clock(self.clock)
        if now >= lease.expires_at:
            return f"lease expired at {lease.expires_at.isoformat()} (now {now.isoformat()})"
        return None

    async def _beat(self, job: Job) -> None:
        # Runs to its end under finish(): the new token is kept even if the caller is cancelled.
        job.lease = await self.queue.heartbeat(job.lease)

    async def _settle(self, running: _Running, exc: BaseException | None) -> None:
        """Settle by what the handler did: ``exc`` is what it raised (``None``: it returned)."""
        job = running.job
        running.settled = True
        # A fail or release, once sent, runs to its end (finish); an ack is sent by the ack
        # task, apart from this one, so a cancellation here cannot cut it off either.
        if exc is None:
            self._ack(job)
        elif isinstance(exc, asyncio.CancelledError):
            if running.abandoned:
                await finish(self._release(job))
            else:
                await finish(
                    self._fail(job, "CancelledError: the handler was cancelled", retryable=True)
                )
        elif isinstance(exc, Retry):
            await finish(self._fail(job, _describe(exc), retryable=True, delay=exc.delay))
        elif isinstance(exc, DoNotRetry):
            await finish(self._fail(job, _describe(exc), retryable=False))
        else:
            logger.warning(
                "worker %s: task %r of item %r raised %s",
                self.worker_id,
                job.task,
                job.item.item_id,
                _describe(exc),
                exc_info=exc,
            )
            await finish(self._fail(job, _describe(exc), retryable=True))

    def _ack(self, job: Job) -> None:
        """Hand ``job``'s ack to the next ``ack_many``: group commit, with no timer.

        The ack task (:meth:`_send_acks`, started by the first ack to arrive while
        none runs) sends what is waiting at once; acks arriving meanwhile wait for
        it and go together in the next ``ack_many``, each fenced on its own token.
        So an idle worker acks with no delay, and a busy one sends one round trip
        (one commit on PostgreSQL) per batch instead of one per item. The item's own
        task ends here: the ack task reports the answer (``succeeded``, or the lease
        lost), and nothing can cancel an ack once handed over but the loop going away.
        """
        self._acks.append(job)
        if self._acker is None:
            self._acker = asyncio.create_task(self._send_acks(), name="statepact-acks")

    async def _send_acks(self) -> None:
        """Send the waiting acks, up to ``_ACK_BATCH`` per ``ack_many``, until none are left."""
        try:
            while self._acks:
                batch, self._acks = self._acks[:_ACK_BATCH], self._acks[_ACK_BATCH:]
                try:
                    answers = await self.queue.ack_many([job.lease for job in batch])
                except Exception as exc:
                    # Nothing is known to have landed: each lease lapses and is reaped.
                    logger.warning(
                        "worker %s: ack of %d item(s) failed: %s",
                        self.worker_id,
                        len(batch),
                        _describe(exc),
                    )
                    continue
                for job, answer in zip(batch, answers, strict=True):
                    if isinstance(answer, LeaseLostError):
                        self._lost(job, f"ack refused: {answer}")
                    else:
                        self._hook("succeeded", job, answer)
        finally:
            self._acker = None
            self._slot_freed.set()

    async def _fail(
        self, job: Job, error: str, *, retryable: bool, delay: float | None = None
    ) -> None:
        try:
            item = await self.queue.fail(job.lease, error, retryable=retryable, retry_in=delay)
        except LeaseLostError as exc:
            self._lost(job, f"fail refused: {exc}")
            return
        self._hook("failed", job, item, error)

    async def _release(self, job: Job) -> None:
        try:
            item = await self.queue.release(job.lease)
        except LeaseLostError as exc:
            self._lost(job, f"release refused: {exc}")
            return
        except Exception as exc:
            # The lease lapses by itself and the reaper brings the item back.
            logger.warning(
                "worker %s: release of item %r failed: %s",
                self.worker_id,
                job.item.item_id,
                _describe(exc),
            )
            return
        self._hook("released", job, item)

    def _lost(self, job: Job, reason: str) -> None:
        logger.warning(
            "worker %s: lease of item %r lost: %s", self.worker_id, job.item.item_id, reason
        )
        self._hook("lease_lost", job, reason)

    def _hook(self, name: str, *args: Any) -> None:
        for hooks in self._hooks:
            try:
                getattr(hooks, name)(*args)
            except Exception:
                logger.exception(
                    "worker %s: hook %s.%s raised", self.worker_id, type(hooks).__name__, name
                )

    # -- reaping ----------------------------------------------------------------------------

    async def _reap_loop(self) -> None:
        """``reap`` every ``reap_every`` s; each reap is atomic, so every worker may run one."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.reap_every)
            if self._stopping.is_set():
                return
            try:
                moved = await finish(self.queue.reap())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("worker %s: reap failed: %s", self.worker_id, _describe(exc))
                continue
            if moved:
                logger.info("worker %s: reaped %d expired lease(s)", self.worker_id, len(moved))
                self._notify_work()
