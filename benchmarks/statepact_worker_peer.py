"""statepact for ``../shared/peers/run.sh``, its queue drained by the ``Worker`` itself.

Run as ``STATEPACT_PEER=benchmarks/statepact_worker_peer.py ../shared/peers/run.sh``.
It prints the same JSON lines, under the same scenario names, as the shared
``statepact_peer.py``: the transaction and state rows come from that script's own
functions (imported, run unchanged), and the queue rows follow the same
``queuebench.run_rounds`` protocol, except that ``statepact.<backing>.process`` and
``.process.c40`` are a :class:`statepact.worker.Worker` with ``concurrency`` 10 and
40 and a no-op handler, timed from ``start()`` to the N-th handler's ack (the
claims, heartbeats and acks are the Worker's, not hand-written loops). Each row's
``params`` says ``driver: "worker"``. One more row per server,
``statepact.<backing>.worker.wake``: 200 items enqueued one at a time to an idle
Worker (concurrency 10), the time from the enqueue call to the handler's start
(``ops_per_s`` is 1 / the mean), with ``p50_ms``, ``p99_ms`` and ``max_ms`` beside
``poll_interval_s``, the fallback poll the wake-ups replace. And on Redis and
PostgreSQL, ``statepact.<backing>.process.p1`` and ``.process.p2``: ``statepact
worker --processes 1`` and ``2`` (a no-op task, the Worker's defaults otherwise)
draining ``--process-items`` items enqueued in batches, timed until the server
counts nothing queued or leased and checked after (nothing queued, leased or
dead); the ``.p2`` row's ``params`` carries ``vs_p1``, its ratio to ``.p1``
(``benchmarks/worker_processes.py`` is the drain).

Needs the shared peers directory on ``PYTHONPATH`` (run.sh sets it) and statepact
installed in the bench venv (run.sh installs the checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import REDIS_HOST, REDIS_PORT, Timer, emit, emit_failure, log, versions
from queuebench import WARMUP_JOBS, run_rounds
from statepact_peer import DB, Backing, pg_url, state_calls, tx_scenarios

from statepact.models import WorkItem
from statepact.worker import Job, Worker, WorkerHooks

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_processes  # the drain by `statepact worker --processes N`


async def worker_drain(queue: Any, count: int, concurrency: int, budget: float) -> Timer:
    """A Worker with a no-op handler, timed from start until ``count`` items are acked."""
    acked = 0
    finished = asyncio.Event()

    class Count(WorkerHooks):
        def succeeded(self, job: Job, item: WorkItem) -> None:
            nonlocal acked
            acked += 1
            if acked >= count:
                finished.set()

    async def noop(job: Job) -> None:
        return None

    worker = Worker(
        queue,
        default=noop,
        concurrency=concurrency,
        lease_for=60,
        poll_interval=0.01,
        hooks=Count(),
    )
    with Timer() as timer:
        await worker.start()
        try:
            await asyncio.wait_for(finished.wait(), budget)
        finally:
            await worker.stop()
    if acked < count:
        raise TimeoutError(f"the worker acked {acked} of {count} in {budget} s")
    return timer


async def wake_latency(queue: Any, samples: int, poll_interval: float) -> dict[str, float]:
    """Enqueue-to-handler-start with an idle Worker (concurrency 10): one item at a time,
    each enqueued once the worker has gone idle again; seconds per sample, sorted."""
    started: asyncio.Queue[float] = asyncio.Queue()

    async def handler(job: Job) -> None:
        started.put_nowait(time.perf_counter())

    worker = Worker(
        queue, default=handler, concurrency=10, lease_for=60, poll_interval=poll_interval
    )
    waits: list[float] = []
    await worker.start()
    try:
        await asyncio.sleep(0.2)  # the worker found the queue empty and waits for work
        for n in range(samples):
            sent = time.perf_counter()
            await queue.enqueue(WorkItem(tenant=f"w{n % 10}", item_id=f"wake-{n}", payload={}))
            waits.append(await asyncio.wait_for(started.get(), poll_interval * 3) - sent)
            await asyncio.sleep(0.02)  # its ack lands and the worker is idle again
    finally:
        await worker.stop()
    waits.sort()
    return {
        "p50_ms": round(1000 * waits[len(waits) // 2], 2),
        "p99_ms": round(1000 * waits[min(len(waits) - 1, (len(waits) * 99) // 100)], 2),
        "max_ms": round(1000 * waits[-1], 2),
        "mean_s": sum(waits) / len(waits),
    }


async def queue_rounds(b: Backing, n: int, conc: int, loops: int, budget: float) -> None:
    q = b.queue
    counter = [0]
    common = {
        "versions": versions("statepact", "redis", "sqlalchemy", "asyncpg"),
        "backing": b.kind,
        "driver": "worker",
    }

    def next_fields() -> dict[str, Any]:
        counter[0] += 1
        return {
            "tenant": f"t{counter[0] % 10}",
            "item_id": f"i{counter[0]}",
            "payload": {"n": counter[0]},
        }

    def next_item() -> WorkItem:
        return WorkItem(**next_fields())

    async def enqueue_one() -> None:
        await q.enqueue(next_item())

    async def process(fill: str, expected_total: int, cfg: dict[str, Any]) -> None:
        count = WARMUP_JOBS if fill == "warmup" else n
        concurrency = cfg.get("concurrency", loops)
        timer = await worker_drain(q, count, concurrency, budget)
        if fill == "warmup":
            return
        name = f"statepact.{b.kind}.process" + (".c40" if concurrency == 40 else "")
        emit(name, count, timer, fill=fill, worker_concurrency=concurrency, **common)

    enqueue_batch = None
    if hasattr(q, "enqueue_many"):
        # The bulk API's documented plain form (docs/work-queue.md#enqueueing-a-batch), as
        # pgqueuer's list form: no model built per item only for the queue to check it.
        async def enqueue_batch(k: int) -> None:
            await q.enqueue_many([next_fields() for _ in range(k)])

    await run_rounds(
        f"statepact.{b.kind}",
        n,
        conc,
        enqueue_one,
        enqueue_batch,
        process,
        common,
        {"concurrency": 40},
        no_batch_reason="statepact has no bulk enqueue (enqueue one item a call)",
    )
    # Wake-ups: how soon an idle worker starts a new item, beside the poll it replaces.
    poll = 1.0
    samples = 200
    try:
        with Timer() as timer:
            found = await wake_latency(q, samples, poll)
        mean = found.pop("mean_s")
        emit(
            f"statepact.{b.kind}.worker.wake",
            samples,
            samples * mean,
            poll_interval_s=poll,
            **found,
            **timer.cpu_params(),
            **common,
        )
    except Exception as e:
        emit_failure(f"statepact.{b.kind}.worker.wake", e, **common)


async def process_rounds(kind: str, items: int) -> None:
    """``statepact worker --processes 1`` and ``2`` on the server ``kind``, one drain each."""
    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/6" if kind == "redis" else pg_url(DB)
    common = {
        "versions": versions("statepact", "redis", "sqlalchemy", "asyncpg"),
        "backing": kind,
        "driver": "worker --processes",
    }
    took: dict[int, float] = {}
    for processes in (1, 2):
        name = f"statepact.{kind}.process.p{processes}"
        try:
            took[processes] = await worker_processes.drain(kind, url, processes, items)
        except Exception as e:
            emit_failure(name, e, **common)
            return
        extra = {"vs_p1": round(took[1] / took[2], 3)} if processes == 2 else {}
        emit(name, items, took[processes], processes=processes, **extra, **common)


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--backing", action="append", choices=["memory", "redis", "postgres"])
    ap.add_argument("--agents", type=int, default=40)
    ap.add_argument("--per-agent", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--reps-fast", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--producers", type=int, default=40)
    ap.add_argument("--worker-concurrency", type=int, default=10)
    ap.add_argument("--state-per", type=int, default=250)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--process-items", type=int, default=20_000)
    ap.add_argument("--only", choices=["tx", "queue", "state"], action="append")
    args = ap.parse_args()
    parts = args.only or ["tx", "queue", "state"]
    for kind in args.backing or ["memory", "redis", "postgres"]:
        # The pool fits 40 producers, or a 40-slot Worker (it holds concurrency + 1).
        b = Backing(kind, max(args.agents, args.producers))
        log(f"statepact_worker_peer: {kind}")
        began = time.monotonic()
        try:
            await b.open()
        except Exception as e:
            emit_failure(f"statepact.{kind}.open", e)
            continue
        try:
            if "tx" in parts:
                await tx_scenarios(b, args.agents, args.per_agent, args.reps, args.reps_fast)
            if "queue" in parts:
                try:
                    await queue_rounds(
                        b, args.jobs, args.producers, args.worker_concurrency, args.timeout
                    )
                except Exception as e:
                    emit_failure(f"statepact.{kind}.queue", e)
            if "state" in parts:
                await state_calls(b, args.agents, args.state_per)
            if "queue" in parts and kind != "memory":
                await process_rounds(kind, args.process_items)
        finally:
            await b.close()
            log(f"statepact_worker_peer: {kind} took {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    asyncio.run(main())
