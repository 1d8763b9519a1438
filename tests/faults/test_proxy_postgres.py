"""PostgreSQL backings behind the fault proxy: ambiguous commits, stalls, bound adapters.

- An ambiguous commit: ``SELECT statepact_commit(...)`` ran and committed, and
  the connection was cut before the reply reached the client. With a one-attempt
  failover budget the caller sees the retryable error, retries with the same
  idempotency key, and gets ``replayed=True``: one version in the history. With
  the default budget the executor sends the commit again itself; the commit
  function recognises its own transaction id and reports it once.
- A stall longer than the budget ends in ``StatePersistenceError(reason=
  "unavailable")`` / ``QueueUnavailableError`` within the budget and a margin.
  That needs client-side timeouts on asyncpg (``connect_args={"timeout": ...,
  "command_timeout": ...}``): the server's ``statement_timeout`` cannot see a
  network stall, and asyncpg's defaults wait 60 s to connect and forever for a
  reply. See docs/faults.md.
- A bound adapter (``PostgresStateStore(...).bound(connection)``) never
  retries: a cut connection surfaces at once, and the proxy sees no new
  connection attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import QueueUnavailableError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue
from statepact.storage.postgres.backend import PostgresBackend
from statepact.testing.faults import FaultProxy
from statepact.testing.servers import PostgresServer
from statepact.tx import TransactionManager
from tests.faults.conftest import FAST_FAILOVER, FaultFigure, FaultFigures

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# asyncpg waits this long for a connection and for each reply before giving up.
COMMAND_TIMEOUT = 0.5
MARGIN = 1.0


def engine_on(
    url: str, *, port: int | None = None, timeout: float = COMMAND_TIMEOUT
) -> AsyncEngine:
    """An engine on ``url`` (through the proxy on ``port`` if given) whose client notices a
    stall: asyncpg's connect ``timeout`` and per-statement ``command_timeout``."""
    target = make_url(url)
    if port is not None:
        target = target.set(port=port)
    return create_async_engine(
        target,
        pool_size=5,
        max_overflow=0,
        pool_timeout=5,
        connect_args={"timeout": timeout, "command_timeout": timeout},
    )


def failover_settings(policy: RetryPolicy) -> dict[str, Any]:
    return {
        "failover_attempts": policy.attempts,
        "failover_base_delay": policy.base_delay,
        "failover_max_delay": policy.max_delay,
    }


def stall_bound(policy: RetryPolicy) -> float:
    """The longest a call may take against a stalled server: each attempt waits out the client
    timeout (connecting, or the statement), plus the backoff budget."""
    return policy.attempts * 2 * COMMAND_TIMEOUT + policy.budget + MARGIN


@pytest.fixture
async def proxy(fault_postgres_server: PostgresServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(fault_postgres_server.port) as running:
        yield running


@pytest.fixture
async def proxied_engine(fault_pg_url: str, proxy: FaultProxy) -> AsyncIterator[AsyncEngine]:
    engine = engine_on(fault_pg_url, port=proxy.port)
    try:
        yield engine
    finally:
        proxy.heal()
        await engine.dispose()


@pytest.fixture
async def direct_engine(fault_pg_url: str) -> AsyncIterator[AsyncEngine]:
    """Straight to the server (no proxy), for checking what landed."""
    engine = engine_on(fault_pg_url, timeout=10.0)
    try:
        yield engine
    finally:
        await engine.dispose()


# -- ambiguous commits ----------------------------------------------------------------------


async def test_ambiguous_commit_surfaces_then_replays_once(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """Cut after the commit function committed: the caller gets the retryable error; a retry with
    the same idempotency key replays (replayed=True) and the history holds one version."""
    began = time.monotonic()
    manager = TransactionManager(
        PostgresBackend(proxied_engine, clock=clock, failover=RetryPolicy(attempts=1))
    )
    checker = TransactionManager(PostgresBackend(direct_engine, clock=clock))
    key = f"idem-{uuid.uuid4().hex}"
    armed = proxy.cut_after_reply(key.encode())
    with pytest.raises(StatePersistenceError) as caught:
        async with manager.transaction(idempotency_key=key) as tx:
            tx.write("orders", "o1", {"state": "paid"})
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
    await armed.wait(1.0)
    assert armed.swallowed, "the server answered the commit"
    history = await checker.history("orders", "o1")
    assert [(v.version, v.value) for v in history] == [(1, {"state": "paid"})]

    async with manager.transaction(idempotency_key=key) as retry:
        retry.write("orders", "o1", {"state": "paid"})
    assert retry.result.replayed is True
    assert retry.result.version == 1
    history = await checker.history("orders", "o1")
    assert [(v.version, v.value) for v in history] == [(1, {"state": "paid"})]
    fault_figures.record(
        FaultFigure(
            scenario="ambiguous commit, caller retries same key",
            backing="postgres",
            faults=proxy.stats.cut,
            acknowledged=1,
            found=len(history),
            lost=1 - len(history),
            duplicates=len(history) - 1,
            ambiguous=1,
            seconds=time.monotonic() - began,
            notes={"replayed": retry.result.replayed},
        )
    )


async def test_ambiguous_commit_absorbed_by_failover_applies_once(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """With a failover budget the executor sends the cut commit again; the commit function finds
    its own transaction and the caller sees one commit, not a replay."""
    manager = TransactionManager(
        PostgresBackend(proxied_engine, clock=clock, failover=FAST_FAILOVER)
    )
    key = f"idem-{uuid.uuid4().hex}"
    armed = proxy.cut_after_reply(key.encode())
    async with manager.transaction(idempotency_key=key) as tx:
        tx.write("orders", "o2", {"n": 1})
    await armed.wait(1.0)
    assert proxy.stats.cut == 1
    assert tx.result == tx.result.__class__(version=1, replayed=False)
    checker = TransactionManager(PostgresBackend(direct_engine, clock=clock))
    history = await checker.history("orders", "o2")
    assert [(v.version, v.value) for v in history] == [(1, {"n": 1})]
    fault_figures.outcome(
        "ambiguous commit, resent by the failover",
        "postgres",
        acknowledged=1,
        found=len(history),
        faults=proxy.stats.cut,
    )


async def test_ambiguous_patch_is_reported_not_retried(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A patch cut after it committed is not sent again (it is not idempotent): the caller gets
    the retryable error saying the outcome is unknown, and the patch landed exactly once."""
    settings = PostgresStoreSettings(**failover_settings(FAST_FAILOVER))
    store = PostgresStateStore(proxied_engine, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1", data={"who": "ambiguous-patch"}))
    # The patch's parameters carry the tenant and run id; the put above already went by.
    armed = proxy.cut_after_reply(b"acme", b"r1")
    with pytest.raises(StatePersistenceError) as caught:
        await store.patch_run("acme", "r1", input_tokens=7)
    await armed.wait(1.0)
    assert caught.value.reason == "unavailable"
    assert "may or may not" in str(caught.value)
    found = await PostgresStateStore(direct_engine, clock=clock).get_run("acme", "r1")
    assert found is not None
    assert found.input_tokens == 7
    fault_figures.outcome(
        "ambiguous patch, reported (not resent)",
        "postgres",
        acknowledged=0,
        found=1,
        ambiguous=1,
        faults=proxy.stats.cut,
    )


# -- stalls past the budget --------------------------------------------------------------------


async def test_stalled_state_store_gives_up_within_the_budget(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A server that stops answering ends a state read in StatePersistenceError("unavailable")
    after the client timeouts and the backoff budget, not later."""
    settings = PostgresStoreSettings(**failover_settings(FAST_FAILOVER))
    store = PostgresStateStore(proxied_engine, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(StatePersistenceError) as caught:
        await store.get_run("acme", "r1")
    elapsed = time.monotonic() - began
    proxy.heal()
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
    bound = stall_bound(settings.retry_policy)
    assert COMMAND_TIMEOUT <= elapsed <= bound, (elapsed, bound)
    fault_figures.record(
        FaultFigure(
            scenario="stall past budget: state store",
            backing="postgres",
            faults=1,
            acknowledged=0,
            found=0,
            lost=0,
            duplicates=0,
            ambiguous=0,
            seconds=elapsed,
            notes={"bound_s": round(bound, 2), "command_timeout_s": COMMAND_TIMEOUT},
        )
    )


async def test_stalled_queue_gives_up_within_the_budget(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A stalled queue server ends a claim in QueueUnavailableError (retryable) within the
    budget."""
    settings = PostgresStoreSettings(**failover_settings(FAST_FAILOVER))
    queue = PostgresWorkQueue(proxied_engine, clock=clock, settings=settings)
    await queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(QueueUnavailableError) as caught:
        await queue.claim("w1", lease_for=30)
    elapsed = time.monotonic() - began
    proxy.heal()
    assert caught.value.retryable is True
    bound = stall_bound(settings.retry_policy)
    assert COMMAND_TIMEOUT <= elapsed <= bound, (elapsed, bound)
    fault_figures.record(
        FaultFigure(
            scenario="stall past budget: queue claim",
            backing="postgres",
            faults=1,
            acknowledged=0,
            found=0,
            lost=0,
            duplicates=0,
            ambiguous=1,
            seconds=elapsed,
            notes={"bound_s": round(bound, 2)},
        )
    )


async def test_stalled_backend_gives_up_within_the_budget(
    proxy: FaultProxy, proxied_engine: AsyncEngine, clock: ManualClock
) -> None:
    """A stalled transaction server ends a commit in StatePersistenceError("unavailable")."""
    manager = TransactionManager(
        PostgresBackend(proxied_engine, clock=clock, failover=FAST_FAILOVER)
    )
    async with manager.transaction() as warm:
        warm.write("orders", "o0", {"n": 0})
    proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(StatePersistenceError) as caught:
        async with manager.transaction() as tx:
            tx.write("orders", "o1", {"n": 1})
    elapsed = time.monotonic() - began
    proxy.heal()
    assert caught.value.reason == "unavailable"
    # begin() and the commit may each wait out the budget.
    bound = 2 * stall_bound(FAST_FAILOVER)
    assert COMMAND_TIMEOUT <= elapsed <= bound, (elapsed, bound)


# -- bound adapters ----------------------------------------------------------------------------


async def test_bound_adapter_never_retries_a_cut_connection(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """Inside the caller's transaction a cut connection surfaces at once as the retryable error;
    the proxy sees no new connection attempt, and nothing of the transaction was committed."""
    settings = PostgresStoreSettings(failover_attempts=10)
    state = PostgresStateStore(proxied_engine, clock=clock, settings=settings)
    queue = PostgresWorkQueue(proxied_engine, clock=clock, settings=settings)
    async with proxied_engine.connect() as conn:
        transaction = await conn.begin()
        await state.bound(conn).put_run(RunRecord(tenant="acme", run_id="r1"))
        await queue.bound(conn).enqueue(WorkItem(tenant="acme", item_id="i1"))
        attempts_before = proxy.stats.accepted
        assert proxy.cut() == 1
        began = time.monotonic()
        with pytest.raises(StatePersistenceError) as caught:
            await state.bound(conn).put_run(RunRecord(tenant="acme", run_id="r2"))
        elapsed = time.monotonic() - began
        with pytest.raises(QueueUnavailableError):
            await queue.bound(conn).enqueue(WorkItem(tenant="acme", item_id="i2"))
        # Nothing retries in the background either.
        await asyncio.sleep(0.3)
        assert proxy.stats.accepted == attempts_before
        with contextlib.suppress(Exception):
            await transaction.rollback()
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
    assert elapsed < 0.5, elapsed
    async with direct_engine.connect() as check:
        runs = await check.execute(text("SELECT count(*) FROM adk_runs"))
        items = await check.execute(text("SELECT count(*) FROM adk_work"))
        assert runs.scalar_one() == 0
        assert items.scalar_one() == 0
    fault_figures.record(
        FaultFigure(
            scenario="bound adapter, connection cut mid-transaction",
            backing="postgres",
            faults=1,
            acknowledged=0,
            found=0,
            lost=0,
            duplicates=0,
            seconds=elapsed,
            notes={"new_connection_attempts": proxy.stats.accepted - attempts_before},
        )
    )
