"""Issue 33's retention test, as a script (too heavy for CI): does pruning a million finished
items slow the workers draining new work, and does any prune step hold the server long?

1. Fill ``--finished`` done items (default 1,000,000) through the queue's own calls
   (``enqueue_many``, ``claim_batch``, ``ack_many``: the bench's filler).
2. ``--workers`` tasks (default 10) claim and ack new work throughout; each that finds
   the queue empty enqueues a batch of new items itself.
3. Meanwhile: ``--seconds`` (default 20) without pruning, then one ``queue.prune()`` call
   (what the ``Worker``'s prune service makes) to its end, then ``--seconds`` without
   again.

Printed: claim+ack throughput during the prune and without it (both phases, before and
after, together: the shared machine's load drifting weighs on both sides alike) and their
ratio (target: within 20%). Then the slowest prune step: on PostgreSQL each prune
statement timed on the client (asyncpg's query logger: the round trip and the wait for
this process's busy event loop included), and with ``--log-slow MS --server-log PATH``
the server's own time of those over MS, from its log (a superuser, a server on this
machine); on Redis the scripts' own execution time from ``SLOWLOG`` (the script sets it
to log every call over 1 ms; use a Redis of your own). Target: under 100 ms.
``--insert`` (PostgreSQL) fills with one ``INSERT`` instead, in seconds, to try a change.

    python benchmarks/retention_under_load.py --backend postgres \\
        --url postgresql://postgres@127.0.0.1:5432/bench33 --finished 1000000 \\
        --log-slow 50 --server-log /var/log/postgresql/postgresql-15-main.log
    python benchmarks/retention_under_load.py --backend redis --url redis://127.0.0.1:6433/0

Everything lives in a namespace/schema of its own, removed at the end. Figures:
docs/benchmarks.md#retention-under-load.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import re
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
        self.times: list[float] = []

    def logged(self, query: Any) -> None:
        if PRUNE_MARK in query.query:
            self.times.append(query.elapsed)

    def summary(self) -> str:
        ms = sorted(t * 1000 for t in self.times) or [0.0]
        return (
            f"slowest prune statement: {ms[-1]:.1f} ms of {len(self.times):,} "
            f"(median {ms[len(ms) // 2]:.1f} ms, p99 {ms[len(ms) * 99 // 100]:.1f} ms)"
        )

    async def attach(self, engine: Any, log_slow: float | None) -> None:
        from sqlalchemy import event

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.driver_connection.add_query_logger(self.logged)
            if log_slow is not None:
                # The server's own account (its log, server time): needs a superuser.
                cursor = dbapi_connection.cursor()
                cursor.execute(f"SET log_min_duration_statement = {int(log_slow)}")
                cursor.close()
                dbapi_connection.commit()  # the driver began a transaction for it

        event.listen(engine.sync_engine, "connect", on_connect)
        await engine.dispose()


class ServerLog:
    """The prune statements the server logged as slower than ``--log-slow`` (its own
    time, ``log_min_duration_statement``), read from its log file (``--server-log``,
    a server on this machine) from where it ended when the run began."""

    ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", re.MULTILINE)
    DURATION = re.compile(r"duration: ([0-9.]+) ms")

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as log:
            self.start = log.seek(0, 2)

    def summary(self) -> str:
        with open(self.path, "rb") as log:
            log.seek(self.start)
            text = log.read().decode(errors="replace")
        starts = [m.start() for m in self.ENTRY.finditer(text)] + [len(text)]
        entries = [text[a:b] for a, b in itertools.pairwise(starts)]
        timed = [self.DURATION.search(e) for e in entries if PRUNE_MARK in e]
        ms = sorted(float(m.group(1)) for m in timed if m)
        other = [self.DURATION.search(e) for e in entries if PRUNE_MARK not in e]
        slowest_other = max((float(m.group(1)) for m in other if m), default=0.0)
        return (
            f"server's log: {len(ms)} prune statements over the threshold, slowest "
            f"{ms[-1] if ms else 0:.1f} ms; {sum(1 for m in other if m)} other statements, "
            f"slowest {slowest_other:.1f} ms"
        )


async def insert_finished(engine: Any, queue: WorkQueue, count: int) -> None:
    """``count`` done items written in one ``INSERT`` (PostgreSQL, ``--insert``): seconds
    where the queue's calls take minutes, for trying a change; the rows then lack the
    fill's history (the dead versions the VACUUM below removes anyway)."""
    from sqlalchemy import text

    name = queue.tables.work.name  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"INSERT INTO {name} (queue, tenant, item_id, payload, status, attempts, "
                "available_at, created_at, updated_at) "
                "SELECT :queue, 't' || (g % 10), 'done-' || g, '{}'::json, 'done', 1, "
                "now() - interval '1 hour', now() - interval '1 hour', "
                "now() - interval '1 hour' + g * interval '1 millisecond' "
                "FROM generate_series(1, :count) AS g"
            ),
            {"queue": queue.name, "count": count},
        )


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


async def phases(queue: WorkQueue, workers: int, seconds: float) -> float:
    """``seconds`` without the prune, then one ``queue.prune()`` call to its end (what the
    ``Worker``'s prune service does), then ``seconds`` without again, while ``workers``
    drain new work throughout. Prints each phase's rate; returns the one during the prune
    over the one of both phases without it."""
    drain = Drain(queue, workers, "drain")
    running = asyncio.create_task(drain.run())
    await asyncio.sleep(1.0)  # warm: connections and the first feed
    acked = {False: 0, True: 0}
    took = {False: 0.0, True: 0.0}
    for name, pruning in (("before", False), ("during", True), ("after", False)):
        before, started = drain.acked, time.perf_counter()
        if pruning:
            pruned = await queue.prune()
            extra = f", {pruned:,} pruned"
        else:
            await asyncio.sleep(seconds)
            extra = ""
        count, spent = drain.acked - before, time.perf_counter() - started
        acked[pruning] += count
        took[pruning] += spent
        rate = count / spent
        print(f"{name} the prune: {count:,} claim+ack in {spent:.1f} s = {rate:,.0f}/s{extra}")
    drain.stop.set()
    await running
    rates = {side: acked[side] / took[side] for side in (False, True)}
    print(f"without prune (before and after): {rates[False]:,.0f}/s; during: {rates[True]:,.0f}/s")
    return rates[True] / rates[False]


async def main(args: argparse.Namespace) -> None:
    async with open_backings(
        args.backend, args.url, clock=SystemClock(), policy=QueuePolicy(), connections=40
    ) as b:
        print(f"{args.backend}: {b.where}")
        queue = await b.new_queue("retention", QueuePolicy(keep_done=timedelta(0)))
        started = time.perf_counter()
        if args.insert:
            await insert_finished(b.raw, queue, args.finished)
        else:
            await fill_finished(queue, args.finished, fillers=8)
        took = time.perf_counter() - started
        how = "one INSERT" if args.insert else "the queue's calls"
        print(f"filled {args.finished:,} done items in {took:.0f} s ({how})")
        print(f"stats() p50 after the fill: {await stats_p50(queue):.2f} ms")
        if args.backend == "postgres":
            from sqlalchemy import text

            # What autovacuum would do before long; without it the first phase reads
            # the fill's dead index entries.
            async with b.raw.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE"))
            print(f"stats() p50 after VACUUM ANALYZE: {await stats_p50(queue):.2f} ms")
        if args.backend == "postgres":
            times = PgStatementTimes()
            await times.attach(b.raw, args.log_slow)
            server_log = ServerLog(args.server_log) if args.server_log else None
        else:
            await b.raw.config_set("slowlog-log-slower-than", 1000)
            await b.raw.config_set("slowlog-max-len", 100_000)
            await b.raw.slowlog_reset()
        ratio = await phases(queue, args.workers, args.seconds)
        print(f"during / without: {ratio:.3f} (target >= 0.8)")
        if args.backend == "postgres":
            print(times.summary())
            if server_log is not None:
                print(server_log.summary())
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
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--log-slow",
        type=float,
        metavar="MS",
        help="PostgreSQL: have the server log this run's statements over MS (superuser)",
    )
    parser.add_argument(
        "--server-log", metavar="PATH", help="PostgreSQL: its log file, read for --log-slow"
    )
    parser.add_argument(
        "--insert", action="store_true", help="PostgreSQL: fill with one INSERT (quick, to try)"
    )
    asyncio.run(main(parser.parse_args()))
