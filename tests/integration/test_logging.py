"""Log records on real servers: dead letters, reaps, lost leases and refusals on every backing;
retries and failovers through a fault proxy; never a DSN's password in any record.

The failover tests connect with a password (a Redis ACL user, a PostgreSQL role made for the
test) through a ``FaultProxy`` that refuses connections, so every record the retry path writes
is checked against a DSN that really holds a secret.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.clock import ManualClock
from statepact.errors import (
    LeaseLostError,
    PreflightError,
    QueueUnavailableError,
    StatePersistenceError,
)
from statepact.models import ItemStatus, RunRecord, WorkItem
from statepact.queue import BaseWorkQueue, QueuePolicy
from statepact.settings import PostgresStoreSettings, RedisStoreSettings
from statepact.storage.postgres import PostgresStateStore, create_engine
from statepact.storage.redis import RedisStateStore, RedisWorkQueue, create_client
from statepact.testing.faults import FaultProxy
from statepact.testing.plugin import RedisServerFactory
from tests.fixtures.postgres import admin_execute

BACKINGS = [
    pytest.param("memory"),
    pytest.param("redis", marks=pytest.mark.integration),
    pytest.param("postgres", marks=pytest.mark.integration),
]
PASSWORD = "pw-" + uuid.uuid4().hex
#: The run the failover tests write: the session's Redis is shared by every test of the run.
RUN = "run-" + uuid.uuid4().hex


def secret_free(records: list[logging.LogRecord], *secrets: str) -> None:
    """No record's message, arguments or extra fields holds any of ``secrets``."""
    for record in records:
        text_of = record.getMessage() + " " + " ".join(str(v) for v in vars(record).values())
        for secret in secrets:
            assert secret not in text_of, f"{record.name}: {record.getMessage()}"


def of(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


# -- the queue's records, on every backing -----------------------------------------------------


async def exercise_queue(queue: BaseWorkQueue, clock: ManualClock) -> dict[str, WorkItem]:
    """A poison item dead-lettered by fail, a lapsed lease reaped (ready again), then lapsed
    again into the dead letter, a settle on a lost lease, a requeue, an oversized payload."""
    await queue.enqueue(WorkItem(tenant="acme", item_id="poison", payload={"n": 1}))
    await queue.enqueue(WorkItem(tenant="globex", item_id="slow", payload={"n": 2}))
    seen: dict[str, WorkItem] = {}
    for _ in range(2):
        lease = await queue.claim("w1", lease_for=5)
        assert lease is not None
        if lease.item.item_id == "poison":
            seen["failed"] = await queue.fail(lease, "bad input", retryable=False)
        else:
            stale = lease
    clock.advance(10)
    [reaped] = await queue.reap()
    seen["reaped"] = reaped
    with pytest.raises(LeaseLostError):
        await queue.ack(stale)
    again = await queue.claim("w2", lease_for=5)
    assert again is not None
    clock.advance(10)
    [lapsed] = await queue.reap()
    seen["lapsed"] = lapsed
    seen["requeued"] = await queue.requeue(seen["failed"])
    with pytest.raises(StatePersistenceError):
        await queue.enqueue(WorkItem(tenant="acme", item_id="huge", payload={"x": "y" * 300_000}))
    return seen


@pytest.fixture
def queue_policy() -> QueuePolicy:
    """Two attempts: the first lapse is reaped back to ready, the second dead-letters."""
    return QueuePolicy(max_attempts=2)


@pytest.fixture(params=BACKINGS)
def work_queue(request: pytest.FixtureRequest) -> BaseWorkQueue:
    queue: BaseWorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return queue


async def test_queue_records_on_every_backing(
    work_queue: BaseWorkQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """Dead letters and lost leases at WARNING, reaps and requeues at INFO, refusals at WARNING,
    each with the queue, tenant, item id and backing as fields."""
    queue = work_queue
    backing = type(queue).__module__.split(".")[2]
    clock = queue.clock
    assert isinstance(clock, ManualClock)
    with caplog.at_level(logging.INFO, logger="statepact"):
        seen = await exercise_queue(queue, clock)
    assert seen["failed"].status == ItemStatus.DEAD
    assert seen["reaped"].status == ItemStatus.QUEUED
    assert seen["lapsed"].status == ItemStatus.DEAD

    records = of(caplog, "statepact.queue")
    summary = [(r.levelname, r.item_id, r.tenant) for r in records]  # type: ignore[attr-defined]
    assert summary == [
        ("WARNING", "poison", "acme"),  # fail, not retryable
        ("INFO", "slow", "globex"),  # reaped, ready again
        ("WARNING", "slow", "globex"),  # ack on the lost lease
        ("WARNING", "slow", "globex"),  # lapsed again: dead
        ("INFO", "poison", "acme"),  # requeued
    ]
    dead, reaped, lost, lapsed, requeued = records
    assert "dead-lettered after 1 attempt(s) (not retryable): bad input" in dead.getMessage()
    assert "reaped item 'slow'" in reaped.getMessage()
    assert "ack of item 'slow'" in lost.getMessage()
    assert "lease (token" in lost.getMessage()
    assert "its lease lapsed after 2 attempt(s)" in lapsed.getMessage()
    assert "requeued" in requeued.getMessage()
    for record in records:
        assert record.backing == backing  # type: ignore[attr-defined]
        assert record.queue == queue.name  # type: ignore[attr-defined]
    [refused] = of(caplog, "statepact.limits")
    assert refused.levelno == logging.WARNING
    assert "payload of item 'huge'" in refused.getMessage()


# -- failover through a proxy, with a password in the DSN ----------------------------------------


@dataclass
class Secured:
    """A DSN holding ``PASSWORD`` that reaches the session's server through ``proxy``."""

    dsn: str
    proxy: FaultProxy


@pytest.fixture
async def redis_with_password(statepact_redis_url: str) -> AsyncIterator[Secured]:
    """An ACL user with a password on the session's Redis, reached through a fault proxy."""
    url = urlsplit(statepact_redis_url)
    user = f"statepact-obs-{uuid.uuid4().hex[:8]}"
    admin = Redis.from_url(statepact_redis_url)
    await admin.execute_command("ACL", "SETUSER", user, "on", f">{PASSWORD}", "~*", "&*", "+@all")
    try:
        async with FaultProxy(url.port or 6379, upstream_host=url.hostname or "127.0.0.1") as proxy:
            database = url.path.strip("/") or "0"
            yield Secured(f"redis://{user}:{PASSWORD}@127.0.0.1:{proxy.port}/{database}", proxy)
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


@pytest.fixture
async def postgres_with_password(
    statepact_postgres_url: str, pg_database_url: str
) -> AsyncIterator[Secured]:
    """A login role with a password, member of the server's test role, on the test's database,
    reached through a fault proxy."""
    server = make_url(statepact_postgres_url)
    role = f"statepact_obs_{uuid.uuid4().hex[:8]}"
    owner = server.username or "postgres"
    await admin_execute(
        statepact_postgres_url,
        f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}' IN ROLE \"{owner}\"",
    )
    try:
        async with FaultProxy(
            server.port or 5432, upstream_host=server.host or "127.0.0.1"
        ) as proxy:
            database = make_url(pg_database_url).database
            yield Secured(
                f"postgresql+asyncpg://{role}:{PASSWORD}@127.0.0.1:{proxy.port}/{database}", proxy
            )
    finally:
        await admin_execute(statepact_postgres_url, f"DROP ROLE IF EXISTS {role}")


class HealOnRetry(logging.Handler):
    """Heals the proxy when the first retry is logged: the next attempt gets through."""

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(logging.WARNING)
        self.proxy = proxy

    def emit(self, record: logging.LogRecord) -> None:
        self.proxy.heal()


FAST = {"failover_attempts": 3, "failover_base_delay": 0.01, "failover_max_delay": 0.02}


async def redis_failover(secured: Secured) -> int:
    """Through a refusing proxy: ``get_run`` and ``stats`` run out of budget; then ``get_run``
    again with the proxy healed at its first retry, so it succeeds. Returns how many retry
    records the logger ``statepact.retry`` wrote before the healed call (the caller captures)."""
    settings = RedisStoreSettings(dsn=secured.dsn, socket_timeout=2.0, **FAST)
    client = create_client(settings)
    proxy = secured.proxy
    counter = Counting()
    retry_log = logging.getLogger("statepact.retry")
    retry_log.addHandler(counter)
    try:
        store = RedisStateStore(client, clock=ManualClock(), settings=settings)
        queue = RedisWorkQueue(client, clock=store.clock, settings=settings)
        await store.put_run(RunRecord(tenant="acme", run_id=RUN))  # the password works
        await client.connection_pool.disconnect()
        proxy.refuse()
        with pytest.raises(StatePersistenceError) as state_error:
            await store.get_run("acme", RUN)
        assert state_error.value.reason == "unavailable"
        with pytest.raises(QueueUnavailableError):
            await queue.stats()
        before = counter.count
        healer = HealOnRetry(proxy)
        retry_log.addHandler(healer)
        try:
            assert await store.get_run("acme", RUN) is not None
        finally:
            retry_log.removeHandler(healer)
    finally:
        retry_log.removeHandler(counter)
        proxy.heal()
        await client.aclose()
    return before


async def postgres_failover(secured: Secured) -> None:
    """Through a refusing proxy, ``get_run`` runs out of its budget (three attempts)."""
    settings = PostgresStoreSettings(dsn=secured.dsn, **FAST)
    engine = create_engine(settings)
    proxy = secured.proxy
    try:
        store = PostgresStateStore(engine, clock=ManualClock(), settings=settings)
        await store.put_run(RunRecord(tenant="acme", run_id=RUN))  # the password works
        await engine.dispose()
        proxy.refuse()
        with pytest.raises(StatePersistenceError) as caught:
            await store.get_run("acme", RUN)
        assert caught.value.reason == "unavailable"
    finally:
        proxy.heal()
        await engine.dispose()


class Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


async def test_redis_failover_is_logged_without_the_password(
    redis_with_password: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused connection: one WARNING per retry, an ERROR when the budget is spent; a proxy
    healed during the retries: a WARNING, then the call succeeds. No record holds the password."""
    with caplog.at_level(logging.DEBUG, logger="statepact"):
        retries = await redis_failover(redis_with_password)
    records = of(caplog, "statepact.retry")
    levels = [r.levelno for r in records[:retries]]
    assert levels == [logging.WARNING, logging.WARNING, logging.ERROR] * 2
    assert records[0].backing == "redis"  # type: ignore[attr-defined]
    assert records[0].error_type == "ConnectionError"  # type: ignore[attr-defined]
    assert records[0].getMessage().startswith(f"redis get_run of run {RUN!r}")
    assert records[3].getMessage().startswith("redis stats (queue 'default'): attempt 1 of 3")
    [recovered] = records[retries:]
    assert recovered.levelno == logging.WARNING
    secret_free(caplog.records, PASSWORD)


async def test_postgres_failover_is_logged_without_the_password(
    postgres_with_password: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="statepact"):
        await postgres_failover(postgres_with_password)
    records = of(caplog, "statepact.retry")
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert records[0].backing == "postgres"  # type: ignore[attr-defined]
    assert records[0].operation == "state store"  # type: ignore[attr-defined]
    assert "postgres state store: attempt 1 of 3 failed with" in records[0].getMessage()
    secret_free(caplog.records, PASSWORD)


# -- refusals ------------------------------------------------------------------------------------


@pytest.fixture
def forgetful_redis(statepact_redis_server_factory: RedisServerFactory) -> Iterator[str]:
    """A Redis of the test's own with no persistence at all, which preflight refuses."""
    server = statepact_redis_server_factory(["--appendonly", "no", "--save", ""])
    yield server.url


async def test_a_redis_preflight_refusal_is_logged(
    forgetful_redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = Redis.from_url(forgetful_redis)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="statepact.redis"),
            pytest.raises(PreflightError),
        ):
            await RedisStateStore.open(client, settings=RedisStoreSettings())
    finally:
        await client.aclose()
    [record] = of(caplog, "statepact.redis")
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("Redis preflight refused the server: ")
    assert "appendonly" in record.getMessage()
    assert record.reasons  # type: ignore[attr-defined]


async def test_a_postgres_verify_refusal_is_logged(
    default_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database left with statement_timeout = 0: verify refuses, and says so on the log."""
    engine = create_async_engine(default_database_url)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("SHOW statement_timeout"))).scalar() == "0"
        with (
            caplog.at_level(logging.WARNING, logger="statepact.postgres"),
            pytest.raises(PreflightError),
        ):
            await PostgresStateStore.open(engine)
    finally:
        await engine.dispose()
    [record] = of(caplog, "statepact.postgres")
    assert record.levelno == logging.WARNING
    assert "statement_timeout" in record.getMessage()
    assert record.error_type == "PreflightError"  # type: ignore[attr-defined]
