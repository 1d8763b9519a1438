"""RedisBackend against real servers: what only Redis shows.

The behaviour every backing shares is the conformance suite's
(``tests/conformance/test_transactions.py``); this module checks the key
layout, round trips, the capped history, replays across cut connections and
lost replies, the lock TTL, error translation and ``connect()``'s preflight.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    FencingError,
    LockTimeoutError,
    PreflightError,
    StatePersistenceError,
)
from statepact.storage.redis import RedisBackend
from statepact.storage.redis._keys import TxKeys
from statepact.testing.faults import FaultProxy
from statepact.testing.plugin import RedisServerFactory
from statepact.testing.servers import free_port
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    Refusal,
    Snapshot,
    Transaction,
    TransactionManager,
    WriteRecord,
)
from tests.fixtures.redis import ObservedRedis

pytestmark = pytest.mark.integration

R = "orders"


def _prefix() -> str:
    return f"sp-it-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def backends(redis_client: Redis, clock: ManualClock) -> AsyncIterator[list[RedisBackend]]:
    """Backends the test builds on ``redis_client``; cleared and closed afterwards."""
    made: list[RedisBackend] = []
    yield made
    for backend in made:
        await backend.clear()
        await backend.close()


def _make(
    made: list[RedisBackend], client: Redis, clock: ManualClock, **options: Any
) -> RedisBackend:
    backend = RedisBackend(client, clock=clock, **{"prefix": _prefix(), **options})
    made.append(backend)
    return backend


async def _write(manager: TransactionManager, key: str, value: object, resource: str = R) -> int:
    async with manager.transaction() as tx:
        tx.write(resource, key, value)
    return tx.result.version


# -- layout and round trips ---------------------------------------------------------------


async def test_keys_follow_the_documented_layout(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock
) -> None:
    """Every key is {prefix}:kind:<seg(resource)>[:<seg(key)>], built by the one key codec."""
    backend = _make(backends, redis_client, clock, prefix="lay-" + uuid.uuid4().hex[:6])
    manager = TransactionManager(backend)
    p = backend.prefix
    async with manager.transaction(idempotency_key="pay:1") as tx:
        tx.write("a:b", "c", {"x": 1})
        tx.write("ü", "k:1", [1])
    txn = tx.txn_id
    lease = await manager.acquire_lease("job", "w1", 10)
    assert lease is not None
    holder = await manager.begin()
    await holder.lock("a:b", "c")
    await manager.register_resource("reg", {"team": "x"})
    keys = {k.decode() for k in await redis_client.keys(f"{{{p}}}:*")}
    assert keys == {
        f"{{{p}}}:seq",
        f"{{{p}}}:res",
        f"{{{p}}}:meta:3:a:b",
        f"{{{p}}}:meta:2:ü",
        f"{{{p}}}:meta:3:reg",
        f"{{{p}}}:data:3:a:b",
        f"{{{p}}}:data:2:ü",
        f"{{{p}}}:hist:3:a:b:1:c",
        f"{{{p}}}:hist:2:ü:3:k:1",
        f"{{{p}}}:idem:5:pay:1",
        f"{{{p}}}:fence:3:job",
        f"{{{p}}}:lease:3:job",
        f"{{{p}}}:lock:3:a:b:1:c",
        f"{{{p}}}:op:{len(txn)}:{txn}",
    }
    assert keys == {
        TxKeys(p).seq,
        TxKeys(p).resources,
        TxKeys(p).meta("a:b"),
        TxKeys(p).meta("ü"),
        TxKeys(p).meta("reg"),
        TxKeys(p).data("a:b"),
        TxKeys(p).data("ü"),
        TxKeys(p).history("a:b", "c"),
        TxKeys(p).history("ü", "k:1"),
        TxKeys(p).idempotency("pay:1"),
        TxKeys(p).fence("job"),
        TxKeys(p).lease("job"),
        TxKeys(p).lock("a:b", "c"),
        TxKeys(p).op(txn),
    }
    # The idempotency record, the commit's outcome record (two minutes) and the lock set
    # expire; nothing else does.
    assert 0 < await redis_client.ttl(TxKeys(p).idempotency("pay:1")) <= 30 * 24 * 3600
    assert 110_000 < await redis_client.pttl(TxKeys(p).op(txn)) <= 120_000
    assert 0 < await redis_client.pttl(TxKeys(p).lock("a:b", "c")) <= 60_000
    assert await redis_client.ttl(TxKeys(p).fence("job")) == -1
    await holder.rollback()
    assert await redis_client.exists(TxKeys(p).lock("a:b", "c")) == 0


def test_prefix_with_braces_is_refused() -> None:
    """A prefix is the cluster hash tag, so braces (or NUL, or nothing) are refused."""
    for bad in ("a{b", "a}b", "", "a\x00"):
        with pytest.raises(ValueError, match="prefix"):
            TxKeys(bad)


async def test_every_commit_is_one_evalsha(observed_redis: ObservedRedis) -> None:
    """A transaction's first read takes the snapshot with it in one EVALSHA, a commit is one
    EVALSHA, a later latest read one HGET, begin() one GET; nothing else is sent."""
    backend = RedisBackend(observed_redis.client, prefix="rt", clock=ManualClock())
    manager = TransactionManager(backend)
    # Warm up: the first call of each script also loads it.
    await _write(manager, "warm", 0)
    async with manager.transaction("serializable", idempotency_key="warm") as tx:
        await tx.read(R, "warm")  # tx_begin_read
        await tx.read(R, "other")  # tx_read
        tx.write(R, "warm", 1)
    await observed_redis.reset()
    for i in range(10):
        await _write(manager, f"k{i}", i)
    assert await observed_redis.round_trips() == ["EVALSHA"] * 10

    await observed_redis.reset()
    async with manager.transaction("serializable", idempotency_key="big") as tx:
        for i in range(10):
            assert await tx.read(R, f"k{i}") == i
            tx.write(R, f"k{i}", i + 1)
        tx.delete(R, "warm")
    assert await observed_redis.round_trips() == ["EVALSHA"] * 10 + ["EVALSHA"]

    await observed_redis.reset()
    async with manager.transaction("read_committed") as tx:
        await tx.read(R, "k1")
        await tx.read(R, "k2")
    assert await observed_redis.round_trips() == ["EVALSHA", "HGET"]

    await observed_redis.reset()
    await manager.begin()
    assert await observed_redis.round_trips() == ["GET"]


async def test_clear_removes_only_its_own_keys(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock
) -> None:
    """clear() deletes its prefix's keys only, even when the prefix holds glob characters."""
    tag = uuid.uuid4().hex[:6]
    globby = _make(backends, redis_client, clock, prefix=f"t?{tag}*[x]")
    plain = _make(backends, redis_client, clock, prefix=f"tx{tag}xx")
    for backend in (globby, plain):
        await _write(TransactionManager(backend), "k", 1)
    bystanders = [f"{{tx{tag}xx}}", f"{{t?{tag}*[x]}}x", f"t?{tag}*[x]:seq"]
    for key in bystanders:
        await redis_client.set(key, "mine")
    await globby.clear()
    left = {key.decode() for key in await redis_client.keys("*")}
    assert not any(key.startswith(f"{{{globby.prefix}}}:") for key in left)
    assert await TransactionManager(plain).history(R, "k") != []
    assert [await redis_client.get(key) for key in bystanders] == [b"mine"] * 3
    assert (await globby.begin("t")).sequence == 0
    await redis_client.delete(*bystanders)


# -- the capped history -----------------------------------------------------------------------


async def test_history_is_capped_and_a_trimmed_snapshot_is_refused(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock
) -> None:
    """history keeps history_limit versions; a snapshot needing a trimmed one gets ConflictError."""
    manager = TransactionManager(_make(backends, redis_client, clock, history_limit=3))
    await _write(manager, "k", "v1")
    old = await manager.begin("snapshot")
    await _write(manager, "k", "v2")
    await _write(manager, "k", "v3")
    keep = await manager.begin("snapshot")
    await _write(manager, "k", "v4")  # trims version 1
    assert [e.version for e in await manager.history(R, "k", limit=10)] == [4, 3, 2]
    assert await keep.read(R, "k") == "v3"
    assert await old.read(R, "never-written") is None
    with pytest.raises(ConflictError, match="snapshot too old") as caught:
        await old.read(R, "k")  # version 1 is gone
    assert (caught.value.resource, caught.value.key) == (R, "k")
    await old.rollback()
    await keep.rollback()

    # A key created after the snapshot (and not trimmed) reads as absent there.
    late = await manager.begin("snapshot")
    await _write(manager, "later", "x")
    assert await late.read(R, "later") is None
    await late.rollback()

    # manager.run retries a too-old snapshot with a fresh one.
    attempts = 0

    async def read_k(tx: Transaction) -> object:
        nonlocal attempts
        attempts += 1
        await tx.read(R, "other")  # the snapshot is taken here
        if attempts == 1:
            for i in range(4):
                await _write(manager, "k", f"w{i}")
        return await tx.read(R, "k")

    assert await manager.run(read_k) == "w3"
    assert attempts == 2


# -- replays across cut connections and lost replies ----------------------------------------


async def test_idempotent_retry_after_the_connection_was_killed_replays(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock, statepact_redis_url: str
) -> None:
    """A commit whose connection is killed right after it ran, retried with the same key,
    replays once: replayed=True, applied once."""
    client = Redis.from_url(statepact_redis_url, client_name="sp-killed")
    direct = _make(backends, redis_client, clock)  # same prefix, cleans up afterwards
    try:
        manager = TransactionManager(RedisBackend(client, prefix=direct.prefix, clock=clock))
        async with manager.transaction(idempotency_key="pay-7") as tx:
            tx.write(R, "o1", {"paid": 7})
        first = tx.result
        killed = 0
        for entry in await redis_client.client_list():
            if entry.get("name") == "sp-killed":
                await redis_client.client_kill_filter(_id=entry["id"])
                killed += 1
        assert killed >= 1
        async with manager.transaction(idempotency_key="pay-7") as again:
            again.write(R, "o1", {"paid": 7})
        assert again.result == CommitResult(first.version, replayed=True)
        history = await manager.history(R, "o1")
        assert [(e.version, e.value) for e in history] == [(first.version, {"paid": 7})]
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("isolation", "idempotency_key"),
    [("snapshot", None), ("read_committed", None), ("serializable", "lost-1")],
)
async def test_a_commit_whose_reply_was_lost_is_applied_once(
    statepact_redis_url: str,
    redis_client: Redis,
    backends: list[RedisBackend],
    clock: ManualClock,
    isolation: str,
    idempotency_key: str | None,
) -> None:
    """The server applies a commit, its reply is lost and the call is sent again: the retry
    recognises the commit it already made (not applied twice, no self-conflict, not a replay)."""
    url = urlsplit(statepact_redis_url)
    db = int(url.path.strip("/") or 0)
    async with FaultProxy(url.port or 6379) as proxy:
        client = Redis(host="127.0.0.1", port=proxy.port, db=db)
        # The direct backend (same prefix, no proxy) checks the outcome and cleans up.
        direct = _make(backends, redis_client, clock)
        try:
            manager = TransactionManager(RedisBackend(client, prefix=direct.prefix, clock=clock))
            await _write(manager, "counter", 0)  # warm: the script is loaded before the cut
            tx = await manager.begin(isolation, idempotency_key=idempotency_key)
            current = await tx.read(R, "counter")
            tx.write(R, "counter", current + 1)
            tx.write(R, "marker", "lost-reply-marker")
            cut = proxy.cut_after_reply(b"EVALSHA", b"lost-reply-marker")
            result = await tx.commit()
            await cut.wait(5)
            assert proxy.stats.cut >= 1
            assert result == CommitResult(2, replayed=False)
            history = await TransactionManager(direct).history(R, "counter")
            assert [(e.version, e.value) for e in history] == [(2, 1), (1, 0)]
            assert (await direct.begin("probe")).sequence == 2
        finally:
            await client.aclose()


async def test_only_a_commit_that_changed_something_leaves_an_outcome_record(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock
) -> None:
    """A writing commit, and a read-only one with an idempotency key, leave their version under
    their transaction id; a read-only commit, a replay and a refused commit leave nothing."""
    backend = _make(backends, redis_client, clock)
    manager = TransactionManager(backend)
    keys = TxKeys(backend.prefix)

    async def outcome(tx: Transaction) -> bytes | None:
        found: bytes | None = await redis_client.get(keys.op(tx.txn_id))
        return found

    async with manager.transaction() as written:
        written.write(R, "o1", 1)
    assert await outcome(written) == b"1"
    async with manager.transaction() as read_only:
        await read_only.read(R, "o1")
    assert await outcome(read_only) is None
    async with manager.transaction(idempotency_key="k") as keyed:
        await keyed.read(R, "o1")
    assert await outcome(keyed) == b"1"
    async with manager.transaction(idempotency_key="k") as replay:
        await replay.read(R, "o1")
    assert replay.result == CommitResult(1, replayed=True)
    assert await outcome(replay) is None
    stale = await manager.begin("snapshot")
    stale.write(R, "o1", "stale")
    await _write(manager, "o1", 2)
    with pytest.raises(ConflictError):
        await stale.commit()
    assert await outcome(stale) is None


async def test_a_resent_commit_answers_as_it_did_and_a_refused_one_stays_refused(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock
) -> None:
    """The same commit request sent again (the failover's resend): one that applied answers its
    version and applies nothing, even after the history trimmed it; one that was fenced is
    fenced again, and nothing of either is applied twice."""
    backend = _make(backends, redis_client, clock, history_limit=2)
    manager = TransactionManager(backend)
    old = await manager.acquire_lease("job", "w1", 10)
    assert old is not None
    clock.advance(11)
    new = await manager.acquire_lease("job", "w2", 10)
    assert new is not None

    def request(txn_id: str, snapshot: Snapshot, data: str, fencing: Any = None) -> CommitRequest:
        return CommitRequest(
            txn_id=txn_id,
            isolation=Isolation.SNAPSHOT,
            snapshot=snapshot,
            reads=(),
            writes=(WriteRecord(R, "o1", data),),
            idempotency_key=None,
            fingerprint=None,
            fencing=fencing,
            now=clock.now(),
        )

    first = request("txn-applied", await backend.begin("txn-applied"), '"mine"')
    assert await backend.commit(first) == CommitResult(1)
    for n in range(3):  # more than history_limit: the commit's own entry is trimmed
        await _write(manager, "o1", n)
    assert [v.version for v in await manager.history(R, "o1")] == [4, 3]
    assert await backend.commit(first) == CommitResult(1)
    assert [v.value for v in await manager.history(R, "o1")] == [2, 1]

    fenced = request("txn-fenced", await backend.begin("txn-fenced"), '"fenced"', old)
    for _ in range(2):
        with pytest.raises(FencingError):
            verdict = await backend.commit(fenced)  # a refusal is answered, not raised:
            assert isinstance(verdict, Refusal)
            raise verdict.error()  # what the front raises for it
    assert await redis_client.exists(TxKeys(backend.prefix).op("txn-fenced")) == 0
    assert (await manager.history(R, "o1"))[0].value == 2


# -- locks ------------------------------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from statepact.storage.redis import RedisBackend
    from statepact.tx import LockMode

    async def main() -> None:
        backend = await RedisBackend.connect(
            sys.argv[1], prefix=sys.argv[2], lock_ttl_seconds=float(sys.argv[3]), durable=False
        )
        assert await backend.try_lock("crashed-txn", "orders", "o1", LockMode.EXCLUSIVE, 0)
        print("locked", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


async def test_a_crashed_holders_lock_frees_itself_after_its_ttl(
    statepact_redis_url: str, redis_client: Redis, clock: ManualClock
) -> None:
    """A process killed while holding a lock blocks the key only until the lock TTL runs out."""
    prefix = _prefix()
    ttl = 1.0
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        statepact_redis_url,
        prefix,
        str(ttl),
        stdout=asyncio.subprocess.PIPE,
    )
    backend = RedisBackend(redis_client, prefix=prefix, clock=clock, lock_ttl_seconds=ttl)
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), 30)
        assert line.strip() == b"locked"
        holder.send_signal(signal.SIGKILL)
        await asyncio.wait_for(holder.wait(), 10)
        killed_at = time.monotonic()
        manager = TransactionManager(backend)
        tx = await manager.begin()
        with pytest.raises(LockTimeoutError):
            await tx.lock(R, "o1", timeout=0)
        await tx.lock(R, "o1", timeout=ttl + 3)
        waited = time.monotonic() - killed_at
        assert 0.5 * ttl < waited < ttl + 3
        await tx.rollback()
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await backend.clear()


async def test_close_releases_the_locks_of_transactions_still_live(
    redis_client: Redis, clock: ManualClock
) -> None:
    """Closing a backend while its transactions hold locks releases them (they can never end
    now) instead of leaving the keys blocked for lock_ttl_seconds."""
    prefix = _prefix()
    closing = RedisBackend(redis_client, prefix=prefix, clock=clock)
    other = RedisBackend(redis_client, prefix=prefix, clock=clock)
    try:
        live = await TransactionManager(closing).begin()
        await live.lock(R, "o1")
        await live.lock(R, "o2", mode="shared")
        await closing.close()
        tx = await TransactionManager(other).begin()
        await tx.lock(R, "o1", timeout=0)
        await tx.lock(R, "o2", timeout=0)
        await tx.rollback()
    finally:
        await other.clear()


# -- errors at the boundary -------------------------------------------------------------------


async def test_an_unreachable_server_is_statepersistenceerror(clock: ManualClock) -> None:
    """With no server, every call raises StatePersistenceError(unavailable), never redis's own."""
    port = free_port()
    client = Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0), socket_timeout=1)
    backend = RedisBackend(
        client, clock=clock, failover=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01)
    )
    manager = TransactionManager(backend)
    with pytest.raises(StatePersistenceError) as caught:
        await manager.begin()
    assert caught.value.reason == "unavailable" and caught.value.retryable
    assert str(port) not in str(caught.value)
    with pytest.raises(StatePersistenceError):
        await manager.acquire_lease("job", "w1", 5)
    with pytest.raises(StatePersistenceError):
        await backend.clear()
    assert await manager.health_check() is False
    await client.aclose()

    with pytest.raises(StatePersistenceError) as caught:
        await RedisBackend.connect(
            f"redis://:s3cret@127.0.0.1:{port}/0",
            failover=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01),
            retry=Retry(NoBackoff(), 0),
        )
    assert "s3cret" not in str(caught.value) and str(port) not in str(caught.value)


# -- connect() and its preflight -------------------------------------------------------------


async def test_connect_runs_the_preflight(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """connect() refuses a server that keeps nothing on disk (unless durable=False) and one
    that evicts keys (always); it accepts a durable one and closes its own client."""
    volatile = statepact_redis_server_factory(["--appendonly", "no", "--save", ""])
    with pytest.raises(PreflightError) as caught:
        await RedisBackend.connect(volatile.url)
    assert any("appendonly" in reason for reason in caught.value.reasons)
    relaxed = await RedisBackend.connect(volatile.url, durable=False)
    assert await relaxed.health_check() is True
    await relaxed.close()
    assert await relaxed.health_check() is False

    evicting = statepact_redis_server_factory(
        ["--appendonly", "no", "--save", "", "--maxmemory-policy", "allkeys-lru"]
    )
    with pytest.raises(PreflightError) as caught:
        await RedisBackend.connect(evicting.url)
    assert len(caught.value.reasons) == 2
    with pytest.raises(PreflightError) as caught:
        await RedisBackend.connect(evicting.url, durable=False)
    assert [r for r in caught.value.reasons if "maxmemory-policy" in r] == list(
        caught.value.reasons
    )

    durable = statepact_redis_server_factory(["--appendonly", "yes"])
    backend = await RedisBackend.connect(durable.url, prefix="app", history_limit=5)
    try:
        manager = TransactionManager(backend)
        assert await _write(manager, "o1", 1) == 1
        assert await manager.health_check() is True
    finally:
        await backend.close()
        await backend.close()  # idempotent


async def test_connect_serves_150_concurrent_transactions(statepact_redis_url: str) -> None:
    """The client connect() builds queues concurrent calls for a pooled connection instead of
    refusing them: 150 transactions at once (read, write, commit) all land."""
    backend = await RedisBackend.connect(statepact_redis_url, prefix=_prefix(), durable=False)
    manager = TransactionManager(backend)

    async def deposit(n: int) -> int:
        async with manager.transaction() as tx:
            assert await tx.read(R, f"k{n}") is None
            tx.write(R, f"k{n}", n)
        return tx.result.version

    try:
        versions = await asyncio.gather(*(deposit(n) for n in range(150)))
        assert sorted(versions) == list(range(1, 151))
    finally:
        await backend.clear()
        await backend.close()


async def test_connect_counts_only_the_failovers_attempts(
    statepact_redis_url: str, clock: ManualClock
) -> None:
    """Against a server that refuses connections, a call on connect()'s client makes exactly the
    failover's attempts: redis-py's own retry is off, whatever its version's default (a retry
    passed explicitly multiplies them, which shows the count would see one)."""
    port = urlsplit(statepact_redis_url).port or 6379
    for own_retries, connections in ((None, 4), (2, 12)):
        async with FaultProxy(port) as proxy:
            assert await _failover_connections(proxy, clock, own_retries) == connections


async def _failover_connections(proxy: FaultProxy, clock: ManualClock, retries: int | None) -> int:
    """How many connections one call on a connect() client opens against a refusing proxy."""
    options = {} if retries is None else {"retry": Retry(NoBackoff(), retries)}
    backend = await RedisBackend.connect(
        f"redis://127.0.0.1:{proxy.port}/0",
        prefix=_prefix(),
        durable=False,
        clock=clock,
        failover=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.02),
        **options,
    )
    try:
        proxy.refuse()
        proxy.cut()
        # The first call meets the cut pooled connection before it connects anew; from the
        # second on, every attempt opens new connections.
        with pytest.raises(StatePersistenceError, match="after 4 attempts"):
            await backend.begin("probe")
        before = proxy.stats.accepted
        with pytest.raises(StatePersistenceError, match="after 4 attempts"):
            await backend.begin("probe")
        return proxy.stats.accepted - before
    finally:
        proxy.heal()
        await backend.close()


async def test_fencing_tokens_survive_a_crash_of_a_durable_server(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """On a server that passes preflight (AOF, fsync always), a kill -9 and restart neither
    loses a commit nor sends the fencing counter backwards."""
    server = statepact_redis_server_factory(["--appendonly", "yes", "--appendfsync", "always"])
    clock = ManualClock()
    backend = await RedisBackend.connect(server.url, clock=clock)
    manager = TransactionManager(backend)
    try:
        first = await manager.acquire_lease("job", "w1", 10)
        assert first is not None
        assert await _write(manager, "o1", "kept") == 1
        server.kill()
        server.start()
        clock.advance(11)
        second = await manager.acquire_lease("job", "w2", 10)
        assert second is not None and second.token > first.token
        async with manager.transaction() as tx:
            assert await tx.read(R, "o1") == "kept"
        assert tx.result.version == 1
    finally:
        await backend.close()


async def test_values_come_back_verbatim(
    redis_client: Redis, backends: list[RedisBackend], clock: ManualClock
) -> None:
    """Values come back byte for byte: big integers, float spellings and unicode survive."""
    manager = TransactionManager(_make(backends, redis_client, clock))
    value = {
        "big": 2**62 + 1,
        "float": 0.1,
        "tiny": 1e-300,
        "text": 'zürich \u2603 \\ "q" \n',
        "control": "\u0001\u001f",
    }
    for isolation in Isolation:
        async with manager.transaction(isolation) as tx:
            tx.write(R, f"v-{isolation.value}", value)
        async with manager.transaction(isolation) as tx:
            assert await tx.read(R, f"v-{isolation.value}") == value
    assert (await manager.history(R, "v-snapshot"))[0].value == value


async def test_a_client_that_decodes_responses_works(
    statepact_redis_url: str, clock: ManualClock
) -> None:
    """A client built with decode_responses=True reads, snapshots, lists history and clears."""
    client = Redis.from_url(statepact_redis_url, decode_responses=True)
    backend = RedisBackend(client, prefix=_prefix(), clock=clock)
    try:
        manager = TransactionManager(backend)
        await _write(manager, "ö", {"name": "zoë"})
        snapshot = await manager.begin("snapshot")
        await _write(manager, "ö", {"name": "zoë 2"})
        assert await snapshot.read(R, "ö") == {"name": "zoë"}
        await snapshot.rollback()
        async with manager.transaction("read_committed") as tx:
            assert await tx.read(R, "ö") == {"name": "zoë 2"}
        assert [e.version for e in await manager.history(R, "ö")] == [2, 1]
        await manager.register_resource(R, {"ü": 1})
        info = await manager.resource_info(R)
        assert info is not None and info.metadata == {"ü": 1} and info.version == 2
        await backend.clear()
        assert (await backend.begin("t")).sequence == 0
    finally:
        await backend.clear()
        await client.aclose()
