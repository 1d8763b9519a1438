"""The claimer: claims while the worker has free slots, and waits well when it has none.

One ``claim_batch`` at a time (one round trip on every backing, tenants in
rotation), for one item after an empty claim and doubling while every claim
comes back full, never more than the free slots. When a slot frees it first
lets a few steps of the event loop pass (no timer), so that the items ending
together are claimed for together. Idle, it waits on the queue's wake-ups
(``watch()``), the worker's own (a tick enqueued, a reap) or the next delayed
item's due time, at most ``poll_interval``. See docs/worker.md, "Wake-ups" and
"Sizing the pool". This module must never claim once ``stopping`` is set, and
never leave a lease it claimed unowned: each goes to ``spawn`` or is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from statepact._cancel import finish
from statepact.clock import read_clock
from statepact.models import Lease
from statepact.queue import MAX_BATCH, WorkWatch
from statepact.worker._job import describe
from statepact.worker._runtime import Runtime

__all__ = ["Claimer"]

logger = logging.getLogger("statepact.worker")

# Steps of the event loop the claimer lets pass after a slot is freed, so the other items
# ending at the same moment free theirs too and one claim_batch asks for all of them (an
# item goes from its handler's return to its ack in about four steps).
_GATHER_STEPS = 6

# The shortest idle sleep: a due time already past (a clock a little ahead of another's)
# is claimed again after this, not in a tight loop.
_MIN_IDLE = 0.005


class Claimer:
    """Claims leases for free slots and hands each to ``spawn``, until ``stopping``."""

    __slots__ = ("_rt", "_spawn", "_watch")

    def __init__(self, rt: Runtime, spawn: Callable[[Lease], None]) -> None:
        self._rt = rt
        self._spawn = spawn
        self._watch: WorkWatch | None = None

    async def run(self) -> None:
        """Claim until ``stopping``; a claim in flight then finishes and its leases are run."""
        # The queue's wake-ups (LISTEN on PostgreSQL, a blocking pop on Redis) for as long
        # as this worker claims; on PostgreSQL that holds one connection of the pool.
        # Its control notices too: an item cancelled while this worker runs it.
        loop = asyncio.get_running_loop()

        def on_cancel(tenant: str, item_id: str, token: int) -> None:
            try:
                here = asyncio.get_running_loop() is loop
            except RuntimeError:
                here = False
            if here:
                self._cancel(tenant, item_id, token)
            else:  # a backing's listener on a thread of its own
                loop.call_soon_threadsafe(self._cancel, tenant, item_id, token)

        async with self._rt.queue.watch(on_cancel=on_cancel) as watch:
            self._watch = watch
            try:
                await self._claims()
            finally:
                self._watch = None

    def _cancel(self, tenant: str, item_id: str, token: int) -> None:
        """Cut the handler running the cancelled item's lease, if this worker runs it."""
        executor = self._rt.newest.get((tenant, item_id))
        if executor is not None:
            executor.cancel(token)

    async def _claims(self) -> None:
        rt = self._rt
        # Items asked for per claim_batch: doubled while every claim comes back full (a
        # backlog), back to what was found when one does not; never above the free slots.
        width = 1
        while True:
            # Cleared before anything is read: a slot freed (or stop()) from here on is seen.
            rt.slot_freed.clear()
            if rt.stopping.is_set():
                return
            free = await self._more_free()
            if rt.stopping.is_set():
                return
            if free <= 0:
                await rt.slot_freed.wait()
                continue
            asked = min(free, width, MAX_BATCH)
            # From here a wake-up counts: one made while this claim or the next_due read is
            # on its way (a schedule's tick, a reap, stop()) ends the wait below.
            rt.work.clear()
            try:
                leases = await self._claim_owned(asked)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "worker %s: claim failed: %s", rt.worker_id, describe(exc), extra=rt.fields()
                )
                width = 1
                await self._wait_for_work(rt.settings.poll_interval)
                continue
            for lease in leases:
                self._spawn(lease)
            concurrency = rt.settings.concurrency
            width = min(concurrency, asked * 2) if len(leases) == asked else len(leases)
            if not leases:
                width = 1
                await self._wait_for_work(await self._idle_for())

    async def _more_free(self) -> int:
        """The free slots once the handlers finishing now have handed their items to the
        completer: a slot freed wakes the claimer at the first item, and the items that end
        in the same few steps of the event loop (a batch claimed together tends to end
        together) are claimed for in the same ``claim_batch`` instead of one claim each.
        Costs a few steps of the loop, no timer."""
        rt = self._rt
        free = rt.settings.concurrency - rt.busy()
        for _ in range(_GATHER_STEPS):
            # Nothing in flight: nothing is left to end (an ack in flight frees its slot when
            # it lands, which the claimer does not wait for).
            if not rt.running or rt.stopping.is_set():
                break
            await asyncio.sleep(0)
            free = rt.settings.concurrency - rt.busy()
        return free

    async def _claim_owned(self, limit: int) -> list[Lease]:
        """Up to ``limit`` leases in one ``claim_batch``; if a cancellation arrives meanwhile,
        what the claim returns is released (the claim itself is not cut off)."""
        rt = self._rt
        claim = asyncio.ensure_future(
            rt.queue.claim_batch(rt.worker_id, lease_for=rt.settings.lease_for, limit=limit)
        )
        try:
            return await asyncio.shield(claim)
        except asyncio.CancelledError:
            await finish(self._release_claimed(claim))
            raise

    async def _release_claimed(self, claim: asyncio.Future[list[Lease]]) -> None:
        with contextlib.suppress(Exception):
            for lease in await claim:
                with contextlib.suppress(Exception):
                    await self._rt.queue.release(lease)

    async def _idle_for(self) -> float:
        """How long an idle claimer sleeps: until the next delayed item comes due, at most
        the poll interval (which bounds a wake-up that is lost or a due time missed)."""
        rt = self._rt
        poll = rt.settings.poll_interval
        try:
            due = await rt.queue.next_due()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "worker %s: next_due failed: %s", rt.worker_id, describe(exc), extra=rt.fields()
            )
            return poll
        if due is None:
            return poll
        until = (due - read_clock(rt.clock)).total_seconds()
        return min(poll, max(until, _MIN_IDLE))

    async def _wait_for_work(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait up to ``timeout`` s for work to be worth claiming again: cut short by the
        queue's wake-ups (LISTEN/NOTIFY, a blocking Redis pop) and by ``rt.work`` (set by
        stop(), a tick, a reap, since the claim before this wait began)."""
        rt = self._rt
        if rt.stopping.is_set():
            return
        watch = self._watch
        if watch is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rt.work.wait(), timeout)
            return
        # Whichever is first: the queue says work arrived, stop()/a reap, or the timeout.
        arrived = asyncio.ensure_future(watch.wait(timeout))
        woken = asyncio.ensure_future(rt.work.wait())
        try:
            await asyncio.wait({arrived, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (arrived, woken):
                waiter.cancel()
            await asyncio.wait({arrived, woken})
            failed = None if arrived.cancelled() else arrived.exception()
            if failed is not None:
                logger.warning(
                    "worker %s: waiting for work failed: %s",
                    rt.worker_id,
                    describe(failed),
                    extra=rt.fields(),
                )
