"""The ``Worker`` itself: its settings, task registry, schedules and hooks, and its lifecycle.

This is the face of the package: it checks every setting when the worker is
built (refusing, naming the field, what the queue would refuse later), registers
handlers, schedules and hooks, and on ``start()`` builds the one
:class:`~statepact.worker._runtime.Runtime` its parts share: the claimer, one
executor per claimed lease, the completer, the schedule loop and the maintenance
services. ``stop()`` ends the loops, gives the handlers the grace period, cuts
and releases the rest, and returns once this worker holds no lease. See
docs/worker.md. This module must never call the queue but through its parts
(``bind`` reads only the queue's type and limits).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from statepact._cancel import finish
from statepact._codec import require_id, require_seconds
from statepact.clock import Clock, SystemClock
from statepact.models import Lease
from statepact.queue import BaseWorkQueue, QueuePolicy, WorkQueue
from statepact.worker._claimer import Claimer
from statepact.worker._completer import Completer
from statepact.worker._executor import Executor
from statepact.worker._hooks import HookSet, WorkerHooks
from statepact.worker._job import Handler
from statepact.worker._lifespan import Lifespan, Shutdown, Startup
from statepact.worker._maintenance import Maintenance, services
from statepact.worker._policy import PolicyMismatchError, require_policy, settle_policy
from statepact.worker._registry import Tasks
from statepact.worker._runtime import Runtime, Settings, require_concurrency, require_timeout
from statepact.worker._schedules import Schedule, ScheduleLoop, Schedules

__all__ = ["DEFAULT_TASK_FIELD", "Worker"]

logger = logging.getLogger("statepact.worker")

#: The payload field naming an item's task, unless ``Worker(task_field=...)`` says otherwise.
DEFAULT_TASK_FIELD = "task"


def _value_limit(queue: WorkQueue | None) -> int | None:
    """The largest payload ``queue`` stores, when it is one of statepact's (the ``WorkQueue``
    protocol does not say); ``None`` for another implementation, or no queue yet."""
    return queue._max_value_bytes if isinstance(queue, BaseWorkQueue) else None


class Worker:
    """Runs registered handlers for a queue's items; see the package docstring and docs/worker.md.

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
        policy: QueuePolicy | None = None,
        startup: Startup | None = None,
        shutdown: Shutdown | None = None,
        timeout: float | timedelta | None = None,
        prune_every: float | timedelta = 60.0,
    ) -> None:
        self._policy = require_policy(policy)
        self._lifespan = Lifespan(startup, shutdown)
        self._settings = Settings.read(
            concurrency=concurrency,
            lease_for=lease_for,
            heartbeat_every=heartbeat_every,
            poll_interval=poll_interval,
            reap_every=reap_every,
            grace_period=grace_period,
            timeout=timeout,
            prune_every=prune_every,
        )
        self.worker_id = require_id("worker_id", worker_id or f"worker-{uuid.uuid4().hex[:12]}")
        self._tasks = Tasks(task_field)
        self._schedules = Schedules(task_field)
        for name, handler in (handlers or {}).items():
            self.add_task(name, handler)
        if default is not None:
            self.set_default(default)
        self._hooks = HookSet(self.worker_id, hooks)
        self._clock_given = clock
        self._queue: WorkQueue | None = None
        if queue is not None:
            self.bind(queue)
        # Set by start(): what the parts share, and the tasks running the loops.
        self._rt: Runtime | None = None
        self._completer: Completer | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._presence: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    # -- settings -----------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self._settings.concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        self._settings.concurrency = require_concurrency(value)

    @property
    def grace_period(self) -> float:
        return self._settings.grace_period

    @grace_period.setter
    def grace_period(self, value: float | timedelta) -> None:
        self._settings.grace_period = require_seconds("grace_period", value, allow_zero=True)

    @property
    def lease_for(self) -> float:
        return self._settings.lease_for

    @property
    def heartbeat_every(self) -> float:
        return self._settings.heartbeat_every

    @property
    def timeout(self) -> float | None:
        """The handlers' default deadline in seconds (``None``: none)."""
        return self._settings.timeout

    @property
    def prune_every(self) -> float:
        return self._settings.prune_every

    @property
    def poll_interval(self) -> float:
        return self._settings.poll_interval

    @property
    def reap_every(self) -> float:
        return self._settings.reap_every

    @property
    def task_field(self) -> str:
        return self._tasks.field

    @property
    def policy(self) -> QueuePolicy | None:
        """The retry policy this worker asks its queue to run with (``Worker(policy=)``), or
        ``None``: the queue's own. ``statepact worker`` opens the queue with it (its options
        override it field by field: :func:`~statepact.worker._policy.settle_policy`)."""
        return self._policy

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

    def _settled(self, policy: QueuePolicy) -> None:
        """``statepact worker`` settled the policy (its options over this worker's): run
        with that one. Only before a queue is bound."""
        if self._queue is not None:
            raise RuntimeError("this Worker already has a queue")
        self._policy = policy

    def bind(self, queue: WorkQueue) -> Worker:
        """Give the worker its queue (once, before it starts); returns the worker."""
        if not isinstance(queue, WorkQueue):
            raise TypeError(f"queue: must be a WorkQueue, got {type(queue).__name__}")
        if self._queue is not None and self._queue is not queue:
            raise RuntimeError("this Worker already has a queue")
        runs = getattr(queue, "policy", None)
        if self._policy is not None and isinstance(runs, QueuePolicy):
            wanted = settle_policy({}, self._policy, runs)
            if wanted != runs:
                # The queue applies its policy in every fail and reap; a worker cannot
                # change it after the queue was opened, so a different one is refused.
                raise PolicyMismatchError(wanted, runs)
        self._queue = queue
        return self

    # -- tasks, hooks, schedules ------------------------------------------------------------

    @property
    def tasks(self) -> tuple[str, ...]:
        """The registered task names, sorted."""
        return self._tasks.names

    def add_task(
        self, name: str, handler: Handler, *, timeout: float | timedelta | None = None
    ) -> None:
        """Register ``handler`` for items whose payload names task ``name``; ``timeout``
        (seconds) bounds each run of it, unless the item sets its own."""
        self._tasks.add(name, handler, require_timeout(f"task {name!r}: timeout", timeout))

    def task(
        self, name: str, *, timeout: float | timedelta | None = None
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`add_task`: ``@worker.task("summarise", timeout=30)``."""
        checked = require_timeout(f"task {name!r}: timeout", timeout)

        def register(handler: Handler) -> Handler:
            self.add_task(name, handler, timeout=checked)
            return handler

        return register

    def set_default(self, handler: Handler) -> Handler:
        """The handler for items whose payload names no task (one allowed); a decorator too."""
        self._tasks.set_default(handler)
        return handler

    def add_hooks(self, hooks: WorkerHooks) -> None:
        """Add an observer; an ``async def`` hook is refused (``TypeError`` naming it)."""
        self._hooks.add(hooks)

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The registered schedules, by name."""
        return self._schedules.all

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
        seconds = Schedules.interval(interval)
        self._before_start()
        return self._schedules.add(
            name=name,
            task=task,
            tenant=tenant,
            payload=payload,
            catch_up=catch_up,
            priority=priority,
            interval=seconds,
            cron=None,
            value_limit=_value_limit(self._queue),
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
        checked = Schedules.cron(expression)
        self._before_start()
        return self._schedules.add(
            name=name,
            task=task,
            tenant=tenant,
            payload=payload,
            catch_up=catch_up,
            priority=priority,
            interval=None,
            cron=checked,
            value_limit=_value_limit(self._queue),
        )

    def _before_start(self) -> None:
        if self._rt is not None:
            raise RuntimeError("schedules are registered before start(); this Worker has started")

    # -- running --------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Leases claimed and not yet settled by this worker: their handler runs, or a fail
        or release is on its way. A lease counts no more once its ack is handed to the
        completer (the ``succeeded`` hook says when the ack landed)."""
        return 0 if self._rt is None else len(self._rt.running)

    @property
    def _running(self) -> set[Executor]:
        """The executors in flight (tests read it)."""
        return set() if self._rt is None else self._rt.running

    async def start(self) -> None:
        """Start claiming (and reaping, and enqueueing ticks) in background tasks; returns at
        once."""
        queue = self.queue
        if self._rt is not None:
            raise RuntimeError("this Worker was started already; a stopped one is not restarted")
        if not self._tasks:
            raise RuntimeError("this Worker has no handlers; register one with @worker.task")
        self._schedules.check(self._tasks.names, _value_limit(queue))
        rt = Runtime(queue, self.worker_id, self._settings, self.clock, self._hooks)
        # The application context first: nothing is claimed before it is open. Anything
        # after it failing to start closes it again.
        rt.context = await self._lifespan.open()
        try:
            self._begin(rt)
        except BaseException:
            await finish(self._lifespan.close(self.worker_id))
            raise

    def _begin(self, rt: Runtime) -> None:
        """Start the loops of a started worker, sharing ``rt``."""
        queue = rt.queue
        self._rt = rt
        completer = self._completer = Completer(rt)
        route = self._tasks.route
        worker_id = self.worker_id

        tasks = self._tasks
        default_timeout = rt.settings.timeout

        def spawn(lease: Lease) -> None:
            job, handler = route(lease, worker_id)
            Executor(rt, completer, job, handler, tasks.timeout(job, default_timeout)).start()

        logger.info(
            "worker %s starting on queue %r: concurrency %d, lease %g s, heartbeat every %g s",
            worker_id,
            queue.name,
            rt.settings.concurrency,
            rt.settings.lease_for,
            rt.settings.heartbeat_every,
            extra=rt.fields(),
        )
        loops = [asyncio.create_task(Claimer(rt, spawn).run(), name="statepact-claim")]
        loops += Maintenance(rt, services(rt)).start()
        if self._schedules:
            loop = ScheduleLoop(rt, self._schedules.all, self._tasks.field)
            loops.append(asyncio.create_task(loop.run(), name="statepact-schedules"))
        for task in loops:
            task.add_done_callback(self._loop_ended)
        self._loops.extend(loops)
        self._presence = self._announce()

    def _announce(self) -> asyncio.Task[None] | None:
        """Announce this worker in the registry beside its queue (the dashboard's workers
        page) until it stops; a beat that fails is logged, never stops the worker. A queue
        of a kind with no registry (an application's own) is not announced."""
        from statepact.dashboard.workers import start_presence

        try:
            return start_presence(
                self.queue,
                self.worker_id,
                concurrency=self._settings.concurrency,
                in_flight=lambda: self.in_flight,
                hooks=self._hooks,
            )
        except (TypeError, ValueError) as exc:
            logger.info("worker %s: not announced to a registry: %s", self.worker_id, exc)
            return None

    async def _withdraw(self) -> None:
        """End the announcement: its task takes the entry away as it ends."""
        presence, self._presence = self._presence, None
        if presence is not None:
            presence.cancel()
            await asyncio.wait({presence})

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A loop ends at stop(); one that ended on an error (a bug) is logged at once."""
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error(
                "worker %s: %s ended: %s",
                self.worker_id,
                task.get_name(),
                error,
                exc_info=error,
                extra={"worker_id": self.worker_id},
            )

    async def stop(self, grace_period: float | timedelta | None = None) -> None:
        """Stop claiming; wait up to the grace period for handlers, then cancel and release.

        Returns once nothing is leased by this worker any more (each lease in flight
        was acked, failed, released, or found lost).
        """
        grace = (
            self._settings.grace_period
            if grace_period is None
            else require_seconds("grace_period", grace_period, allow_zero=True)
        )
        rt = self._rt
        try:
            if rt is not None:
                rt.stopping.set()
                rt.work.set()
                rt.slot_freed.set()
                # Not cut short by a cancellation: what is in flight is settled or released.
                await finish(self._drain(rt, grace))
        finally:
            try:
                await finish(self._withdraw())
                await finish(self._lifespan.close(self.worker_id))
            finally:
                self._stopped.set()
        logger.info("worker %s stopped", self.worker_id, extra={"worker_id": self.worker_id})

    async def _drain(self, rt: Runtime, grace: float) -> None:
        if self._loops:
            await asyncio.wait(self._loops)  # each ends soon after stopping is set
        if rt.running:
            logger.info(
                "worker %s stopping: %d in flight, grace %g s",
                self.worker_id,
                len(rt.running),
                grace,
                extra=rt.fields(),
            )
            # Every handler done, the grace period over, or a second signal: whichever is
            # first. (Cancelling the wait below leaves the items' tasks running.)
            everything = asyncio.ensure_future(asyncio.wait(_tasks_of(rt)))
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                {everything, hurry}, timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (everything, hurry):
                waiter.cancel()
            await asyncio.wait({everything, hurry})
        for executor in list(rt.running):
            executor.abandon()
        while rt.running:
            await asyncio.wait(_tasks_of(rt))
        if self._completer is not None:
            await self._completer.flush()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Start, then run until :meth:`stop` (SIGTERM or SIGINT, handled here) has finished."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        # Handled from before the start: a signal that arrives while the worker starts (its
        # context opening, say) is kept and acted on once it has, never a default-action kill.
        early: list[signal.Signals] = []

        def on_signal(sig: signal.Signals) -> None:
            if self._rt is None:
                early.append(sig)
            else:
                self._on_signal(sig)

        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, on_signal, sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    continue  # not the main thread, or a loop without signal support
                installed.append(sig)
        try:
            await self.start()
        except BaseException:
            for sig in installed:
                loop.remove_signal_handler(sig)
            raise
        for sig in early:
            self._on_signal(sig)
        try:
            await self._stopped.wait()
        except asyncio.CancelledError:
            await finish(self.stop(0))
            raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop_task is not None or (self._rt is not None and self._rt.stopping.is_set()):
            logger.info(
                "worker %s: %s again, cancelling what is left",
                self.worker_id,
                sig.name,
                extra={"worker_id": self.worker_id},
            )
            self._hurry.set()
            return
        logger.info(
            "worker %s: %s, draining", self.worker_id, sig.name, extra={"worker_id": self.worker_id}
        )
        self._stop_task = asyncio.get_running_loop().create_task(self.stop(), name="statepact-stop")

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await finish(self.stop())


def _tasks_of(rt: Runtime) -> set[asyncio.Task[None]]:
    return {executor.task for executor in rt.running if executor.task is not None}
