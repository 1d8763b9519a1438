"""What a handler sees and raises: :class:`Job`, :class:`Retry`, :class:`Snooze`,
:class:`DoNotRetry`.

A ``Job`` is one claimed lease as the handler sees it (with the application
context and ``complete_in``, which the executor provides); ``Retry``,
``Snooze`` and ``DoNotRetry`` are control flow a handler uses to tell the worker
how to settle the item (so they live here, not in ``statepact.errors``). See
docs/worker.md, "Handlers and routing" and "What settles an item". This module
must never touch the queue.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeAlias

from statepact._codec import require_seconds
from statepact._limits import MAX_RETRY_DELAY
from statepact.models import Lease, WorkItem
from statepact.queue import MAX_ERROR_CHARS

__all__ = ["DoNotRetry", "Handler", "Job", "Retry", "Snooze", "check_handler", "describe"]


@dataclass
class Job:
    """What a handler is given: the claimed item and its current lease.

    ``lease`` is replaced by each heartbeat (the token changes), so a handler that
    fences its own writes on the lease reads ``job.lease.token`` when it writes.
    ``context`` is what the worker's ``startup`` returned (``None`` without one).
    """

    lease: Lease
    task: str | None
    worker_id: str
    context: Any = None
    # Set by the executor running this job: what complete_in() calls.
    _complete: Callable[[object], Awaitable[WorkItem]] | None = field(
        default=None, repr=False, compare=False
    )

    async def complete_in(self, session: object) -> WorkItem:
        """Make this item's ack part of the caller's open transaction (PostgreSQL only).

        ``session`` is an SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` inside a
        transaction the handler began. The fenced ack runs in it; when that transaction
        commits, the item is done with the handler's rows, and the worker sends no ack
        of its own (the ``succeeded`` hook fires after the commit). Rolled back, the
        item stays leased and the worker settles it as if the handler had raised.
        Returns the item as the ack wrote it (``done``, not yet committed). Raises
        ``LeaseLostError`` (the lease moved on: roll back), ``TypeError`` on a queue
        that cannot join an SQL transaction (Redis, memory) or a session of another
        kind, ``RuntimeError`` when called twice in one transaction or outside a
        worker's handler. See docs/worker.md, "Completing in your transaction".
        """
        if self._complete is None:
            raise RuntimeError(
                "job.complete_in: this Job is not running in a Worker's handler; only the "
                "handler a Worker called can complete its item in a transaction"
            )
        return await self._complete(session)

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

    ``delay`` is seconds or a ``timedelta``, 0 to ``MAX_RETRY_DELAY`` (30 days), the
    same bound ``WorkQueue.fail(retry_in=)`` keeps. The attempt still counts: past
    ``QueuePolicy.max_attempts`` the item is dead-lettered as any failure is.
    """

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        self.delay = require_seconds("delay", delay, allow_zero=True, most=MAX_RETRY_DELAY)
        self.reason = reason
        super().__init__(f"retry in {self.delay:g} s" + (f": {reason}" if reason else ""))


class Snooze(Exception):
    """Raised by a handler: put the item back, due again in ``seconds``, the attempt given back.

    ``seconds`` is seconds or a ``timedelta``, 0 to ``MAX_RETRY_DELAY`` (30 days). Unlike
    :class:`Retry` this is no failure: ``attempts`` is as it was before the claim and
    ``last_error`` is untouched, so an item may snooze any number of times. Fenced as
    every settle (a lease lost meanwhile snoozes nothing).
    """

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = require_seconds("seconds", seconds, allow_zero=True, most=MAX_RETRY_DELAY)
        super().__init__(f"snooze {self.seconds:g} s")


class DoNotRetry(Exception):
    """Raised by a handler: this item can never succeed; dead-letter it now with ``reason``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def is_coroutine_function(function: object) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 -- an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def check_handler(name: str, handler: object) -> Handler:
    """``handler`` if it is a coroutine function; a ``TypeError`` naming the task if not."""
    if not callable(handler) or not is_coroutine_function(handler):
        raise TypeError(
            f"handler for task {name!r}: must be a coroutine function (async def), got "
            f"{type(handler).__name__} {getattr(handler, '__name__', handler)!r}"
        )
    return handler


def describe(exc: BaseException) -> str:
    """``Type: message`` (the type alone when there is no message), cut to what ``fail`` keeps."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR_CHARS]
