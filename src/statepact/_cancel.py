"""What a cancellation may interrupt, and what it must not: the one helper for work that,
once started, has to finish.

A caller's ``CancelledError`` (``asyncio.wait_for``/``asyncio.timeout`` running
out, a ``TaskGroup`` cancelling its children) may arrive at any ``await``. Two
kinds of work must not be abandoned there: a round trip already sent to a server
(abandoning it leaves the driver to tear the connection down mid-reply, and a
write whose outcome nobody waited for may land after what the caller does next),
and a cleanup that releases something (a transaction's locks and snapshot).
:func:`finish` runs such work in a task of its own, which the caller's
cancellation does not reach; the caller waits for it and then gets its
``CancelledError`` back, never swallowed. See docs/transactions.md
("Cancellation").

This module must never swallow a ``CancelledError`` and never import a driver.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from functools import partial
from types import CoroutineType
from typing import Any, TypeVar

__all__ = ["finish"]

T = TypeVar("T")

# The tasks finish() is waiting for. Their caller's cancellation never reaches them, so a
# finish() called from inside one has nothing to guard against and awaits directly (one
# task per protected call, not one per layer that protects it).
_UNABANDONED: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()


async def finish(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile.

    ``work`` runs in a task of its own (or is that task, if it already is
    one). Uncancelled, this is ``await work``. Cancelled (once or several
    times), the caller keeps waiting until ``work`` has finished, then raises
    the first ``CancelledError``; what ``work`` returned or raised is dropped
    (the caller asked to stop). The wait is as long as ``work`` takes, so
    ``work`` must be bounded by its own timeouts (a socket timeout, the
    failover budget). Like SQLAlchemy's cleanup on exit and
    ``asyncio.Condition.wait``, a second cancellation does not cut the wait
    short: returning early would leave ``work`` running behind the caller's
    back, racing whatever it does next (the next statement of the same
    transaction, closing the pool). Only the task running ``work`` being
    cancelled itself (the event loop shutting down) ends it early.
    """
    loop = asyncio.get_running_loop()
    if asyncio.current_task(loop) in _UNABANDONED:
        return await work  # already out of reach of the caller's cancellation
    task = loop.create_task(work) if type(work) is CoroutineType else asyncio.ensure_future(work)
    _UNABANDONED.add(task)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        # The caller waits on a future of its own that the task's end resolves (what
        # asyncio.shield does, with less around it): cancelling the caller cancels only that.
        woken = loop.create_future()
        task.add_done_callback(partial(_wake, woken))
        try:
            await woken
        except asyncio.CancelledError as exc:
            # The caller was cancelled (while it waited, or as ``work`` ended): keep waiting
            # for ``work`` if it runs still; the cancellation is raised once it is done.
            cancelled = cancelled or exc
    if cancelled is None:
        return task.result()  # what ``work`` returned or raised (cancelled: the loop's end)
    # ``work`` is done and the caller was cancelled: what ``work`` raised is retrieved, so
    # that an error nobody waits for any more is not reported as unhandled, and dropped.
    if not task.cancelled():
        task.exception()
    raise cancelled


def _wake(woken: asyncio.Future[None], _task: asyncio.Future[Any]) -> None:
    if not woken.done():
        woken.set_result(None)
