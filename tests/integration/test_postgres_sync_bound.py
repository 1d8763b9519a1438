"""``bound(session)`` on sync SQLAlchemy (psycopg), in a Flask-style application, against a
real PostgreSQL, with an async ``Worker`` taking the work on the same database.

The application is what Flask with Flask-SQLAlchemy runs: a sync engine on psycopg, a
``scoped_session`` (``db.session``), and a request-scoped transaction that commits
when the view returns and rolls back when it raises. A request writes an order (the
application's own table), its run and its work item in that one transaction:

- a request that rolls back leaves nothing, and a running worker never claims the item;
- a request that commits is claimed by the worker at once: the enqueue's NOTIFY is
  part of the transaction, so an idle worker whose fallback poll is 10 s starts the
  item well within a second of the commit.

The blocking adapters refuse what the async ones refuse (bad input before anything is
sent, a session outside a transaction, a failed transaction) and keep savepoints.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from statepact import OutOfTurnError, PostgresStoreSettings
from statepact.errors import RunNotFoundError, StateConflictError, StatePersistenceError
from statepact.models import ItemStatus, RunRecord, SessionRecord, WorkItem
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue, create_engine
from statepact.storage.postgres.sync import SyncBoundStateStore, SyncBoundWorkQueue
from statepact.worker import Job, Worker

pytestmark = pytest.mark.integration

POLL = 10.0  # the worker's fallback poll: a start well under it came from the NOTIFY
WAKE_BOUND = 1.0  # what docs/worker.md promises an idle worker: well under a second


class Stores:
    """The async stores (the worker's side) and the Flask-style app's sync engine."""

    def __init__(self, state: PostgresStateStore, queue: PostgresWorkQueue, sync: Engine) -> None:
        self.state = state
        self.queue = queue
        self.sync = sync
        self.db = scoped_session(sessionmaker(sync))  # Flask-SQLAlchemy's db.session

    def request(self, view: Callable[[], Any]) -> Any:
        """One request, as Flask-SQLAlchemy scopes it: the view runs in a transaction of
        the thread's session, committed when it returns, rolled back when it raises; the
        session is removed at the end of the request either way."""
        try:
            with self.db.begin():
                return view()
        finally:
            self.db.remove()

    def orders(self) -> list[str]:
        with self.sync.connect() as conn:
            return list(conn.execute(text("SELECT id FROM orders ORDER BY id")).scalars())


@pytest.fixture
async def stores(pg_database_url: str) -> AsyncIterator[Stores]:
    settings = PostgresStoreSettings(dsn=pg_database_url, queue_name="orders", pool_size=6)
    engine = create_engine(settings)
    psycopg = make_url(pg_database_url).set(drivername="postgresql+psycopg")
    sync = create_sync_engine(psycopg)
    with sync.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id text PRIMARY KEY, item text NOT NULL)"))
    try:
        yield Stores(
            PostgresStateStore(engine, settings=settings),
            PostgresWorkQueue(engine, settings=settings),
            sync,
        )
    finally:
        sync.dispose()
        await engine.dispose()


def place_order(stores: Stores, order_id: str, *, fail: bool = False) -> RunRecord:
    """The view: the order, its run and its work item, in the request's transaction."""
    session = stores.db()
    session.execute(text("INSERT INTO orders (id, item) VALUES (:id, 'book')"), {"id": order_id})
    run = stores.state.bound(stores.db).put_run(
        RunRecord(tenant="acme", run_id=order_id, data={"order": order_id})
    )
    stores.queue.bound(stores.db).enqueue(
        WorkItem(tenant="acme", item_id=order_id, payload={"task": "fulfil", "run": order_id})
    )
    if fail:
        raise ValueError("the payment was declined")
    return run


def _worker(
    stores: Stores, started: asyncio.Queue[tuple[str, float]], *, poll_interval: float = POLL
) -> Worker:
    async def fulfil(job: Job) -> None:
        started.put_nowait((job.item.item_id, time.monotonic()))

    return Worker(
        stores.queue, handlers={"fulfil": fulfil}, poll_interval=poll_interval, reap_every=0
    )


async def test_a_request_that_rolls_back_leaves_nothing_for_the_worker(stores: Stores) -> None:
    """The view raises after its writes: no order, no run, no item; a worker running all
    along, polling every 0.1 s as well as listening, never claims anything."""
    started: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    worker = _worker(stores, started, poll_interval=0.1)
    async with worker:
        with pytest.raises(ValueError, match="declined"):
            await asyncio.to_thread(
                stores.request, lambda: place_order(stores, "o-rolled-back", fail=True)
            )
        await asyncio.sleep(1.0)  # ten polls and any wake-up
    assert started.empty()
    assert await stores.queue.get_item("acme", "o-rolled-back") is None
    assert await stores.state.get_run("acme", "o-rolled-back") is None
    assert stores.orders() == []
    assert (await stores.queue.stats()).tenants == {}


async def test_a_committed_request_is_claimed_by_an_async_worker_at_once(stores: Stores) -> None:
    """Five requests, one at a time, to an idle worker whose poll is 10 s: each item starts
    within a second of its commit, so the sync path sent the queue's NOTIFY."""
    started: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
    latencies: list[float] = []
    async with _worker(stores, started):
        for n in range(5):
            await asyncio.sleep(0.1)  # the worker is idle, waiting on its LISTEN
            order_id = f"o-{n}"
            run = await asyncio.to_thread(stores.request, lambda o=order_id: place_order(stores, o))
            committed = time.monotonic()
            assert run.version == 1
            claimed, at = await asyncio.wait_for(started.get(), POLL / 2)
            assert claimed == order_id
            latencies.append(at - committed)
    print(f"\ncommit to start: {', '.join(f'{s * 1000:.0f} ms' for s in latencies)}")
    assert max(latencies) < WAKE_BOUND, latencies
    assert stores.orders() == [f"o-{n}" for n in range(5)]
    for n in range(5):
        item = await stores.queue.get_item("acme", f"o-{n}")
        assert item is not None and item.status == ItemStatus.DONE


async def test_the_blocking_calls_return_what_the_async_ones_return(stores: Stores) -> None:
    """put_run, patch_run, put_session, enqueue, enqueue_many: plain calls on a Session,
    their records as the async bound form returns them, and committed together."""
    run_id = f"r-{uuid.uuid4().hex[:8]}"

    def view() -> tuple[RunRecord, RunRecord, SessionRecord, list[WorkItem]]:
        state = stores.state.bound(stores.db())
        queue = stores.queue.bound(stores.db())
        assert isinstance(state, SyncBoundStateStore)
        assert isinstance(queue, SyncBoundWorkQueue)
        created = state.put_run(RunRecord(tenant="acme", run_id=run_id, data={"step": 1}))
        patched = state.patch_run("acme", run_id, input_tokens=1200, cost="0.0081", iterations=1)
        put = state.put_run(patched.model_copy(update={"data": {"step": 2}}))
        assert (created.version, patched.version, put.version) == (1, 2, 3)
        session = state.put_session(SessionRecord(tenant="acme", session_id=run_id))
        first = queue.enqueue(WorkItem(tenant="acme", item_id=f"{run_id}-a"), delay=60)
        rest = queue.enqueue_many(
            [WorkItem(tenant="acme", item_id=f"{run_id}-b"), WorkItem(tenant="beta", item_id="c")]
        )
        again = queue.enqueue(WorkItem(tenant="acme", item_id=f"{run_id}-a"))  # idempotent
        assert again.available_at == first.available_at
        return patched, put, session, [first, *rest]

    patched, put, session, items = await asyncio.to_thread(stores.request, view)
    stored = await stores.state.get_run("acme", run_id)
    assert stored is not None
    assert (stored.version, stored.data, stored.input_tokens, str(stored.cost)) == (
        3,
        {"step": 2},
        1200,
        "0.008100000",
    )
    assert (put.data, put.version, put.cost) == (stored.data, stored.version, stored.cost)
    assert patched.iterations == stored.iterations == 1
    assert session.version == 1
    assert await stores.state.get_session("acme", run_id) is not None
    for item in items:
        found = await stores.queue.get_item(item.tenant, item.item_id)
        assert found is not None and found.status == ItemStatus.QUEUED
        assert found.available_at == item.available_at


async def test_a_sync_connection_works_too(stores: Stores) -> None:
    """``engine.begin()``'s Connection: the enqueue commits with the block."""

    def write() -> None:
        with stores.sync.begin() as conn:
            stores.queue.bound(conn).enqueue(WorkItem(tenant="acme", item_id="on-conn"))

    await asyncio.to_thread(write)
    assert await stores.queue.get_item("acme", "on-conn") is not None


def _session_calls(stores: Stores) -> dict[str, Callable[[Any], Any]]:
    return {
        "put_run": lambda s: stores.state.bound(s).put_run(RunRecord(tenant="acme", run_id="x")),
        "patch_run": lambda s: stores.state.bound(s).patch_run("acme", "x", iterations=1),
        "put_session": lambda s: stores.state.bound(s).put_session(
            SessionRecord(tenant="acme", session_id="x")
        ),
        "enqueue": lambda s: stores.queue.bound(s).enqueue(WorkItem(tenant="acme", item_id="x")),
        "enqueue_many": lambda s: stores.queue.bound(s).enqueue_many(
            [WorkItem(tenant="acme", item_id="x")]
        ),
    }


async def test_out_of_turn_is_refused_as_on_the_async_form(stores: Stores) -> None:
    """Every call refuses a Session outside a transaction (it would autobegin one nobody
    commits), a closed Connection and a failed transaction, sending nothing."""

    def refusals() -> dict[str, list[str]]:
        seen: dict[str, list[str]] = {}
        for name, call in _session_calls(stores).items():
            messages = seen[name] = []
            with Session(stores.sync) as session:
                with pytest.raises(OutOfTurnError) as refused:
                    call(session)
                messages.append(str(refused.value))
                assert not session.in_transaction()  # nothing autobegun
            conn = stores.sync.connect()
            conn.close()
            with pytest.raises(OutOfTurnError) as refused:
                call(conn)
            messages.append(str(refused.value))
            with Session(stores.sync) as session, session.begin():
                with pytest.raises(Exception, match="does_not_exist"):
                    session.execute(text("SELECT * FROM does_not_exist"))
                with pytest.raises(OutOfTurnError) as refused:
                    call(session)
                messages.append(str(refused.value))
                session.rollback()
        return seen

    seen = await asyncio.to_thread(refusals)
    for name, (outside, closed, failed) in seen.items():
        assert "not inside a transaction" in outside, name
        assert "with session.begin()" in outside, name
        assert "is closed" in closed, name
        assert "roll" in failed, name
    assert await stores.queue.get_item("acme", "x") is None
    assert await stores.state.get_run("acme", "x") is None


async def test_bad_input_is_refused_before_anything_is_sent(stores: Stores) -> None:
    """The front's validation, the same as async: nothing reaches the transaction."""
    big = {"blob": "x" * (PostgresStoreSettings().max_value_bytes + 1)}

    def view() -> list[str]:
        state, queue = stores.state.bound(stores.db), stores.queue.bound(stores.db)
        refused = []
        for call in (
            lambda: state.put_run(RunRecord(tenant="", run_id="r")),
            lambda: state.patch_run("acme", "r", iterations=-1),
            lambda: queue.enqueue_many([]),
            lambda: queue.enqueue(WorkItem(tenant="acme", item_id="i", queue="elsewhere")),
            lambda: queue.enqueue(WorkItem(tenant="acme", item_id="i", payload=big)),
        ):
            with pytest.raises((ValueError, TypeError, StatePersistenceError)) as exc:
                call()
            refused.append(str(exc.value))
        # The transaction is untouched and still commits.
        stores.db.execute(text("INSERT INTO orders (id, item) VALUES ('kept', 'pen')"))
        return refused

    refused = await asyncio.to_thread(stores.request, view)
    assert refused[0].startswith("tenant:")
    assert refused[1].startswith("iterations:")
    assert refused[2].startswith("items:")
    assert refused[3].startswith("queue:")
    assert "payload" in refused[4]
    assert stores.orders() == ["kept"]


async def test_conflicts_and_missing_runs_raise_as_on_the_async_form(stores: Stores) -> None:
    def view() -> None:
        state = stores.state.bound(stores.db)
        state.put_run(RunRecord(tenant="acme", run_id="c1"))
        with pytest.raises(StateConflictError):
            state.put_run(RunRecord(tenant="acme", run_id="c1"))  # version 0: exists
        with pytest.raises(RunNotFoundError):
            state.patch_run("acme", "missing", iterations=1)

    await asyncio.to_thread(stores.request, view)
    assert await stores.state.get_run("acme", "c1") is not None


async def test_a_savepoint_rolls_back_its_enqueue_alone(stores: Stores) -> None:
    """``begin_nested()``: the item enqueued in the savepoint goes with it; the rest commits."""

    def view() -> None:
        session = stores.db()
        stores.queue.bound(session).enqueue(WorkItem(tenant="acme", item_id="kept"))
        with pytest.raises(RuntimeError), session.begin_nested():
            stores.queue.bound(session).enqueue(WorkItem(tenant="acme", item_id="dropped"))
            raise RuntimeError("undo the savepoint")

    await asyncio.to_thread(stores.request, view)
    assert await stores.queue.get_item("acme", "kept") is not None
    assert await stores.queue.get_item("acme", "dropped") is None


async def test_each_thread_binds_its_own_scoped_session(stores: Stores) -> None:
    """Four request threads at once, each on its scoped session: every order lands."""
    errors: list[BaseException] = []

    def serve(n: int) -> None:
        try:
            stores.request(lambda: place_order(stores, f"t-{n}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def run_all() -> None:
        threads = [threading.Thread(target=serve, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    await asyncio.to_thread(run_all)
    assert errors == []
    assert stores.orders() == [f"t-{n}" for n in range(4)]
    assert (await stores.queue.stats()).tenants["acme"].queued == 4


def test_the_adapters_are_what_bound_returns_for_sync_sessions() -> None:
    """No server: bound() of a sync Session, Connection or scoped_session is the blocking
    adapter; an AsyncSession still gets the async bound form."""
    from sqlalchemy.ext.asyncio import AsyncSession

    settings = PostgresStoreSettings(dsn="postgresql://u@127.0.0.1:1/d")
    engine = create_engine(settings)
    state, queue = PostgresStateStore(engine), PostgresWorkQueue(engine)
    sync = create_sync_engine("postgresql+psycopg://u@127.0.0.1:1/d")
    with Session(sync) as session:
        assert isinstance(state.bound(session), SyncBoundStateStore)
        assert isinstance(queue.bound(session), SyncBoundWorkQueue)
        assert isinstance(queue.bound(scoped_session(sessionmaker(sync))), SyncBoundWorkQueue)
    assert isinstance(state.bound(AsyncSession()), PostgresStateStore)


async def test_a_cancel_in_a_sync_request_lands_with_its_commit_only(stores: Stores) -> None:
    """``bound(session).cancel``: rolled back, the item is still queued; committed, it is
    cancelled with the reason, and ``cancel_many`` answers in the order asked."""
    for item_id in ("c1", "c2"):
        await stores.queue.enqueue(WorkItem(tenant="acme", item_id=item_id))

    def cancel(fail: bool) -> WorkItem | None:
        found = stores.queue.bound(stores.db).cancel("acme", "c1", reason="customer left")
        if fail:
            raise ValueError("changed their mind")
        return found

    with pytest.raises(ValueError, match="changed their mind"):
        await asyncio.to_thread(stores.request, lambda: cancel(True))
    kept = await stores.queue.get_item("acme", "c1")
    assert kept is not None and kept.status == ItemStatus.QUEUED
    answered = await asyncio.to_thread(stores.request, lambda: cancel(False))
    assert answered is not None and answered.status == ItemStatus.CANCELLED
    gone = await stores.queue.get_item("acme", "c1")
    assert gone is not None and (gone.status, gone.last_error) == (
        ItemStatus.CANCELLED,
        "customer left",
    )
    many = await asyncio.to_thread(
        stores.request,
        lambda: stores.queue.bound(stores.db).cancel_many("acme", ["missing", "c2"]),
    )
    assert [None if item is None else item.item_id for item in many] == [None, "c2"]
