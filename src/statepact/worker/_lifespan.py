"""The application context: ``Worker(startup=, shutdown=)``, opened once per worker process.

``startup`` is an async callable taking nothing and returning what handlers
reach as ``job.context`` (an engine, HTTP clients, model clients); ``shutdown``
is an async callable given that context, awaited when the worker stops, also
when something after ``startup`` failed to start and when the worker's task is
cancelled. A sync callable is refused when the worker is built, naming the
field. See docs/worker.md, "The application context". This module must never
touch the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from statepact._cancel import finish
from statepact.worker._job import describe, is_coroutine_function

__all__ = ["Lifespan", "Shutdown", "Startup"]

logger = logging.getLogger("statepact.worker")

Startup: TypeAlias = Callable[[], Awaitable[Any]]
Shutdown: TypeAlias = Callable[[Any], Awaitable[object]]


def _require_async(field: str, function: object, takes: str) -> None:
    if function is None:
        return
    if not callable(function) or not is_coroutine_function(function):
        raise TypeError(
            f"{field}: must be an async callable (async def) {takes}, got "
            f"{type(function).__name__} {getattr(function, '__name__', function)!r}"
        )


class Lifespan:
    """Opens the context once (``open``) and closes it once (``close``), if it was opened."""

    __slots__ = ("_context", "_opened", "_shutdown", "_startup")

    def __init__(self, startup: Startup | None, shutdown: Shutdown | None) -> None:
        _require_async("startup", startup, "taking nothing and returning the context")
        _require_async("shutdown", shutdown, "taking the context startup returned")
        self._startup = startup
        self._shutdown = shutdown
        self._context: Any = None
        self._opened = False

    @property
    def context(self) -> Any:
        return self._context

    async def open(self) -> Any:
        """Run ``startup`` (once): its result is the context; ``None`` without one."""
        if self._startup is not None:
            self._context = await self._startup()
        self._opened = True
        return self._context

    async def close(self, worker_id: str) -> None:
        """Run ``shutdown(context)`` once, to its end even if cancelled meanwhile; a failure
        is logged (the worker has stopped either way), never raised."""
        if not self._opened:
            return
        self._opened = False
        if self._shutdown is None:
            return
        try:
            await finish(self._shutdown(self._context))
        except Exception as exc:
            logger.error(
                "worker %s: shutdown failed: %s",
                worker_id,
                describe(exc),
                exc_info=exc,
                extra={"worker_id": worker_id},
            )
