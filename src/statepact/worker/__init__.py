"""The ``Worker``: runs handlers for the items of any ``WorkQueue``, in the user's own process.

A worker claims items while it has free slots (``concurrency``), routes each to
the handler registered under the payload's task field, heartbeats the lease
every ``heartbeat_every`` seconds while the handler runs, and settles the item
by what the handler did: a return acks it, :class:`Retry` fails it to be tried
again in N seconds, :class:`Snooze` puts it back for N seconds with the attempt
given back, :class:`DoNotRetry` dead-letters it, any other exception
fails it through the queue's ``QueuePolicy``. A lease lost on the way (a
heartbeat refused, or the lease's expiry passed on the worker's clock) cancels
the handler and settles nothing. ``stop()`` (or SIGTERM/SIGINT under ``run()``)
stops claiming, lets handlers finish within ``grace_period``, then cancels and
*releases* the rest. Schedules registered with :meth:`Worker.every` and
:meth:`Worker.cron` enqueue one item per tick, however many workers run them.

The package is laid out by role (docs/worker.md, "The parts"): ``_worker`` (the
face: settings, registry, lifecycle), ``_claimer`` (free slots, wake-ups),
``_executor`` (one per claimed lease: handler, heartbeat, the settle decided),
``_completer`` (the settle calls: acks batched), ``_schedules``,
``_maintenance`` (the reaper), ``_hooks``, ``_registry``, ``_job`` and
``_runtime`` (the one object the parts share). This package must never settle
an item whose lease it lost, never settle a lease twice, and never read time
except through the one clock (lease expiry) and the event loop.
"""

from __future__ import annotations

from statepact._limits import MAX_RETRY_DELAY  # noqa: F401 -- importable here as it was
from statepact.worker._hooks import WorkerHooks
from statepact.worker._job import DoNotRetry, Handler, Job, Retry, Snooze
from statepact.worker._schedules import SCHEDULED_FOR_FIELD, Schedule  # noqa: F401
from statepact.worker._worker import DEFAULT_TASK_FIELD, Worker

__all__ = [
    "DEFAULT_TASK_FIELD",
    "DoNotRetry",
    "Handler",
    "Job",
    "Retry",
    "Schedule",
    "Snooze",
    "Worker",
    "WorkerHooks",
]
