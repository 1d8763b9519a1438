"""RedisStateStore against real servers: round trips, key layout, retries, sizes, encodings.

The behaviour shared with every backing is the conformance suite's
(``tests/conformance``); this module checks what only Redis shows.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from statepact._retry import new_op_id
from statepact.clock import ManualClock, to_micros
from statepact.errors import StateConflictError, StatePersistenceError
from statepact.models import RunRecord, RunStatus, SessionRecord
from statepact.storage.redis import RedisStateStore, RedisStoreSettings
from statepact.storage.redis._keys import StateKeys
from tests.fixtures.redis import ObservedRedis

pytestmark = pytest.mark.integration

KEYS = StateKeys("adk")


def _run(tenant: str, run_id: str, **fields: object) -> RunRecord:
    return RunRecord(tenant=tenant, run_id=run_id, **fields)  # type: ignore[arg-type]


async def test_every_state_call_is_one_evalsha(observed_redis: ObservedRedis) -> None:
    """Each StateStore call is one round trip: one EVALSHA, whatever the page length."""
    store = RedisStateStore(observed_redis.client, clock=ManualClock())
    # Warm up: the first call of each script also loads it (NOSCRIPT, SCRIPT LOAD).
    await store.put_session(SessionRecord(tenant="t", session_id="warm"))
    await store.get_session("t", "warm")
    await store.list_sessions("t")
    warm = await store.put_run(_run("t", "warm", session_id="s"))
    await store.put_run(warm)
    await store.patch_run("t", "warm", iterations=1)
    await store.get_run("t", "warm")
    await store.list_runs("t")
    await store.delete_run("t", "warm")
    for i in range(60):
        await store.put_run(_run("t", f"r{i:02}", session_id="s", status="running"))

    async def one(call: object) -> list[str]:
        await observed_redis.reset()
        await call  # type: ignore[misc]
        return await observed_redis.round_trips()

    created = await one(store.put_run(_run("t", "new", session_id="s")))
    assert created == ["EVALSHA"]
    record = await store.get_run("t", "new")
    assert record is not None
    assert await one(store.put_run(record.model_copy(update={"status": "running"}))) == ["EVALSHA"]
    assert await one(store.patch_run("t", "new", input_tokens=3, cost="0.5")) == ["EVALSHA"]
    assert await one(store.get_run("t", "new")) == ["EVALSHA"]
    assert await one(store.list_runs("t", limit=50)) == ["EVALSHA"]
    assert await one(store.list_runs("t", status="running", limit=50)) == ["EVALSHA"]
    assert await one(store.list_runs("t", session_id="s", limit=50)) == ["EVALSHA"]
    assert await one(store.list_runs("t", session_id="s", status="running")) == ["EVALSHA"]
    assert await one(store.delete_run("t", "new")) == ["EVALSHA"]
    assert await one(store.put_session(SessionRecord(tenant="t", session_id="s2"))) == ["EVALSHA"]
    assert await one(store.get_session("t", "s2")) == ["EVALSHA"]
    assert await one(store.list_sessions("t")) == ["EVALSHA"]
    page = await store.list_runs("t", limit=50)
    assert len(page.items) == 50 and page.next is not None


async def test_scripts_load_once_and_reload_after_a_flush(observed_redis: ObservedRedis) -> None:
    """A script is loaded on first use, then only EVALSHA; after SCRIPT FLUSH it reloads."""
    store = RedisStateStore(observed_redis.client, clock=ManualClock())
    await observed_redis.reset()
    assert await store.get_run("t", "r") is None
    assert await observed_redis.round_trips() == ["EVALSHA", "SCRIPT", "EVALSHA"]
    await observed_redis.reset()
    assert await store.get_run("t", "r") is None
    assert await observed_redis.round_trips() == ["EVALSHA"]

    # A second store on the same server finds the script already there.
    other = RedisStateStore(observed_redis.client, clock=ManualClock())
    await observed_redis.reset()
    assert await other.get_run("t", "r") is None
    assert await observed_redis.round_trips() == ["EVALSHA"]

    await observed_redis.probe.script_flush()
    created = await store.put_run(_run("t", "r"))
    assert created.version == 1
    assert await store.get_run("t", "r") == created


async def test_an_oversized_blob_sends_nothing(observed_redis: ObservedRedis) -> None:
    """A blob over max_value_bytes is refused before any command reaches the server."""
    store = RedisStateStore(
        observed_redis.client, clock=ManualClock(), settings=RedisStoreSettings(max_value_bytes=64)
    )
    await store.get_run("t", "warm")  # the connection is open and the script loaded
    await observed_redis.reset()
    with pytest.raises(StatePersistenceError) as caught:
        await store.put_run(_run("t", "big", data={"text": "x" * 100}))
    assert caught.value.reason == "too_large"
    assert caught.value.retryable is False
    with pytest.raises(StatePersistenceError):
        await store.put_session(SessionRecord(tenant="t", session_id="s", data={"x": "y" * 80}))
    assert await observed_redis.round_trips() == []
    assert await observed_redis.script_commands() == []
    assert await observed_redis.probe.dbsize() == 0


async def test_keys_follow_the_documented_layout(redis_client: Redis) -> None:
    """Blob, counters hash and every index sit at the keys ``_keys`` builds, in one slot."""
    store = RedisStateStore(redis_client, clock=ManualClock())
    created = await store.put_run(_run("acme", "run_1", session_id="s1", data={"a": 1}))
    assert await redis_client.get("adk:state:{4:acme}:run:5:run_1") == b'{"a":1}'
    counters = await redis_client.hgetall(KEYS.run_meta("acme", "run_1"))
    assert counters[b"version"] == b"1"
    assert counters[b"cost"] == b"0"
    assert counters[b"session"] == b"s1"
    pending, running = RunStatus.PENDING, RunStatus.RUNNING
    for index in (
        KEYS.runs("acme"),
        KEYS.runs_by_status("acme", pending),
        KEYS.runs_by_session("acme", "s1"),
        KEYS.runs_by_session_status("acme", "s1", pending),
    ):
        assert await redis_client.zscore(index, "run_1") == created.seq, index

    # A status change moves the run between the indexes the script builds in Lua.
    await store.put_run(created.model_copy(update={"status": running, "session_id": None}))
    assert not await redis_client.exists(KEYS.runs_by_status("acme", pending))
    assert not await redis_client.exists(KEYS.runs_by_session("acme", "s1"))
    assert not await redis_client.exists(KEYS.runs_by_session_status("acme", "s1", pending))
    assert await redis_client.zscore(KEYS.runs_by_status("acme", running), "run_1") == 1

    await store.put_session(SessionRecord(tenant="acme", session_id="s1"))
    keys = [key async for key in redis_client.scan_iter(match="adk:state:*")]
    assert {key_slot(key) for key in keys} == {key_slot(b"{4:acme}")}

    # Delete takes the run, its counters and its index entries; the sequence stays, and the
    # writes' replay keys until they expire.
    assert await store.delete_run("acme", "run_1") is True
    left = {key async for key in redis_client.scan_iter(match="adk:state:{4:acme}:*")}
    replay = {key for key in left if key.startswith(b"adk:state:{4:acme}:op:")}
    assert len(replay) == 4
    for key in replay:
        assert 0 < await redis_client.pttl(key) <= 120_000
    assert left - replay == {
        KEYS.seq("acme").encode(),
        KEYS.session("acme", "s1").encode(),
        KEYS.session_meta("acme", "s1").encode(),
        KEYS.sessions("acme").encode(),
    }


@pytest.mark.parametrize(
    ("tenant", "run_id", "session_id"),
    [("a:b", "c", "s:1"), ("a", "b:c", "{s}"), ("{t}", "}r{", "日本 語"), ("é" * 300, "🙂", "s")],
)
async def test_awkward_ids_index_and_list(
    redis_client: Redis, tenant: str, run_id: str, session_id: str
) -> None:
    """Ids with ':', braces, spaces and multi-byte text are indexed where the lister looks."""
    store = RedisStateStore(redis_client, clock=ManualClock())
    created = await store.put_run(_run(tenant, run_id, session_id=session_id, status="running"))
    for kwargs in ({}, {"status": "running"}, {"session_id": session_id}):
        page = await store.list_runs(tenant, **kwargs)  # type: ignore[arg-type]
        assert page.items == [created], kwargs
    page = await store.list_runs(tenant, session_id=session_id, status="running")
    assert page.items == [created]
    assert await store.delete_run(tenant, run_id) is True
    assert (await store.list_runs(tenant, session_id=session_id)).items == []


async def test_a_put_retried_after_a_lost_reply_is_not_a_conflict(redis_client: Redis) -> None:
    """The same put_run sent twice (its first reply lost) writes once and succeeds twice,
    even when other writes landed in between."""
    clock = ManualClock()
    store = RedisStateStore(redis_client, clock=clock)
    await store.put_run(_run("t", "r"))
    op = KEYS.op("t", new_op_id())
    keys = [KEYS.run("t", "r"), KEYS.run_meta("t", "r"), KEYS.seq("t"), KEYS.runs("t"), op]
    args = [KEYS.prefix("t"), "r", 1, b'{"step":2}', "running", "", to_micros(clock.now())]
    first = await store._run("put_run", "put_run", keys, args)
    again = await store._run("put_run", "put_run", keys, args)
    # The same run; the write leaves its own blob out, the replay reads the stored one.
    assert first[:-1] == again[:-1]
    assert (first[-1], again[-1]) == (None, b'{"step":2}')
    for _ in range(6):
        await store.patch_run("t", "r", iterations=1)
    late = await store._run("put_run", "put_run", keys, args)
    assert int(late[0]) == 1
    stored = await store.get_run("t", "r")
    assert stored is not None
    assert stored.version == 8
    assert stored.data == {"step": 2}
    assert 0 < await redis_client.pttl(op) <= 120_000
    # A different call holding the same version is a real conflict.
    with pytest.raises(StateConflictError) as caught:
        await store.put_run(stored.model_copy(update={"version": 1}))
    assert (caught.value.expected, caught.value.actual) == (1, 8)


async def test_a_patch_retried_after_a_lost_reply_adds_once(redis_client: Redis) -> None:
    """The same patch_run sent again, even after many other patches landed, adds once."""
    clock = ManualClock()
    store = RedisStateStore(redis_client, clock=clock)
    await store.put_run(_run("t", "r"))
    keys = [KEYS.run_meta("t", "r"), KEYS.run("t", "r"), KEYS.op("t", new_op_id())]
    args = [KEYS.prefix("t"), "r", to_micros(clock.now()), "5", "0", "1000", "0", "0"]
    await store._run("patch_run", "patch_run", keys, args)
    for _ in range(10):
        await store.patch_run("t", "r", input_tokens=1)
    await store._run("patch_run", "patch_run", keys, args)
    stored = await store.get_run("t", "r")
    assert stored is not None
    assert stored.input_tokens == 15
    assert stored.cost == Decimal("0.000001")
    assert stored.version == 12


async def test_a_delete_retried_after_a_lost_reply_still_says_it_existed(
    redis_client: Redis,
) -> None:
    """The same delete_run sent twice answers True twice; a new delete answers False."""
    store = RedisStateStore(redis_client, clock=ManualClock())
    await store.put_run(_run("t", "r", session_id="s"))
    keys = [KEYS.run("t", "r"), KEYS.run_meta("t", "r"), KEYS.runs("t"), KEYS.op("t", new_op_id())]
    assert await store._run("delete_run", "delete_run", keys, [KEYS.prefix("t"), "r"]) == 1
    assert await store._run("delete_run", "delete_run", keys, [KEYS.prefix("t"), "r"]) == 1
    assert await store.delete_run("t", "r") is False
    assert await store.get_run("t", "r") is None


async def test_patches_from_many_connections_all_land(
    statepact_redis_url: str, redis_client: Redis
) -> None:
    """Ten clients patching one run at once: every token and nano-unit of cost lands."""
    await RedisStateStore(redis_client, clock=ManualClock()).put_run(_run("t", "r"))
    clients = [Redis.from_url(statepact_redis_url) for _ in range(10)]
    try:
        stores = [RedisStateStore(client, clock=ManualClock()) for client in clients]
        await asyncio.gather(
            *(
                store.patch_run("t", "r", input_tokens=1, cost="0.000000001")
                for store in stores
                for _ in range(20)
            )
        )
    finally:
        for client in clients:
            await client.aclose()
    stored = await RedisStateStore(redis_client, clock=ManualClock()).get_run("t", "r")
    assert stored is not None
    assert stored.input_tokens == 200
    assert stored.cost == Decimal("0.000000200")
    assert stored.version == 201


async def test_a_client_that_decodes_responses_works(statepact_redis_url: str) -> None:
    """A client built with decode_responses=True reads back the same records."""
    client = Redis.from_url(statepact_redis_url, decode_responses=True)
    try:
        store = RedisStateStore(client, clock=ManualClock(), settings=RedisStoreSettings())
        created = await store.put_run(_run("t", "é", session_id="s", data={"k": "ü"}))
        patched = await store.patch_run("t", "é", cost="1.5", output_tokens=2)
        assert patched.cost == Decimal("1.5")
        assert await store.get_run("t", "é") == patched
        assert [r.run_id for r in (await store.list_runs("t", session_id="s")).items] == ["é"]
        assert created.data == {"k": "ü"}
        session = await store.put_session(SessionRecord(tenant="t", session_id="s"))
        assert (await store.list_sessions("t")).items == [session]
    finally:
        await client.aclose()


async def test_namespaces_keep_stores_apart(redis_client: Redis) -> None:
    """Two namespaces on one database share nothing."""
    one = RedisStateStore(redis_client, settings=RedisStoreSettings(namespace="one"))
    two = RedisStateStore(redis_client, settings=RedisStoreSettings(namespace="two"))
    await one.put_run(_run("t", "r"))
    assert await two.get_run("t", "r") is None
    assert (await two.list_runs("t")).items == []
    assert await redis_client.exists("one:state:{1:t}:run:1:r") == 1
