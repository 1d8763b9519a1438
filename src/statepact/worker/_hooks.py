"""The worker's observers: :class:`WorkerHooks` and the one place they are called from.

Hooks are called synchronously on the worker's event loop, in registration
order, each one's exception logged and ignored. An ``async def`` hook is refused
when it is added (a ``TypeError`` naming the class and the hook): awaiting it
would put the observer on the path of every item, and starting it unawaited
would run it nowhere. See docs/worker.md, "Hooks". This module must never touch
the queue.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from typing import Any

from statepact.models import WorkItem
from statepact.worker._job import Job, is_coroutine_function

__all__ = ["HOOK_NAMES", "HookSet", "WorkerHooks"]

logger = logging.getLogger("statepact.worker")


class WorkerHooks:
    """Observer of a worker; override what you need (every method here does nothing).

    Called synchronously on the worker's event loop, so a hook must be quick and
    must not block; an exception a hook raises is logged and otherwise ignored;
    an ``async def`` hook is refused when the hooks are added.
    ``started``: the handler is about to run. ``succeeded``: the ack landed.
    ``renewed``: a heartbeat landed (``job.lease`` holds the new token).
    ``failed``: the item was failed (``item.status`` says retried or dead).
    ``lease_lost``: the lease moved on; the handler was cancelled (or had
    finished) and nothing was settled. ``released``: given back at shutdown, or
    snoozed (``item.available_at`` says when it is due). ``cancelled``: an operator
    cancelled the item (``queue.cancel``); the handler was cancelled and nothing
    was settled.
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

    def cancelled(self, job: Job, reason: str) -> None:
        pass


HOOK_NAMES = (
    "started",
    "renewed",
    "succeeded",
    "failed",
    "lease_lost",
    "released",
    "cancelled",
)


class HookSet:
    """The hooks of one worker, checked when added and called by name."""

    __slots__ = ("_hooks", "_worker_id")

    def __init__(self, worker_id: str, hooks: WorkerHooks | Iterable[WorkerHooks] | None) -> None:
        self._worker_id = worker_id
        self._hooks: list[WorkerHooks] = []
        if hooks is None:
            return
        for each in [hooks] if isinstance(hooks, WorkerHooks) else list(hooks):
            self.add(each)

    def add(self, hooks: WorkerHooks) -> None:
        """Add ``hooks``; refuse what is not a ``WorkerHooks`` or overrides a hook with an
        ``async def`` (or an async generator), naming it, before anything is added."""
        if not isinstance(hooks, WorkerHooks):
            raise TypeError(f"hooks: must be a WorkerHooks, got {type(hooks).__name__}")
        for name in HOOK_NAMES:
            method = getattr(hooks, name)
            if is_coroutine_function(method) or inspect.isasyncgenfunction(method):
                raise TypeError(
                    f"hooks: {type(hooks).__name__}.{name} is async; hooks are called "
                    "synchronously on the worker's loop and never awaited. Make it a plain "
                    "def (start a task from it if it must await)"
                )
        self._hooks.append(hooks)

    def call(self, name: str, *args: Any) -> None:
        """Call hook ``name`` on each set of hooks; log what one raises and go on."""
        for hooks in self._hooks:
            try:
                result = getattr(hooks, name)(*args)
            except Exception:
                logger.exception(
                    "worker %s: hook %s.%s raised",
                    self._worker_id,
                    type(hooks).__name__,
                    name,
                    extra={"worker_id": self._worker_id},
                )
                continue
            if result is not None and inspect.isawaitable(result):
                # A plain def that returned an awaitable: it is not run (nothing awaits hooks),
                # and closing it keeps "never awaited" out of the log.
                close = getattr(result, "close", None)
                if close is not None:
                    close()
                logger.error(
                    "worker %s: hook %s.%s returned an awaitable, which was not run; hooks are "
                    "synchronous",
                    self._worker_id,
                    type(hooks).__name__,
                    name,
                    extra={"worker_id": self._worker_id},
                )
