"""The HTTP API: ``POST /orders`` places an order, ``GET /orders/{id}`` shows where it is.

Run it with ``uvicorn orders_app.api:app``. Placing an order is ONE SQLAlchemy
transaction (``session.begin()``) holding three writes: the ``orders`` row,
statepact's run (``state.bound(session)``) and the work item for the worker
(``queue.bound(session)``). They commit together, or, when anything fails
before the commit (here: a declined payment), none of them is left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from orders_app.models import orders
from orders_app.payments import PaymentDeclinedError, authorise
from orders_app.services import Services, run_id_for
from statepact import RunRecord, WorkItem

PRICE_CENTS = 1250


class OrderIn(BaseModel):
    customer: str = Field(min_length=1, max_length=100)
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(gt=0, le=1000)
    payment_token: str = Field(min_length=1, max_length=100)


class OrderOut(BaseModel):
    id: int
    customer: str
    item: str
    quantity: int
    status: str
    label: str | None
    run_id: str
    run_status: str | None
    work_status: str | None


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.services = await Services.open()
    try:
        yield
    finally:
        await app.state.services.close()


app = FastAPI(title="orders (statepact example)", lifespan=lifespan)


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


@app.post("/orders", status_code=201)
async def place_order(order: OrderIn, request: Request) -> OrderOut:
    """Write the order, its run and its work item in one transaction; 402 if the card is
    declined, and then nothing was written."""
    app_services = services(request)
    try:
        async with app_services.sessions() as session, session.begin():
            inserted = await session.execute(
                sa.insert(orders)
                .values(customer=order.customer, item=order.item, quantity=order.quantity)
                .returning(orders.c.id)
            )
            order_id = inserted.scalar_one()
            run_id = run_id_for(order_id)
            # statepact's writes join the session's transaction: nothing is committed here.
            await app_services.state.bound(session).put_run(
                RunRecord(
                    tenant=order.customer,
                    run_id=run_id,
                    data={"order_id": order_id, "item": order.item, "quantity": order.quantity},
                )
            )
            await app_services.queue.bound(session).enqueue(
                WorkItem(tenant=order.customer, item_id=run_id, payload={"order_id": order_id})
            )
            # Anything raised before the block ends rolls back all three writes.
            authorise(
                order.payment_token,
                customer=order.customer,
                amount=PRICE_CENTS * order.quantity,
            )
    except PaymentDeclinedError as exc:
        raise HTTPException(status_code=402, detail=str(exc)) from exc
    return await _order(app_services, order_id)


@app.get("/orders/{order_id}")
async def get_order(order_id: int, request: Request) -> OrderOut:
    """The order, its run's status and its work item's status."""
    return await _order(services(request), order_id)


async def _order(app_services: Services, order_id: int) -> OrderOut:
    async with app_services.sessions() as session:
        row: Any = (
            await session.execute(sa.select(orders).where(orders.c.id == order_id))
        ).one_or_none()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    run_id = run_id_for(order_id)
    run = await app_services.state.get_run(row.customer, run_id)
    item = await app_services.queue.get_item(row.customer, run_id)
    return OrderOut(
        id=row.id,
        customer=row.customer,
        item=row.item,
        quantity=row.quantity,
        status=row.status,
        label=row.label,
        run_id=run_id,
        run_status=run.status.value if run else None,
        work_status=item.status.value if item else None,
    )
