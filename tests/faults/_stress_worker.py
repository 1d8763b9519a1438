"""The worker stress lane's handler, and a ``Worker`` process running it (test_worker_stress.py).

:func:`behave` is the one handler every stressed worker runs, in the test's own
process and in these processes alike. What it does with an item is drawn from
the lane's seed, the item and its attempt (so a failure replays with the same
seed): return at once, hold the CPU (past the lease, now and then), hang for
seconds (until it is done or cut), raise :class:`Abort` (a ``BaseException`` that
is not an ``Exception``) or raise a ``RuntimeError``. From its fifth attempt on an
item is only ever quick.

Run as ``python -m tests.faults._stress_worker '<spec JSON>'``: it opens the
queue as ``tests/integration/_queue_worker.py`` does and runs a ``Worker`` whose
hooks append one fsynced line per event to its own log, so the test can read
after a SIGKILL what it did::

    claim <tenant> <item_id> <token>      the handler starts with this lease
    beat <tenant> <item_id> <token>       a heartbeat returned this new token
    acked <tenant> <item_id> <token>      the ack landed with this token
    lost|failed|released <tenant> <item_id> <token>

It stops its Worker and exits 0 once ``stats()`` shows nothing queued or leased.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from statepact.models import WorkItem
from statepact.worker import Job, Worker, WorkerHooks
from tests._processes import say
from tests.integration._queue_worker import Log, open_queue

# A lease short enough that a CPU-bound handler outlasts it now and then, heartbeats
# three times a lease, the reaper every 0.2 s.
LEASE = 0.6
HEARTBEAT = 0.2
REAP = 0.2
CONCURRENCY = 4
# High enough that no run of Aborts, errors, kills and lapses can dead-letter an item; a
# short backoff, so that failed items come back within the lane's seconds.
POLICY = {"max_attempts": 100, "backoff_base": 0.05, "backoff_cap": 0.2, "jitter": 0.5}


class Abort(BaseException):
    """A handler's own ``BaseException`` (not an ``Exception``)."""


def plan(seed: int, job: Job) -> tuple[str, float]:
    """What the handler does for this attempt of this item, and for how long."""
    item = job.item
    rng = random.Random(f"{seed}/{item.tenant}/{item.item_id}/{job.attempts}")
    draw = rng.random()
    if job.attempts > 4 or draw < 0.50:
        return "quick", rng.uniform(0, 0.02)
    if draw < 0.62:
        return "cpu", rng.uniform(0.02, 0.12)
    if draw < 0.65:
        return "cpu", rng.uniform(LEASE + 0.1, LEASE + 0.3)  # the lease lapses meanwhile
    if draw < 0.77:
        return "hang", rng.uniform(0.8, 2.5)
    if draw < 0.87:
        return "abort", 0.0
    if draw < 0.92:
        return "error", 0.0
    return "quick", 0.0


async def behave(seed: int, job: Job) -> None:
    kind, seconds = plan(seed, job)
    if kind == "cpu":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # holds the event loop: no heartbeat meanwhile
            pass
        await asyncio.sleep(0)
    elif kind in ("quick", "hang"):
        await asyncio.sleep(seconds)
    elif kind == "abort":
        raise Abort(f"abort on attempt {job.attempts}")
    elif kind == "error":
        raise RuntimeError(f"error on attempt {job.attempts}")


class Logged(WorkerHooks):
    """Each hook call as a log line."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.counts = {"claim": 0, "beat": 0, "acked": 0, "lost": 0, "failed": 0, "released": 0}

    def line(self, kind: str, job: Job) -> None:
        self.counts[kind] += 1
        self.log.write(kind, job.item.tenant, job.item.item_id, job.lease.token)

    def started(self, job: Job) -> None:
        self.line("claim", job)

    def renewed(self, job: Job) -> None:
        self.line("beat", job)

    def succeeded(self, job: Job, item: WorkItem) -> None:
        self.line("acked", job)

    def failed(self, job: Job, item: WorkItem, error: str) -> None:
        self.line("failed", job)

    def lease_lost(self, job: Job, reason: str) -> None:
        self.line("lost", job)

    def released(self, job: Job, item: WorkItem) -> None:
        self.line("released", job)


async def main(spec: dict[str, Any]) -> None:
    queue, close = await open_queue(spec)
    log = Log(spec["log"])
    hooks = Logged(log)
    seed: int = spec["seed"]

    async def work(job: Job) -> None:
        await behave(seed, job)

    worker = Worker(
        queue,
        default=work,
        concurrency=CONCURRENCY,
        lease_for=LEASE,
        heartbeat_every=HEARTBEAT,
        reap_every=REAP,
        poll_interval=0.05,
        worker_id=spec["worker_id"],
        hooks=hooks,
    )
    try:
        await worker.start()
        say(event="ready")
        while True:
            await asyncio.sleep(0.2)
            stats = await queue.stats()
            if stats.queued == 0 and stats.leased == 0:
                break
        await worker.stop()
        say(event="done", **hooks.counts)
    finally:
        log.close()
        await close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
