"""The worker stress lane's handler, and a ``Worker`` process running it (test_worker_stress.py).

:func:`behave` is the one handler every stressed worker runs, in the test's own
process and in these processes alike. What it does with an item is drawn from
the lane's seed, the item and its attempt (so a failure replays with the same
seed): return at once, hold the CPU (past the lease, now and then), hang for
seconds (until it is done or cut), raise :class:`Abort` (a ``BaseException`` that
is not an ``Exception``) or raise a ``RuntimeError``. From its fifth attempt on an
item is only ever quick.

Run as ``python -m tests.faults._stress_worker '<spec JSON>'``: it runs a
``Worker`` as ``tests/integration/_worker_process.py`` does (the crash test's),
whose hooks append one fsynced line per event to its own log, so the test can
read after a SIGKILL what it did::

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
from statepact.worker import Handler, Job
from tests.integration import _worker_process as process
from tests.integration._queue_worker import Log

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


class Logged(process.Logged):
    """The crash test's hook lines, and ``released`` too."""

    def __init__(self, log: Log) -> None:
        super().__init__(log)
        self.counts["released"] = 0

    def released(self, job: Job, item: WorkItem) -> None:
        self.line("released", job)


async def main(spec: dict[str, Any]) -> None:
    seed: int = spec["seed"]

    def work(log: Log) -> Handler:
        async def stressed(job: Job) -> None:
            await behave(seed, job)

        return stressed

    settings = {"concurrency": CONCURRENCY, "lease": LEASE, "heartbeat": HEARTBEAT, "reap": REAP}
    await process.serve({**spec, **settings}, work, Logged)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
