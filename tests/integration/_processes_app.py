"""A worker application for ``test_worker_processes.py``: one task that notes its process.

``record`` appends ``<pid> <item_id>`` to the file named by
``STATEPACT_TEST_WORKER_LOG`` after sleeping ``payload["seconds"]``, so the test can
see which of ``statepact worker --processes N``'s children ran each item.
"""

from __future__ import annotations

import asyncio
import os

from statepact.worker import Job, Worker
from tests.integration._worker_app import LOG_ENV


def note(job: Job) -> None:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(f"{os.getpid()} {job.item.item_id}\n")


async def record(job: Job) -> None:
    await asyncio.sleep(float(job.payload.get("seconds", 0)))
    note(job)


worker = Worker(
    handlers={"record": record}, concurrency=4, lease_for=10, grace_period=1.0, poll_interval=0.05
)
