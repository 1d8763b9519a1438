"""A claimer process of the flow-control fault test (test_flow_control_faults.py).

Run as ``python -m tests.faults._flow_worker '<spec JSON>'``: it opens the queue the
spec names (``tests.integration._queue_worker.open_queue``) and claims in batches,
up to ``concurrency`` items at a time, each handled for a few milliseconds and
acked. Before its handler starts it appends ``claim <tenant> <item_id> <weight>
<claimed at µs>`` to its log and fsyncs it (the claim time is the lease's
``updated_at``, the moment the queue counted the item's weight), and after an ack
``acked <tenant> <item_id>``: the test reads them after a SIGKILL. Idle, it sleeps
until ``next_due()`` (a rate's next room), at most 50 ms. It never ends by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from typing import Any

from statepact.clock import to_micros
from statepact.models import Lease
from tests.integration._queue_worker import open_queue


async def main(spec: dict[str, Any]) -> None:
    queue, close = await open_queue(spec)
    rng = random.Random(spec["worker_id"])
    fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    running: set[asyncio.Task[None]] = set()

    def line(text: str) -> None:
        os.write(fd, (text + "\n").encode())
        os.fsync(fd)

    async def handle(lease: Lease) -> None:
        await asyncio.sleep(rng.uniform(0.005, 0.04))
        await queue.ack(lease)
        line(f"acked {lease.item.tenant} {lease.item.item_id}")

    try:
        while True:
            free = spec["concurrency"] - len(running)
            leases = (
                []
                if free <= 0
                else await queue.claim_batch(spec["worker_id"], lease_for=spec["lease"], limit=free)
            )
            for lease in leases:
                item = lease.item
                assert item.updated_at is not None
                line(
                    f"claim {item.tenant} {item.item_id} {item.weight} {to_micros(item.updated_at)}"
                )
                task = asyncio.ensure_future(handle(lease))
                running.add(task)
                task.add_done_callback(running.discard)
            if not leases:
                due = await queue.next_due()
                wait = 0.05
                if due is not None:
                    wait = min(wait, max(0.001, (due - queue.clock.now()).total_seconds()))
                await asyncio.sleep(wait)
    finally:
        await close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
