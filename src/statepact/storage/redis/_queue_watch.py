"""The Redis queue's watches: wake-ups (a blocking pop on ``Q wake``) and control notices
(a pub/sub subscription to ``Q ctl``), for ``RedisWorkQueue.watch``.

This module must never build a key (the queue passes them in) and never let a
redis-py exception out of a wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import RedisError

from statepact._cancel import finish
from statepact.queue import OnCancel
from statepact.storage.redis._client import as_text
from statepact.storage.redis._keys import parse_ref

__all__ = ["ControlListener", "RedisWatch"]

_log = logging.getLogger("statepact.queue")


class RedisWatch:
    """Blocks on the queue's wake list (BLPOP): each item made ready wakes one watcher.

    A block never outlasts the client's socket timeout (redis-py would take the
    silence for a dead server): a longer wait is several blocks. An error (the
    server away) is waited out for the rest of the timeout, as a lost wake-up is.
    """

    __slots__ = ("_key", "_longest", "_redis")

    def __init__(self, redis: Any, key: str, socket_timeout: float | None) -> None:
        self._redis = redis
        self._key = key
        self._longest = None if socket_timeout is None else max(0.05, socket_timeout - 0.5)

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            block = left if self._longest is None else min(left, self._longest)
            try:
                # BLPOP's timeout 0 means forever: never send less than 1 ms.
                popped = await self._redis.blpop([self._key], timeout=max(block, 0.001))
            except RedisError:
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                return False
            if popped is not None:
                return True


class ControlListener:
    """Calls ``on_cancel(tenant, item_id, token)`` for each control notice of the queue.

    A task of its own reads the queue's control channel (``QueueKeys.control``,
    published by cancel.lua) on a pub/sub connection of its own; on a
    RESP2 client that is one more connection per watch with ``on_cancel``. A lost
    connection is subscribed again after a pause; a notice published meanwhile is
    missed, and the worker learns of the cancel at its next heartbeat (the
    fallback). A callback that raises is logged and the listener goes on.
    """

    __slots__ = ("_channel", "_on_cancel", "_read_for", "_redis", "_task")

    def __init__(
        self,
        redis: Any,
        channel: str,
        socket_timeout: float | None,
        on_cancel: OnCancel,
    ) -> None:
        self._redis = redis
        self._channel = channel
        self._on_cancel = on_cancel
        self._read_for = (
            1.0 if socket_timeout is None else max(0.05, min(1.0, socket_timeout - 0.5))
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe, and return once the server confirmed it (a cancel after this is heard)."""
        pubsub = await self._subscribe()
        self._task = asyncio.get_running_loop().create_task(
            self._listen(pubsub), name="statepact-queue-control"
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _subscribe(self) -> Any:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self._channel.encode("utf-8"))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10 * self._read_for
            while loop.time() < deadline:
                message = await pubsub.get_message(timeout=self._read_for)
                if message is not None and as_text(message["type"]) == "subscribe":
                    return pubsub
            raise RedisError("no confirmation of SUBSCRIBE")
        except BaseException:
            await finish(pubsub.aclose())
            raise

    async def _listen(self, pubsub: Any) -> None:
        try:
            while True:
                try:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=self._read_for
                    )
                except RedisError:
                    await finish(pubsub.aclose())
                    pubsub = await self._resubscribe()
                    continue
                if message is not None and as_text(message["type"]) == "message":
                    self._deliver(message["data"])
        finally:
            await finish(pubsub.aclose())

    async def _resubscribe(self) -> Any:
        pause = 0.1
        while True:
            await asyncio.sleep(pause)
            try:
                return await self._subscribe()
            except RedisError:
                pause = min(2.0, pause * 2)

    def _deliver(self, data: Any) -> None:
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        token, _, reference = raw.partition(b":")
        try:
            tenant, item_id = parse_ref(reference)
            self._on_cancel(tenant, item_id, int(token))
        except Exception:
            _log.exception("queue control notice %r: on_cancel failed", raw[:200])
