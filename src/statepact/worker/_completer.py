"""The completer: every settle call the worker makes for an item its executor has decided.

Acks go by group commit, with no timer: one task sends the acks waiting in one
``ack_many`` at once, and the acks that arrive meanwhile wait for it and go
together in the next one (up to ``_ACK_BATCH``), each fenced on its own token.
A batch never names an item twice (a second lease of one item, its first having
lapsed, waits for the next batch, where the queue fences it), and a batch the
queue refuses as a whole is acked lease by lease, so one bad lease never costs
the others their ack. Fails and releases are one call each. See docs/worker.md,
"Sizing the pool" and "The parts". This module must never settle a lease twice:
an executor hands each lease here once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from statepact.errors import LeaseLostError, PoolExhaustedError, QueueUnavailableError
from statepact.models import WorkItem
from statepact.worker._job import Job, describe
from statepact.worker._runtime import Runtime

__all__ = ["Completer"]

logger = logging.getLogger("statepact.worker")

# The most acks one of the worker's ack_many calls carries (the queue takes up to 1,000).
_ACK_BATCH = 200

# Errors after which nothing is known to have landed and another call would wait as long:
# the server is away past its failover budget. Each lease lapses and is reaped.
_AWAY = (QueueUnavailableError, PoolExhaustedError)


class Completer:
    """Settles leases for one worker: acks batched, fails and releases one by one."""

    __slots__ = ("_rt", "_sender", "_waiting")

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._waiting: list[Job] = []
        self._sender: asyncio.Task[None] | None = None

    # -- acks ---------------------------------------------------------------------------

    def ack(self, job: Job) -> None:
        """Hand ``job``'s ack to the next ``ack_many``; the executor's part ends here. The
        answer is reported by hook (``succeeded``, or the lease lost); nothing cancels an ack
        once handed over but the event loop going away."""
        self._waiting.append(job)
        if self._sender is None:
            self._rt.acks_sending = True
            self._sender = asyncio.create_task(self._send(), name="statepact-acks")

    async def flush(self) -> None:
        """Until every ack handed over has been sent (or found undeliverable)."""
        while self._sender is not None:
            await asyncio.wait({self._sender})

    async def _send(self) -> None:
        rt = self._rt
        try:
            while self._waiting:
                await self._ack_batch(self._take())
        finally:
            self._sender = None
            rt.acks_sending = False
            rt.slot_freed.set()

    def _take(self) -> list[Job]:
        """The next batch: up to ``_ACK_BATCH`` waiting acks, no item named twice."""
        waiting = self._waiting
        batch = waiting[:_ACK_BATCH]
        if len({(job.lease.item.tenant, job.lease.item.item_id) for job in batch}) == len(batch):
            del waiting[:_ACK_BATCH]
            return batch
        batch, rest, seen = [], [], set()
        for job in waiting:
            key = (job.lease.item.tenant, job.lease.item.item_id)
            if len(batch) < _ACK_BATCH and key not in seen:
                seen.add(key)
                batch.append(job)
            else:
                rest.append(job)
        self._waiting = rest
        return batch

    async def _ack_batch(self, batch: list[Job]) -> None:
        rt = self._rt
        try:
            answers = await rt.queue.ack_many([job.lease for job in batch])
        except _AWAY as exc:
            logger.warning(
                "worker %s: ack of %d item(s) failed: %s",
                rt.worker_id,
                len(batch),
                describe(exc),
                extra=rt.fields(),
            )
            return
        except Exception as exc:
            logger.warning(
                "worker %s: ack of %d item(s) failed, acking each alone: %s",
                rt.worker_id,
                len(batch),
                describe(exc),
                extra=rt.fields(),
            )
            for job in batch:
                await self._ack_one(job)
            return
        for job, answer in zip(batch, answers, strict=True):
            if isinstance(answer, LeaseLostError):
                self.lost(job, f"ack refused: {answer}")
            else:
                rt.hooks.call("succeeded", job, answer)

    async def _ack_one(self, job: Job) -> None:
        item = await self._settle("ack", job, self._rt.queue.ack(job.lease))
        if item is not None:
            self._rt.hooks.call("succeeded", job, item)

    # -- the other settles ------------------------------------------------------------------

    async def fail(
        self, job: Job, error: str, *, retryable: bool, delay: float | None = None
    ) -> None:
        """Fail the item (the queue's policy decides retried or dead); run under ``finish``."""
        failed = self._rt.queue.fail(job.lease, error, retryable=retryable, retry_in=delay)
        item = await self._settle("fail", job, failed)
        if item is not None:
            self._rt.hooks.call("failed", job, item, error)

    async def release(self, job: Job, *, count_attempt: bool, delay: float | None = None) -> None:
        """Give the item back, due after ``delay`` (now without one), the attempt kept or
        given back; run under ``finish``."""
        released = self._rt.queue.release(job.lease, delay=delay, count_attempt=count_attempt)
        item = await self._settle("release", job, released)
        if item is not None:
            self._rt.hooks.call("released", job, item)

    async def _settle(self, what: str, job: Job, call: Awaitable[WorkItem]) -> WorkItem | None:
        """The item ``call`` settled, or ``None``: the lease was lost (reported), or the call
        failed (logged; nothing is known to have landed, the lease lapses and is reaped)."""
        try:
            return await call
        except LeaseLostError as exc:
            self.lost(job, f"{what} refused: {exc}")
        except Exception as exc:
            logger.warning(
                "worker %s: %s of item %r failed: %s",
                self._rt.worker_id,
                what,
                job.item.item_id,
                describe(exc),
                extra=self._rt.fields(job.item, job.task),
            )
        return None

    def lost(self, job: Job, reason: str) -> None:
        """The lease moved on: nothing is settled for it; say why."""
        rt = self._rt
        logger.warning(
            "worker %s: lease of item %r lost: %s",
            rt.worker_id,
            job.item.item_id,
            reason,
            extra=rt.fields(job.item, job.task),
        )
        rt.hooks.call("lease_lost", job, reason)
