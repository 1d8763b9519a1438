"""PostgreSQL backings behind the fault proxy: ambiguous commits, stalls, bound adapters.

- An ambiguous commit: ``SELECT statepact_commit(...)`` ran and committed, and
  the connection was cut before the reply reached the client. With a one-attempt
  failover budget the caller sees the retryable error, retries with the same
  idempotency key, and gets ``replayed=True``: one version in the history. With
  the default budget the executor sends the commit again itself; the commit
  function recognises its own transaction id and reports it once.
- An ambiguous state write (``put_run``, ``patch_run``): the statement
  committed and the reply was lost. It carries a call id, so the failover
  sends it again and the resend finds its first attempt's row in
  ``adk_run_writes``: the call succeeds and applies once, even when the resend
  comes after other writes to the run, or races its first attempt still
  running on the server.
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
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import OutOfTurnError, QueueUnavailableError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue
from statepact.storage.postgres._client import sqlstate_of
from statepact.storage.postgres.backend import PostgresBackend
from statepact.testing.faults import FaultProxy
from statepact.testing.servers import PostgresServer
from statepact.tx import TransactionManager
from tests.faults._resend import deposit_resent_after_others_committed
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


@pytest.mark.parametrize(
    ("isolation", "idempotent"),
    [("read_committed", False), ("snapshot", False), ("snapshot", True)],
    ids=["read_committed", "snapshot", "snapshot-idempotency"],
)
async def test_commit_resent_after_others_moved_its_key_on_applies_once(
    isolation: str,
    idempotent: bool,
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A commit cut after it applied, resent after another client committed more versions of
    the key than a Redis backend's history keeps, answers its own success: applied once,
    manager.run's body run once (PostgreSQL keeps every version, so the resend finds it)."""
    policy = RetryPolicy(attempts=40, base_delay=0.05, max_delay=0.2)
    outcome = await deposit_resent_after_others_committed(
        proxy,
        TransactionManager(PostgresBackend(proxied_engine, clock=clock, failover=policy)),
        TransactionManager(PostgresBackend(direct_engine, clock=clock)),
        fault_figures,
        backing="postgres",
        isolation=isolation,
        idempotency_key=f"idem-{uuid.uuid4().hex}" if idempotent else None,
    )
    assert (outcome.balance, outcome.body_runs) == (outcome.expected, 1)


def resending_settings() -> PostgresStoreSettings:
    """A budget that outlasts a test holding the failover's resends out for a while."""
    return PostgresStoreSettings(
        failover_attempts=20, failover_base_delay=0.05, failover_max_delay=0.2
    )


async def _write_rows(engine: AsyncEngine, run_id: str) -> int:
    """How many rows of adk_run_writes the run has: one per write that applied."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT count(*) FROM adk_run_writes WHERE run_id = :r"), {"r": run_id}
        )
        return int(result.scalar_one())


async def test_ambiguous_patch_is_resent_and_applied_once(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A patch cut after it committed is sent again by the failover (it carries a call id): the
    resend finds its first attempt's row, the call succeeds and the patch counts once."""
    settings = PostgresStoreSettings(**failover_settings(FAST_FAILOVER))
    store = PostgresStateStore(proxied_engine, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1", data={"who": "ambiguous-patch"}))
    # The patch's parameters carry the tenant and run id; the put above already went by.
    armed = proxy.cut_after_reply(b"acme", b"r1")
    patched = await store.patch_run("acme", "r1", input_tokens=7)
    await armed.wait(1.0)
    assert armed.swallowed, "the server answered the patch"
    assert proxy.stats.cut == 1
    assert (patched.input_tokens, patched.version) == (7, 2)
    found = await PostgresStateStore(direct_engine, clock=clock).get_run("acme", "r1")
    assert found is not None
    assert (found.input_tokens, found.version) == (7, 2)
    assert await _write_rows(direct_engine, "r1") == 2
    fault_figures.outcome(
        "ambiguous patch, resent by the failover",
        "postgres",
        acknowledged=7,
        found=found.input_tokens,
        faults=proxy.stats.cut,
        unit="tokens",
    )


async def test_patch_resent_after_others_wrote_is_applied_once(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A patch cut after it committed, whose resend comes after five other patches of the same
    run landed, is still counted once."""
    store = PostgresStateStore(proxied_engine, clock=clock, settings=resending_settings())
    other = PostgresStateStore(direct_engine, clock=clock)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    # Cut after the patch committed, and keep the failover's resends out until healed.
    armed = proxy.cut_after_reply(b"acme", b"r1", then="refuse")
    patch = asyncio.create_task(store.patch_run("acme", "r1", input_tokens=7))
    await armed.wait(2.0)
    assert armed.swallowed
    for _ in range(5):
        await other.patch_run("acme", "r1", output_tokens=1)
    proxy.heal()
    patched = await asyncio.wait_for(patch, 10.0)
    # The resend answers with the run as it is now, as the first attempt's success.
    assert (patched.input_tokens, patched.output_tokens, patched.version) == (7, 5, 7)
    found = await other.get_run("acme", "r1")
    assert found is not None
    assert (found.input_tokens, found.output_tokens, found.version) == (7, 5, 7)
    fault_figures.outcome(
        "ambiguous patch resent after 5 other writes",
        "postgres",
        acknowledged=7 + 5,
        found=found.input_tokens + found.output_tokens,
        unit="tokens",
    )


async def test_ambiguous_create_is_resent_and_reports_success(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A create (version 0) cut after it committed: the resend answers version 1, not a
    conflict with itself; resent after five patches, it answers the run as it is now."""
    store = PostgresStateStore(proxied_engine, clock=clock, settings=resending_settings())
    other = PostgresStateStore(direct_engine, clock=clock)
    armed = proxy.cut_after_reply(b"created-by-me-1")
    created = await store.put_run(
        RunRecord(tenant="acme", run_id="r1", data={"who": "created-by-me-1"})
    )
    await armed.wait(1.0)
    assert armed.swallowed
    assert (created.version, created.data) == (1, {"who": "created-by-me-1"})

    armed = proxy.cut_after_reply(b"created-by-me-2", then="refuse")
    put = asyncio.create_task(
        store.put_run(RunRecord(tenant="acme", run_id="r2", data={"who": "created-by-me-2"}))
    )
    await armed.wait(2.0)
    assert armed.swallowed
    for _ in range(5):
        await other.patch_run("acme", "r2", iterations=1)
    proxy.heal()
    stored = await asyncio.wait_for(put, 10.0)
    assert (stored.version, stored.data, stored.iterations) == (6, {"who": "created-by-me-2"}, 5)
    assert await _write_rows(direct_engine, "r1") == 1
    assert await _write_rows(direct_engine, "r2") == 6
    fault_figures.outcome(
        "ambiguous create, resent by the failover",
        "postgres",
        acknowledged=2,
        found=2,
        faults=proxy.stats.cut,
    )


async def test_ambiguous_update_is_resent_and_reports_the_next_version(
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A put at version 3 cut after it committed: the resend answers version 4 with the data it
    wrote, not StateConflictError(expected=3, actual=4) against its own first attempt."""
    store = PostgresStateStore(proxied_engine, clock=clock, settings=resending_settings())
    run = await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    for n in range(2):
        run = await store.put_run(run.model_copy(update={"data": {"n": n}}))
    assert run.version == 3
    armed = proxy.cut_after_reply(b"updated-by-me")
    written = await store.put_run(run.model_copy(update={"data": {"who": "updated-by-me"}}))
    await armed.wait(1.0)
    assert armed.swallowed
    assert (written.version, written.data) == (4, {"who": "updated-by-me"})
    found = await PostgresStateStore(direct_engine, clock=clock).get_run("acme", "r1")
    assert found is not None
    assert (found.version, found.data) == (4, {"who": "updated-by-me"})
    fault_figures.outcome(
        "ambiguous update, resent by the failover",
        "postgres",
        acknowledged=1,
        found=found.version - run.version,
        faults=proxy.stats.cut,
    )


async def _waiting_on_locks(engine: AsyncEngine, count: int, within: float = 5.0) -> None:
    """Wait until ``count`` sessions of the database wait on a lock (the held run row)."""
    deadline = time.monotonic() + within
    waiting = 0
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            waiting = int(
                (
                    await conn.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'"
                        )
                    )
                ).scalar_one()
            )
        if waiting >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{waiting} session(s) waiting on a lock, expected {count}")


@pytest.mark.parametrize("write", ["patch", "put"])
async def test_a_resend_racing_its_running_first_attempt_applies_once(
    write: str,
    proxy: FaultProxy,
    proxied_engine: AsyncEngine,
    direct_engine: AsyncEngine,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """The first attempt is held on the server (another session holds the run's row lock), the
    client's connection is cut, and the resend arrives while the first attempt still runs. When
    the lock is released exactly one applies: a patch's resend hits the call's row (23505) and
    is sent once more, a put's finds the version moved by its own first attempt; either
    answers success."""
    store = PostgresStateStore(proxied_engine, clock=clock, settings=resending_settings())
    run = await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    unique_violations: list[str | None] = []

    def seen(context: Any) -> None:
        unique_violations.append(sqlstate_of(context.original_exception))

    event.listen(proxied_engine.sync_engine, "handle_error", seen)
    async with direct_engine.connect() as locker:
        await locker.execute(text("SELECT 1 FROM adk_runs WHERE run_id = 'r1' FOR UPDATE"))
        if write == "patch":
            call = asyncio.create_task(store.patch_run("acme", "r1", input_tokens=7))
        else:
            call = asyncio.create_task(store.put_run(run.model_copy(update={"data": {"n": 1}})))
        await _waiting_on_locks(direct_engine, 1)
        assert proxy.cut() >= 1
        # The resend reaches the server and waits behind the first attempt.
        await _waiting_on_locks(direct_engine, 2)
        assert not call.done()
        await locker.commit()
    result = await asyncio.wait_for(call, 10.0)
    event.remove(proxied_engine.sync_engine, "handle_error", seen)
    found = await PostgresStateStore(direct_engine, clock=clock).get_run("acme", "r1")
    assert found is not None
    assert found.version == result.version == 2
    if write == "patch":
        assert found.input_tokens == result.input_tokens == 7
        assert "23505" in unique_violations
    else:
        assert found.data == result.data == {"n": 1}
    assert await _write_rows(direct_engine, "r1") == 2
    fault_figures.outcome(
        f"resend racing its first attempt ({write})",
        "postgres",
        acknowledged=1,
        found=found.version - run.version,
        faults=1,
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
    """Inside the caller's transaction a cut connection surfaces at once as the retryable error
    (retry the transaction); the next bound call on that connection is OutOfTurnError (roll it
    back first), so a loop retrying the call cannot spin; the proxy sees no new connection
    attempt, and nothing of the transaction was committed."""
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
        with pytest.raises(OutOfTurnError, match="roll the transaction back") as again:
            await queue.bound(conn).enqueue(WorkItem(tenant="acme", item_id="i2"))
        assert again.value.retryable is False
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
