"""PostgresStateStore against a real PostgreSQL: statements, transactions, failover, sizes, names.

The behaviour shared with every backing is the conformance suite's
(``tests/conformance``); this module checks what only PostgreSQL shows: one
statement per call, ``bound()`` inside a caller's transaction (a state change
and the work it queued commit together or not at all), what is and is not
retried, the pool, and the table names of ``StateTables``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact.clock import ManualClock
from statepact.errors import (
    PoolExhaustedError,
    QueueUnavailableError,
    RunNotFoundError,
    SchemaVersionError,
    StateConflictError,
    StatePersistenceError,
)
from statepact.models import ItemStatus, RunRecord, RunStatus, SessionRecord, WorkItem
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import (
    PostgresStateStore,
    PostgresWorkQueue,
    StateTables,
    _direct,
    migrate,
)
from statepact.storage.postgres.schema import WRITE_RETENTION, tables_for

pytestmark = pytest.mark.integration

LIMIT = DEFAULT_MAX_VALUE_BYTES
FAST_FAILOVER = {"failover_attempts": 3, "failover_base_delay": 0.01, "failover_max_delay": 0.02}


_LOCK_WAITERS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


def _run(run_id: str, **fields: Any) -> RunRecord:
    return RunRecord(tenant="acme", run_id=run_id, **fields)


async def _scalar(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql))).scalar()


async def _terminate_backend(url: str, pid: int) -> None:
    """Kill one server session from a connection of its own (never one of the pool's)."""
    killer = create_async_engine(url, poolclass=NullPool)
    try:
        async with killer.connect() as conn:
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != pid
            killed = (
                await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            ).scalar_one()
            assert killed is True
    finally:
        await killer.dispose()


# -- one statement per call -------------------------------------------------------------


async def test_each_call_is_one_statement(
    postgres_state_store: PostgresStateStore, statements: list[str]
) -> None:
    """put_run (create and update), patch_run, get, list and delete are one statement each."""
    store = postgres_state_store
    calls = [
        lambda: store.put_run(_run("r1", session_id="s1")),
        lambda: store.patch_run("acme", "r1", input_tokens=5, cost="0.25"),
        lambda: store.get_run("acme", "r1"),
        lambda: store.list_runs("acme", session_id="s1", status="pending"),
        lambda: store.put_session(SessionRecord(tenant="acme", session_id="s1")),
        lambda: store.get_session("acme", "s1"),
        lambda: store.list_sessions("acme"),
    ]
    for call in calls:
        before = len(statements)
        await call()
        assert len(statements) - before == 1, statements[before:]
    stored = await store.get_run("acme", "r1")
    assert stored is not None
    before = len(statements)
    await store.put_run(stored.model_copy(update={"status": RunStatus.RUNNING}))
    assert len(statements) - before == 1
    before = len(statements)
    assert await store.delete_run("acme", "r1") is True
    assert len(statements) - before == 1


async def test_run_writes_keep_their_generic_plan(pg_database_url: str, clock: ManualClock) -> None:
    """A run's get, update and patch are planned once per connection, not on every call:
    after the five custom plans of a prepared statement PostgreSQL keeps its generic plan.
    Given the run's key as constants, the planner rated every custom plan of the update
    and the patch cheaper than the generic one once ANALYZE had seen other runs written
    often (a new run's rows estimated none, any run's many), and planned each call anew;
    the statements read the key through an InitPlan, which no plan sees into."""
    # Five runs written often: each write leaves a row (tenant, run_id, applied_at, op_id)
    # for resends to find, kept 10 minutes. The statistics then expect 1,000 rows of any
    # one run and none of a run they never saw.
    setup = create_async_engine(pg_database_url, poolclass=NullPool)
    try:
        others = PostgresStateStore(setup, clock=clock)
        for i in range(5):
            await others.put_run(_run(f"other{i}"))
        async with setup.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO adk_run_writes (tenant, run_id, applied_at, op_id) "
                    "SELECT 'acme', 'other' || (n % 5), now() - n * interval '1 ms', md5(n::text) "
                    "FROM generate_series(1, 5000) AS n"
                )
            )
            await conn.execute(text("ANALYZE adk_runs"))
            await conn.execute(text("ANALYZE adk_run_writes"))
    finally:
        await setup.dispose()
    engine = create_async_engine(pg_database_url, pool_size=1, max_overflow=0)
    try:
        store = PostgresStateStore(engine, clock=clock)
        record = await store.put_run(_run("r1"))
        for step in range(8):
            record = await store.put_run(record.model_copy(update={"data": {"step": step}}))
            await store.patch_run("acme", "r1", input_tokens=1)
            record = await store.get_run("acme", "r1") or record
        # The pool's one connection: the store's statements were prepared on it.
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT statement, custom_plans, generic_plans FROM pg_prepared_statements"
                    )
                )
            ).all()
    finally:
        await engine.dispose()
    kinds = {
        "patch": "UPDATE adk_runs SET version=",
        "update": "UPDATE adk_runs SET session_id=",
        "get": "SELECT adk_runs.tenant",
    }
    plans = {
        kind: (row.custom_plans, row.generic_plans)
        for row in rows
        for kind, start in kinds.items()
        if start in row.statement and "INSERT INTO adk_runs" not in row.statement
    }
    assert set(plans) == set(kinds), plans
    assert set(plans.values()) == {(5, 3)}, plans


@pytest.mark.parametrize("write", ["patch", "put"])
async def test_concurrent_run_writes_share_one_statement(
    write: str, postgres_state_store: PostgresStateStore, statements: list[str]
) -> None:
    """Twenty writes of twenty runs made at once: the first goes alone, the other nineteen
    wait for it and go together in one statement; each caller gets its own run back."""
    store = postgres_state_store
    created = [await store.put_run(_run(f"r{n}")) for n in range(20)]
    before = len(statements)
    if write == "patch":
        results = await asyncio.gather(
            *(store.patch_run("acme", f"r{n}", input_tokens=n) for n in range(20))
        )
    else:
        results = await asyncio.gather(
            *(
                store.put_run(run.model_copy(update={"data": {"n": n}}))
                for n, run in enumerate(created)
            )
        )
    sent = statements[before:]
    assert len(sent) == 2, sent
    assert "unnest" not in sent[0] and "unnest" in sent[1]
    for n, result in enumerate(results):
        assert (result.run_id, result.version) == (f"r{n}", 2)
        if write == "patch":
            assert result.input_tokens == n
        else:
            assert result.data == {"n": n}


async def test_a_stalled_run_write_holds_back_no_write_of_its_own_process(
    postgres_state_store: PostgresStateStore,
    pg_engine: AsyncEngine,
    failed_sqlstates: list[str | None],
) -> None:
    """A patch alone stalled on a run row another session holds (a caller's transaction
    through ``bound``), then one inside a shared statement: the writes of other runs made
    meanwhile land while the stalled one still waits, and the stalled ones land, once each,
    when the row is released."""
    store = postgres_state_store
    for n in range(6):
        await store.put_run(_run(f"r{n}"))
    held = "SELECT 1 FROM adk_runs WHERE run_id = :run_id FOR UPDATE"
    async with pg_engine.connect() as holder:
        await holder.execute(text(held), {"run_id": "r0"})
        stalled = asyncio.create_task(store.patch_run("acme", "r0", iterations=1))
        deadline = time.monotonic() + 5
        while await _scalar(pg_engine, _LOCK_WAITERS) < 1:
            assert time.monotonic() < deadline, "the patch of r0 never waited on its row"
            await asyncio.sleep(0.02)
        others = [store.patch_run("acme", f"r{n}", iterations=1) for n in range(1, 4)]
        await asyncio.wait_for(asyncio.gather(*others), 5.0)
        assert not stalled.done()
        await holder.rollback()
        assert (await asyncio.wait_for(stalled, 5.0)).iterations == 1
    async with pg_engine.connect() as holder:
        await holder.execute(text(held), {"run_id": "r4"})
        first = asyncio.create_task(store.patch_run("acme", "r1", iterations=1))
        shared = {
            n: asyncio.create_task(store.patch_run("acme", f"r{n}", iterations=1))
            for n in (2, 3, 4, 5)
        }
        await asyncio.wait_for(first, 5.0)
        await asyncio.wait_for(asyncio.gather(*(shared[n] for n in (2, 3, 5))), 5.0)
        assert "55P03" in failed_sqlstates
        assert not shared[4].done()
        await holder.rollback()
        await asyncio.wait_for(shared[4], 5.0)
    for n, iterations in enumerate((1, 2, 2, 2, 1, 1)):
        stored = await store.get_run("acme", f"r{n}")
        assert stored is not None
        assert stored.iterations == iterations, n


async def test_shared_statements_of_two_stores_never_deadlock(
    pg_engine: AsyncEngine, clock: ManualClock, failed_sqlstates: list[str | None]
) -> None:
    """Two stores (two processes, as far as the server knows) patch the same twenty runs at
    once, ten rounds, one naming them in ascending order and one in descending: their shared
    statements lock the runs in one order, and under a lock_timeout far below the server's
    deadlock_timeout, so no deadlock (40P01) is ever reported, and every counter is the
    exact sum."""
    stores = [PostgresStateStore(pg_engine, clock=clock) for _ in range(2)]
    names = [f"r{n:02d}" for n in range(20)]
    for run_id in names:
        await stores[0].put_run(_run(run_id))
    for _ in range(10):
        await asyncio.wait_for(
            asyncio.gather(
                *(stores[0].patch_run("acme", run_id, iterations=1) for run_id in names),
                *(
                    stores[1].patch_run("acme", run_id, input_tokens=1)
                    for run_id in reversed(names)
                ),
            ),
            10,
        )
    assert "40P01" not in failed_sqlstates, failed_sqlstates
    for run_id in names:
        stored = await stores[1].get_run("acme", run_id)
        assert stored is not None
        assert (stored.iterations, stored.input_tokens, stored.version) == (10, 10, 21)


async def test_only_a_refused_write_reads_again(
    postgres_state_store: PostgresStateStore, statements: list[str]
) -> None:
    """A conflicting put reads the stored version once more to report it; a missing patch too."""
    store = postgres_state_store
    created = await store.put_run(_run("r1"))
    await store.patch_run("acme", "r1", iterations=1)
    before = len(statements)
    with pytest.raises(StateConflictError) as caught:
        await store.put_run(created.model_copy(update={"data": {"stale": True}}))
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert len(statements) - before == 2


async def test_counters_are_columns_and_cost_is_exact_numeric(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine
) -> None:
    """Counters live in columns (added in place); cost is NUMERIC(38,9), exact."""
    await postgres_state_store.put_run(_run("r1", data={"blob": "stays"}))
    await asyncio.gather(
        *(
            postgres_state_store.patch_run("acme", "r1", input_tokens=7, cost="0.000000001")
            for _ in range(20)
        )
    )
    async with pg_engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT input_tokens, cost, version, pg_typeof(cost)::text, data::text "
                    "FROM adk_runs WHERE tenant = 'acme' AND run_id = 'r1'"
                )
            )
        ).one()
    assert row[0] == 140
    assert row[1] == Decimal("0.000000020")
    assert row[2] == 21
    assert row[3] == "numeric"
    assert row[4] == '{"blob":"stays"}'


async def test_blob_round_trips_whatever_the_engine_deserializer(
    pg_database_url: str, clock: ManualClock
) -> None:
    """Blobs are read back as their exact text: an engine's own JSON deserializer is not used."""
    engine = create_async_engine(pg_database_url, json_deserializer=lambda _text: {"not": "it"})
    try:
        store = PostgresStateStore(engine, clock=clock)
        data = {"n": [6.02e23, 2**100, 1.0, -0.5], "é": "ü"}
        await store.put_run(_run("r1", data=data))
        stored = await store.get_run("acme", "r1")
        assert stored is not None
        assert stored.data == data
        assert [type(n) for n in stored.data["n"]] == [float, int, float, float]
    finally:
        await engine.dispose()


# -- bound(): the caller's transaction ------------------------------------------------


async def test_bound_put_is_rolled_back_with_the_callers_transaction(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine
) -> None:
    """A put_run inside a caller's transaction that rolls back leaves nothing."""
    async with pg_engine.connect() as conn:
        await conn.begin()
        written = await postgres_state_store.bound(conn).put_run(_run("r1", data={"x": 1}))
        assert written.version == 1
        await conn.rollback()
    assert await postgres_state_store.get_run("acme", "r1") is None


async def test_bound_put_lands_when_the_callers_transaction_commits(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine
) -> None:
    """A put_run inside a caller's transaction that commits leaves the run."""
    async with AsyncSession(pg_engine) as session, session.begin():
        bound = postgres_state_store.bound(session)
        written = await bound.put_run(_run("r1", data={"x": 1}))
        # Inside the transaction the bound store sees its own write; others do not yet.
        assert await bound.get_run("acme", "r1") == written
        assert await postgres_state_store.get_run("acme", "r1") is None
    assert await postgres_state_store.get_run("acme", "r1") == written


async def test_a_failed_transaction_leaves_neither_the_run_nor_its_work(
    postgres_state_store: PostgresStateStore,
    postgres_work_queue: PostgresWorkQueue,
    pg_engine: AsyncEngine,
) -> None:
    """A transaction that writes a run and enqueues its work, then fails, leaves neither."""
    with pytest.raises(RuntimeError, match="after the writes"):
        async with AsyncSession(pg_engine) as session, session.begin():
            await postgres_state_store.bound(session).put_run(_run("r1"))
            await postgres_work_queue.bound(session).enqueue(
                WorkItem(tenant="acme", item_id="step-1", payload={"run": "r1"})
            )
            raise RuntimeError("the caller fails after the writes")
    assert await postgres_state_store.get_run("acme", "r1") is None
    assert await postgres_work_queue.get_item("acme", "step-1") is None
    assert (await postgres_work_queue.stats()).tenants == {}
    assert await postgres_work_queue.claim("w1", lease_for=30) is None
    assert await _scalar(pg_engine, "SELECT count(*) FROM adk_queue_turns") == 0


async def test_a_committed_transaction_leaves_both_the_run_and_its_work(
    postgres_state_store: PostgresStateStore,
    postgres_work_queue: PostgresWorkQueue,
    pg_engine: AsyncEngine,
) -> None:
    """A transaction that writes a run and enqueues its work, then commits, leaves both."""
    async with pg_engine.connect() as conn:
        await conn.begin()
        run = await postgres_state_store.bound(conn).put_run(_run("r1"))
        item = await postgres_work_queue.bound(conn).enqueue(
            WorkItem(tenant="acme", item_id="step-1", payload={"run": "r1"})
        )
        await conn.commit()
    assert await postgres_state_store.get_run("acme", "r1") == run
    assert await postgres_work_queue.get_item("acme", "step-1") == item
    lease = await postgres_work_queue.claim("w1", lease_for=30)
    assert lease is not None
    assert lease.item.item_id == "step-1"
    assert lease.item.status is ItemStatus.LEASED


async def test_a_bound_store_retries_nothing(
    postgres_state_store: PostgresStateStore,
    pg_engine: AsyncEngine,
    pg_database_url: str,
    statements: list[str],
) -> None:
    """A bound store whose connection died raises at once (retryable) and sends nothing again."""
    async with pg_engine.connect() as conn:
        await conn.begin()
        pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar()
        await _terminate_backend(pg_database_url, int(pid))
        before = len(statements)
        with pytest.raises(StatePersistenceError) as caught:
            await postgres_state_store.bound(conn).get_run("acme", "r1")
        assert len(statements) - before == 1
        assert caught.value.reason == "unavailable"
        assert caught.value.retryable is True
        assert "transaction" in str(caught.value)
        await conn.rollback()


async def test_an_owned_read_is_retried_past_a_dropped_connection(
    postgres_state_store: PostgresStateStore,
    pg_engine: AsyncEngine,
    pg_database_url: str,
    statements: list[str],
) -> None:
    """On an engine, a read whose pooled connection was dropped is retried and succeeds."""
    created = await postgres_state_store.put_run(_run("r1"))
    async with pg_engine.connect() as conn:
        pid = int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        await conn.commit()
    # The pool holds that one connection now; kill it behind the pool's back.
    await _terminate_backend(pg_database_url, pid)
    before = len(statements)
    assert await postgres_state_store.get_run("acme", "r1") == created
    # The first attempt met the dead connection; the retry ran on a new one.
    assert len(statements) - before == 2


async def _drop_the_pooled_connection(engine: AsyncEngine, url: str) -> None:
    """Kill the one pooled connection behind the pool's back."""
    async with engine.connect() as conn:
        pid = int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        await conn.commit()
    await _terminate_backend(url, pid)


async def test_a_run_write_on_a_dropped_connection_is_resent_and_applied_once(
    pg_database_url: str, clock: ManualClock
) -> None:
    """A put or patch whose connection died mid-call carries a call id: the executor sends it
    again on a new connection and it applies once."""
    engine = create_async_engine(pg_database_url, pool_size=1, max_overflow=0)
    try:
        store = PostgresStateStore(engine, clock=clock)
        created = await store.put_run(_run("r1"))
        await _drop_the_pooled_connection(engine, pg_database_url)
        patched = await store.patch_run("acme", "r1", input_tokens=5)
        assert (patched.input_tokens, patched.version) == (5, 2)
        await _drop_the_pooled_connection(engine, pg_database_url)
        put = await store.put_run(created.model_copy(update={"version": 2, "data": {"n": 1}}))
        assert (put.version, put.data, put.input_tokens) == (3, {"n": 1}, 5)
        stored = await store.get_run("acme", "r1")
        assert stored is not None
        assert (stored.input_tokens, stored.version, stored.data) == (5, 3, {"n": 1})
    finally:
        await engine.dispose()


async def test_a_session_write_that_may_have_run_is_not_retried(
    pg_database_url: str, clock: ManualClock
) -> None:
    """A session put whose connection died mid-call is not sent again (it carries no call id):
    the caller gets the retryable error saying the outcome is unknown."""
    engine = create_async_engine(pg_database_url, pool_size=1, max_overflow=0)
    try:
        store = PostgresStateStore(engine, clock=clock)
        await _drop_the_pooled_connection(engine, pg_database_url)
        with pytest.raises(StatePersistenceError) as caught:
            await store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        assert caught.value.reason == "unavailable"
        assert "may or may not have been applied" in str(caught.value)
        assert await store.get_session("acme", "s1") is None
    finally:
        await engine.dispose()


# -- adk_run_writes: the rows that let a resend recognise its first attempt ------------------


async def _write_rows(engine: AsyncEngine, run_id: str) -> int:
    return int(
        await _scalar(engine, f"SELECT count(*) FROM adk_run_writes WHERE run_id = '{run_id}'")
    )


async def test_each_applied_run_write_leaves_one_row_and_a_refused_one_none(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine
) -> None:
    """put (create, update) and patch leave a row each; a conflict, a missing run and an
    overflow leave none, and the stored run is unchanged."""
    store = postgres_state_store
    created = await store.put_run(_run("r1"))
    updated = await store.put_run(created.model_copy(update={"data": {"n": 1}}))
    await store.patch_run("acme", "r1", iterations=1)
    assert await _write_rows(pg_engine, "r1") == 3
    with pytest.raises(StateConflictError):
        await store.put_run(created.model_copy(update={"data": {"n": 2}}))
    with pytest.raises(StateConflictError):
        await store.put_run(_run("r1"))
    with pytest.raises(RunNotFoundError):
        await store.patch_run("acme", "missing", iterations=1)
    with pytest.raises(ValueError):
        await store.patch_run("acme", "r1", iterations=2**63 - 1)
    assert await _write_rows(pg_engine, "r1") == 3
    assert await _write_rows(pg_engine, "missing") == 0
    stored = await store.get_run("acme", "r1")
    assert stored is not None
    assert (stored.version, stored.data, stored.iterations) == (updated.version + 1, {"n": 1}, 1)


async def test_only_a_resend_looks_for_its_first_attempt(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """A first attempt's statement applies and records its call id without looking it up; the
    resend form of the same call (same call id and clock reading) finds that row and answers
    the run as it is, applying nothing twice."""
    from statepact.storage.postgres._sql.state import statements

    store = postgres_state_store
    await store.put_run(_run("r1"))
    sql = statements(store.tables)
    for name in ("create_run", "update_run", "patch_run"):
        attempts = getattr(sql, name)
        first, resent = attempts.first, attempts.again
        assert "UNION ALL" not in str(first) and "UNION ALL" in str(resent)
    now = clock.now()
    params: dict[str, Any] = {
        "p_tenant": "acme",
        "p_record_id": "r1",
        "p_now": now,
        "p_op_id": "call-1",
        "p_cutoff": now - WRITE_RETENTION,
        "p_cost": Decimal(0),
        "p_max_cost": Decimal(10**9),
    }
    for name in ("input_tokens", "output_tokens", "iterations", "cursor"):
        params[f"p_{name}"] = 1 if name == "iterations" else 0
        params[f"p_max_{name}"] = 2**62
    async with pg_engine.begin() as conn:
        applied = (await conn.execute(sql.patch_run.first, params)).mappings().one()
    assert (applied["replayed"], applied["iterations"], applied["version"]) == (False, 1, 2)
    for _ in range(2):
        async with pg_engine.begin() as conn:
            again = (await conn.execute(sql.patch_run.again, params)).mappings().one()
        assert (again["replayed"], again["iterations"], again["version"]) == (True, 1, 2)
    assert await _write_rows(pg_engine, "r1") == 2  # the create's and this call's


async def test_a_write_sweeps_its_runs_rows_past_the_retention(
    postgres_state_store: PostgresStateStore, pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """Each write deletes its run's rows older than WRITE_RETENTION (by the injected clock),
    and only its run's; delete_run deletes all of the run's rows."""
    store = postgres_state_store
    await store.put_run(_run("r1"))
    await store.put_run(_run("r2"))
    for _ in range(3):
        await store.patch_run("acme", "r1", iterations=1)
    assert await _write_rows(pg_engine, "r1") == 4
    clock.advance(WRITE_RETENTION - timedelta(seconds=1))
    await store.patch_run("acme", "r1", iterations=1)
    assert await _write_rows(pg_engine, "r1") == 5
    clock.advance(timedelta(seconds=2))
    await store.patch_run("acme", "r1", iterations=1)
    # The four rows of the first minute are gone; the last two are within the retention.
    assert await _write_rows(pg_engine, "r1") == 2
    assert await _write_rows(pg_engine, "r2") == 1
    assert await store.delete_run("acme", "r1") is True
    assert await _write_rows(pg_engine, "r1") == 0
    assert await _write_rows(pg_engine, "r2") == 1


async def test_a_database_before_revision_0003_is_refused(
    empty_database_url: str, clock: ManualClock
) -> None:
    """At revision statepact_0002 (schema version 1, no adk_run_writes) open() refuses with
    SchemaVersionError naming `statepact db upgrade`; after the upgrade it opens."""
    await migrate.upgrade(empty_database_url, "statepact_0002")
    engine = create_async_engine(
        empty_database_url, connect_args={"server_settings": {"statement_timeout": "30s"}}
    )
    try:
        with pytest.raises(SchemaVersionError) as caught:
            await PostgresStateStore.open(engine, clock=clock)
        assert caught.value.found == "1"
        assert caught.value.expected == "3"  # the head revision's (statepact_0008)
        assert "statepact db upgrade" in str(caught.value)
        await migrate.upgrade(empty_database_url)
        store = await PostgresStateStore.open(engine, clock=clock)
        await store.put_run(_run("r1"))
        assert await store.patch_run("acme", "r1", iterations=1) is not None
        await migrate.downgrade(empty_database_url, "statepact_0002")
        assert await _scalar(engine, "SELECT version FROM adk_schema") == 1
        assert await _scalar(engine, "SELECT to_regclass('adk_run_writes')") is None
    finally:
        await engine.dispose()


# -- the server unreachable, the pool exhausted -----------------------------------------


async def test_an_unreachable_server_is_unavailable_after_the_budget(
    clock: ManualClock,
) -> None:
    """Connection errors are retried within the failover budget, then unavailable (retryable)."""
    engine = create_async_engine("postgresql+asyncpg://postgres@127.0.0.1:9/none")
    attempts: list[int] = []
    event.listen(engine.sync_engine, "do_connect", lambda *_args: attempts.append(1))
    settings = PostgresStoreSettings(**FAST_FAILOVER)
    try:
        store = PostgresStateStore(engine, clock=clock, settings=settings)
        with pytest.raises(StatePersistenceError) as caught:
            await store.get_run("acme", "r1")
        assert caught.value.reason == "unavailable"
        assert caught.value.retryable is True
        assert len(attempts) == 3
        assert "127.0.0.1" not in str(caught.value)
        queue = PostgresWorkQueue(engine, clock=clock, settings=settings)
        with pytest.raises(QueueUnavailableError):
            await queue.get_item("acme", "x")
    finally:
        await engine.dispose()


async def test_an_exhausted_pool_is_reported_at_once(
    pg_database_url: str, clock: ManualClock
) -> None:
    """No free pooled connection: PoolExhaustedError after the pool timeout, never retried."""
    engine = create_async_engine(pg_database_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    checkouts: list[int] = []
    event.listen(engine.sync_engine.pool, "checkout", lambda *_args: checkouts.append(1))
    try:
        store = PostgresStateStore(engine, clock=clock)
        async with engine.connect() as held:
            await held.execute(text("SELECT 1"))
            started = time.monotonic()
            with pytest.raises(PoolExhaustedError) as caught:
                await store.get_run("acme", "r1")
            elapsed = time.monotonic() - started
        assert elapsed < 1.0, "the exhausted pool was waited on more than once"
        assert caught.value.retryable is False
        assert len(checkouts) == 1
    finally:
        await engine.dispose()


async def test_a_busy_store_hands_its_connection_to_a_queue_waiting_on_the_pool(
    pg_database_url: str, clock: ManualClock
) -> None:
    """A store and a queue on one engine of two connections: while two callers keep the store
    busy (a call always running, so it would pass each connection on to its next call), a
    queue call waiting on the pool gets one, rather than the pool timeout."""
    engine = create_async_engine(pg_database_url, pool_size=2, max_overflow=0, pool_timeout=2.0)
    store = PostgresStateStore(engine, clock=clock)
    queue = PostgresWorkQueue(engine, clock=clock)
    stop = asyncio.Event()
    warmed = asyncio.Event()
    calls = 0

    async def busy() -> None:
        nonlocal calls
        while not stop.is_set():
            await store.get_run("acme", "r1")
            calls += 1
            if calls >= 20:
                warmed.set()

    try:
        await store.put_run(_run("r1"))
        running = [asyncio.create_task(busy()) for _ in range(2)]
        await warmed.wait()
        started = time.monotonic()
        assert await queue.get_item("acme", "missing") is None
        assert time.monotonic() - started < 1.0
        stop.set()
        await asyncio.gather(*running)
    finally:
        stop.set()
        await engine.dispose()


# -- sizes ------------------------------------------------------------------------------------


async def test_an_oversized_record_is_refused_with_nothing_written(
    postgres_state_store: PostgresStateStore,
    postgres_work_queue: PostgresWorkQueue,
    pg_engine: AsyncEngine,
    statements: list[str],
) -> None:
    """A blob or payload over max_value_bytes is refused before any statement is sent."""
    big = {"x": "a" * LIMIT}
    before = len(statements)
    with pytest.raises(StatePersistenceError) as caught:
        await postgres_state_store.put_run(_run("r1", data=big))
    assert caught.value.reason == "too_large"
    with pytest.raises(StatePersistenceError):
        await postgres_state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data=big)
        )
    with pytest.raises(StatePersistenceError):
        await postgres_work_queue.enqueue(WorkItem(tenant="acme", item_id="i1", payload=big))
    assert len(statements) == before
    for table in ("adk_runs", "adk_sessions", "adk_work", "adk_queue_turns", "adk_run_writes"):
        assert await _scalar(pg_engine, f"SELECT count(*) FROM {table}") == 0


# -- table names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "Runs", "1runs", "runs; DROP TABLE adk_runs", 'ru"ns', "adk runs", "a" * 64, "rüns"],
)
def test_state_tables_refuse_anything_but_a_plain_identifier(name: str) -> None:
    """StateTables refuses a name that is not a plain lower-case identifier, naming the field."""
    with pytest.raises(ValueError, match="runs"):
        StateTables(runs=name)


def test_state_tables_refuse_one_name_for_two_tables() -> None:
    """Two roles cannot share one table."""
    with pytest.raises(ValueError, match="sessions"):
        StateTables(runs="shared", sessions="shared")


async def test_custom_table_names_and_schema_are_used(
    pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """A store built with StateTables and db_schema reads and writes those relations only."""
    names = StateTables(
        runs="my_runs",
        sessions="my_sessions",
        work="my_work",
        queue_turns="my_turns",
        schema="my_schema_version",
        run_writes="my_run_writes",
    )
    tables = tables_for(names, "agents")
    async with pg_engine.begin() as conn:
        await conn.execute(text("CREATE SCHEMA agents"))
        # The test plays the deployment's own migration here; the kit never does.
        await conn.run_sync(tables.runs.metadata.create_all)
    settings = PostgresStoreSettings(db_schema="agents")
    store = PostgresStateStore(pg_engine, clock=clock, settings=settings, tables=names)
    queue = PostgresWorkQueue(pg_engine, clock=clock, settings=settings, tables=names)
    await store.put_run(_run("r1", session_id="s1"))
    await store.patch_run("acme", "r1", output_tokens=3)
    await queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    lease = await queue.claim("w1", lease_for=30)
    assert lease is not None
    await queue.ack(lease)
    assert [r.run_id for r in (await store.list_runs("acme", session_id="s1")).items] == ["r1"]
    assert await _scalar(pg_engine, "SELECT output_tokens FROM agents.my_runs") == 3
    assert await _scalar(pg_engine, "SELECT status FROM agents.my_work") == "done"
    assert await _scalar(pg_engine, "SELECT count(*) FROM agents.my_run_writes") == 2
    assert await _scalar(pg_engine, "SELECT count(*) FROM adk_runs") == 0
    assert await _scalar(pg_engine, "SELECT count(*) FROM adk_work") == 0
    assert await _scalar(pg_engine, "SELECT count(*) FROM adk_run_writes") == 0
    # A batch draws its ids from the deployment's own table's identity, in the batch's order.
    await queue.enqueue_many([WorkItem(tenant="acme", item_id=i) for i in ("x-2", "x-10")])
    leases = await queue.claim_batch("w1", lease_for=30, limit=2)
    assert [lease.item.item_id for lease in leases] == ["x-2", "x-10"]
    assert await _scalar(pg_engine, "SELECT count(*) FROM agents.my_work") == 3


# -- executors ----------------------------------------------------------------------------


async def test_a_store_on_one_connection_commits_each_call(
    pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """Built on an AsyncConnection, each call runs and commits on it; calls take turns."""
    async with pg_engine.connect() as conn:
        store = PostgresStateStore(conn, clock=clock)
        await asyncio.gather(*(store.put_run(_run(f"r{n}")) for n in range(5)))
        assert not conn.in_transaction()
        # Committed: another connection sees them.
        other = PostgresStateStore(pg_engine, clock=clock)
        assert len((await other.list_runs("acme")).items) == 5
        await conn.begin()
        with pytest.raises(ValueError, match="bound"):
            await store.get_run("acme", "r0")
        await conn.rollback()


async def test_create_engine_replaces_a_closed_connection_without_a_round_trip(
    pg_database_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled connection the server ended is refused at checkout, so even a call that is
    never sent again (a session put) succeeds on a fresh one; a call is one statement, with
    no pre-ping in front of it."""
    from pydantic import SecretStr

    from statepact.storage.postgres import create_engine

    plain = pg_database_url.replace("postgresql+asyncpg://", "postgresql://")
    settings = PostgresStoreSettings(dsn=SecretStr(plain), pool_size=1, failover_attempts=1)
    engine = create_engine(settings)
    statements: list[str] = []
    drivers: list[Any] = []

    def on_execute(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)
        drivers.append(conn.connection.driver_connection)

    direct = _direct.Statements.execute

    async def on_driver(self: _direct.Statements, statement: Any, parameters: Any = None) -> Any:
        # On an engine the store runs its statements on the driver (DirectExecutor).
        statements.append(statement.sql)
        drivers.append(self.driver)
        return await direct(self, statement, parameters)

    monkeypatch.setattr(_direct.Statements, "execute", on_driver)
    event.listen(engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        store = PostgresStateStore(engine, clock=clock, settings=settings)
        await store.put_session(SessionRecord(tenant="acme", session_id="s0"))
        pooled = drivers[-1]
        await _drop_the_pooled_connection(engine, pg_database_url)
        for _ in range(200):  # until the event loop has read the server's goodbye
            if pooled.is_closed():
                break
            await asyncio.sleep(0.01)
        assert pooled.is_closed()
        statements.clear()
        await store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        assert await store.get_session("acme", "s1") is not None
        assert len(statements) == 2, statements  # the put and the get, nothing else
    finally:
        await engine.dispose()


async def test_create_engine_sizes_the_pool_from_settings(
    pg_database_url: str, clock: ManualClock
) -> None:
    """create_engine(settings) takes the DSN, pool size and pool timeout from the settings."""
    from pydantic import SecretStr

    from statepact.storage.postgres import create_engine

    plain = pg_database_url.replace("postgresql+asyncpg://", "postgresql://")
    settings = PostgresStoreSettings(dsn=SecretStr(plain), pool_size=2, pool_timeout=0.1)
    engine = create_engine(settings)
    try:
        assert engine.url.drivername == "postgresql+asyncpg"
        assert engine.pool.size() == 2  # type: ignore[attr-defined]
        store = await PostgresStateStore.open(engine, clock=clock, settings=settings)
        await store.put_run(_run("r1"))
        assert await store.get_run("acme", "r1") is not None
    finally:
        await engine.dispose()
