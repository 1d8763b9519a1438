"""The application's role on PostgreSQL: the grants docs/operations.md lists are enough.

The role that runs the migrations owns statepact's tables; the application may
connect as another role, granted DML on the tables and USAGE on the sequences
(the lease tokens, and the item ids ``enqueue_many`` draws in its batch's
order). These tests connect as such a role and run every store, show what a
role without the sequences' USAGE is refused, and what ``missing_privileges``
(``statepact doctor``'s check) reports for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact import PostgresStoreSettings, QueuePolicy, RunRecord, WorkItem
from statepact.clock import ManualClock
from statepact.errors import PreflightError
from statepact.storage.postgres import StateTables, open_backing
from statepact.storage.postgres.schema import tables_for
from statepact.storage.postgres.verify import missing_privileges
from tests.fixtures.postgres import admin_execute

pytestmark = pytest.mark.integration

#: What docs/operations.md ("The application's role") tells a DBA to grant.
GRANTS = (
    'GRANT USAGE ON SCHEMA public TO "{role}"',
    'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"',
    'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"',
)


#: The sequences the application's role draws from or reads, as ``missing_privileges``
#: names them (the identities' as ``pg_get_serial_sequence`` answers).
SEQUENCES = {
    "sequence adk_work_token_seq",
    "sequence statepact_version_seq",
    "sequence public.adk_work_id_seq",
    "sequence public.adk_runs_seq_seq",
    "sequence public.adk_sessions_seq_seq",
    "sequence public.statepact_adk_sessions_seq_seq",
}


@contextlib.asynccontextmanager
async def _role_engine(
    pg_database_url: str, statepact_postgres_url: str, grants: tuple[str, ...]
) -> AsyncIterator[AsyncEngine]:
    role = f"statepact_app_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    await admin_execute(statepact_postgres_url, f'CREATE ROLE "{role}" LOGIN')
    owner = create_async_engine(pg_database_url)
    try:
        async with owner.begin() as conn:
            for grant in grants:
                await conn.execute(text(grant.format(role=role)))
        engine = create_async_engine(make_url(pg_database_url).set(username=role))
        try:
            yield engine
        finally:
            await engine.dispose()
    finally:
        async with owner.begin() as conn:
            await conn.execute(text(f'DROP OWNED BY "{role}"'))
        await owner.dispose()
        await admin_execute(statepact_postgres_url, f'DROP ROLE IF EXISTS "{role}"')


@pytest.fixture
async def app_engine(
    pg_database_url: str, statepact_postgres_url: str
) -> AsyncIterator[AsyncEngine]:
    """An engine connected as a role granted exactly ``GRANTS``."""
    async with _role_engine(pg_database_url, statepact_postgres_url, GRANTS) as engine:
        yield engine


@pytest.fixture
async def tables_only_engine(
    pg_database_url: str, statepact_postgres_url: str
) -> AsyncIterator[AsyncEngine]:
    """An engine connected as a role granted the tables' DML but no sequence."""
    async with _role_engine(pg_database_url, statepact_postgres_url, GRANTS[:2]) as engine:
        yield engine


async def test_the_documented_grants_run_every_store(app_engine: AsyncEngine) -> None:
    """As the application's role: runs, batches, claims, settles, reaps and transactions."""
    clock = ManualClock()
    backing = await open_backing(
        PostgresStoreSettings(), clock=clock, policy=QueuePolicy(), client=app_engine
    )
    async with backing:
        run = await backing.state.put_run(RunRecord(tenant="acme", run_id="r1"))
        run = await backing.state.patch_run("acme", "r1", input_tokens=5)
        assert run.input_tokens == 5

        queue = backing.queue
        ids = ["x-2", "x-10", "x-1"]
        stored = await queue.enqueue_many([WorkItem(tenant="acme", item_id=i) for i in ids])
        assert [item.item_id for item in stored] == ids
        await queue.enqueue(WorkItem(tenant="beta", item_id="b1"))
        leases = await queue.claim_batch("w1", lease_for=30, limit=4)
        # A tenant's items in the batch's order, the tenants in turn.
        assert [(lease.item.tenant, lease.item.item_id) for lease in leases] == [
            ("acme", "x-2"),
            ("beta", "b1"),
            ("acme", "x-10"),
            ("acme", "x-1"),
        ]
        settled = await queue.ack_many(leases[:3])
        assert all(isinstance(item, WorkItem) for item in settled), settled
        clock.advance(31)
        assert [item.item_id for item in await queue.reap()] == ["x-1"]

        async with backing.manager.transaction() as tx:
            tx.write("agents", "a1", {"n": 1})
        async with backing.manager.transaction() as tx:
            assert await tx.read("agents", "a1") == {"n": 1}


async def test_a_role_without_the_sequences_is_refused_an_enqueue_many_and_nothing_is_written(
    tables_only_engine: AsyncEngine, pg_database_url: str
) -> None:
    """Without USAGE on the sequences, ``enqueue_many`` fails naming the privilege and
    stores nothing. A lone ``enqueue`` (the identity's own default) lands: the refusal
    is the sequence's, not the table's (enqueues made at once share an ``enqueue_many``
    statement and need the grant too, as docs/operations.md says)."""
    backing = await open_backing(
        PostgresStoreSettings(), policy=QueuePolicy(), client=tables_only_engine
    )
    async with backing:
        with pytest.raises(PreflightError, match="permission denied for sequence adk_work_id_seq"):
            await backing.queue.enqueue_many(
                [WorkItem(tenant="acme", item_id=f"i{n}") for n in range(3)]
            )
        await backing.queue.enqueue(WorkItem(tenant="acme", item_id="one"))
    owner = create_async_engine(pg_database_url)
    try:
        async with owner.connect() as conn:
            rows = (await conn.execute(text("SELECT item_id FROM adk_work"))).scalars().all()
    finally:
        await owner.dispose()
    assert rows == ["one"]


async def test_missing_privileges_finds_none_for_the_documented_grants(
    app_engine: AsyncEngine,
) -> None:
    assert await missing_privileges(app_engine) == []


async def test_missing_privileges_names_each_sequence_a_tables_only_role_lacks(
    tables_only_engine: AsyncEngine,
) -> None:
    lacking = await missing_privileges(tables_only_engine)
    assert {line.split(":")[0] for line in lacking} == SEQUENCES, lacking
    assert all(line.endswith(": USAGE, SELECT") for line in lacking), lacking


async def test_missing_privileges_names_every_table_of_a_role_with_no_grant(
    pg_database_url: str, statepact_postgres_url: str
) -> None:
    """Only the schema's USAGE and adk_schema's SELECT (what verify() reads): every other
    table lacks its four privileges, adk_schema nothing, every sequence both."""
    grants = (GRANTS[0], 'GRANT SELECT ON adk_schema TO "{role}"')
    async with _role_engine(pg_database_url, statepact_postgres_url, grants) as engine:
        lacking = await missing_privileges(engine)
    tables = {line.split(":")[0]: line.split(": ")[1] for line in lacking}
    assert "adk_schema" not in tables
    assert tables["adk_work"] == "SELECT, INSERT, UPDATE, DELETE"
    assert tables["statepact_values"] == "SELECT, INSERT, UPDATE, DELETE"
    assert set(tables) >= SEQUENCES


async def test_doctor_refuses_a_role_without_the_sequences_naming_them_and_the_fix(
    pg_database_url: str, statepact_postgres_url: str
) -> None:
    from statepact.cli import doctor
    from tests._cli import parse

    async with _role_engine(pg_database_url, statepact_postgres_url, GRANTS[:2]) as engine:
        url = engine.url.render_as_string(hide_password=False)
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(
            doctor.command, parse(doctor.add_arguments, "--postgres", url), out=out, err=err
        )
    text_out = out.getvalue()
    assert code == 1, text_out
    assert "ok       migrations" in text_out
    assert "REFUSED  privileges: the connected role lacks " in text_out
    assert "sequence public.adk_work_id_seq: USAGE, SELECT" in text_out
    assert "fix: as the tables' owner: GRANT USAGE ON SCHEMA <schema> TO <role>; GRANT SELECT" in (
        text_out
    )
    assert "doctor: 1 check(s) refused" in text_out


async def test_missing_privileges_reads_a_deployments_own_names_and_schema(
    pg_database_url: str, statepact_postgres_url: str
) -> None:
    """With ``tables`` and ``db_schema``, the deployment's relations are the ones checked."""
    names = StateTables(runs="my_runs", sessions="my_sessions", work="my_work")
    owner = create_async_engine(pg_database_url)
    try:
        async with owner.begin() as conn:
            await conn.execute(text("CREATE SCHEMA agents"))
            await conn.run_sync(tables_for(names, "agents").runs.metadata.create_all)
    finally:
        await owner.dispose()
    grants = (*GRANTS, 'GRANT USAGE ON SCHEMA agents TO "{role}"')
    async with _role_engine(pg_database_url, statepact_postgres_url, grants) as engine:
        lacking = await missing_privileges(engine, tables=names, db_schema="agents")
        assert await missing_privileges(engine) == []  # the default relations: all granted
    assert "agents.my_work: SELECT, INSERT, UPDATE, DELETE" in lacking
    assert "agents.adk_schema: SELECT" in lacking
    assert "sequence agents.my_work_id_seq: USAGE, SELECT" in lacking
    assert "sequence agents.my_work_token_seq: USAGE, SELECT" in lacking
    assert not any("public." in line for line in lacking), lacking


async def test_a_schema_the_role_may_not_enter_is_named_alone_by_both(
    pg_database_url: str, statepact_postgres_url: str
) -> None:
    """No USAGE on ``public`` (revoked from PUBLIC in this test's own database): the tables
    look absent to the role, so both ``missing_privileges`` and the doctor name the schema
    rather than what is in it; the doctor's schema check is refused as well."""
    from statepact.cli import doctor
    from tests._cli import parse

    owner = create_async_engine(pg_database_url)
    try:
        async with owner.begin() as conn:
            await conn.execute(text("REVOKE USAGE ON SCHEMA public FROM PUBLIC"))
    finally:
        await owner.dispose()
    grants = ('GRANT SELECT ON adk_schema TO "{role}"',)
    async with _role_engine(pg_database_url, statepact_postgres_url, grants) as engine:
        lacking = await missing_privileges(engine)
        url = engine.url.render_as_string(hide_password=False)
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(
            doctor.command, parse(doctor.add_arguments, "--postgres", url), out=out, err=err
        )
    assert lacking == ["schema public: USAGE"]
    text_out = out.getvalue()
    assert code == 1, text_out
    assert "REFUSED  schema version" in text_out
    assert "REFUSED  privileges: the connected role lacks schema public: USAGE" in text_out


async def test_open_refuses_a_role_that_may_not_read_the_schema_version_naming_the_table(
    pg_database_url: str, statepact_postgres_url: str
) -> None:
    """verify() (run by open) reads adk_schema: without SELECT there, the refusal quotes
    the server's message naming the table, and says where the grants are."""
    async with _role_engine(pg_database_url, statepact_postgres_url, GRANTS[:1]) as engine:
        with pytest.raises(PreflightError) as caught:
            await open_backing(PostgresStoreSettings(), policy=QueuePolicy(), client=engine)
    assert "permission denied for table adk_schema" in str(caught.value)
    assert "docs/operations.md#the-applications-role" in str(caught.value)
    assert caught.value.retryable is False
