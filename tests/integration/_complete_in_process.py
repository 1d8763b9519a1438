"""A ``Worker`` process for ``test_worker_complete_in.py``: a handler that writes a row and
completes its item in that transaction, then waits before committing.

Run as ``python -m tests.integration._complete_in_process '<spec JSON>'``. It opens
the PostgreSQL queue (``SystemClock``), runs a Worker whose handler inserts one
row of ``complete_in_rows`` and calls ``job.complete_in(session)`` in the same
transaction, says ``{"event": "before_commit", ...}`` and sleeps, so the test can
SIGKILL it between the write and the commit.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from statepact.worker import Job, Worker
from tests._processes import say
from tests.integration._queue_worker import open_queue


async def main(spec: dict[str, Any]) -> None:
    queue, close = await open_queue(spec)

    async def startup() -> Any:
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(spec["url"], pool_size=2)

    async def shutdown(engine: Any) -> None:
        await engine.dispose()

    async def handle(job: Job) -> None:
        async with AsyncSession(job.context) as session, session.begin():
            await session.execute(
                text("INSERT INTO complete_in_rows (item_id, attempt) VALUES (:i, :a)"),
                {"i": job.item.item_id, "a": job.attempts},
            )
            await job.complete_in(session)
            say(event="before_commit", item_id=job.item.item_id, attempts=job.attempts)
            await asyncio.sleep(3600)

    worker = Worker(
        queue,
        default=handle,
        lease_for=spec["lease"],
        reap_every=0,
        poll_interval=0.05,
        startup=startup,
        shutdown=shutdown,
    )
    try:
        await worker.run()
    finally:
        await close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
