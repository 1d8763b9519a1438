"""What only the PostgreSQL backings have, behind the fault proxy (the scenarios both backings
share are in ``test_proxy_scenarios.py``).

- A resend racing its first attempt: the first attempt of a ``put_run`` or
  ``patch_run`` still runs on the server (waiting on a row lock) when the
  client's connection is cut and the failover's resend arrives; exactly one
  applies, and the call succeeds.
- A bound adapter (``PostgresStateStore(...).bound(connection)``) never
  retries: a cut connection surfaces at once, and the proxy sees no new
  connection attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.errors import OutOfTurnError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue
from statepact.storage.postgres._client import sqlstate_of
from tests.faults._proxied import RESENDING, ProxiedPostgres
from tests.faults.conftest import FaultFigures

pytestmark = [pytest.mark.integration, pytest.mark.faults]


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
    proxied_postgres: ProxiedPostgres,
    fault_figures: FaultFigures,
    failed_sqlstates: list[str | None],
) -> None:
    """The first attempt is held on the server (another session holds the run's row lock), the
    client's connection is cut, and the resend arrives while the first attempt still runs. When
    the lock is released exactly one applies: a patch's resend hits the call's row (23505) and
    is sent once more, a put's finds the version moved by its own first attempt; either
    answers success."""
    proxy, proxied_engine = proxied_postgres.proxy, proxied_postgres.engine
    direct_engine = proxied_postgres.direct_engine
    store = proxied_postgres.state(RESENDING)
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
    found = await proxied_postgres.state().get_run("acme", "r1")
    assert found is not None
    assert found.version == result.version == 2
    if write == "patch":
        assert found.input_tokens == result.input_tokens == 7
        # On an engine the store's statements run on the driver (DirectExecutor).
        assert "23505" in unique_violations + failed_sqlstates
    else:
        assert found.data == result.data == {"n": 1}
    await proxied_postgres.check_write_rows("r1", 2)
    fault_figures.outcome(
        f"resend racing its first attempt ({write})",
        "postgres",
        acknowledged=1,
        found=found.version - run.version,
        faults=1,
    )


@pytest.mark.parametrize("write", ["patch", "put"])
async def test_a_shared_run_write_statement_whose_reply_is_lost_applies_each_once(
    write: str, proxied_postgres: ProxiedPostgres, fault_figures: FaultFigures
) -> None:
    """Five writes of five runs made at once: the first goes alone, the other four share one
    statement, and that statement's reply is lost (the proxy forwards it, swallows the answer
    and cuts the connection). The failover sends it again: it finds every call's row and
    applies nothing, and each caller reads its own write back, once (its run one version up,
    one call row)."""
    proxy = proxied_postgres.proxy
    store = proxied_postgres.state(RESENDING)
    names = [f"shared-{n}" for n in range(5)]
    runs = [await store.put_run(RunRecord(tenant="acme", run_id=name)) for name in names]
    armed = proxy.cut_after_reply(b"shared-3")

    async def call(n: int) -> RunRecord:
        if write == "patch":
            return await store.patch_run("acme", names[n], input_tokens=n + 1)
        return await store.put_run(runs[n].model_copy(update={"data": {"n": n}}))

    results = await asyncio.wait_for(asyncio.gather(*(call(n) for n in range(5))), 10.0)
    await armed.wait(1.0)
    assert armed.swallowed, "the server did not answer the shared statement"
    reader = proxied_postgres.state()
    for n, result in enumerate(results):
        found = await reader.get_run("acme", names[n])
        assert found is not None
        assert (result.run_id, result.version, found.version) == (names[n], 2, 2)
        if write == "patch":
            assert found.input_tokens == result.input_tokens == n + 1
        else:
            assert found.data == result.data == {"n": n}
        await proxied_postgres.check_write_rows(names[n], 2)
    fault_figures.outcome(
        f"shared run writes, reply lost ({write})",
        "postgres",
        acknowledged=5,
        found=sum(result.version - 1 for result in results),
        faults=1,
    )


async def test_shared_commits_whose_reply_is_lost_apply_each_once(
    proxied_postgres: ProxiedPostgres, fault_figures: FaultFigures
) -> None:
    """Six transactions of six keys commit at once: the first goes alone, the other five
    share one statement, and its reply is lost (forwarded, the answer swallowed, the
    connection cut). The failover sends it again marked as a resend: each commit finds its
    own version in the history and applies nothing more; every caller gets that version,
    and each key holds one version written by it."""
    proxy = proxied_postgres.proxy
    manager = await proxied_postgres.manager(RESENDING)
    keys = [f"shared-{n}" for n in range(6)]
    armed = proxy.cut_after_reply(b"shared-4")

    async def commit(n: int) -> int:
        async with manager.transaction() as tx:
            tx.write("orders", keys[n], {"n": n})
        return tx.result.version

    versions = await asyncio.wait_for(asyncio.gather(*(commit(n) for n in range(6))), 10.0)
    await armed.wait(1.0)
    assert armed.swallowed, "the server did not answer the shared commits"
    checker = proxied_postgres.direct_manager()
    found = 0
    for n, key in enumerate(keys):
        history = await checker.history("orders", key)
        assert [(v.version, v.value) for v in history] == [(versions[n], {"n": n})]
        found += len(history)
    assert len(set(versions)) == 6
    fault_figures.outcome(
        "shared commits, reply lost", "postgres", acknowledged=6, found=found, faults=1
    )


# -- bound adapters ----------------------------------------------------------------------------


async def test_bound_adapter_never_retries_a_cut_connection(
    proxied_postgres: ProxiedPostgres, fault_figures: FaultFigures
) -> None:
    """Inside the caller's transaction a cut connection surfaces at once as the retryable error
    (retry the transaction); the next bound call on that connection is OutOfTurnError (roll it
    back first), so a loop retrying the call cannot spin; the proxy sees no new connection
    attempt, and nothing of the transaction was committed."""
    proxy, proxied_engine = proxied_postgres.proxy, proxied_postgres.engine
    clock = proxied_postgres.clock
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
    async with proxied_postgres.direct_engine.connect() as check:
        runs = await check.execute(text("SELECT count(*) FROM adk_runs"))
        items = await check.execute(text("SELECT count(*) FROM adk_work"))
        assert runs.scalar_one() == 0
        assert items.scalar_one() == 0
    fault_figures.outcome(
        "bound adapter, connection cut mid-transaction",
        "postgres",
        acknowledged=0,
        found=0,
        seconds=elapsed,
        new_connection_attempts=proxy.stats.accepted - attempts_before,
    )
