"""``statepact queue stats | dead-letters | requeue | purge-dead`` on real Redis and PostgreSQL.

Each test fills a queue through the library (two tenants: dead, queued and
leased items), runs the command as ``statepact queue ...`` parses it, and checks
both what it printed and the queue it left, read back through the library.
The PostgreSQL URL carries a password the server never asks for, to show that
no output prints it.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import AsyncIterator

import pytest

from statepact import cli
from statepact.cli import queue as queue_cli
from statepact.clock import SystemClock
from statepact.models import ItemStatus, Lease, WorkItem
from statepact.queue import BaseWorkQueue
from tests.fixtures.redis import unlink_namespace

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-pw"


@pytest.fixture(params=["redis", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[list[str], BaseWorkQueue]]:
    """The server options for the command, and the test's own view of the same queue."""
    if request.param == "redis":
        from redis.asyncio import Redis

        from statepact.settings import RedisStoreSettings
        from statepact.storage.redis import RedisWorkQueue

        url: str = request.getfixturevalue("statepact_redis_url")
        namespace = f"spq{uuid.uuid4().hex[:10]}"
        client = Redis.from_url(url)
        settings = RedisStoreSettings(namespace=namespace, queue_name="jobs")
        try:
            yield (
                ["--redis", url, "--namespace", namespace, "--queue", "jobs"],
                RedisWorkQueue(client, clock=SystemClock(), settings=settings),
            )
        finally:
            await unlink_namespace(client, namespace)
        return
    from sqlalchemy.engine import make_url

    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresWorkQueue, create_engine

    plain = make_url(request.getfixturevalue("pg_database_url"))
    url = plain.set(password=PASSWORD).render_as_string(hide_password=False)
    pg = PostgresStoreSettings(dsn=url, pool_size=4, queue_name="jobs")
    engine = create_engine(pg)
    try:
        yield (
            ["--postgres", url, "--queue", "jobs"],
            PostgresWorkQueue(engine, clock=SystemClock(), settings=pg),
        )
    finally:
        await engine.dispose()


async def fill(queue: BaseWorkQueue) -> Lease:
    """acme: dead-1, dead-2 (dead), ready (queued), busy (leased); beta: dead-b (dead), b1
    (queued). Returns busy's lease."""
    for item_id in ("dead-1", "dead-2", "busy", "ready"):
        await queue.enqueue(WorkItem(tenant="acme", item_id=item_id, payload={"id": item_id}))
    await queue.enqueue(WorkItem(tenant="beta", item_id="dead-b"))
    busy: Lease | None = None
    for _ in range(4):
        lease = await queue.claim("ops", lease_for=600)
        assert lease is not None
        if lease.item.item_id == "busy":
            busy = lease
        else:
            await queue.fail(lease, f"ValueError: {lease.item.item_id}", retryable=False)
    await queue.enqueue(WorkItem(tenant="beta", item_id="b1"))
    assert busy is not None
    ready = await queue.get_item("acme", "ready")
    assert ready is not None and ready.status is ItemStatus.QUEUED
    return busy


async def run(options: list[str], *argv: str) -> tuple[int, str, str]:
    """``statepact queue ARGV... OPTIONS`` parsed by the real parser; (exit code, out, err)."""
    args = cli.build_parser().parse_args(["queue", *argv, *options])
    out, err = io.StringIO(), io.StringIO()
    # The command runs its own event loop (asyncio.run): call it from a thread.
    code = await asyncio.to_thread(lambda: queue_cli.command(args, out=out, err=err))
    assert PASSWORD not in out.getvalue() + err.getvalue()
    return code, out.getvalue(), err.getvalue()


async def test_stats_prints_each_tenant_and_the_totals(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """stats: a line per tenant with queued, leased and dead, then the totals; --json the same
    numbers as WorkQueue.stats()."""
    options, view = served
    await fill(view)
    code, out, err = await run(options, "stats")
    assert code == 0, err
    lines = out.splitlines()
    assert "Redis at" in lines[0] or "PostgreSQL at" in lines[0]
    assert lines[1] == "queue 'jobs'"
    assert lines[2].split() == ["tenant", "queued", "leased", "dead", "cancelled"]
    assert [line.split() for line in lines[3:]] == [
        ["acme", "1", "1", "2", "0"],
        ["beta", "1", "0", "1", "0"],
        ["total", "2", "1", "3", "0"],
    ]
    code, out, err = await run(options, "stats", "--json")
    assert code == 0, err
    stats = await view.stats()
    assert json.loads(out) == {
        "queue": "jobs",
        "tenants": {t: c.model_dump() for t, c in stats.tenants.items()},
        "queued": 2,
        "leased": 1,
        "dead": 3,
        "cancelled": 0,
    }


async def test_stats_of_an_empty_queue_says_so(served: tuple[list[str], BaseWorkQueue]) -> None:
    """stats of a queue with nothing in it: one line saying so, exit 0."""
    options, _ = served
    code, out, err = await run(options, "stats")
    assert code == 0, err
    assert out.splitlines()[1] == "queue 'jobs': no queued, leased, dead or cancelled items"


async def test_dead_letters_lists_the_tenants_dead_items_oldest_first(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """dead-letters TENANT: the count, then each dead item with attempts, death time, error
    and payload; --limit shows the oldest N and says so; --json carries the records."""
    options, view = served
    await fill(view)
    code, out, err = await run(options, "dead-letters", "acme")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == "queue 'jobs', tenant 'acme': 2 dead item(s)"
    assert lines[2].startswith("  dead-1  attempts 1  died ")
    assert lines[2].endswith("error: ValueError: dead-1")
    assert lines[3] == '    payload: {"id": "dead-1"}'
    assert lines[4].startswith("  dead-2  attempts 1  died ")
    code, out, _ = await run(options, "dead-letters", "acme", "--limit", "1")
    assert code == 0
    assert out.splitlines()[1] == (
        "queue 'jobs', tenant 'acme': 2 dead item(s), the oldest 1 shown (--limit)"
    )
    assert len(out.splitlines()) == 4
    code, out, _ = await run(options, "dead-letters", "acme", "--json")
    assert code == 0
    document = json.loads(out)
    assert (document["queue"], document["tenant"], document["dead"]) == ("jobs", "acme", 2)
    dead = await view.dead_letters("acme")
    assert document["items"] == [item.model_dump(mode="json") for item in dead]
    code, out, _ = await run(options, "dead-letters", "nobody")
    assert (code, out.splitlines()[1]) == (0, "queue 'jobs', tenant 'nobody': 0 dead item(s)")


async def test_requeue_brings_a_dead_item_back_and_refuses_any_other(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """requeue TENANT ITEM: the dead item is queued again with attempts reset (exit 0); an
    item that is queued, leased or missing is refused in one line, changing nothing (exit 1)."""
    options, view = served
    busy = await fill(view)
    code, out, err = await run(options, "requeue", "acme", "dead-1")
    assert code == 0, err
    assert out == (
        "requeued item 'dead-1' of tenant 'acme' in queue 'jobs': queued, due now, attempts "
        "reset (last error kept: ValueError: dead-1)\n"
    )
    back = await view.get_item("acme", "dead-1")
    assert back is not None
    assert (back.status, back.attempts, back.last_error) == (
        ItemStatus.QUEUED,
        0,
        "ValueError: dead-1",
    )
    before = await view.stats()
    for item_id, state in (
        ("ready", "is queued, not dead"),
        ("busy", "is leased, not dead"),
        ("dead-1", "is queued, not dead"),
        ("missing", "does not exist"),
    ):
        code, out, err = await run(options, "requeue", "acme", item_id)
        assert (code, out) == (1, "")
        assert err == (
            f"statepact queue requeue: error: item_id: {item_id!r} of tenant 'acme' in queue "
            f"'jobs' {state}; only a dead item can be requeued\n"
        )
    assert await view.stats() == before
    assert (await view.ack(busy)).status is ItemStatus.DONE  # the lease was left alone
    code, out, _ = await run(options, "requeue", "acme", "dead-2", "--json")
    assert code == 0
    again = await view.get_item("acme", "dead-2")
    assert again is not None and json.loads(out) == again.model_dump(mode="json")


async def test_purge_dead_needs_yes_and_deletes_only_that_tenants_dead_items(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """purge-dead TENANT without --yes says how many it would delete and deletes nothing
    (exit 1); with --yes it deletes them and says how many; queued and leased items and the
    other tenant stay; a second purge deletes 0."""
    options, view = served
    busy = await fill(view)
    code, out, err = await run(options, "purge-dead", "acme")
    assert (code, out) == (1, "")
    assert err == (
        "statepact queue purge-dead: error: would purge 2 dead item(s) of tenant 'acme' from "
        "queue 'jobs'; nothing was deleted: pass --yes to delete them\n"
    )
    assert len(await view.dead_letters("acme")) == 2
    code, out, err = await run(options, "purge-dead", "acme", "--yes")
    assert code == 0, err
    assert out == "purged 2 dead item(s) of tenant 'acme' from queue 'jobs'\n"
    assert await view.dead_letters("acme") == []
    assert await view.get_item("acme", "dead-1") is None
    stats = await view.stats()
    assert {t: (c.queued, c.leased, c.dead) for t, c in stats.tenants.items()} == {
        "acme": (1, 1, 0),
        "beta": (1, 0, 1),
    }
    assert [item.item_id for item in await view.dead_letters("beta")] == ["dead-b"]
    assert (await view.heartbeat(busy)).item.item_id == "busy"  # still held by its lease
    code, out, _ = await run(options, "purge-dead", "acme", "--yes", "--json")
    assert (code, json.loads(out)) == (0, {"queue": "jobs", "tenant": "acme", "purged": 0})
    # The purged id is free again: an enqueue stores a new item under it.
    fresh = await view.enqueue(WorkItem(tenant="acme", item_id="dead-1", payload={"v": 2}))
    assert (fresh.status, fresh.payload) == (ItemStatus.QUEUED, {"v": 2})


async def test_a_bad_tenant_is_refused_in_one_line(served: tuple[list[str], BaseWorkQueue]) -> None:
    """An empty TENANT: the front's refusal, naming tenant, as one line; exit 1."""
    options, view = served
    await fill(view)
    for argv in (("dead-letters", ""), ("purge-dead", "", "--yes"), ("purge-dead", "")):
        code, out, err = await run(options, *argv)
        assert (code, out) == (1, "")
        assert err == f"statepact queue {argv[0]}: error: tenant: must not be empty\n"
    assert (await view.stats()).dead == 3


async def test_a_queue_that_is_not_there_says_what_to_do(empty_database_url: str) -> None:
    """PostgreSQL without the tables: one line pointing at `statepact db upgrade`; exit 1."""
    code, _, err = await run(["--postgres", empty_database_url], "stats")
    assert code == 1
    assert err.startswith("statepact queue stats: error: ")
    assert "statepact db upgrade" in err


async def test_schema_names_the_postgres_schema_holding_the_tables(pg_database_url: str) -> None:
    """--schema: the queue in that schema's tables (migrated there), not the search_path's."""
    from sqlalchemy import text

    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresWorkQueue, create_engine, migrate

    migrated = create_engine(
        PostgresStoreSettings(dsn=pg_database_url, pool_size=2),
        connect_args={"server_settings": {"search_path": "ops"}},
    )
    pg = PostgresStoreSettings(dsn=pg_database_url, pool_size=2, db_schema="ops")
    engine = create_engine(pg)
    try:
        async with migrated.begin() as conn:
            await conn.execute(text("CREATE SCHEMA ops"))
        await migrate.upgrade(migrated)
        view = PostgresWorkQueue(engine, clock=SystemClock(), settings=pg)
        await fill(view)
        options = ["--postgres", pg_database_url, "--schema", "ops"]
        code, out, err = await run(options, "stats")
        assert code == 0, err
        assert out.splitlines()[0].endswith(", schema 'ops'")
        assert out.splitlines()[5].split() == ["total", "2", "1", "3", "0"]
        code, out, _ = await run(["--postgres", pg_database_url], "stats")
        empty = "queue 'default': no queued, leased, dead or cancelled items"
        assert (code, out.splitlines()[1]) == (0, empty)
        code, out, err = await run(options, "purge-dead", "beta", "--yes")
        assert (code, out) == (0, "purged 1 dead item(s) of tenant 'beta' from queue 'default'\n")
        assert (await view.stats()).dead == 2
    finally:
        await migrated.dispose()
        await engine.dispose()
