"""A ``Worker`` process for ``test_worker_crash.py``: drains a real queue through the Worker.

Run as ``python -m tests.integration._worker_process '<spec JSON>'``. It opens
the queue as ``_queue_worker.py`` does (its own client or engine, ``SystemClock``)
and runs a :class:`statepact.worker.Worker` (``concurrency`` slots, heartbeats,
its reaper) whose one handler sleeps ``work`` seconds (``long_work`` for one item
in ``long_every``, so heartbeats land). Its hooks and the handler
append one line per event to this process's own log file, fsynced before the
process goes on, so the test can read after any SIGKILL what it did::

    claim <tenant> <item_id> <token>    the handler starts with this lease (hook)
    beat <tenant> <item_id> <token>     a heartbeat returned this new token (hook)
    ack <tenant> <item_id> <token>      the handler returned; the ack comes next
    acked <tenant> <item_id> <token>    the ack landed with this token (hook)
    lost <tenant> <item_id> <token>     the lease was lost; nothing settled (hook)
    failed <tenant> <item_id> <token>   the item was failed (hook; never expected here)

It stops its Worker and exits 0 once ``stats()`` shows nothing queued or leased
(the test enqueues everything first), printing a JSON ``done`` event.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

from statepact.models import WorkItem
from statepact.worker import Handler, Job, Worker, WorkerHooks
from tests._processes import say
from tests.integration._queue_worker import Log, open_queue


class Logged(WorkerHooks):
    """Each hook call as a log line."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.counts = {"claim": 0, "beat": 0, "acked": 0, "lost": 0, "failed": 0}

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


async def serve(
    spec: dict[str, Any], work: Callable[[Log], Handler], hooks: type[Logged] = Logged
) -> None:
    """Open the queue, run a Worker with the handler ``work(log)`` makes and ``hooks`` logging
    to this process's log, until nothing is queued or leased; say ``ready`` and ``done``."""
    queue, close = await open_queue(spec)
    log = Log(spec["log"])
    logged = hooks(log)
    worker = Worker(
        queue,
        default=work(log),
        concurrency=spec["concurrency"],
        lease_for=spec["lease"],
        heartbeat_every=spec["heartbeat"],
        reap_every=spec["reap"],
        poll_interval=0.05,
        worker_id=spec["worker_id"],
        hooks=logged,
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
        say(event="done", **logged.counts)
    finally:
        log.close()
        await close()


async def main(spec: dict[str, Any]) -> None:
    def work(log: Log) -> Handler:
        async def sleep(job: Job) -> None:
            # One item in ``long_every`` outlasts two heartbeats (but not a lease).
            long = job.payload.get("n", 1) % spec["long_every"] == 0
            await asyncio.sleep(spec["long_work"] if long else spec["work"])
            log.write("ack", job.item.tenant, job.item.item_id, job.lease.token)

        return sleep

    await serve(spec, work)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
