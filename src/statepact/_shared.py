"""Concurrent calls of one kind share round trips: group commit, no timer.

A call made while none of its kind is on its way is sent at once, on its own,
exactly as without this module. Calls made while one is on its way wait for it,
then go together in one batch (one script on Redis, one statement and one
commit on PostgreSQL), sent by a task of their own in the order they were made;
each caller gets its own answer back. Two calls with the same key never share
a batch (the second waits for the next one), and a batch holds at most
``max_items`` calls and ``max_bytes`` of payload. So under load the round trips
are shared, and a lone caller pays nothing: nothing ever waits on a timer (after a
batch, the sending task lets the event loop run a few steps, no more, so that its
callers' next calls join the next batch).

A caller cancelled while its call still waits is taken out (nothing was sent);
once its batch is sent it waits for the answer, then gets its
``CancelledError`` (as :func:`statepact._cancel.finish` does). An error of the
batch as a whole is every caller's error.

Used by the queues' single enqueues (``statepact.queue``) and PostgreSQL's run
writes (``statepact.storage.postgres.state``). This module must never hold a
call back when nothing of its kind is on its way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from statepact._cancel import finish

__all__ = ["SharedRoundTrips"]

# Event loop steps the sender waits, after a batch, for its callers' next calls: an answer
# reaches its caller two steps after it is set (the future, then the shield around it).
_SETTLE_STEPS = 3

W = TypeVar("W")
R = TypeVar("R")


@dataclass(slots=True)
class _Waiting(Generic[W, R]):
    """One call waiting for the next shared round trip, and where its answer goes."""

    work: W
    key: Hashable
    size: int
    answer: asyncio.Future[R]


class SharedRoundTrips(Generic[W, R]):
    """Calls of one kind (``work``, each a ``W``) sent alone or together, see the module.

    ``one(work)`` sends one call; ``many(works)`` sends several in one round trip and
    answers each, in order. ``key(work)`` is what two calls of one batch must not
    share; ``size(work)`` counts toward ``max_bytes``. ``name`` names the sending task.
    """

    __slots__ = (
        "_busy",
        "_flusher",
        "_key",
        "_many",
        "_max_bytes",
        "_max_items",
        "_name",
        "_one",
        "_size",
        "_waiting",
    )

    def __init__(
        self,
        one: Callable[[W], Awaitable[R]],
        many: Callable[[list[W]], Awaitable[list[R]]],
        *,
        key: Callable[[W], Hashable],
        size: Callable[[W], int],
        max_items: int,
        max_bytes: int,
        name: str,
    ) -> None:
        self._one = one
        self._many = many
        self._key = key
        self._size = size
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._name = name
        self._waiting: list[_Waiting[W, R]] = []
        self._busy = False  # a call (alone, or a batch) is on its way
        self._flusher: asyncio.Task[None] | None = None

    async def send(self, work: W) -> R:
        """Send ``work`` now if nothing of its kind is on its way, else with the next batch."""
        if not self._busy:
            self._busy = True
            try:
                return await self._one(work)
            finally:
                self._busy = False
                self._start()
        loop = asyncio.get_running_loop()
        waiting = _Waiting(work, self._key(work), self._size(work), loop.create_future())
        self._waiting.append(waiting)
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

    def _start(self) -> None:
        if self._waiting and not self._busy:
            self._busy = True
            self._flusher = asyncio.get_running_loop().create_task(self._flush(), name=self._name)

    def _next_batch(self) -> list[_Waiting[W, R]]:
        batch: list[_Waiting[W, R]] = []
        keys: set[Hashable] = set()
        later: list[_Waiting[W, R]] = []
        size = 0
        for waiting in self._waiting:
            full = len(batch) >= self._max_items or size + waiting.size > self._max_bytes
            if full or waiting.key in keys:
                later.append(waiting)
                continue
            keys.add(waiting.key)
            size += waiting.size
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

    async def _flush(self) -> None:
        batch: list[_Waiting[W, R]] = []
        try:
            while await self._more():
                batch = self._next_batch()
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
            self._busy = False
            self._flusher = None
            # Only a BaseException (the loop going away) leaves a caller unanswered.
            for waiting in batch:
                if not waiting.answer.done():
                    waiting.answer.cancel()
