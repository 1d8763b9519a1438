"""The plugin's per-test fixtures in a project outside this tree, on real servers.

An inner pytest run (a subprocess, in ``tmp_path``, with no ``conftest.py`` of
ours) stands for an application's own test suite: its ``conftest.py`` applies
its own schema to statepact's template through the
``pytest_statepact_postgres_template`` hook, its tests use the per-test
database and Redis namespace, and its conformance module is the few lines
``docs/testing.md`` gives, run on the outer session's servers (handed over as
``STATEPACT_TEST_*_URL``, with servers required). Then the helpers underneath:
the namespace sweep (on one server and on a cluster) and the time a clone takes.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from statepact.clock import ManualClock
from statepact.models import RunRecord, WorkItem
from statepact.settings import RedisStoreSettings
from statepact.storage.postgres import migrate
from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue
from statepact.testing.cluster import LocalRedisCluster
from statepact.testing.databases import (
    build_template,
    create_database,
    database_url,
    drop_database,
    run_in_thread,
    unique_database_name,
)
from statepact.testing.namespaces import clear_namespace, namespace_patterns, unique_namespace
from statepact.tx import TransactionManager
from tests._inner_pytest import run_pytest_without_servers

pytestmark = pytest.mark.integration

INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
addopts = --strict-markers
xfail_strict = true
filterwarnings = error
"""

# The application's conftest: its own table (and a row every test starts with) in the template.
APP_CONFTEST = """
import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine


def pytest_statepact_postgres_template(url):
    async def build():
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.execute(text(
                "CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL)"
            ))
            await conn.execute(text("INSERT INTO orders VALUES (0, 'seed')"))
        await engine.dispose()

    asyncio.run(build())
"""

APP_TESTS = """
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from statepact import RunRecord, TransactionManager, WorkItem
from statepact.storage.postgres import PostgresStateStore, migrate


async def _orders(url):
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO orders VALUES (1, 'book')"))
            rows = (await conn.execute(text("SELECT id FROM orders ORDER BY id"))).all()
            name = (await conn.execute(text("SELECT current_database()"))).scalar_one()
    finally:
        await engine.dispose()
    return [row.id for row in rows], name


@pytest.mark.parametrize("attempt", [1, 2, 3])
async def test_each_test_starts_from_the_template(statepact_postgres_database, attempt):
    ids, name = await _orders(statepact_postgres_database)
    assert ids == [0, 1]  # the hook's row, and this test's only: nothing leaked in
    assert name.startswith("statepact_t_")
    with open("databases.txt", "a") as out:
        out.write(name + "\\n")


async def test_statepact_schema_is_at_head_with_a_timeout(statepact_postgres_database):
    assert await migrate.current(statepact_postgres_database) == migrate.head()
    engine = create_async_engine(statepact_postgres_database)  # no timeout of its own
    try:
        async with engine.connect() as conn:
            timeout = (await conn.execute(text("SHOW statement_timeout"))).scalar_one()
        assert timeout == "30s"
        await PostgresStateStore.open(engine)  # verify() passes on the database as it is
    finally:
        await engine.dispose()


@pytest.mark.parametrize("attempt", [1, 2])
async def test_stores_see_nothing_of_other_tests(
    statepact_postgres_state_store, statepact_redis_state_store, statepact_redis_work_queue,
    attempt,
):
    for store in (statepact_postgres_state_store, statepact_redis_state_store):
        assert (await store.list_runs("acme")).items == []
        await store.put_run(RunRecord(tenant="acme", run_id="r1", session_id="s"))
    assert await statepact_redis_work_queue.claim("w", lease_for=30) is None
    await statepact_redis_work_queue.enqueue(WorkItem(tenant="acme", item_id="i1"))


async def test_the_backend_is_open_and_empty(statepact_postgres_backend):
    manager = TransactionManager(statepact_postgres_backend)
    async with manager.transaction() as tx:
        assert await tx.read("orders", "o1") is None
        tx.write("orders", "o1", {"n": 1})
    assert tx.result.version == 1  # the first commit on this database
"""

CONFORMANCE = """
from statepact.testing.conformance import (
    PostgresStateStoreConformance,
    PostgresTransactionConformance,
    PostgresWorkQueueConformance,
    RedisStateStoreConformance,
    RedisTransactionConformance,
    RedisWorkQueueConformance,
)


class TestStateOnOurPostgres(PostgresStateStoreConformance):
    pass


class TestQueueOnOurPostgres(PostgresWorkQueueConformance):
    pass


class TestTransactionsOnOurPostgres(PostgresTransactionConformance):
    pass


class TestStateOnOurRedis(RedisStateStoreConformance):
    pass


class TestQueueOnOurRedis(RedisWorkQueueConformance):
    pass


class TestTransactionsOnOurRedis(RedisTransactionConformance):
    pass
"""

CLASSES = (
    "TestStateOnOurPostgres",
    "TestQueueOnOurPostgres",
    "TestTransactionsOnOurPostgres",
    "TestStateOnOurRedis",
    "TestQueueOnOurRedis",
    "TestTransactionsOnOurRedis",
)


def _project(tmp_path: Path, **files: str) -> Path:
    project = tmp_path / "app"
    project.mkdir()
    (project / "pytest.ini").write_text(INI)
    for name, text in files.items():
        (project / name).write_text(text)
    return project


def _inner(
    project: Path, redis_url: str, postgres_url: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {
        "STATEPACT_TEST_REDIS_URL": redis_url,
        "STATEPACT_TEST_POSTGRES_URL": postgres_url,
        "STATEPACT_REQUIRE_SERVERS": "1",
    }
    return run_pytest_without_servers(project, *args, env=env, timeout=timeout)


def _counts(stdout: str) -> dict[str, int]:
    """The final summary's counts: ``{"passed": 12, "failed": 1, ...}``."""
    summary = stdout.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}


async def _statepact_databases(server_url: str) -> set[str]:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(server_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE 'statepact_%'")
            )
            return {row.datname for row in rows}
    finally:
        await engine.dispose()


async def test_an_application_suite_uses_the_per_test_database_and_namespace(
    tmp_path: Path, statepact_redis_url: str, statepact_postgres_url: str
) -> None:
    """The hook's table is in every per-test database, which starts from the template
    (writes do not leak), has statepact's schema at head and a statement_timeout; the
    Redis stores see nothing of other tests; nothing is left on either server after."""
    before = await _statepact_databases(statepact_postgres_url)
    project = _project(tmp_path, **{"conftest.py": APP_CONFTEST, "test_app.py": APP_TESTS})
    run = _inner(project, statepact_redis_url, statepact_postgres_url, "-q")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert _counts(run.stdout) == {"passed": 7}
    names = (project / "databases.txt").read_text().split()
    assert len(names) == len(set(names)) == 3
    assert await _statepact_databases(statepact_postgres_url) == before
    redis = Redis.from_url(statepact_redis_url)
    try:
        assert [key async for key in redis.scan_iter(match="statepact-test-*")] == []
    finally:
        await redis.aclose()


async def test_the_conformance_suites_run_on_the_applications_servers(
    tmp_path: Path, statepact_redis_url: str, statepact_postgres_url: str
) -> None:
    """The few lines of docs/testing.md run all three suites on PostgreSQL (a database
    per test, the application's hook applied) and on Redis (a namespace per test):
    every collected test passes, none skipped."""
    project = _project(
        tmp_path, **{"conftest.py": APP_CONFTEST, "test_statepact_conformance.py": CONFORMANCE}
    )
    collected = _inner(project, statepact_redis_url, statepact_postgres_url, "--collect-only", "-q")
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr
    per_class = {cls: collected.stdout.count(f"::{cls}::") for cls in CLASSES}
    assert all(count > 20 for count in per_class.values()), per_class
    run = _inner(project, statepact_redis_url, statepact_postgres_url, "-q", timeout=540)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert _counts(run.stdout) == {"passed": sum(per_class.values())}


async def test_a_hook_that_leaves_a_connection_open_fails_the_session_saying_so(
    tmp_path: Path, statepact_redis_url: str, statepact_postgres_url: str
) -> None:
    """PostgreSQL cannot clone a database in use: the plugin names the hook and the fix,
    and the template is dropped all the same."""
    leaky = APP_CONFTEST.replace(
        "        await engine.dispose()\n", "        _keep.append(engine)\n"
    )
    leaky = leaky.replace("def pytest_statepact", "_keep = []\n\n\ndef pytest_statepact")
    assert leaky != APP_CONFTEST
    tests = "def test_db(statepact_postgres_database):\n    pass\n"
    project = _project(tmp_path, **{"conftest.py": leaky, "test_app.py": tests})
    before = await _statepact_databases(statepact_postgres_url)
    run = _inner(project, statepact_redis_url, statepact_postgres_url, "-q")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr
    assert "1 error" in run.stdout
    assert "connection(s) to the template database are still open" in run.stdout
    assert "pytest_statepact_postgres_template" in run.stdout
    assert await _statepact_databases(statepact_postgres_url) == before


def _timed(work: Callable[[str], Awaitable[object]], kind: str, server_url: str) -> float:
    """Seconds ``work(name)`` took on a new database name. The database it made must be at the
    head revision (usable by the stores); it is dropped after."""
    name = unique_database_name(kind)
    started = time.perf_counter()
    try:
        run_in_thread(lambda: work(name))
        seconds = time.perf_counter() - started
        url = database_url(server_url, name)
        assert run_in_thread(lambda: migrate.current(url)) == migrate.head()
        return seconds
    finally:
        run_in_thread(lambda: drop_database(server_url, name))


def test_a_clone_of_the_template_is_a_migrated_database(
    statepact_postgres_url: str, statepact_postgres_template: str
) -> None:
    """A per-test database as the fixture makes it (its own loop in a thread, a connection,
    CREATE DATABASE ... TEMPLATE, the timeout) is at the head revision, as one built by the
    migrations is. What each costs (medians of ten clones and three builds) is printed for
    the record, not asserted: timings are a benchmark's business on a shared machine."""
    server = statepact_postgres_url
    clones = [
        _timed(
            lambda name: create_database(server, name, template=statepact_postgres_template),
            "clone",
            server,
        )
        for _ in range(10)
    ]
    builds = [_timed(lambda name: build_template(server, name), "build", server) for _ in range(3)]
    clone, build = statistics.median(clones), statistics.median(builds)
    print(f"per-test database: clone {clone * 1000:.0f} ms, migrate {build * 1000:.0f} ms")


async def _fill_namespace(redis: Redis | RedisCluster, namespace: str, clock: ManualClock) -> None:
    settings = RedisStoreSettings(namespace=namespace)
    store = RedisStateStore(redis, clock=clock, settings=settings)
    queue = RedisWorkQueue(redis, clock=clock, settings=settings)
    for tenant in ("acme", "globex", "initech", "umbrella"):
        await store.put_run(RunRecord(tenant=tenant, run_id="r1", session_id="s1"))
        await queue.enqueue(WorkItem(tenant=tenant, item_id="i1"))
    async with TransactionManager(
        RedisBackend(redis, prefix=namespace, clock=clock)
    ).transaction() as tx:
        tx.write("orders", "o1", {"n": 1})


async def _keys(redis: Redis | RedisCluster, namespace: str) -> list[bytes]:
    found: list[bytes] = []
    for pattern in namespace_patterns(namespace):
        found += [key async for key in redis.scan_iter(match=pattern)]
    return found


async def test_clear_namespace_deletes_its_keys_and_no_others(
    statepact_redis_url: str, clock: ManualClock
) -> None:
    """Every key the store, the queue and a backend prefixed with the namespace wrote is
    deleted; another namespace (one that extends this one's name, too) keeps its keys."""
    mine, other = unique_namespace(), unique_namespace()
    longer = mine + "x"
    redis = Redis.from_url(statepact_redis_url)
    try:
        for namespace in (mine, other, longer):
            await _fill_namespace(redis, namespace, clock)
        written = len(await _keys(redis, mine))
        assert written > 10
        assert await clear_namespace(redis, mine) == written
        assert await _keys(redis, mine) == []
        for namespace in (other, longer):
            assert len(await _keys(redis, namespace)) == written
            await clear_namespace(redis, namespace)
    finally:
        await redis.aclose()


async def test_clear_namespace_on_a_cluster(
    local_cluster: LocalRedisCluster, clock: ManualClock
) -> None:
    """On a cluster the namespace's keys live in several slots (one per tenant, plus the
    queue's and the backend's); the sweep finds them on every primary."""
    redis = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in local_cluster.startup_nodes]
    )
    await redis.initialize()
    try:
        namespace, other = unique_namespace(), unique_namespace()
        await _fill_namespace(redis, namespace, clock)
        await _fill_namespace(redis, other, clock)
        written = len(await _keys(redis, namespace))
        assert written > 10
        assert await clear_namespace(redis, namespace) == written
        assert await _keys(redis, namespace) == []
        assert len(await _keys(redis, other)) == written
    finally:
        await redis.aclose()
