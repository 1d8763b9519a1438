"""Maintenance: the services a worker runs on an interval, in one place.

A :class:`Service` is a name, an interval and one async call; :class:`Maintenance`
runs each in a task of its own, every ``every`` seconds until the worker stops,
each call to its end (``finish``) and each failure logged and tried again at the
next interval. The reaper (``queue.reap()``, every ``reap_every`` seconds, waking
the claimer when it moved items) and the pruner (``queue.prune()``, every
``prune_every`` seconds); a limit reconciler or a registry heartbeat is one more
:class:`Service` in :func:`services`. See docs/worker.md, "The reaper". This module must never
touch a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from statepact._cancel import finish
from statepact.worker._job import describe
from statepact.worker._runtime import Runtime

__all__ = ["Maintenance", "Service", "services"]

logger = logging.getLogger("statepact.worker")


@dataclass(frozen=True, slots=True)
class Service:
    """``run`` every ``every`` seconds (the first one ``every`` seconds after start)."""

    name: str
    every: float
    run: Callable[[], Awaitable[None]]


def services(rt: Runtime) -> list[Service]:
    """The services a worker with these settings runs (``reap_every=0``: no reaper)."""
    found: list[Service] = []
    if rt.settings.reap_every > 0:
        found.append(Service("reap", rt.settings.reap_every, lambda: _reap(rt)))
    if rt.settings.prune_every > 0:
        found.append(Service("prune", rt.settings.prune_every, lambda: _prune(rt)))
    return found


async def _reap(rt: Runtime) -> None:
    """``reap`` once; each reap is atomic, so every worker may run one."""
    moved = await rt.queue.reap()
    if moved:
        logger.info(
            "worker %s: reaped %d expired lease(s)", rt.worker_id, len(moved), extra=rt.fields()
        )
        rt.work.set()


async def _prune(rt: Runtime) -> None:
    """``prune`` once: the queue deletes finished items past its policy's ``keep_*`` (and
    logs how many). Its server-side try-lock keeps it to one process per queue: every other
    worker's call returns 0 at once."""
    await rt.queue.prune()


class Maintenance:
    """Runs the services of one worker until it stops."""

    __slots__ = ("_rt", "_services")

    def __init__(self, rt: Runtime, services: list[Service]) -> None:
        self._rt = rt
        self._services = services

    def start(self) -> list[asyncio.Task[None]]:
        """One task per service; each ends soon after ``stopping`` is set."""
        return [
            asyncio.create_task(self._loop(service), name=f"statepact-{service.name}")
            for service in self._services
        ]

    async def _loop(self, service: Service) -> None:
        stopping = self._rt.stopping
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), service.every)
            if stopping.is_set():
                return
            try:
                await finish(service.run())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "worker %s: %s failed: %s",
                    self._rt.worker_id,
                    service.name,
                    describe(exc),
                    extra=self._rt.fields(),
                )
