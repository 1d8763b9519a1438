"""``ListenWatch``: a queue's wake-ups and control notices over PostgreSQL LISTEN/NOTIFY.

One connection of the engine, held while watching, listens on the queue's channel
(enqueues, re-queues, resume) and, when the watcher asks for cancel notices, on its
control channel (``<channel>_ctl``: a JSON ``{"tenant", "item_id", "token"}`` per
cancelled leased item). It must never run a statement of its own on that connection
and never raise from a notification callback: a notice it cannot read is dropped (the
worker's next heartbeat is the fallback).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statepact._cancel import finish
from statepact.storage.postgres._client import is_database_error

__all__ = ["CancelNotice", "ListenWatch", "control_channel"]

_log = logging.getLogger(__name__)

#: What a watch calls on a cancel notice: ``(tenant, item_id, token)``.
CancelNotice = Callable[[str, str, int], None]


def control_channel(channel: str) -> str:
    """The control channel beside a queue's wake-up channel."""
    return f"{channel}_ctl"


class ListenWatch:
    """LISTEN on the queue's channel (and its control channel for ``on_cancel``), on one
    connection of the engine held while watching.

    A notification on the queue's channel sets an event the next ``wait`` returns on.
    The connection is opened on the first ``wait`` and again after it drops, and given
    back on ``close``; a ``wait`` that (re)opened it returns True at once, since a
    notification sent before it listened is lost (the caller claims again).
    """

    def __init__(
        self, engine: AsyncEngine, channel: str, on_cancel: CancelNotice | None = None
    ) -> None:
        self._engine = engine
        self._channel = channel
        self._control = control_channel(channel)
        self._on_cancel = on_cancel
        self._arrived = asyncio.Event()
        self._conn: AsyncConnection | None = None
        self._driver: Any = None

    def _notified(self, *_args: Any) -> None:
        self._arrived.set()

    def _cancelled(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if self._on_cancel is None:
            return
        try:
            notice = json.loads(payload)
            tenant, item_id, token = notice["tenant"], notice["item_id"], int(notice["token"])
        except (ValueError, KeyError, TypeError):
            _log.warning("statepact queue: unreadable cancel notice dropped: %r", payload)
            return
        try:
            self._on_cancel(tenant, item_id, token)
        except Exception:
            _log.exception("statepact queue: on_cancel raised for item %r", item_id)

    def _dropped(self, *_args: Any) -> None:
        self._driver = None

    async def _listen(self) -> None:
        conn = await self._engine.connect()
        try:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            if driver is None:  # pragma: no cover - a checked-out connection has its driver's
                raise SQLAlchemyError("the pooled connection has no driver connection")
            await driver.add_listener(self._channel, self._notified)
            if self._on_cancel is not None:
                await driver.add_listener(self._control, self._cancelled)
            driver.add_termination_listener(self._dropped)
        except BaseException:
            await finish(conn.invalidate())
            raise
        self._conn, self._driver = conn, driver

    async def open(self) -> None:
        """Listen now (a cancel notice is heard before the first ``wait``); a failure is
        left to ``wait``, which tries again. The first ``wait`` still returns at once, as
        one that opened the connection does."""
        try:
            await finish(self._listen())
        except Exception as exc:
            if not is_database_error(exc):
                raise
            return
        self._arrived.set()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._driver is None or self._driver.is_closed():
            await finish(self.close())
            try:
                await finish(self._listen())  # a connect cut short would tear asyncpg's handshake
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                return False
            # Listening only from now: what was sent before (while the caller claimed for
            # the first time, or while the connection was down) may be waiting.
            return True
        if self._arrived.is_set():
            self._arrived.clear()
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - loop.time()))
        woken = self._arrived.is_set()
        self._arrived.clear()
        return woken

    async def close(self) -> None:
        conn, driver = self._conn, self._driver
        self._conn = self._driver = None
        if conn is None:
            return
        try:
            if driver is None or driver.is_closed():
                # Dropped under us: never back into the pool, where the next checkout
                # (no pre-ping) would send a statement on it.
                await conn.invalidate()
                return
            await driver.remove_listener(self._channel, self._notified)
            if self._on_cancel is not None:
                await driver.remove_listener(self._control, self._cancelled)
            await conn.close()
        except Exception as exc:
            if not is_database_error(exc):
                raise
            await conn.invalidate()
