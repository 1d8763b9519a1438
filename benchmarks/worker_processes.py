"""``statepact worker --processes N``: how much a second process adds to a drain.

Run from the checkout: ``python benchmarks/worker_processes.py --redis URL --postgres URL``
(each optional; the URLs may also come from ``STATEPACT_REDIS_URL`` /
``STATEPACT_POSTGRES_URL``). For each server and N in (1, 2): the supervisor is
started with a no-op task (concurrency 10, the Worker's defaults otherwise) and
left to start idle; then ``--items`` items across 16 tenants are enqueued in
batches of 5,000, and the time runs from the first enqueue call until the server
counts nothing queued or leased (polled every 10 ms). The server is checked after each
run: nothing queued, leased or dead. Prints one line per run and the ratio of two
processes to one; docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from statepact.clock import SystemClock
from statepact.models import WorkItem
from statepact.queue import BaseWorkQueue
from statepact.testing.namespaces import clear_namespace, unique_namespace
from statepact.worker import Job, Worker

ROOT = Path(__file__).resolve().parents[1]
BATCH = 5_000


async def noop(job: Job) -> None:
    return None


worker = Worker(default=noop)


@asynccontextmanager
async def opened(
    kind: str, url: str, queue_name: str
) -> AsyncIterator[tuple[list[str], BaseWorkQueue]]:
    if kind == "redis":
        from redis.asyncio import Redis

        from statepact.settings import RedisStoreSettings
        from statepact.storage.redis import RedisWorkQueue

        namespace = unique_namespace()
        client = Redis.from_url(url)
        settings = RedisStoreSettings(namespace=namespace, durable=False)
        try:
            yield (
                ["--redis", url, "--namespace", namespace, "--no-durable"],
                RedisWorkQueue(client, clock=SystemClock(), settings=settings),
            )
        finally:
            await clear_namespace(client, namespace)
            await client.aclose()
        return
    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresWorkQueue, create_engine

    engine = create_engine(PostgresStoreSettings(dsn=url, pool_size=4))
    try:
        yield (
            ["--postgres", url, "--queue", queue_name],
            PostgresWorkQueue(
                engine,
                clock=SystemClock(),
                settings=PostgresStoreSettings(dsn=url, queue_name=queue_name),
            ),
        )
    finally:
        await engine.dispose()


async def drain(kind: str, url: str, processes: int, items: int) -> float:
    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    async with opened(kind, url, queue_name) as (options, queue):
        supervisor = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "statepact.cli",
            "worker",
            "worker_processes:worker",
            *options,
            "--processes",
            str(processes),
            "--log-level",
            "warning",
            cwd=ROOT / "benchmarks",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")},
        )
        assert supervisor.stdout is not None
        ready = 0
        while ready < processes:
            line = (await asyncio.wait_for(supervisor.stdout.readline(), 60)).decode()
            if not line:
                raise SystemExit("the supervisor exited before its workers started")
            ready += ": queue " in line
        await asyncio.sleep(0.5)  # every child's first claim and LISTEN in place
        batch = [WorkItem(tenant=f"t{n % 16}", item_id=f"i{n}", payload={}) for n in range(items)]
        started = time.perf_counter()
        for first in range(0, items, BATCH):
            await queue.enqueue_many(batch[first : first + BATCH])
        while (stats := await queue.stats()).queued or stats.leased:  # noqa: ASYNC110 - polled
            await asyncio.sleep(0.01)
        took = time.perf_counter() - started
        supervisor.send_signal(signal.SIGTERM)
        await asyncio.wait_for(supervisor.wait(), 60)
        stats = await queue.stats()
        assert (stats.queued, stats.leased, stats.dead) == (0, 0, 0), stats
        return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default=os.environ.get("STATEPACT_REDIS_URL"))
    parser.add_argument("--postgres", default=os.environ.get("STATEPACT_POSTGRES_URL"))
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for kind, url in (("redis", args.redis), ("postgres", args.postgres)):
        if not url:
            continue
        best: dict[int, float] = {}
        for _ in range(args.rounds):
            for processes in (1, 2):
                took = await drain(kind, url, processes, args.items)
                rate = args.items / took
                best[processes] = max(best.get(processes, 0.0), rate)
                line = f"{kind:8} processes={processes} {args.items} items {took:6.2f} s"
                print(f"{line} {rate:8.0f}/s", flush=True)
        print(
            f"{kind:8} 2 processes / 1: {best[2] / best[1]:.2f}x (best of {args.rounds})",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
