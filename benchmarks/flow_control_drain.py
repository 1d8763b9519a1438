"""Issue 35's speed target, as a script: does a queue with flow-control limits set drain
as fast as the same queue without them (target: within 15%)?

Each cell fills a fresh queue with ``--items`` items spread over ``--tenants`` tenants
and ``--keys`` limit keys (weight 1), then times ``--workers`` concurrent
``claim`` + ``ack`` loops draining it. The limited queue has every kind of limit set
(per tenant, per key, per (tenant, key), a rate per key and per tenant), each high
enough never to bind: what is measured is the bookkeeping, not a cap. Cells without and
with limits alternate, ``--rounds`` times, in the same minute; the best of each is kept.

    python benchmarks/flow_control_drain.py --backend memory
    python benchmarks/flow_control_drain.py --backend postgres \\
        --url postgresql://postgres@127.0.0.1:5432/flow35
    python benchmarks/flow_control_drain.py --backend redis --url redis://127.0.0.1:6379/0

Everything lives in a namespace/schema of its own, removed at the end. Figures:
docs/benchmarks.md#flow-control-drain.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta

from statepact._queue_limits import QueueLimits, Rate
from statepact.cli._common import open_backings
from statepact.clock import SystemClock
from statepact.models import WorkItem
from statepact.queue import QueuePolicy, WorkQueue

LEASE = 60.0
#: Far above anything a drain reaches: limits that are checked but never bind.
LOOSE = QueueLimits(
    per_tenant=100_000,
    per_key=100_000,
    per_tenant_key=100_000,
    key_rate=Rate(weight=10**9, per=timedelta(seconds=60)),
    tenant_rate=Rate(weight=10**9, per=timedelta(seconds=60)),
)


def items(n: int, tenants: int, keys: int, tag: str) -> list[WorkItem]:
    return [
        WorkItem(tenant=f"t{i % tenants}", item_id=f"{tag}-{i}", limit_key=f"k{i % keys}")
        for i in range(n)
    ]


async def drain(queue: WorkQueue, workers: int) -> int:
    """Claim and ack until the queue is empty; the number acked."""
    acked = 0

    async def one(n: int) -> None:
        nonlocal acked
        while (lease := await queue.claim(f"w{n}", lease_for=LEASE)) is not None:
            await queue.ack(lease)
            acked += 1

    await asyncio.gather(*(one(n) for n in range(workers)))
    return acked


async def cell(
    queue: WorkQueue, args: argparse.Namespace, workers: int, limited: bool, tag: str
) -> float:
    """Claim+ack per second draining a freshly filled queue."""
    await queue.set_limits(LOOSE if limited else None)
    batch = items(args.items, args.tenants, args.keys, tag)
    for start in range(0, len(batch), 500):
        await queue.enqueue_many(batch[start : start + 500])
    started = time.perf_counter()
    acked = await drain(queue, workers)
    took = time.perf_counter() - started
    if acked != args.items:
        raise SystemExit(f"{tag}: drained {acked} of {args.items}")
    return acked / took


async def main(args: argparse.Namespace) -> None:
    async with open_backings(
        args.backend, args.url, clock=SystemClock(), policy=QueuePolicy(), connections=40
    ) as b:
        print(
            f"{args.backend}: {b.where}; {args.items:,} items, {args.tenants} tenants, "
            f"{args.keys} keys, best of {args.rounds}"
        )
        queue = await b.new_queue("flow", QueuePolicy(keep_done=timedelta(0)))
        # Untimed: connections opened, statements prepared, both ways.
        warm = argparse.Namespace(**{**vars(args), "items": 200})
        for limited in (False, True):
            await cell(queue, warm, 10, limited, f"warm-{limited}")
        for workers in args.workers:
            best = {False: 0.0, True: 0.0}
            for r in range(args.rounds):
                for limited in (False, True):
                    tag = f"w{workers}-r{r}-{'on' if limited else 'off'}"
                    rate = await cell(queue, args, workers, limited, tag)
                    best[limited] = max(best[limited], rate)
                    await queue.prune()
            ratio = best[True] / best[False]
            print(
                f"{workers:>2} workers: without limits {best[False]:,.0f}/s, "
                f"with limits {best[True]:,.0f}/s, ratio {ratio:.2f} (target >= 0.85)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("memory", "redis", "postgres"), required=True)
    parser.add_argument("--url")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
