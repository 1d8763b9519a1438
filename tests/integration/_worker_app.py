"""A worker application for ``test_worker_cli.py``, run by ``statepact worker`` in a subprocess.

``tests.integration._worker_app:worker`` is a ``Worker`` defined without a queue
(the command binds it); ``:make`` is a factory taking the queue. The one task,
``sleep``, sleeps ``payload["seconds"]`` and appends ``start <item_id>``,
``end <item_id>`` or ``cancelled <item_id>`` to the file named by
``STATEPACT_TEST_WORKER_LOG``, so the test can see where SIGTERM found each handler.
"""

from __future__ import annotations

import asyncio
import os

from statepact.queue import WorkQueue
from statepact.worker import Job, Worker

LOG_ENV = "STATEPACT_TEST_WORKER_LOG"


def note(kind: str, job: Job) -> None:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(f"{kind} {job.item.item_id}\n")


async def sleep(job: Job) -> None:
    note("start", job)
    try:
        await asyncio.sleep(float(job.payload["seconds"]))
    except asyncio.CancelledError:
        note("cancelled", job)
        raise
    note("end", job)


worker = Worker(
    handlers={"sleep": sleep}, concurrency=2, lease_for=10, grace_period=1.0, poll_interval=0.05
)


def make(queue: WorkQueue) -> Worker:
    return Worker(queue, handlers={"sleep": sleep}, lease_for=10, poll_interval=0.05)
