"""The worker: claims an order's work item, processes the order, finishes its run, acks.

``python -m orders_app.worker`` runs until stopped (Ctrl-C or SIGTERM: it
finishes the item in hand first); ``--until-idle`` exits once no item is ready.

One item, over the public ``WorkQueue`` API:

1. ``claim`` a lease (fenced: only this lease may settle the item);
2. do the work while a task ``heartbeat``s the lease, so a long step keeps it;
3. in ONE transaction: mark the order processed, put the run ``succeeded``,
   count the iteration (``patch_run``) and ``ack`` the lease (``bound(session)``),
   so the order, the run and the item agree whatever happens;
4. on an error, ``fail`` the lease: the queue's policy retries the item later
   or, after ``max_attempts``, moves it to the dead letter.

A worker that dies mid-item leaves its lease to expire; ``reap()`` (called
here whenever the queue is idle) hands the item to the next claim.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
from dataclasses import dataclass

import sqlalchemy as sa

from orders_app.models import orders
from orders_app.services import Services
from statepact import Lease, LeaseLostError, RunStatus

POLL_SECONDS = 1.0


class Heartbeat:
    """Extends ``lease`` every third of its length until stopped; ``lease`` is the newest."""

    def __init__(self, services: Services, lease: Lease) -> None:
        self.lease = lease
        self.beats = 0
        self._services = services
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease.lease_seconds / 3)
            self.lease = await self._services.queue.heartbeat(self.lease)
            self.beats += 1

    async def __aenter__(self) -> Heartbeat:
        if self._task is not None:
            raise RuntimeError("a Heartbeat runs once")
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@dataclass(frozen=True)
class Options:
    worker_id: str
    lease_seconds: float = 30.0
    work_seconds: float = 0.0  # how long the work step takes (a model or service call)


async def fulfil(order_id: int, item: str, quantity: int, options: Options) -> str:
    """The work itself: here a shipping label, after ``work_seconds`` of pretended effort."""
    await asyncio.sleep(options.work_seconds)
    return f"PKG-{order_id:06d}-{quantity}x{item.upper()}"


async def process(services: Services, heartbeat: Heartbeat, options: Options) -> str:
    """Process the order the lease names, extending the lease while working; return the
    order's label."""
    lease = heartbeat.lease
    tenant, run_id = lease.item.tenant, lease.item.item_id
    order_id = int(lease.item.payload["order_id"])
    async with heartbeat:
        async with services.sessions() as session:
            row = (
                await session.execute(
                    sa.select(orders.c.item, orders.c.quantity).where(orders.c.id == order_id)
                )
            ).one()
        label = await fulfil(order_id, row.item, row.quantity, options)
    lease = heartbeat.lease  # the newest token: the ack is fenced on it

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
                    "data": {**run.data, "label": label, "worker": options.worker_id},
                }
            )
        )
        await state.patch_run(tenant, run_id, iterations=1)
        await services.queue.bound(session).ack(lease)
    return label


async def work_once(services: Services, options: Options) -> bool:
    """Claim and settle one item; ``False`` when none was ready."""
    lease = await services.queue.claim(options.worker_id, lease_for=options.lease_seconds)
    if lease is None:
        return False
    heartbeat = Heartbeat(services, lease)
    item = lease.item
    try:
        try:
            label = await process(services, heartbeat, options)
        except LeaseLostError:
            raise
        except Exception as exc:
            # Settled on the newest lease: a heartbeat replaced the token the claim gave.
            failed = await services.queue.fail(heartbeat.lease, f"{type(exc).__name__}: {exc}")
            print(
                f"failed order {item.payload.get('order_id')} ({item.tenant}/{item.item_id}): "
                f"{type(exc).__name__}: {exc}; the item is {failed.status.value}",
                flush=True,
            )
            return True
    except LeaseLostError:
        # The lease lapsed and another worker holds the item now: it settles it, not us.
        print(f"lost the lease on {item.tenant}/{item.item_id}", flush=True)
        return True
    print(
        f"processed order {item.payload['order_id']} ({item.tenant}/{item.item_id}): "
        f"{label}, lease extended {heartbeat.beats} times",
        flush=True,
    )
    return True


async def main(options: Options, *, until_idle: bool = False) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    services = await Services.open()
    try:
        while not stopping.is_set():
            if await work_once(services, options):
                continue
            moved = await services.queue.reap()  # items of workers that died, back to ready
            if moved:
                continue
            if until_idle:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), POLL_SECONDS)
    finally:
        await services.close()


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
