"""Security checks on every backing: secrets, injection, scripts and tenant isolation.

- Secrets: no password in any error (and its whole ``__cause__`` chain), repr or
  log line, when a server is unreachable, refuses a password, or is reached
  with a password in its URL; nor in the CLI's one-line errors.
- SQL: every id, key and blob reaches PostgreSQL as a bound parameter (every
  statement the engine sends is inspected), ids made of quotes, semicolons and
  ``'; DROP TABLE`` round-trip unchanged on every backing, and ``StateTables``
  / ``db_schema`` refuse anything but a plain identifier.
- Lua: the scripts Redis runs are exactly the packaged ``.lua`` files (by text,
  and by the SHA1 of every EVALSHA the server saw, with no EVAL at all), and
  ids full of Lua syntax round-trip unchanged.
- Tenants: one tenant can never read, list, patch, delete, claim, settle,
  requeue or count another tenant's data through any public call, including
  with a lease or record forged through ``model_copy``.

This module must never print or log a real password: the ones here are made up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import statepact.storage.redis as redis_package
from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import LeaseLostError, RunNotFoundError, StateConflictError, StatepactError
from statepact.models import ItemStatus, RunRecord, RunStatus, SessionRecord, WorkItem
from statepact.queue import WorkQueue
from statepact.settings import PostgresStoreSettings, RedisStoreSettings
from statepact.state import StateStore
from statepact.storage.redis._scripts import (
    ADK_SCRIPTS,
    LANGGRAPH_SCRIPTS,
    QUEUE_SCRIPTS,
    STATE_SCRIPTS,
    TX_SCRIPTS,
    script_source,
)
from statepact.tx import StorageBackend, TransactionManager
from tests.fixtures.redis import OBSERVED_CLIENT, ObservedRedis

SECRET = "Zq8-S3cretPW-k41"
OTHER_SECRET = "Wy2-0therPW-m93"
FAST = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)
FAST_SETTINGS: dict[str, Any] = {
    "failover_attempts": 2,
    "failover_base_delay": 0.01,
    "failover_max_delay": 0.02,
}

# Quotes, comment and statement separators, placeholders, Lua string and comment
# syntax, key-codec and glob metacharacters: all must be plain data.
NASTY = [
    "'; DROP TABLE adk_runs; --",
    "x'); DELETE FROM adk_work; --",
    '"; DROP TABLE statepact_values; --',
    "a' OR '1'='1",
    "$1",
    "%s %(x)s",
    "\\'\\\\",
    "]] .. redis.call('FLUSHALL') .. [[",
    "--[[ x ]] end); redis.call('FLUSHDB'); (",
    "' .. KEYS[1] .. '",
    "{tag}:4:acme:run:5:run_1",
    "*?[a-z]",
    "\n\t\r",
    "ü😀\u202e",
]
BACKINGS = [
    pytest.param("memory"),
    pytest.param("redis", marks=pytest.mark.integration),
    pytest.param("postgres", marks=pytest.mark.integration),
]


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _chain(exc: BaseException) -> str:
    """str and repr of the error and of every error behind it."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


async def _refused(call: Callable[[], Awaitable[Any]]) -> StatepactError:
    with pytest.raises(StatepactError) as caught:
        await call()
    return caught.value


def _assert_hidden(*texts: str, secrets: tuple[str, ...] = (SECRET,)) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a password got out: {text!r}"


# -- secrets -----------------------------------------------------------------------------------


async def test_an_unreachable_redis_names_no_password(caplog: pytest.LogCaptureFixture) -> None:
    """Every way of opening a Redis backing fails without showing the URL's password."""
    caplog.set_level(logging.DEBUG)
    from redis.asyncio import Redis

    from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue

    url = f"redis://agent:{SECRET}@127.0.0.1:{_free_port()}/0"
    settings = RedisStoreSettings(dsn=url, **FAST_SETTINGS)
    errors = [await _refused(lambda: RedisBackend.connect(url, failover=FAST))]
    client = Redis.from_url(url)
    try:
        errors.append(await _refused(lambda: RedisStateStore.open(client, settings=settings)))
        errors.append(await _refused(lambda: RedisWorkQueue.open(client, settings=settings)))
        errors.append(
            await _refused(lambda: RedisStateStore(client, settings=settings).get_run("a", "r"))
        )
    finally:
        await client.aclose()
    _assert_hidden(*(_chain(exc) for exc in errors), repr(settings), caplog.text)


@pytest.mark.integration
async def test_a_wrong_redis_password_is_not_shown(
    statepact_redis_server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that refuses the password says so without showing either password; a
    backing opened with the right one does not show it in its repr or its errors."""
    caplog.set_level(logging.DEBUG)
    from redis.asyncio import Redis

    from statepact.storage.redis import RedisBackend

    server = statepact_redis_server_factory()
    # Set the password on a connection opened before it (the harness pings without one).
    admin = Redis.from_url(server.url)
    await admin.config_set("requirepass", OTHER_SECRET)
    try:
        wrong = f"redis://:{SECRET}@127.0.0.1:{server.port}/0"
        right = f"redis://:{OTHER_SECRET}@127.0.0.1:{server.port}/0"
        error = await _refused(lambda: RedisBackend.connect(wrong, failover=FAST, durable=False))
        backend = await RedisBackend.connect(right, failover=FAST, durable=False)
        try:
            manager = TransactionManager(backend)
            async with manager.transaction() as tx:
                tx.write("orders", "o1", {"paid": True})
            texts = [repr(backend), repr(manager), str(tx.result)]
        finally:
            await backend.close()
    finally:
        await admin.config_set("requirepass", "")
        await admin.aclose()
    closed = await _refused_any(lambda: backend.history("orders", "o1", 1))
    _assert_hidden(_chain(error), *texts, closed, caplog.text, secrets=(SECRET, OTHER_SECRET))


async def _refused_any(call: Callable[[], Awaitable[Any]]) -> str:
    """The text of whatever a call on a closed backing raises (it must raise)."""
    with pytest.raises(Exception) as caught:
        await call()
    return _chain(caught.value)


async def test_an_unreachable_postgres_names_no_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every way of opening a PostgreSQL backing fails without showing the URL's password."""
    caplog.set_level(logging.DEBUG)
    from statepact.storage.postgres import (
        PostgresBackend,
        PostgresStateStore,
        PostgresWorkQueue,
        create_engine,
    )

    url = f"postgresql+asyncpg://agent:{SECRET}@127.0.0.1:{_free_port()}/app"
    settings = PostgresStoreSettings(dsn=url, **FAST_SETTINGS)
    errors = [await _refused(lambda: PostgresBackend.connect(url, failover=FAST))]
    engine = create_engine(settings)
    try:
        errors.append(await _refused(lambda: PostgresStateStore.open(engine, settings=settings)))
        errors.append(await _refused(lambda: PostgresWorkQueue.open(engine, settings=settings)))
        store = PostgresStateStore(engine, settings=settings)
        errors.append(await _refused(lambda: store.get_run("a", "r")))
        texts = [repr(engine), repr(store), repr(settings)]
    finally:
        await engine.dispose()
    _assert_hidden(*(_chain(exc) for exc in errors), *texts, caplog.text)


@pytest.mark.integration
async def test_a_postgres_url_with_a_password_is_never_shown(
    pg_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Reached with a password in its URL, a backend keeps it out of reprs, errors and logs."""
    caplog.set_level(logging.DEBUG)
    from sqlalchemy.engine import make_url

    from statepact.errors import FencingError
    from statepact.storage.postgres import PostgresBackend

    url = make_url(pg_database_url).set(password=SECRET).render_as_string(hide_password=False)
    backend = await PostgresBackend.connect(url, create_schema=False, failover=FAST)
    try:
        manager = TransactionManager(backend)
        old = await manager.acquire_lease("jobs", "a", 0.001)
        assert old is not None
        await asyncio.sleep(0.02)  # past a's 1 ms lease, however quick the round trips
        assert await manager.acquire_lease("jobs", "b", 60) is not None  # a newer token
        with pytest.raises(FencingError) as fenced:
            async with manager.transaction(fencing=old) as tx:
                tx.write("jobs", "j1", 1)
        texts = [repr(backend), repr(manager), _chain(fenced.value)]
    finally:
        await backend.close()
    closed = await _refused_any(lambda: backend.history("jobs", "j1", 1))
    _assert_hidden(*texts, closed, caplog.text)


def _cli_cases() -> list[Any]:
    redis_url = f"redis://agent:{SECRET}@127.0.0.1:{_free_port()}/0"
    pg_url = f"postgresql://agent:{SECRET}@127.0.0.1:{_free_port()}/app"
    return [
        pytest.param(["db", "current", "--url", pg_url], True, id="db-current"),
        pytest.param(["db", "upgrade", "--url", pg_url], True, id="db-upgrade"),
        pytest.param(["db", "current", "--url", pg_url, "--debug"], False, id="db-debug"),
        pytest.param(["demo", "--redis", redis_url], True, id="demo-redis"),
        pytest.param(["demo", "--postgres", pg_url], True, id="demo-postgres"),
        pytest.param(["doctor", "--redis", redis_url, "--postgres", pg_url], False, id="doctor"),
        pytest.param(["bench", "--backend", "redis", "--redis", redis_url], True, id="bench-redis"),
        pytest.param(
            ["bench", "--backend", "postgres", "--postgres", pg_url], True, id="bench-postgres"
        ),
    ]


@pytest.mark.parametrize(("argv", "one_line"), _cli_cases())
def test_cli_errors_show_no_password(
    argv: list[str],
    one_line: bool,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server the CLI cannot reach is reported (in one line, without --debug), never with
    the URL's password."""
    caplog.set_level(logging.DEBUG)
    from statepact.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    assert code != 0, out + err
    _assert_hidden(out, err, caplog.text)
    if one_line:
        # The error is one line, and the last (bench prints its progress before it).
        lines = [line for line in err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(f"statepact {argv[0]}")]
        assert len(errors) == 1, err
        assert lines[-1] == errors[0], err


# -- SQL ------------------------------------------------------------------------------------------


@pytest.fixture(params=BACKINGS)
def state_store(request: pytest.FixtureRequest) -> StateStore:
    store: StateStore = request.getfixturevalue(f"{request.param}_state_store")
    return store


@pytest.fixture(params=BACKINGS)
def work_queue(request: pytest.FixtureRequest) -> WorkQueue:
    queue: WorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return queue


@pytest.fixture(params=BACKINGS)
def tx_backend(request: pytest.FixtureRequest) -> StorageBackend:
    backend: StorageBackend = request.getfixturevalue(f"{request.param}_backend")
    return backend


async def test_nasty_ids_round_trip_in_the_state_store(state_store: StateStore) -> None:
    """Ids and blobs made of SQL and Lua syntax are stored and read back unchanged, and
    the store goes on working (no statement was cut short, no table dropped)."""
    for index, nasty in enumerate(NASTY):
        data = {nasty: nasty, "list": [nasty], "n": index}
        created = await state_store.put_run(
            RunRecord(tenant=nasty, run_id=nasty, session_id=nasty, data=data)
        )
        assert (created.tenant, created.run_id, created.session_id) == (nasty, nasty, nasty)
        assert created.data == data
        assert await state_store.get_run(nasty, nasty) == created
        patched = await state_store.patch_run(nasty, nasty, input_tokens=1, cost=Decimal("0.5"))
        assert patched.input_tokens == 1
        assert (await state_store.list_runs(nasty, session_id=nasty)).items == [patched]
        session = await state_store.put_session(
            SessionRecord(tenant=nasty, session_id=nasty, data=data)
        )
        assert await state_store.get_session(nasty, nasty) == session
    for nasty in NASTY:
        runs = (await state_store.list_runs(nasty)).items
        assert [(r.tenant, r.run_id) for r in runs] == [(nasty, nasty)]
        assert await state_store.delete_run(nasty, nasty)
    fresh = await state_store.put_run(RunRecord(tenant="after", run_id="r"))
    assert await state_store.get_run("after", "r") == fresh


async def test_nasty_ids_round_trip_in_the_queue(work_queue: WorkQueue) -> None:
    """Tenants, item ids, payloads and error texts made of SQL and Lua syntax come back as
    they went in, through enqueue, claim, fail and dead_letters."""
    for nasty in NASTY:
        stored = await work_queue.enqueue(
            WorkItem(tenant=nasty, item_id=nasty, payload={nasty: [nasty]})
        )
        assert (stored.tenant, stored.item_id, stored.payload) == (nasty, nasty, {nasty: [nasty]})
        assert await work_queue.get_item(nasty, nasty) == stored
    claimed = await work_queue.claim_batch("w", lease_for=60, limit=len(NASTY))
    assert sorted((lease.item.tenant, lease.item.item_id) for lease in claimed) == sorted(
        (nasty, nasty) for nasty in NASTY
    )
    for lease in claimed:
        dead = await work_queue.fail(lease, lease.item.item_id, retryable=False)
        assert dead.last_error == lease.item.item_id
        assert await work_queue.dead_letters(lease.item.tenant) == [dead]
    stats = await work_queue.stats()
    assert set(stats.tenants) == set(NASTY)
    assert stats.dead == len(NASTY)


async def test_nasty_names_round_trip_in_transactions(tx_backend: StorageBackend) -> None:
    """Resources, keys, values, owners, idempotency keys and registry metadata made of SQL
    and Lua syntax are stored and read back unchanged."""
    manager = TransactionManager(tx_backend)
    for nasty in NASTY:
        async with manager.transaction(idempotency_key=nasty) as tx:
            tx.write(nasty, nasty, {nasty: nasty})
        async with manager.transaction(idempotency_key=nasty) as again:
            again.write(nasty, nasty, {nasty: nasty})
        assert again.result.replayed
        async with manager.transaction() as reader:
            assert await reader.read(nasty, nasty) == {nasty: nasty}
        history = await manager.history(nasty, nasty, 10)
        assert [entry.value for entry in history] == [{nasty: nasty}]
        await manager.register_resource(nasty, {nasty: [nasty]})
        info = await manager.resource_info(nasty)
        assert info is not None
        assert (info.name, info.metadata) == (nasty, {nasty: [nasty]})
        lease = await manager.acquire_lease(nasty, nasty, 30)
        assert lease is not None
        assert (lease.resource, lease.owner) == (nasty, nasty)
        assert await manager.release_lease(lease)


@pytest.mark.integration
async def test_postgres_sends_caller_text_only_as_bound_parameters(
    pg_engine: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No id, key, blob or error text ever appears in the text of a statement PostgreSQL
    receives; it travels as a parameter (the statements of every call are inspected, through
    SQLAlchemy and on the driver)."""
    from sqlalchemy import event

    from statepact.storage.postgres import (
        PostgresBackend,
        PostgresStateStore,
        PostgresWorkQueue,
        _direct,
    )

    sentinel = "SENTINEL'; DROP TABLE adk_runs; --"
    seen: list[tuple[str, str]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, repr(parameters)))

    direct = _direct.Statements.execute

    async def on_driver(self: _direct.Statements, statement: Any, parameters: Any = None) -> Any:
        seen.append((statement.sql, repr(statement.arguments(parameters))))
        return await direct(self, statement, parameters)

    monkeypatch.setattr(_direct.Statements, "execute", on_driver)
    event.listen(pg_engine.sync_engine, "before_cursor_execute", record)
    try:
        store = PostgresStateStore(pg_engine, clock=clock)
        run = await store.put_run(
            RunRecord(tenant=sentinel, run_id=sentinel, session_id=sentinel, data={"s": sentinel})
        )
        await store.put_run(run.model_copy(update={"status": RunStatus.RUNNING}))
        await store.patch_run(sentinel, sentinel, iterations=1)
        await store.list_runs(sentinel, session_id=sentinel, status=RunStatus.RUNNING)
        await store.put_session(SessionRecord(tenant=sentinel, session_id=sentinel))
        await store.list_sessions(sentinel)
        await store.delete_run(sentinel, sentinel)
        queue = PostgresWorkQueue(pg_engine, clock=clock)
        await queue.enqueue(WorkItem(tenant=sentinel, item_id=sentinel, payload={"s": sentinel}))
        lease = await queue.claim(sentinel, lease_for=30)
        assert lease is not None
        lease = await queue.heartbeat(lease)
        dead = await queue.fail(lease, sentinel, retryable=False)
        await queue.dead_letters(sentinel)
        await queue.requeue(dead)
        await queue.get_item(sentinel, sentinel)
        await queue.stats()
        manager = TransactionManager(PostgresBackend(pg_engine, clock=clock))
        async with manager.transaction("serializable", idempotency_key=sentinel) as tx:
            await tx.read(sentinel, sentinel)
            tx.write(sentinel, sentinel, {"s": sentinel})
            await tx.lock(sentinel, sentinel)
        await manager.history(sentinel, sentinel, 5)
        await manager.register_resource(sentinel, {"s": sentinel})
        await manager.resource_info(sentinel)
        held = await manager.acquire_lease(sentinel, sentinel, 30)
        assert held is not None
        await manager.renew_lease(held)
        await manager.release_lease(held)
    finally:
        event.remove(pg_engine.sync_engine, "before_cursor_execute", record)
    assert seen, "no statement was captured"
    assert any("SENTINEL" in parameters for _, parameters in seen)
    leaked = [statement for statement, _ in seen if "SENTINEL" in statement]
    assert not leaked, f"caller text inside SQL: {leaked[:3]}"


@pytest.mark.parametrize(
    "bad",
    [
        "adk_runs; DROP TABLE x",
        'adk"runs',
        "adk'runs",
        "Adk_Runs",
        "1runs",
        "adk-runs",
        "adk runs",
        "adk_runs--",
        "ädk",
        "",
        "a" * 64,
        None,
        7,
    ],
)
@pytest.mark.parametrize("field", ["runs", "sessions", "work", "queue_turns", "schema"])
def test_state_tables_refuse_anything_but_an_identifier(field: str, bad: Any) -> None:
    """A table name is interpolated into SQL, so anything but a plain identifier is refused,
    with ``ValueError`` naming the field."""
    from statepact.storage.postgres import StateTables

    with pytest.raises(ValueError, match=rf"^{field}: "):
        StateTables(**{field: bad})


@pytest.mark.parametrize("bad", ["public; DROP SCHEMA x", 'a"b', "a.b", "a b", "", "1a"])
def test_db_schema_refuses_anything_but_an_identifier(bad: str) -> None:
    """The schema name goes into SQL the same way and is refused the same way."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="db_schema"):
        PostgresStoreSettings(db_schema=bad)


def test_state_tables_take_a_plain_identifier() -> None:
    """The refusals above are not refusing everything."""
    from statepact.storage.postgres import StateTables

    assert StateTables(runs="my_runs_2").runs == "my_runs_2"


# -- Lua -------------------------------------------------------------------------------------------

LUA_DIR = Path(redis_package.__file__).parent / "lua"
FAMILIES = {
    **dict.fromkeys(STATE_SCRIPTS, "state"),
    **dict.fromkeys(QUEUE_SCRIPTS, "queue"),
    **dict.fromkeys(TX_SCRIPTS, "tx"),
    **dict.fromkeys(ADK_SCRIPTS, "adk"),
    **dict.fromkeys(LANGGRAPH_SCRIPTS, "langgraph"),
}


def test_every_script_is_the_lua_files_and_nothing_else() -> None:
    """What is sent for a script is ``_common.lua``, its folder's ``_prelude.lua`` and its own
    file, verbatim; every file on disk is one of them, and every script file is registered."""
    files = {
        path.relative_to(LUA_DIR).as_posix(): path.read_text("utf-8")
        for path in LUA_DIR.rglob("*.lua")
    }
    for name, family in FAMILIES.items():
        assert script_source(name) == "\n".join(
            (files["_common.lua"], files[f"{family}/_prelude.lua"], files[f"{family}/{name}.lua"])
        )
    families = ("state", "queue", "tx", "adk", "langgraph")
    preludes = {f"{family}/_prelude.lua" for family in families}
    scripts = {f"{family}/{name}.lua" for name, family in FAMILIES.items()}
    assert set(files) == {"_common.lua", *preludes, *scripts}
    assert len(FAMILIES) == sum(
        len(names)
        for names in (STATE_SCRIPTS, QUEUE_SCRIPTS, TX_SCRIPTS, ADK_SCRIPTS, LANGGRAPH_SCRIPTS)
    )
    assert "put_run" in STATE_SCRIPTS and "claim" in QUEUE_SCRIPTS and "tx_commit" in TX_SCRIPTS


def test_every_script_file_starts_with_its_header() -> None:
    """Each script names itself, then lists its KEYS, its ARGV and what it returns."""
    for name, family in FAMILIES.items():
        text = (LUA_DIR / family / f"{name}.lua").read_text("utf-8")
        head = text.split("]]", 1)[0]
        assert text.startswith(f"--[[ {name}"), name
        assert "KEYS" in head and "ARGV" in head and "Returns" in head, name


@pytest.mark.integration
async def test_redis_runs_only_the_packaged_scripts(observed_redis: ObservedRedis) -> None:
    """Every script the server ran while ids full of Lua syntax went through all three
    Redis backings is one of the packaged files, by SHA1; nothing was sent as EVAL."""
    from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue

    clock = ManualClock()
    store = RedisStateStore(observed_redis.client, clock=clock)
    queue = RedisWorkQueue(observed_redis.client, clock=clock)
    manager = TransactionManager(RedisBackend(observed_redis.client, prefix="sec", clock=clock))
    for nasty in NASTY:
        run = await store.put_run(RunRecord(tenant=nasty, run_id=nasty, data={nasty: nasty}))
        assert await store.get_run(nasty, nasty) == run
        await store.patch_run(nasty, nasty, cursor=1)
        await store.list_runs(nasty)
        await store.delete_run(nasty, nasty)
        await queue.enqueue(WorkItem(tenant=nasty, item_id=nasty, payload={nasty: nasty}))
        lease = await queue.claim("w", lease_for=30)
        assert lease is not None
        assert (lease.item.tenant, lease.item.item_id) == (nasty, nasty)
        await queue.ack(lease)
        async with manager.transaction("serializable", idempotency_key=nasty) as tx:
            await tx.read(nasty, nasty)
            tx.write(nasty, nasty, {nasty: nasty})
            await tx.lock(nasty, nasty)
        async with manager.transaction() as reader:
            assert await reader.read(nasty, nasty) == {nasty: nasty}
        held = await manager.acquire_lease(nasty, nasty, 30)
        assert held is not None
        await manager.release_lease(held)
    await queue.stats()

    known = {hashlib.sha1(script_source(n).encode()).hexdigest(): n for n in FAMILIES}
    entries = await observed_redis.probe.slowlog_get(100_000)
    commands = [
        _text(entry["command"])
        for entry in entries
        if _text(entry.get("client_name", "")) == OBSERVED_CLIENT
    ]
    names = {command.split(" ", 1)[0].upper() for command in commands}
    assert "EVALSHA" in names
    assert not names & {"EVAL", "EVAL_RO", "FCALL", "FCALL_RO", "FUNCTION"}, names
    shas = {command.split(" ")[1] for command in commands if command.upper().startswith("EVALSHA")}
    assert shas <= set(known), shas - set(known)
    sources = [script_source(n) for n in FAMILIES]
    for command in commands:
        if command.upper().startswith("SCRIPT LOAD "):
            body = command[len("SCRIPT LOAD ") :].split("... (", 1)[0]
            assert any(source.startswith(body[:100]) for source in sources), body[:100]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# -- tenants ---------------------------------------------------------------------------------------

A, B = "acme", "evil"


async def test_a_tenant_cannot_reach_another_tenants_runs(state_store: StateStore) -> None:
    """Through every StateStore call, tenant B sees, changes and deletes nothing of A's."""
    run = await state_store.put_run(
        RunRecord(tenant=A, run_id="r1", session_id="s1", data={"secret": "a's"})
    )
    run = await state_store.patch_run(A, "r1", input_tokens=7, cost="1.5")
    session = await state_store.put_session(SessionRecord(tenant=A, session_id="s1", data={"x": 1}))

    async def a_view() -> Any:
        return (
            await state_store.get_run(A, "r1"),
            await state_store.list_runs(A),
            await state_store.get_session(A, "s1"),
            await state_store.list_sessions(A),
        )

    before = await a_view()
    assert run.seq is not None
    assert await state_store.get_run(B, "r1") is None
    assert await state_store.get_session(B, "s1") is None
    assert (await state_store.list_runs(B)).items == []
    assert (await state_store.list_runs(B, session_id="s1")).items == []
    assert (await state_store.list_runs(B, status=RunStatus.PENDING)).items == []
    assert (await state_store.list_runs(B, after=str(run.seq - 1))).items == []
    assert (await state_store.list_sessions(B)).items == []
    with pytest.raises(RunNotFoundError):
        await state_store.patch_run(B, "r1", input_tokens=1)
    assert await state_store.delete_run(B, "r1") is False
    # A's own records, re-addressed to B (model_copy skips validation): B has none.
    for forged in (
        run.model_copy(update={"tenant": B}),
        RunRecord(tenant=B, run_id="r1", version=run.version),
    ):
        with pytest.raises(StateConflictError) as conflict:
            await state_store.put_run(forged)
        assert (conflict.value.tenant, conflict.value.actual) == (B, 0)
    with pytest.raises(StateConflictError):
        await state_store.put_session(session.model_copy(update={"tenant": B}))
    # B's own r1 and s1 are B's; A's stay A's.
    mine = await state_store.put_run(RunRecord(tenant=B, run_id="r1", session_id="s1"))
    await state_store.put_session(SessionRecord(tenant=B, session_id="s1"))
    assert mine.input_tokens == 0
    assert mine.data == {}
    assert (await state_store.list_runs(B)).items == [mine]
    assert await a_view() == before


@pytest.mark.parametrize(
    "pair",
    [
        (("t:1", "x"), ("t", "1:x")),
        (("4:acme", "r"), ("acme", "r")),
        (("acme}", "r"), ("acme", "}r")),
        (("{acme}", "r"), ("acme", "r")),
        (("a", "b:5:c"), ("a:b", "5:c")),
        (("x", "run:1:y"), ("x:run", "1:y")),
    ],
)
async def test_ids_that_share_a_spelling_stay_apart(
    state_store: StateStore, pair: tuple[tuple[str, str], tuple[str, str]]
) -> None:
    """Two (tenant, run_id) pairs that would build the same key by naive concatenation are
    two runs; neither sees the other."""
    (t1, r1), (t2, r2) = pair
    first = await state_store.put_run(RunRecord(tenant=t1, run_id=r1, data={"who": 1}))
    second = await state_store.put_run(RunRecord(tenant=t2, run_id=r2, data={"who": 2}))
    assert await state_store.get_run(t1, r1) == first
    assert await state_store.get_run(t2, r2) == second
    assert (await state_store.list_runs(t1)).items == [first]
    assert (await state_store.list_runs(t2)).items == [second]


async def test_a_tenant_cannot_settle_another_tenants_item(work_queue: WorkQueue) -> None:
    """A lease re-addressed to another tenant's item (same item id) through model_copy holds
    nothing there: every settle and heartbeat is refused and both items stay as they were."""
    await work_queue.enqueue(WorkItem(tenant=A, item_id="job-1", payload={"a": 1}))
    await work_queue.enqueue(WorkItem(tenant=B, item_id="job-1", payload={"b": 1}))
    lease_a = await work_queue.claim("worker-a", lease_for=60)
    assert lease_a is not None
    assert lease_a.item.tenant == A  # "acme" < "evil": A is served first

    async def both() -> Any:
        return (await work_queue.get_item(A, "job-1"), await work_queue.get_item(B, "job-1"))

    def settles(lease: Any) -> list[Callable[[], Awaitable[Any]]]:
        return [
            lambda: work_queue.heartbeat(lease),
            lambda: work_queue.ack(lease),
            lambda: work_queue.fail(lease, "x", retryable=False),
            lambda: work_queue.release(lease),
        ]

    forged = lease_a.model_copy(update={"item": lease_a.item.model_copy(update={"tenant": B})})
    before = await both()
    for settle in settles(forged):
        with pytest.raises(LeaseLostError):
            await settle()
    assert await both() == before
    # B's item leased too: A's token still does not hold it.
    lease_b = await work_queue.claim("worker-b", lease_for=60)
    assert lease_b is not None
    assert lease_b.item.tenant == B
    assert lease_b.token != lease_a.token
    before = await both()
    forged = lease_a.model_copy(update={"item": lease_b.item})
    for settle in settles(forged):
        with pytest.raises(LeaseLostError):
            await settle()
    assert await both() == before
    # And each holder still settles its own.
    assert (await work_queue.ack(lease_a)).status is ItemStatus.DONE
    assert (await work_queue.ack(lease_b)).status is ItemStatus.DONE


async def test_dead_letters_stats_and_requeue_are_per_tenant(work_queue: WorkQueue) -> None:
    """A's dead item is in A's dead letters and counts only; B can neither see nor requeue
    it, not even with A's record re-addressed to B."""
    await work_queue.enqueue(WorkItem(tenant=A, item_id="poison"))
    lease = await work_queue.claim("w", lease_for=60)
    assert lease is not None
    dead = await work_queue.fail(lease, "boom", retryable=False)
    await work_queue.enqueue(WorkItem(tenant=B, item_id="other"))
    assert await work_queue.dead_letters(B) == []
    assert await work_queue.get_item(B, "poison") is None
    stats = await work_queue.stats()
    assert (stats.tenants[A].dead, stats.tenants[A].queued) == (1, 0)
    assert (stats.tenants[B].dead, stats.tenants[B].queued) == (0, 1)
    for forged in (dead.model_copy(update={"tenant": B}), WorkItem(tenant=B, item_id="poison")):
        with pytest.raises(ValueError, match=r"^item_id: "):
            await work_queue.requeue(forged)
    assert await work_queue.dead_letters(A) == [dead]
    assert await work_queue.get_item(A, "poison") == dead
    # B's own item of the same id is B's alone.
    mine = await work_queue.enqueue(WorkItem(tenant=B, item_id="poison"))
    assert mine.status is ItemStatus.QUEUED
    assert await work_queue.dead_letters(A) == [dead]


async def test_claims_hand_out_each_tenants_own_payload(work_queue: WorkQueue) -> None:
    """Items of the same id in several tenants are claimed each with its own tenant and
    payload; no lease carries another tenant's payload."""
    tenants = [A, B, "t3"]
    for tenant in tenants:
        await work_queue.enqueue(WorkItem(tenant=tenant, item_id="same", payload={"t": tenant}))
    leases = await work_queue.claim_batch("w", lease_for=60, limit=10)
    assert sorted((lease.item.tenant, lease.item.payload["t"]) for lease in leases) == sorted(
        (tenant, tenant) for tenant in tenants
    )
