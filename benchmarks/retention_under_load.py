"""Issue 33's retention test, as a script (too heavy for CI): does pruning a million finished
items slow the workers draining new work, and does any prune step hold the server long?

1. Fill ``--finished`` done items (default 1,000,000) through the queue's own calls
   (``enqueue_many``, ``claim_batch``, ``ack_many``: the bench's filler).
2. ``--workers`` tasks (default 10) claim and ack new work for ``--seconds`` without
   pruning; each that finds the queue empty enqueues a batch of new items itself.
3. The same while ``queue.prune()`` (what the ``Worker``'s prune service calls) deletes
   the finished items; this phase lasts until they are all gone (at least ``--seconds``).

Printed: claim+ack throughput without and during the prune and their ratio (target:
within 20%), and the slowest prune step on the server: on PostgreSQL each ``DELETE``
statement timed on the client (SQLAlchemy cursor events, the round trip included); on
Redis the scripts' own execution time from ``SLOWLOG`` (the script is set to log every
call over 1 ms while the prune runs; use a Redis of your own). Target: under 100 ms.

    python benchmarks/retention_under_load.py --backend postgres \\
        --url postgresql://postgres@127.0.0.1:5432/bench33 --finished 1000000
    python benchmarks/retention_under_load.py --backend redis --url redis://127.0.0.1:6433/0

Everything lives in a namespace/schema of its own, removed at the end. Figures:
docs/benchmarks.md#retention-under-load.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from datetime import timedelta
from typing import Any

from statepact.cli._bench.lifecycle import fill_finished
from statepact.cli._common import open_backings
from statepact.clock import SystemClock
from statepact.models import WorkItem
from statepact.queue import QueuePolicy, WorkQueue

FEED = 500  # new items a worker enqueues when it finds the queue empty
LEASE = 60.0


class Drain:
    """``workers`` tasks claiming and acking until ``stop`` is set; ``acked`` counts."""

    def __init__(self, queue: WorkQueue, workers: int, phase: str) -> None:
        self.queue = queue
        self.workers = workers
        self.phase = phase
        self.acked = 0
        self.stop = asyncio.Event()
        self._fed = 0

    async def _one(self, n: int) -> None:
        while not self.stop.is_set():
            lease = await self.queue.claim(f"{self.phase}-w{n}", lease_for=LEASE)
            if lease is None:
                start, self._fed = self._fed, self._fed + FEED
                await self.queue.enqueue_many(
                    [
                        WorkItem(tenant=f"n{i % 10}", item_id=f"{self.phase}-{i}")
                        for i in range(start, start + FEED)
                    ]
                )
                continue
            await self.queue.ack(lease)
            self.acked += 1

    async def run(self) -> None:
        await asyncio.gather(*(self._one(n) for n in range(self.workers)))


#: In the text of the queue's prune statement (one batch's ``DELETE``) and no other.
PRUNE_MARK = "arm_done_before"


class PgStatementTimes:
    """Every prune statement (one batch's ``DELETE``) as asyncpg timed it on the client
    (its query logger: the round trip included). The queue runs its statements on the
    asyncpg connections under the engine's pool, so the logger is added to each as it
    opens (the pool is emptied first)."""

    def __init__(self) -> None:
        self.slowest = 0.0
        self.count = 0

    def logged(self, query: Any) -> None:
        if PRUNE_MARK in query.query:
            self.count += 1
            self.slowest = max(self.slowest, query.elapsed)

    async def attach(self, engine: Any) -> None:
        from sqlalchemy import event

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.driver_connection.add_query_logger(self.logged)

        event.listen(engine.sync_engine, "connect", on_connect)
        await engine.dispose()


async def stats_p50(queue: WorkQueue) -> float:
    """The median of 50 ``stats()`` calls (after 10 untimed), in ms."""
    for _ in range(10):
        await queue.stats()
    took = []
    for _ in range(50):
        started = time.perf_counter()
        await queue.stats()
        took.append(time.perf_counter() - started)
    return sorted(took)[25] * 1000


async def phase(queue: WorkQueue, workers: int, seconds: float, name: str, prune: bool) -> float:
    """Claim+ack per second over the phase; with ``prune``, it lasts until the prune ends."""
    drain = Drain(queue, workers, name)
    running = asyncio.create_task(drain.run())
    await asyncio.sleep(1.0)  # warm: connections and the first feed
    before, started = drain.acked, time.perf_counter()
    pruned = 0
    if prune:
        deadline = started + seconds
        while True:
            pruned += await queue.prune()
            if time.perf_counter() >= deadline and pruned > 0:
                break
            await asyncio.sleep(0.05)
    else:
        await asyncio.sleep(seconds)
    took = time.perf_counter() - started
    rate = (drain.acked - before) / took
    drain.stop.set()
    await running
    extra = f", {pruned:,} pruned" if prune else ""
    print(f"{name}: {drain.acked - before:,} claim+ack in {took:.1f} s = {rate:,.0f}/s{extra}")
    return rate


async def main(args: argparse.Namespace) -> None:
    async with open_backings(
        args.backend, args.url, clock=SystemClock(), policy=QueuePolicy(), connections=40
    ) as b:
        print(f"{args.backend}: {b.where}")
        queue = await b.new_queue("retention", QueuePolicy(keep_done=timedelta(0)))
        started = time.perf_counter()
        await fill_finished(queue, args.finished, fillers=8)
        print(f"filled {args.finished:,} done items in {time.perf_counter() - started:.0f} s")
        print(f"stats() p50 after the fill: {await stats_p50(queue):.2f} ms")
        if args.backend == "postgres":
            from sqlalchemy import text

            # What autovacuum would do before long; without it the first phase reads
            # the fill's dead index entries.
            async with b.raw.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE"))
            print(f"stats() p50 after VACUUM ANALYZE: {await stats_p50(queue):.2f} ms")
        without = await phase(queue, args.workers, args.seconds, "without prune", prune=False)
        if args.backend == "postgres":
            times = PgStatementTimes()
            await times.attach(b.raw)
        else:
            await b.raw.config_set("slowlog-log-slower-than", 1000)
            await b.raw.config_set("slowlog-max-len", 100_000)
            await b.raw.slowlog_reset()
        during = await phase(queue, args.workers, args.seconds, "during prune", prune=True)
        print(f"during / without: {during / without:.3f} (target >= 0.8)")
        if args.backend == "postgres":
            print(f"slowest prune statement: {times.slowest * 1000:.1f} ms of {times.count:,}")
        else:
            from statepact.storage.redis._scripts import script_source

            logged = await b.raw.slowlog_get(100_000)
            sha = hashlib.sha1(script_source("prune").encode()).hexdigest().encode()
            pruning = [e for e in logged if sha in bytes(e.get("command", b""))]
            slowest = max((e["duration"] for e in pruning), default=0) / 1000
            other = max((e["duration"] for e in logged if e not in pruning), default=0) / 1000
            print(
                f"slowest prune script (SLOWLOG, server time): {slowest:.1f} ms; "
                f"{len(pruning)} prune scripts over 1 ms; slowest other command {other:.1f} ms"
            )
            await b.raw.config_set("slowlog-log-slower-than", 10_000)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("redis", "postgres"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=15.0)
    asyncio.run(main(parser.parse_args()))
