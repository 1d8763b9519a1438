"""Concurrent calls of one kind share round trips: group commit, no timer.

A call made while none of its kind is on its way is sent at once, on its own,
exactly as without this module. Calls made while one is on its way wait for it,
then go together in one batch (one script on Redis, one statement and one
commit on PostgreSQL), sent by a task of their own in the order they were made;
each caller gets its own answer back. Two calls sharing a key never share a
batch (the second waits for the next one), and a batch holds at most
``max_items`` calls and ``max_bytes`` of payload. So under load the round trips
are shared, and a lone caller pays nothing: nothing ever waits on a timer (after a
batch, the sending task lets the event loop run a few steps, no more, so that its
callers' next calls join the next batch).

A call in flight never holds the others back for long: when the one they wait
for has been on its way for ``PATIENCE`` (a lock wait on the server, a slow
network), the waiting calls are sent without it, and the late one answers its
own caller whenever it ends. So a write stalled on a row lock that another
session holds delays the others of its process by ``PATIENCE`` at most, once,
not until the lock is released. (A batch already sent is one statement: the
PostgreSQL backings give it a ``lock_timeout`` and send its calls again one by
one if it runs out.)

A call may be answered without being sent at all: ``refused(work)``, when given, is
asked for each waiting call as a batch is formed, and an answer (or an error) it
returns is that call's answer at once (``PostgresBackend`` refuses there the commits that a commit
of its own, just landed, dooms: on a hot key, all but one of the commits waiting
behind it, answered together instead of one per batch).

A caller cancelled while its call still waits is taken out (nothing was sent);
once its batch is sent it waits for the answer, then gets its
``CancelledError`` (as :func:`statepact._cancel.finish` does). An error of the
batch as a whole is every caller's error.

Used by the queues' single enqueues (``statepact.queue``), PostgreSQL's run
writes (``statepact.storage.postgres.state``) and ``PostgresBackend``'s
transactions' first reads and commits. This module must never hold a call back
when nothing of its kind is on its way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from statepact._cancel import finish

__all__ = ["PATIENCE", "SharedRoundTrips"]

# Event loop steps the sender waits, after a batch, for its callers' next calls: an answer
# reaches its caller two steps after it is set (the future, then the shield around it).
_SETTLE_STEPS = 3

#: Seconds waiting calls wait for the send on its way before they are sent without it.
PATIENCE = 0.05

W = TypeVar("W")
R = TypeVar("R")


@dataclass(slots=True)
class _Waiting(Generic[W, R]):
    """One call waiting for the next shared round trip, and where its answer goes."""

    work: W
    keys: Collection[Hashable]
    answer: asyncio.Future[R]


class SharedRoundTrips(Generic[W, R]):
    """Calls of one kind (``work``, each a ``W``) sent alone or together, see the module.

    ``one(work)`` sends one call; ``many(works)`` sends several in one round trip and
    answers each, in order. ``keys(work)`` are what two calls of one batch must not
    share (none: any calls may go together); ``size(work)`` counts toward
    ``max_bytes`` (asked only of a call about to join a batch). ``refused(work)``, if
    given, answers a waiting call without sending it: the answer or error it returns
    (``None``: send it). ``name`` names the sending task.
    """

    __slots__ = (
        "_flushers",
        "_keys",
        "_many",
        "_max_bytes",
        "_max_items",
        "_name",
        "_one",
        "_overdue",
        "_patience",
        "_refused",
        "_sender",
        "_size",
        "_waiting",
    )

    def __init__(
        self,
        one: Callable[[W], Awaitable[R]],
        many: Callable[[list[W]], Awaitable[list[R]]],
        *,
        keys: Callable[[W], Collection[Hashable]],
        size: Callable[[W], int],
        max_items: int,
        max_bytes: int,
        name: str,
        patience: float = PATIENCE,
        refused: Callable[[W], R | BaseException | None] | None = None,
    ) -> None:
        self._one = one
        self._many = many
        self._keys = keys
        self._size = size
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._name = name
        self._patience = patience
        self._refused = refused
        self._waiting: list[_Waiting[W, R]] = []
        # The send the waiting calls wait for (a call alone, or the task sending batches),
        # None when none is on its way; the timer that stops them waiting for it.
        self._sender: object | None = None
        self._overdue: asyncio.TimerHandle | None = None
        self._flushers: set[asyncio.Task[None]] = set()

    async def send(self, work: W) -> R:
        """Send ``work`` now if nothing of its kind is on its way, else with the next batch."""
        if self._sender is None:
            sender = self._sender = object()
            try:
                return await self._one(work)
            finally:
                self._done(sender)
        loop = asyncio.get_running_loop()
        waiting = _Waiting(work, self._keys(work), loop.create_future())
        self._waiting.append(waiting)
        if self._overdue is None:
            self._overdue = loop.call_later(self._patience, self._take_over, self._sender)
        try:
            return await asyncio.shield(waiting.answer)
        except asyncio.CancelledError:
            if waiting in self._waiting:
                self._waiting.remove(waiting)  # not sent: nothing to wait for
                raise
            if waiting.answer.done():
                raise
            await finish(waiting.answer)  # sent: wait for its answer, then be cancelled
            raise

    def _done(self, sender: object) -> None:
        """``sender`` ended: if the waiting calls were waiting for it, send them."""
        if self._sender is sender:
            self._sender = None
            self._rearm(None)
            self._start()

    def _rearm(self, sender: object | None) -> None:
        """Stop the patience timer; with ``sender``, start it again for the calls that wait
        for that sender's next send."""
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None
        if sender is not None and self._waiting:
            self._overdue = asyncio.get_running_loop().call_later(
                self._patience, self._take_over, sender
            )

    def _take_over(self, sender: object | None) -> None:
        """The send the waiting calls wait for is overdue: send them without it."""
        self._overdue = None
        if self._sender is sender and self._waiting:
            self._sender = None
            self._start()

    def _start(self) -> None:
        if self._waiting and self._sender is None:
            sender = self._sender = object()
            task = asyncio.get_running_loop().create_task(self._flush(sender), name=self._name)
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)

    def _next_batch(self) -> list[_Waiting[W, R]]:
        batch: list[_Waiting[W, R]] = []
        taken: set[Hashable] = set()
        later: list[_Waiting[W, R]] = []
        size = 0
        refused = self._refused
        for waiting in self._waiting:
            if refused is not None:
                answer = refused(waiting.work)
                if answer is not None:
                    if waiting.answer.done():
                        pass
                    elif isinstance(answer, BaseException):
                        waiting.answer.set_exception(answer)  # answered here, never sent
                    else:
                        waiting.answer.set_result(answer)
                    continue
            if len(batch) >= self._max_items or not taken.isdisjoint(waiting.keys):
                later.append(waiting)
                continue
            grown = size + self._size(waiting.work)
            if grown > self._max_bytes and batch:
                later.append(waiting)
                continue
            taken.update(waiting.keys)
            size = grown
            batch.append(waiting)
        self._waiting = later
        return batch

    async def _more(self) -> bool:
        """Whether calls wait for the next batch, after letting the callers just answered
        call again: a caller in a loop makes its next call within a few steps of the event
        loop, and joins the next batch instead of the first of them going alone (which
        would cost a round trip, and a commit, of its own every other batch)."""
        for _ in range(_SETTLE_STEPS):
            if self._waiting:
                break
            await asyncio.sleep(0)
        return bool(self._waiting)

    async def _flush(self, sender: object) -> None:
        batch: list[_Waiting[W, R]] = []
        try:
            # Until the calls stop coming, or another sender took over (this one overdue).
            while await self._more() and self._sender is sender:
                batch = self._next_batch()
                if not batch:
                    continue  # every waiting call was refused without a send
                self._rearm(sender)
                try:
                    if len(batch) == 1:
                        answers = [await self._one(batch[0].work)]
                    else:
                        answers = await self._many([waiting.work for waiting in batch])
                except Exception as exc:
                    for waiting in batch:
                        waiting.answer.set_exception(exc)
                else:
                    for waiting, answer in zip(batch, answers, strict=True):
                        waiting.answer.set_result(answer)
                batch = []
        finally:
            self._done(sender)
            # Only a BaseException (the loop going away) leaves a caller unanswered.
            for waiting in batch:
                if not waiting.answer.done():
                    waiting.answer.cancel()
