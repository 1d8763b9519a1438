"""The queue lifecycle's cells in ``statepact bench`` (issue 33): what ``stats()`` costs with
no finished items and with ``--finished`` of them, and how soon an operator's ``cancel``
stops the handler running the item. What each is: docs/benchmarks.md#queue-lifecycle.

Filling the finished items is setup (shown on the progress bar, not timed); they are
pruned again afterwards. Nothing here touches data outside the bench's namespace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from statepact._limits import MAX_ENQUEUE_BATCH
from statepact.cli._common import CommandError
from statepact.models import WorkItem
from statepact.queue import MAX_BATCH, QueuePolicy, WorkQueue

if TYPE_CHECKING:
    from statepact.cli._bench.scenarios import Runner

__all__ = [
    "CANCEL_SAMPLES",
    "STATS_SAMPLES",
    "Latencies",
    "cancel_latency",
    "fill_finished",
    "stats_cost",
]

#: ``stats()`` calls timed at each size (after a few untimed ones).
STATS_SAMPLES = 100
#: Running items cancelled one at a time to time the handler's stop.
CANCEL_SAMPLES = 20
#: The idle worker's fallback poll in the cancel cell: the issue asks for the stop within a
#: second with the poll at 10 s, so a cancel the worker only saw on its poll would show.
CANCEL_POLL = 10.0
#: Concurrent fillers: each enqueues one batch, then claims and acks it.
FILLERS = 4
LEASE_SECONDS = 300.0


def percentile(sorted_seconds: list[float], pct: int) -> float:
    """The ``pct``-th percentile of ``sorted_seconds`` (nearest rank below), in ms."""
    at = min(len(sorted_seconds) - 1, len(sorted_seconds) * pct // 100)
    return sorted_seconds[at] * 1000


@dataclass(frozen=True)
class Latencies:
    """Sorted latency samples as a record reports them (ms unrounded here)."""

    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, sorted_seconds: list[float]) -> Latencies:
        return cls(
            ops=len(sorted_seconds),
            seconds=sum(sorted_seconds),
            p50_ms=percentile(sorted_seconds, 50),
            p99_ms=percentile(sorted_seconds, 99),
            max_ms=sorted_seconds[-1] * 1000,
        )

    def fields(self, digits: int | None = None) -> dict[str, Any]:
        """A record's ``ops``, ``seconds``, ``p50_ms`` and ``p99_ms``; the two ms figures
        rounded to ``digits`` when given (each record keeps the form it always had)."""
        p50, p99 = self.p50_ms, self.p99_ms
        if digits is not None:
            p50, p99 = round(p50, digits), round(p99, digits)
        return {"ops": self.ops, "seconds": self.seconds, "p50_ms": p50, "p99_ms": p99}


async def fill_finished(
    queue: WorkQueue,
    count: int,
    *,
    tenants: int = 10,
    prefix: str = "done",
    fillers: int = FILLERS,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Put ``count`` done items in ``queue`` through its own calls: ``enqueue_many`` in
    batches, each then claimed (``claim_batch``) and acked (``ack_many``), ``fillers``
    batches at a time. The queue must hold nothing else due. Returns how many were acked."""
    batches = iter(range(0, count, MAX_ENQUEUE_BATCH))
    acked = 0

    async def filler(n: int) -> None:
        nonlocal acked
        for start in batches:
            size = min(MAX_ENQUEUE_BATCH, count - start)
            await queue.enqueue_many(
                [
                    WorkItem(tenant=f"t{i % tenants}", item_id=f"{prefix}-{i}")
                    for i in range(start, start + size)
                ]
            )
            left = size
            while left > 0:
                leases = await queue.claim_batch(
                    f"filler-{n}", lease_for=LEASE_SECONDS, limit=min(MAX_BATCH, left)
                )
                if not leases:
                    # Another filler took this batch's last items; its acks count them.
                    break
                answers = await queue.ack_many(leases)
                lost = [a for a in answers if isinstance(a, Exception)]
                if lost:
                    raise CommandError(f"bench: filling finished items lost a lease: {lost[0]}")
                left -= len(leases)
                acked += len(leases)
                if progress is not None:
                    progress(acked)

    await asyncio.gather(*(filler(n) for n in range(fillers)))
    return acked


async def _time_stats(queue: WorkQueue) -> list[float]:
    for _ in range(10):
        await queue.stats()
    seconds: list[float] = []
    for _ in range(STATS_SAMPLES):
        started = time.perf_counter()
        await queue.stats()
        seconds.append(time.perf_counter() - started)
    return sorted(seconds)


async def stats_cost(r: Runner) -> None:
    """``stats()`` on an empty queue, then with ``--finished`` done items in it; both
    recorded, the second with its ratio to the first. The items are pruned afterwards."""
    finished = r.p.finished
    # keep_done=0: prune() deletes every done item at once (the cleanup).
    queue = await r.b.new_queue(f"bench-{r.tag}-stats", QueuePolicy(keep_done=timedelta(0)))
    r.progress.start(f"{r.b.kind}: queue stats(), 0 finished items")
    empty = Latencies.of(await _time_stats(queue))
    await r.record(
        "queue.stats.empty",
        f"queue: stats(), 0 finished, p50 {empty.p50_ms:.3f} ms, p99 {empty.p99_ms:.3f} ms",
        concurrency=1,
        **empty.fields(),
        finished=0,
    )

    r.progress.start(f"{r.b.kind}: fill {finished:,} finished items (untimed)")
    started = time.perf_counter()
    acked = await fill_finished(queue, finished, progress=lambda n: r.progress.update(n / finished))
    fill_seconds = time.perf_counter() - started
    if acked != finished:
        raise CommandError(f"bench: filled {acked} of {finished} finished items")
    r.progress.start(f"{r.b.kind}: queue stats(), {finished:,} finished items")
    full = Latencies.of(await _time_stats(queue))
    r.progress.start(f"{r.b.kind}: prune {finished:,} finished items (untimed)")
    started = time.perf_counter()
    pruned = await queue.prune()
    prune_seconds = time.perf_counter() - started
    if pruned != finished:
        raise CommandError(f"bench: prune deleted {pruned} of {finished} finished items")
    ratio = full.p50_ms / empty.p50_ms if empty.p50_ms > 0 else float("inf")
    r.progress.start(f"{r.b.kind}: queue stats(), {finished:,} finished items")
    await r.record(
        "queue.stats.finished",
        f"queue: stats(), {finished:,} finished, p50 {full.p50_ms:.3f} ms, "
        f"p99 {full.p99_ms:.3f} ms ({ratio:.2f}x empty)",
        concurrency=1,
        **full.fields(),
        finished=finished,
        x_empty_p50=ratio,
        fill_items_per_s=round(finished / fill_seconds) if fill_seconds > 0 else None,
        prune_items_per_s=round(pruned / prune_seconds) if prune_seconds > 0 else None,
    )


async def cancel_latency(r: Runner) -> None:
    """An idle ``Worker`` runs a handler that waits forever; for each sample, enqueue an
    item, wait for its handler to start, then time from ``queue.cancel`` to the handler's
    ``CancelledError``."""
    from statepact.worker import Job, Worker

    queue = await r.b.new_queue(f"bench-{r.tag}-cancel", QueuePolicy())
    started: asyncio.Queue[str] = asyncio.Queue()
    stopped: asyncio.Queue[float] = asyncio.Queue()

    async def hang(job: Job) -> None:
        started.put_nowait(job.item.item_id)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.put_nowait(time.perf_counter())
            raise

    r.progress.start(f"{r.b.kind}: cancel to handler stop, idle Worker")
    latencies: list[float] = []
    worker = Worker(queue, default=hang, poll_interval=CANCEL_POLL)
    async with worker:
        for n in range(CANCEL_SAMPLES):
            item_id = f"cancel-{n}"
            await queue.enqueue(WorkItem(tenant="cancel", item_id=item_id))
            got = await asyncio.wait_for(started.get(), CANCEL_POLL * 2)
            if got != item_id:
                raise CommandError(f"bench: the worker started {got!r}, expected {item_id!r}")
            sent_at = time.perf_counter()
            await queue.cancel("cancel", item_id, reason="bench")
            latencies.append(await asyncio.wait_for(stopped.get(), CANCEL_POLL * 2) - sent_at)
            r.progress.update((n + 1) / CANCEL_SAMPLES)
    latencies.sort()
    cancel = Latencies.of(latencies)
    await r.record(
        "queue.worker.cancel",
        f"queue: cancel to handler stop p50 {cancel.p50_ms:.1f} ms, p99 {cancel.p99_ms:.1f} ms, "
        f"max {cancel.max_ms:.1f} ms (poll {CANCEL_POLL:g} s)",
        concurrency=1,
        **cancel.fields(2),
        max_ms=round(cancel.max_ms, 2),
        fallback_poll_s=CANCEL_POLL,
    )
