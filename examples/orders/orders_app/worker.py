"""The worker: a statepact ``Worker`` that processes each order's work item.

``python -m orders_app.worker`` runs until stopped (Ctrl-C or SIGTERM: it
finishes the items in hand first); ``--until-idle`` exits once no item is ready.
``statepact worker orders_app.worker:worker`` runs the same ``worker`` from the
command line (it opens the queue from ``STATEPACT_POSTGRES_URL``).

The ``Worker`` claims, heartbeats the lease while the handler runs, and settles:

1. ``startup`` opens the application's services once per process (the engine,
   the session factory, statepact's stores); each handler reaches them as
   ``job.context``, and ``shutdown`` disposes of the engine when the worker stops;
2. the handler does the work, then in ONE transaction marks the order
   processed, puts the run ``succeeded``, counts the iteration (``patch_run``)
   and completes the item (``job.complete_in(session)``: the fenced ack is a
   statement of that transaction), so the order, the run and the item agree
   whatever happens;
3. if the handler raises (the transaction rolled back), the worker fails the
   item: the queue's policy (``POLICY``) retries it later or, after
   ``max_attempts``, moves it to the dead letter.

A worker that dies mid-item leaves its lease to expire; the worker's reaper hands
the item to the next claim.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time
from dataclasses import dataclass

import sqlalchemy as sa

from orders_app.models import orders
from orders_app.services import POLICY, Services
from orders_app.settings import store_settings
from statepact import RunStatus, WorkItem
from statepact.storage.postgres import PostgresWorkQueue, create_engine
from statepact.worker import Job, Worker, WorkerHooks

IDLE_CHECK_SECONDS = 0.2


@dataclass(frozen=True)
class Options:
    worker_id: str
    lease_seconds: float = 30.0
    work_seconds: float = 0.0  # how long the work step takes (a model or service call)


async def fulfil(order_id: int, item: str, quantity: int, options: Options) -> str:
    """The work itself: here a shipping label, after ``work_seconds`` of pretended effort."""
    await asyncio.sleep(options.work_seconds)
    return f"PKG-{order_id:06d}-{quantity}x{item.upper()}"


class Report(WorkerHooks):
    """One line per item settled, and how often its lease was extended meanwhile."""

    def __init__(self) -> None:
        self.beats: dict[str, int] = {}
        self.labels: dict[str, str] = {}
        self.last_seen = time.monotonic()  # the last item started or settled

    def started(self, job: Job) -> None:
        self.last_seen = time.monotonic()

    def renewed(self, job: Job) -> None:
        self.beats[job.item.item_id] = self.beats.get(job.item.item_id, 0) + 1

    def succeeded(self, job: Job, item: WorkItem) -> None:
        self.last_seen = time.monotonic()
        print(
            f"processed order {item.payload['order_id']} ({item.tenant}/{item.item_id}): "
            f"{self.labels.pop(item.item_id, '?')}, lease extended "
            f"{self.beats.pop(item.item_id, 0)} times",
            flush=True,
        )

    def failed(self, job: Job, item: WorkItem, error: str) -> None:
        self.last_seen = time.monotonic()
        self.beats.pop(item.item_id, None)
        print(
            f"failed order {item.payload.get('order_id')} ({item.tenant}/{item.item_id}): "
            f"{error}; the item is {item.status.value}",
            flush=True,
        )

    def lease_lost(self, job: Job, reason: str) -> None:
        # The lease lapsed and another worker holds the item now: it settles it, not us.
        print(f"lost the lease on {job.item.tenant}/{job.item.item_id}", flush=True)


def build(options: Options, report: Report | None = None) -> Worker:
    """The worker: the services as its context, the example's retry policy, one handler."""
    report = report or Report()
    worker = Worker(
        worker_id=options.worker_id,
        lease_for=options.lease_seconds,
        policy=POLICY,
        startup=Services.open,
        shutdown=Services.close,
        hooks=report,
    )

    @worker.set_default  # the items name no task: every one is an order to process
    async def process(job: Job) -> None:
        services: Services = job.context
        tenant, run_id = job.item.tenant, job.item.item_id
        order_id = int(job.payload["order_id"])
        async with services.sessions() as session:
            row = (
                await session.execute(
                    sa.select(orders.c.item, orders.c.quantity).where(orders.c.id == order_id)
                )
            ).one()
        label = await fulfil(order_id, row.item, row.quantity, options)

        async with services.sessions() as session, session.begin():
            await session.execute(
                sa.update(orders)
                .where(orders.c.id == order_id)
                .values(status="processed", label=label, processed_at=sa.func.now())
            )
            state = services.state.bound(session)
            run = await state.get_run(tenant, run_id)
            if run is None:
                raise LookupError(f"order {order_id} has no run {run_id!r}")
            run = await state.put_run(
                run.model_copy(
                    update={
                        "status": RunStatus.SUCCEEDED,
                        "data": {**run.data, "label": label, "worker": job.worker_id},
                    }
                )
            )
            await state.patch_run(tenant, run_id, iterations=1)
            await job.complete_in(session)  # the ack commits with the order and the run
        report.labels[run_id] = label

    return worker


#: For ``statepact worker orders_app.worker:worker``.
worker = build(Options(worker_id=f"{socket.gethostname()}-{os.getpid()}"))


async def idle(worker: Worker, report: Report, queue: PostgresWorkQueue) -> bool:
    """Nothing in hand, and no item started for two poll intervals: the worker claims
    whenever a slot is free, so nothing was ready (an item waiting for its retry is not)."""
    if worker.in_flight or time.monotonic() - report.last_seen < 2 * worker.poll_interval:
        return False
    return (await queue.stats()).leased == 0


async def main(options: Options, *, until_idle: bool = False) -> None:
    settings = store_settings()
    engine = create_engine(settings)  # the queue's; the handlers use the services' engine
    try:
        queue = await PostgresWorkQueue.open(engine, settings=settings, policy=POLICY)
        report = Report()
        chosen = build(options, report).bind(queue)
        if not until_idle:
            await chosen.run()  # until SIGTERM or Ctrl-C, then drains
            return
        async with chosen:
            while not await idle(chosen, report, queue):  # noqa: ASYNC110 -- polls the server
                await asyncio.sleep(IDLE_CHECK_SECONDS)
    finally:
        await engine.dispose()


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m orders_app.worker")
    parser.add_argument("--until-idle", action="store_true", help="exit once no item is ready")
    parser.add_argument(
        "--worker-id", default=f"{socket.gethostname()}-{os.getpid()}", help="names the leases"
    )
    parser.add_argument("--lease-seconds", type=float, default=30.0, help="length of a lease")
    parser.add_argument(
        "--work-seconds", type=float, default=0.0, help="how long the pretended work takes"
    )
    args = parser.parse_args()
    options = Options(args.worker_id, args.lease_seconds, args.work_seconds)
    asyncio.run(main(options, until_idle=args.until_idle))


if __name__ == "__main__":
    cli()
