"""PostgresBackend against a real server: what only PostgreSQL shows.

The behaviour every backing shares is the conformance suite's
(``tests/conformance/test_transactions.py``); this module checks ``connect()``
and the schema it finds or creates through the migrations, the one-statement
calls, commits whose reply was lost (cut by a fault proxy after the server
committed), consistent snapshots under concurrent commits from several pools,
locks that span pooled connections and expire, a deadlock inside a commit,
error translation and ``clear()``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    LockTimeoutError,
    PoolExhaustedError,
    SchemaVersionError,
    StatePersistenceError,
)
from statepact.storage.postgres import PostgresBackend, migrate
from statepact.testing.faults import FaultProxy
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    LockMode,
    Transaction,
    TransactionManager,
    WriteRecord,
)

pytestmark = pytest.mark.integration

R = "orders"
FAST_FAILOVER = RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.2)
ISOLATIONS = [i.value for i in Isolation]
_LOCK_ROW = "SELECT 1 FROM statepact_values WHERE resource = :r AND key = :k FOR UPDATE"


@pytest.fixture
async def backends(clock: ManualClock) -> AsyncIterator[Callable[..., Any]]:
    """``await make(url, **options)``: backends on their own pools, closed after the test."""
    made: list[PostgresBackend] = []

    async def make(url: str, **options: Any) -> PostgresBackend:
        backend = await PostgresBackend.connect(url, **{"clock": clock, **options})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.close()


async def _scalar(url: str, sql: str, **params: Any) -> Any:
    """One value read through a connection of its own (never the backend's pool)."""
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(sql), params)).scalar()
    finally:
        await engine.dispose()


async def _write(manager: TransactionManager, key: str, value: object, resource: str = R) -> int:
    async with manager.transaction() as tx:
        tx.write(resource, key, value)
    return tx.result.version


def _via(url: str, proxy: FaultProxy) -> str:
    return make_url(url).set(host=proxy.host, port=proxy.port).render_as_string(hide_password=False)


def _server_port(url: str) -> int:
    return make_url(url).port or 5432


# -- connect and the schema ---------------------------------------------------------------


async def test_connect_on_an_empty_database_applies_the_migrations(
    empty_database_url: str, backends: Callable[..., Any]
) -> None:
    """connect() on a database without the tables creates them through the Alembic revisions."""
    assert await _scalar(empty_database_url, "SELECT to_regclass('statepact_meta')") is None
    backend = await backends(empty_database_url)
    assert await migrate.current(empty_database_url) == migrate.head()
    assert (
        await _scalar(empty_database_url, "SELECT to_regprocedure('statepact_commit(jsonb)')")
        is not None
    )
    manager = TransactionManager(backend)
    assert await _write(manager, "o1", {"n": 1}) == 1
    # A second connect finds the schema and leaves it alone.
    again = await backends(empty_database_url)
    assert await TransactionManager(again).history(R, "o1") != []
    assert await migrate.current(empty_database_url) == migrate.head()


async def test_workers_connecting_at_once_to_an_empty_database_migrate_it_once(
    empty_database_url: str, backends: Callable[..., Any]
) -> None:
    """Several connect() calls racing on an empty database all succeed; the revisions run once
    (Alembic's advisory lock) and every backend sees the others' commits."""
    made = await asyncio.gather(*(backends(empty_database_url, min_size=0) for _ in range(4)))
    assert await migrate.current(empty_database_url) == migrate.head()
    assert await _scalar(empty_database_url, "SELECT count(*) FROM statepact_meta") == 1
    versions = [await _write(TransactionManager(b), f"k{n}", n) for n, b in enumerate(made)]
    assert versions == [1, 2, 3, 4]


async def test_create_schema_false_refuses_an_empty_database(
    empty_database_url: str, backends: Callable[..., Any]
) -> None:
    """connect(create_schema=False) on a database without the tables raises SchemaVersionError
    and creates nothing."""
    with pytest.raises(SchemaVersionError, match="create_schema=False"):
        await backends(empty_database_url, create_schema=False)
    assert await _scalar(empty_database_url, "SELECT to_regclass('statepact_meta')") is None
    assert await migrate.current(empty_database_url) is None


async def test_tables_without_the_commit_functions_are_refused(
    empty_database_url: str, backends: Callable[..., Any]
) -> None:
    """Tables at revision statepact_0001 are an existing schema: connect() refuses, it does
    not alter it."""
    await migrate.upgrade(empty_database_url, "statepact_0001")
    with pytest.raises(SchemaVersionError, match="statepact db upgrade"):
        await backends(empty_database_url)
    assert await migrate.current(empty_database_url) == "statepact_0001"
    await migrate.upgrade(empty_database_url)
    backend = await backends(empty_database_url, create_schema=False)
    assert await backend.health_check() is True


async def test_connect_accepts_both_url_schemes_and_hides_the_password(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """postgresql:// and postgresql+asyncpg:// both connect; another scheme is refused without
    echoing the URL."""
    url = make_url(pg_database_url)
    for driver in ("postgresql", "postgresql+asyncpg"):
        backend = await backends(url.set(drivername=driver).render_as_string(hide_password=False))
        assert await backend.health_check() is True
    with pytest.raises(ValueError, match="dsn") as caught:
        await PostgresBackend.connect("mysql://user:s3cret-pw@127.0.0.1/db")
    assert "s3cret-pw" not in str(caught.value)


async def test_open_on_an_engine_the_caller_owns(pg_database_url: str, clock: ManualClock) -> None:
    """open(engine) checks the schema and works; close() leaves the caller's engine usable."""
    engine = create_async_engine(pg_database_url, pool_size=2, max_overflow=0)
    try:
        backend = await PostgresBackend.open(engine, clock=clock)
        assert await _write(TransactionManager(backend), "o1", 1) == 1
        await backend.close()
        assert await backend.health_check() is False
        async with engine.connect() as conn:
            sequence = text("SELECT last_value FROM statepact_version_seq")
            assert (await conn.execute(sequence)).scalar() == 1
    finally:
        await engine.dispose()


async def test_unreachable_server_is_statepersistenceerror(clock: ManualClock) -> None:
    """connect() to a port nobody listens on gives up within the budget, reason "unavailable"."""
    async with FaultProxy(1) as proxy:
        proxy.refuse()
        began = time.monotonic()
        with pytest.raises(StatePersistenceError) as caught:
            await PostgresBackend.connect(
                f"postgresql://statepact:pw@127.0.0.1:{proxy.port}/nowhere",
                clock=clock,
                failover=FAST_FAILOVER,
            )
    assert caught.value.reason == "unavailable" and caught.value.retryable
    assert "pw@" not in str(caught.value)
    assert time.monotonic() - began < 5


# -- one statement per call ------------------------------------------------------------------


async def test_every_call_is_one_statement(pg_database_url: str, clock: ManualClock) -> None:
    """manager.begin(), a read (the first one takes the snapshot with it), a commit (with
    reads, writes, a key and fencing) and a lock attempt are one statement each, in
    autocommit; end() without locks sends nothing; a blind write is its commit alone."""
    statements: list[str] = []
    engine = create_async_engine(pg_database_url, pool_size=3, max_overflow=0)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Every query asyncpg sends on the connection, whoever sends it.
        dbapi_connection.driver_connection.add_query_logger(
            lambda record: statements.append(record.query)
        )

    event.listen(engine.sync_engine, "connect", on_connect)

    async def sent() -> int:
        await asyncio.sleep(0)  # asyncpg calls its loggers with call_soon
        return len(statements)

    backend = await PostgresBackend.open(engine, clock=clock)
    manager = TransactionManager(backend)
    try:
        await _write(manager, "warm", 1)
        lease = await manager.acquire_lease("job", "w1", 30)
        assert lease is not None
        statements.clear()
        tx = await manager.begin("serializable", idempotency_key="k1", fencing=lease)
        assert await sent() == 1
        await tx.read(R, "warm")
        await tx.read(R, "absent")
        assert await sent() == 3
        tx.write(R, "o1", {"n": 1})
        tx.write("other", "o2", {"n": 2})
        await tx.commit()
        assert await sent() == 4
        assert "statepact_commit" in statements[-1]
        tx = await manager.begin()
        await tx.lock(R, "o1")
        assert await sent() == 6
        await tx.rollback()  # end() releases the lock: one statement
        assert await sent() == 7
        tx = await manager.begin()
        await tx.rollback()  # no locks: end() sends nothing
        assert await sent() == 8
        async with manager.transaction() as tx:
            assert await tx.read(R, "warm") == 1  # begin and read in one statement
        assert await sent() == 9
        assert await _write(manager, "blind", 1) > 0  # no read: the commit alone
        assert await sent() == 10
    finally:
        await backend.close()
        await engine.dispose()


async def test_values_come_back_verbatim(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """The stored JSON text is what the front sent, byte for byte (json, not jsonb)."""
    backend = await backends(pg_database_url)
    manager = TransactionManager(backend)
    value = {"z": 1, "a": [1.5, "ü", {"k": None}], "big": 12345678901234567890}
    await _write(manager, "o1", value)
    stored = await backend.read(R, "o1", None)
    assert stored.data == '{"a":[1.5,"ü",{"k":null}],"big":12345678901234567890,"z":1}'
    assert (await backend.read(R, "o1", await backend.begin("t"))).data == stored.data
    assert await _read(manager, "o1") == value


async def _read(manager: TransactionManager, key: str, resource: str = R) -> Any:
    async with manager.transaction() as tx:
        return await tx.read(resource, key)


# -- lost replies ------------------------------------------------------------------------------


async def test_commit_sent_twice_is_applied_once(
    pg_database_url: str, backends: Callable[..., Any], clock: ManualClock
) -> None:
    """The same CommitRequest sent again (a lost reply) returns the first version and applies
    nothing, under every isolation; another transaction with the same writes applies again."""
    backend = await backends(pg_database_url)
    for n, isolation in enumerate(Isolation):
        txn_id = uuid.uuid4().hex
        request = CommitRequest(
            txn_id=txn_id,
            isolation=isolation,
            snapshot=await backend.begin(txn_id),
            reads=(),
            writes=(WriteRecord(R, "o1", f'{{"n":{n}}}'), WriteRecord(R, "o2", None)),
            idempotency_key=None,
            fingerprint=None,
            fencing=None,
            now=clock.now(),
        )
        first = await backend.commit(request)
        assert await backend.commit(request) == first
        assert first == CommitResult(n + 1)
        assert [v.version for v in await backend.history(R, "o1", 10)] == list(range(n + 1, 0, -1))
        await backend.end(txn_id)
    other = uuid.uuid4().hex
    again = CommitRequest(
        txn_id=other,
        isolation=Isolation.READ_COMMITTED,
        snapshot=await backend.begin(other),
        reads=(),
        writes=(WriteRecord(R, "o1", '{"n":2}'), WriteRecord(R, "o2", None)),
        idempotency_key=None,
        fingerprint=None,
        fencing=None,
        now=clock.now(),
    )
    assert await backend.commit(again) == CommitResult(4)


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_commit_whose_reply_was_lost_is_applied_once(
    pg_database_url: str, backends: Callable[..., Any], isolation: str
) -> None:
    """The proxy cuts the connection after the server committed; the failover sends the commit
    again, which finds its own first attempt: one version, the caller sees one plain commit."""
    direct = TransactionManager(await backends(pg_database_url))
    await _write(direct, "counter", 10)
    async with FaultProxy(_server_port(pg_database_url)) as proxy:
        backend = await backends(_via(pg_database_url, proxy), failover=FAST_FAILOVER)
        manager = TransactionManager(backend)
        tx = await manager.begin(isolation)
        current = await tx.read(R, "counter")
        tx.write(R, "counter", current + 1)
        armed = proxy.cut_after_reply(tx.txn_id.encode())
        result = await tx.commit()
        await armed.wait(2.0)
        assert armed.swallowed, "the server answered the commit before the cut"
        assert proxy.stats.cut == 1
    assert result == CommitResult(2, replayed=False)
    history = await direct.history(R, "counter")
    assert [(v.version, v.value) for v in history] == [(2, 11), (1, 10)]
    assert (await direct.begin()).taken_at == 2


async def test_ambiguous_commit_with_an_idempotency_key_replays_once(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """Without a failover budget the cut commit surfaces as the retryable unavailable error; the
    caller's retry with the same key replays the first result, and the history holds one version."""
    direct = TransactionManager(await backends(pg_database_url))
    async with FaultProxy(_server_port(pg_database_url)) as proxy:
        backend = await backends(_via(pg_database_url, proxy), failover=RetryPolicy(attempts=1))
        manager = TransactionManager(backend)
        await _write(manager, "warm", 1)  # the statements are prepared before the cut
        key = f"pay-{uuid.uuid4().hex}"
        armed = proxy.cut_after_reply(key.encode())
        with pytest.raises(StatePersistenceError) as caught:
            async with manager.transaction(idempotency_key=key) as tx:
                tx.write(R, "o1", {"state": "paid"})
        assert caught.value.reason == "unavailable" and caught.value.retryable
        await armed.wait(2.0)
        assert armed.swallowed
        history = await direct.history(R, "o1")
        assert [(v.version, v.value) for v in history] == [(2, {"state": "paid"})]

        async with manager.transaction(idempotency_key=key) as retry:
            retry.write(R, "o1", {"state": "paid"})
        assert retry.result == CommitResult(2, replayed=True)
    assert [v.version for v in await direct.history(R, "o1")] == [2]
    assert (await direct.begin()).taken_at == 2


async def test_ambiguous_commit_absorbed_by_the_failover_is_not_a_replay(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """With a failover budget the backing resends the cut commit itself; the idempotency record
    names the same transaction, so the caller sees its own commit (replayed=False), once."""
    direct = TransactionManager(await backends(pg_database_url))
    async with FaultProxy(_server_port(pg_database_url)) as proxy:
        backend = await backends(_via(pg_database_url, proxy), failover=FAST_FAILOVER)
        manager = TransactionManager(backend)
        await _write(manager, "warm", 1)
        key = f"pay-{uuid.uuid4().hex}"
        armed = proxy.cut_after_reply(key.encode())
        async with manager.transaction(idempotency_key=key) as tx:
            tx.write(R, "o1", {"n": 1})
        await armed.wait(2.0)
        assert proxy.stats.cut == 1
    assert tx.result == CommitResult(2, replayed=False)
    assert [(v.version, v.value) for v in await direct.history(R, "o1")] == [(2, {"n": 1})]


async def test_a_server_that_stays_away_is_statepersistenceerror(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """Connections cut and new ones refused: a commit gives up after the failover budget with the
    retryable unavailable error; nothing was applied."""
    direct = TransactionManager(await backends(pg_database_url))
    async with FaultProxy(_server_port(pg_database_url)) as proxy:
        backend = await backends(_via(pg_database_url, proxy), failover=FAST_FAILOVER)
        manager = TransactionManager(backend)
        tx = await manager.begin()
        tx.write(R, "o1", 1)
        proxy.refuse()
        proxy.cut()
        began = time.monotonic()
        with pytest.raises(StatePersistenceError) as caught:
            await tx.commit()
        assert caught.value.reason == "unavailable" and caught.value.retryable
        assert time.monotonic() - began < 5
        assert await backend.health_check() is False
        proxy.heal()
        assert await backend.health_check() is True
    assert await direct.history(R, "o1") == []


async def test_a_silent_server_times_out_and_fails_over(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """A partition (bytes accepted, never answered) ends in the client's command timeout and
    the failover, not a hang: StatePersistenceError, and the unanswered commit applied nothing."""
    direct = TransactionManager(await backends(pg_database_url))
    async with FaultProxy(_server_port(pg_database_url)) as proxy:
        backend = await backends(
            _via(pg_database_url, proxy),
            failover=RetryPolicy(attempts=2, base_delay=0.05, max_delay=0.1),
            connect_args={"command_timeout": 0.3, "timeout": 0.5},
        )
        manager = TransactionManager(backend)
        tx = await manager.begin()
        tx.write(R, "o1", 1)
        proxy.blackhole()
        began = time.monotonic()
        with pytest.raises(StatePersistenceError) as caught:
            await tx.commit()
        assert caught.value.reason == "unavailable"
        assert time.monotonic() - began < 5
        proxy.heal()
    assert await direct.history(R, "o1") == []


async def test_an_exhausted_pool_raises_at_once(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """With every pooled connection taken, a call raises PoolExhaustedError after the pool
    timeout, without failover retries; the backend holds no connection between calls."""
    backend = await backends(pg_database_url, max_size=1, pool_timeout=0.2)
    await _write(TransactionManager(backend), "o1", 0)
    held = await backend.engine.connect()
    try:
        began = time.monotonic()
        with pytest.raises(PoolExhaustedError):
            await backend.begin("t1")
        assert time.monotonic() - began < 1.0
    finally:
        await held.close()
    assert (await backend.begin("t2")).sequence == 1


# -- concurrency ---------------------------------------------------------------------------------


async def test_snapshots_stay_consistent_under_concurrent_commits(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """Transfers committed through three pools never show a snapshot a partial or out-of-order
    set of commits: every snapshot's accounts sum to the total (version order is commit order)."""
    pools = [TransactionManager(await backends(pg_database_url, max_size=4)) for _ in range(3)]
    accounts, total = [f"acct-{i}" for i in range(5)], 5 * 100
    async with pools[0].transaction() as seed:
        for account in accounts:
            seed.write(R, account, 100)
    done = asyncio.Event()
    snapshots = 0

    async def transfer(manager: TransactionManager, n: int) -> None:
        source, target = accounts[n % 5], accounts[(n * 3 + 1) % 5]

        async def body(tx: Transaction) -> None:
            a = await tx.read(R, source)
            b = await tx.read(R, target)
            if source != target:
                tx.write(R, source, a - 7)
                tx.write(R, target, b + 7)

        await manager.run(body, retries=200)

    async def auditor(manager: TransactionManager) -> None:
        nonlocal snapshots
        while not done.is_set():
            async with manager.transaction("snapshot") as tx:
                seen = []
                for account in accounts:
                    seen.append(await tx.read(R, account))
                    await asyncio.sleep(0)
            assert sum(seen) == total, (tx.taken_at, seen)
            snapshots += 1

    auditors = [asyncio.create_task(auditor(m)) for m in pools]
    await asyncio.gather(*(transfer(pools[n % 3], n) for n in range(60)))
    done.set()
    await asyncio.gather(*auditors)
    assert snapshots > 3
    async with pools[1].transaction() as tx:
        final = [await tx.read(R, account) for account in accounts]
    assert sum(final) == total
    versions = [v.version for a in accounts for v in await pools[2].history(R, a, limit=1000)]
    # The seed wrote five keys at version 1; each transfer two keys at one new version.
    assert len(versions) - 5 == 2 * (len(set(versions)) - 1)


async def test_a_commit_doomed_by_one_of_its_process_is_refused_without_a_round_trip(
    pg_database_url: str, backends: Callable[..., Any], statements: list[str]
) -> None:
    """Two transactions read one key at one snapshot; the first commits a write of it. The
    second's write of it is refused with the ConflictError the server would give (first
    committer wins), and no commit statement is sent for it. A transaction that read after
    that commit landed, one whose key no commit moved and one under read_committed are
    sent to the server and land; one with an idempotency key (it could be a replay) is
    sent too, and the server refuses it."""
    manager = TransactionManager(await backends(pg_database_url))
    await _write(manager, "k1", 0)
    await _write(manager, "k2", 0)
    first, second = manager.transaction(), manager.transaction()
    async with first, second:
        values = await asyncio.gather(first.read(R, "k1"), second.read(R, "k1"))
        assert values == [0, 0]
        assert first.taken_at == second.taken_at
        first.write(R, "k1", 1)
        await first.commit()
        second.write(R, "k1", 2)
        sent = len(statements)
        with pytest.raises(ConflictError) as caught:
            await second.commit()
        assert not [sql for sql in statements[sent:] if "statepact_commit" in sql]
    assert (caught.value.resource, caught.value.key) == (R, "k1")
    assert f"version {first.result.version}" in str(caught.value)
    assert await _read(manager, "k1") == 1

    async def increment(key: str, **options: Any) -> None:
        async with manager.transaction(**options) as tx:
            tx.write(R, key, await tx.read(R, key) + 1)

    sent = len(statements)
    await increment("k1")  # read after the commit landed
    await increment("k2")  # no commit of this process moved it
    stale = manager.transaction("read_committed")
    async with stale:
        await stale.read(R, "k1")
        await increment("k1")
        stale.write(R, "k1", 10)  # read_committed: no first-committer check
    keyed = manager.transaction(idempotency_key=f"once-{uuid.uuid4().hex}")
    with pytest.raises(ConflictError):
        async with keyed:
            await keyed.read(R, "k2")
            await increment("k2")
            keyed.write(R, "k2", 20)  # it might be a replay: the server refuses it
    assert [await _read(manager, key) for key in ("k1", "k2")] == [10, 2]
    commits = [sql for sql in statements[sent:] if "statepact_commit" in sql]
    assert len(commits) == 6


async def test_a_stalled_commit_holds_back_no_commit_of_its_own_process(
    pg_database_url: str, backends: Callable[..., Any], failed_sqlstates: list[str | None]
) -> None:
    """One backend, as every agent of a process shares it. A commit alone stalled on a row an
    outside session holds, then one inside a shared statement: the commits to other keys
    made meanwhile land while the stalled one still waits (the waiting calls stop waiting
    for it, and the shared statement gives up on the held row at once and sends each of its
    commits alone); the stalled commits land once the row is released."""
    manager = TransactionManager(await backends(pg_database_url))
    outsider = create_async_engine(pg_database_url, poolclass=pool.NullPool)
    try:
        for key in ("k0", "k1", "k2", "k3", "k4", "k5"):
            await _write(manager, key, f"{key}-before")
        async with outsider.connect() as conn:
            # (1) The stalled commit went alone; the next ones must not wait for it.
            await conn.execute(text(_LOCK_ROW), {"r": R, "k": "k0"})
            stalled = asyncio.create_task(_write(manager, "k0", "k0-after"))
            await _wait_for_lock_wait(pg_database_url, "statepact_commit")
            others = [_write(manager, key, f"{key}-after") for key in ("k1", "k2", "k3")]
            await asyncio.wait_for(asyncio.gather(*others), 5.0)
            assert not stalled.done()
            await conn.rollback()
            await asyncio.wait_for(stalled, 5.0)
        async with outsider.connect() as conn:
            # (2) The held row is inside a shared statement: it fails at once (lock_timeout),
            # and its commits are sent again one by one; only the held key's waits.
            await conn.execute(text(_LOCK_ROW), {"r": R, "k": "k4"})
            first = asyncio.create_task(_write(manager, "k1", "k1-again"))
            shared = {
                key: asyncio.create_task(_write(manager, key, f"{key}-again"))
                for key in ("k2", "k3", "k4", "k5")
            }
            await asyncio.wait_for(first, 5.0)
            landed = [shared[key] for key in ("k2", "k3", "k5")]
            await asyncio.wait_for(asyncio.gather(*landed), 5.0)
            assert "55P03" in failed_sqlstates
            assert not shared["k4"].done()
            await conn.rollback()
            await asyncio.wait_for(shared["k4"], 5.0)
        async with manager.transaction() as tx:
            found = [await tx.read(R, key) for key in ("k0", "k1", "k2", "k3", "k4", "k5")]
        assert found == ["k0-after", "k1-again", "k2-again", "k3-again", "k4-again", "k5-again"]
    finally:
        await outsider.dispose()


async def test_commits_to_different_keys_do_not_wait_on_each_other(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """A commit stalled on a row lock an outside session holds on its key, and then one stalled
    after it drew its version, delay no commit to another key: there is no global
    serialisation point. Snapshots stay consistent meanwhile: one taken while the stalled
    commit is in flight never sees it, not even after it lands; a new one sees both."""
    first = TransactionManager(await backends(pg_database_url))
    second = TransactionManager(await backends(pg_database_url))
    outsider = create_async_engine(pg_database_url, poolclass=pool.NullPool)
    try:
        await _write(first, "k1", "k1-before")
        async with outsider.connect() as conn:
            # (1) The outside session holds k1's row: the commit waits in its lock phase.
            await conn.execute(
                text(
                    "SELECT 1 FROM statepact_values WHERE resource = :r AND key = 'k1' FOR UPDATE"
                ),
                {"r": R},
            )
            stalled = asyncio.create_task(_write(first, "k1", "k1-locked"))
            await _wait_for_lock_wait(pg_database_url, "statepact_commit")
            assert await asyncio.wait_for(_write(second, "k2", "k2"), 5.0) == 2
            assert not stalled.done()
            await conn.rollback()
            assert await stalled == 3
        async with outsider.connect() as conn:
            # (2) An uncommitted history row with the version the next commit of k3 draws:
            # that commit holds its number and its row locks, and waits in its insert.
            await conn.execute(
                text(
                    "INSERT INTO statepact_history (resource, key, version, committed_at) "
                    "VALUES (:r, 'k3', 4, '2026-01-01T00:00:00Z')"
                ),
                {"r": R},
            )
            stalled = asyncio.create_task(_write(first, "k3", "k3"))
            await _wait_for_lock_wait(pg_database_url, "statepact_commit")
            before = await second.begin()
            assert await asyncio.wait_for(_write(second, "k4", "k4"), 5.0) == 5
            assert not stalled.done()
            after_k4 = await second.begin()
            await conn.rollback()
            assert await stalled == 4
        # Neither snapshot taken while k3's commit was in flight ever sees it.
        assert await before.read(R, "k3") is None
        assert await before.read(R, "k4") is None
        assert await after_k4.read(R, "k3") is None
        assert await after_k4.read(R, "k4") == "k4"
        await before.rollback()
        await after_k4.rollback()
        async with second.transaction() as tx:
            assert [await tx.read(R, k) for k in ("k1", "k2", "k3", "k4")] == [
                "k1-locked",
                "k2",
                "k3",
                "k4",
            ]
    finally:
        await outsider.dispose()
    assert [v.version for v in await second.history(R, "k3")] == [4]


async def test_a_commit_finds_its_rows_by_primary_key_whatever_the_statistics_say(
    pg_database_url: str, clock: ManualClock
) -> None:
    """The planner would join a commit's keys to ``statepact_values`` over a sequential
    scan (revision 0004 did: on a table of a few hundred pages, or a small one bloated by
    rewrites, every commit read all of it). Each statement inside ``statepact_commit``
    reaches the tables through their primary keys (auto_explain shows the nested plans):
    one key takes the short path (lock, update, history row); several keys, serializable
    reads, a key with no row yet and a conflict take the full one."""
    plans: list[str] = []
    engine = create_async_engine(pg_database_url, pool_size=1, max_overflow=0)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_log_listener(
            lambda _conn, message: plans.append(message.message)
        )

    event.listen(engine.sync_engine, "connect", on_connect)
    backend = await PostgresBackend.open(engine, clock=clock)
    manager = TransactionManager(backend)

    async def nested_plans(
        isolation: str, writes: dict[str, int], reads: tuple[str, ...]
    ) -> list[str]:
        tx = await manager.begin(isolation)
        for key in reads:
            await tx.read(R, key)
        for key, value in writes.items():
            tx.write(R, key, value)
        plans.clear()
        try:
            await tx.commit()
        finally:
            await asyncio.sleep(0)  # asyncpg calls its log listeners with call_soon
        return [plan for plan in plans if "statepact_commit(" not in plan]

    try:
        # 40 keys rewritten 5 times beside 2,000 of another resource (about 1 kB each, some
        # 300 pages): the planner costs a hash join over a sequential scan below a hundred
        # primary-key probes, which it assumes a set-returning function's 100 rows need.
        async with manager.transaction() as tx:
            for i in range(40):
                tx.write(R, f"a{i}", 0)
        for round_ in range(1, 6):
            for i in range(40):
                await _write(manager, f"a{i}", round_)
        async with engine.connect() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO statepact_values (resource, key, version, data, committed_at) "
                "SELECT 'filler', 'k' || g, 1, to_json(repeat('x', 1000)), now() "
                "FROM generate_series(1, 2000) AS g"
            )
            await conn.exec_driver_sql("ANALYZE statepact_values")
            # The session's next statements log their plans, nested ones included, to it.
            await conn.exec_driver_sql("LOAD 'auto_explain'")
            for setting in ("log_min_duration = 0", "log_nested_statements = on"):
                await conn.exec_driver_sql(f"SET auto_explain.{setting}")
            await conn.exec_driver_sql("SET auto_explain.log_level = notice")
            await conn.commit()

        short = await nested_plans("snapshot", {"a1": 7}, ("a1",))
        assert [plan.split("\n", 2)[1].split()[2] for plan in short] == [
            "SELECT",
            "UPDATE",
            "INSERT",
        ], short
        full = [
            *await nested_plans("snapshot", {"a2": 7, "a3": 7}, ("a2", "a3")),
            *await nested_plans("serializable", {"a4": 7}, ("a4", "a5", "a6")),
            *await nested_plans("read_committed", {"new-key": 7}, ()),
        ]
        loser = await manager.begin("snapshot")
        await loser.read(R, "a7")
        await _write(manager, "a7", 8)
        loser.write(R, "a7", 9)
        plans.clear()
        with pytest.raises(ConflictError):
            await loser.commit()
        await asyncio.sleep(0)
        full += plans
        assert len(full) > 3 * len(short)
        for plan in [*short, *full]:
            assert "Seq Scan on statepact_" not in plan, plan
            assert "Hash Join" not in plan, plan
    finally:
        await backend.close()
        await engine.dispose()


async def test_a_snapshot_reads_what_its_first_read_saw(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """A transaction's snapshot is taken by its first read, in the same statement: later reads
    of other keys see the state of that moment, whatever commits in between."""
    writer = TransactionManager(await backends(pg_database_url))
    reader = TransactionManager(await backends(pg_database_url))
    await _write(writer, "a", 1)
    await _write(writer, "b", 1)
    async with reader.transaction() as tx:
        assert await tx.read(R, "a") == 1
        assert tx.taken_at == 2
        await _write(writer, "b", 2)
        await _write(writer, "c", 2)
        assert await tx.read(R, "b") == 1
        assert await tx.read(R, "c") is None
    assert tx.result == CommitResult(2)


async def test_hot_key_increments_from_several_pools_all_land(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """Concurrent increments of one key through three pools under snapshot isolation end exact."""
    pools = [TransactionManager(await backends(pg_database_url, max_size=3)) for _ in range(3)]

    async def increment(tx: Transaction) -> None:
        tx.write(R, "hot", (await tx.read(R, "hot") or 0) + 1)

    await asyncio.gather(*(pools[n % 3].run(increment, retries=500) for n in range(45)))
    assert await _read(pools[0], "hot") == 45
    assert [v.version for v in await pools[1].history(R, "hot", limit=100)] == list(
        range(45, 0, -1)
    )


async def test_a_deadlock_inside_a_commit_is_a_conflict_and_applies_nothing(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """An outside transaction that closes a lock cycle with a commit makes PostgreSQL abort the
    commit (40P01): ConflictError without a failover budget; absorbed by a resend with one."""
    for budget, expect_conflict in ((RetryPolicy(attempts=1), True), (FAST_FAILOVER, False)):
        backend = await backends(pg_database_url, failover=budget)
        manager = TransactionManager(backend)
        base = await _write(manager, "a", 0)
        await _write(manager, "b", 0)
        outsider = create_async_engine(pg_database_url, poolclass=pool.NullPool)
        try:
            async with outsider.connect() as conn:
                await conn.execute(text(_LOCK_ROW), {"r": R, "k": "b"})
                tx = await manager.begin("read_committed")
                tx.write(R, "a", 1)
                tx.write(R, "b", 1)
                commit = asyncio.create_task(tx.commit())
                await _wait_for_lock_wait(pg_database_url, "statepact_commit")
                await asyncio.sleep(0.3)
                # The commit holds a and waits for b; taking a now closes the cycle. The
                # commit waited first, so its deadlock check fires first and it is the victim.
                take_a = asyncio.create_task(conn.execute(text(_LOCK_ROW), {"r": R, "k": "a"}))
                if expect_conflict:
                    with pytest.raises(ConflictError, match="deadlock"):
                        await commit
                    await take_a
                    await conn.rollback()
                    assert await _read(manager, "a") == 0
                else:
                    await take_a
                    await conn.rollback()  # the resent commit gets both keys now
                    assert (await commit).version == base + 2
                    assert await _read(manager, "a") == 1
        finally:
            await outsider.dispose()
        await backend.clear()


async def _wait_for_lock_wait(url: str, marker: str, timeout: float = 5.0) -> None:  # noqa: ASYNC109
    """Until a backend running a statement containing ``marker`` waits on a lock."""
    deadline = time.monotonic() + timeout
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE :pattern"
    )
    while time.monotonic() < deadline:
        if await _scalar(url, sql, pattern=f"%{marker}%"):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no statement with {marker!r} started waiting on a lock")


# -- locks ---------------------------------------------------------------------------------------


async def test_locks_span_pools_and_expire_after_their_ttl(
    pg_database_url: str, backends: Callable[..., Any], clock: ManualClock
) -> None:
    """A lock taken through one pool excludes a transaction on another; a holder that never ends
    (a crashed process) loses it lock_ttl_seconds later, by the server's time (moving the
    injected clock changes nothing)."""
    ttl = 1.0
    first = TransactionManager(await backends(pg_database_url, lock_ttl_seconds=ttl))
    second = TransactionManager(await backends(pg_database_url, lock_ttl_seconds=ttl))
    crashed = await first.begin()
    await crashed.lock(R, "o1", mode=LockMode.EXCLUSIVE)
    granted_at = time.monotonic()
    waiter = await second.begin()
    with pytest.raises(LockTimeoutError):
        await waiter.lock(R, "o1", mode="shared", timeout=0.1)
    clock.advance(3600)
    with pytest.raises(LockTimeoutError):
        await waiter.lock(R, "o1", timeout=0)
    await waiter.lock(R, "o1", timeout=ttl + 3)
    assert time.monotonic() - granted_at >= ttl * 0.9
    assert (
        await _scalar(pg_database_url, "SELECT count(*) FROM statepact_locks WHERE key = 'o1'") == 1
    )
    await waiter.rollback()
    assert await _scalar(pg_database_url, "SELECT count(*) FROM statepact_locks") == 0


async def test_a_host_whose_clock_runs_ahead_does_not_take_a_live_lock(
    pg_database_url: str, backends: Callable[..., Any], clock: ManualClock
) -> None:
    """Lock rows expire by the server's time: a process whose clock is 61 s ahead of the
    holder's (past the 60 s lock TTL) is refused the holder's live lock."""
    ahead = ManualClock(clock.now() + timedelta(seconds=61))
    holder = TransactionManager(await backends(pg_database_url, lock_ttl_seconds=60))
    skewed = TransactionManager(await backends(pg_database_url, lock_ttl_seconds=60, clock=ahead))
    held = await holder.begin()
    await held.lock(R, "o1")
    other = await skewed.begin()
    with pytest.raises(LockTimeoutError):
        await other.lock(R, "o1", timeout=0)
    with pytest.raises(LockTimeoutError):
        await other.lock(R, "o1", mode="shared", timeout=0)
    await other.rollback()
    await held.rollback()
    taker = await skewed.begin()
    await taker.lock(R, "o1", timeout=0)
    await taker.rollback()


async def test_close_releases_the_locks_of_transactions_still_live(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """Closing a backend while its transactions hold locks deletes their rows (they can never
    end now) instead of leaving the keys blocked for lock_ttl_seconds."""
    closing = await backends(pg_database_url)
    other = TransactionManager(await backends(pg_database_url))
    live = [await TransactionManager(closing).begin() for _ in range(2)]
    await live[0].lock(R, "o1")
    await live[1].lock(R, "o2", mode="shared")
    await closing.close()
    assert await _scalar(pg_database_url, "SELECT count(*) FROM statepact_locks") == 0
    tx = await other.begin()
    await tx.lock(R, "o1", timeout=0)
    await tx.lock(R, "o2", timeout=0)
    await tx.rollback()


async def test_a_waiter_on_another_pool_gets_the_lock_when_the_holder_ends(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """Shared holders on two pools coexist; an exclusive waiter polls until both end."""
    one = TransactionManager(await backends(pg_database_url))
    two = TransactionManager(await backends(pg_database_url))
    a, b, c = await one.begin(), await two.begin(), await two.begin()
    await a.lock(R, "k", mode="shared")
    await b.lock(R, "k", mode="shared")
    waiting = asyncio.create_task(c.lock(R, "k", mode="exclusive", timeout=5.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await a.rollback()
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await b.commit()
    await asyncio.wait_for(waiting, 5.0)
    await c.rollback()


# -- clear ---------------------------------------------------------------------------------------


async def test_clear_empties_only_the_statepact_tables(
    pg_database_url: str, backends: Callable[..., Any]
) -> None:
    """clear() truncates the statepact_* tables and restarts the sequence; an application's table
    and the migration bookkeeping stay."""
    engine: AsyncEngine = create_async_engine(pg_database_url, poolclass=pool.NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE app_orders (id int PRIMARY KEY)"))
            await conn.execute(text("INSERT INTO app_orders VALUES (1)"))
    finally:
        await engine.dispose()
    backend = await backends(pg_database_url)
    manager = TransactionManager(backend)
    await _write(manager, "o1", 1)
    await manager.register_resource(R, {"owner": "billing"})
    assert await manager.acquire_lease("job", "w1", 30) is not None
    await backend.clear()
    assert await _scalar(pg_database_url, "SELECT count(*) FROM app_orders") == 1
    assert await migrate.current(pg_database_url) == migrate.head()
    for table in ("statepact_values", "statepact_history", "statepact_resources"):
        assert await _scalar(pg_database_url, f"SELECT count(*) FROM {table}") == 0
    assert await _scalar(pg_database_url, "SELECT seq FROM statepact_meta") == 0
    assert await _write(manager, "o1", 1) == 1


async def test_the_backend_holds_no_connection_once_idle(
    pg_database_url: str, clock: ManualClock
) -> None:
    """Connections pass from one call to the next while calls keep coming, and are all back
    in the pool once none runs; after engine.dispose(), which replaces the pool, calls check
    out of the new pool (a kept reference to the old one would leak into a disposed pool)."""
    engine = create_async_engine(pg_database_url, pool_size=4, max_overflow=0)
    backend = await PostgresBackend.open(engine, clock=clock)
    manager = TransactionManager(backend)
    try:
        await asyncio.gather(*(_write(manager, f"k{n}", n) for n in range(20)))
        await asyncio.sleep(0)  # the check-in runs as soon as no call is running
        first = engine.sync_engine.pool
        assert first.checkedout() == 0  # type: ignore[attr-defined]
        assert first.checkedin() > 0  # type: ignore[attr-defined]
        await engine.dispose()
        await asyncio.gather(*(_write(manager, f"k{n}", -n) for n in range(20)))
        await asyncio.sleep(0)
        second = engine.sync_engine.pool
        assert second is not first
        assert first.checkedin() == 0  # type: ignore[attr-defined]
        assert second.checkedout() == 0  # type: ignore[attr-defined]
        assert second.checkedin() > 0  # type: ignore[attr-defined]
        assert [await _read(manager, f"k{n}") for n in range(20)] == [-n for n in range(20)]
    finally:
        await backend.close()
        await engine.dispose()
