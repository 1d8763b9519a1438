"""``StatepactCheckpointSaver`` beyond LangGraph's conformance suite, on every backing.

A graph run, interrupted and resumed; a worker cancelled (memory) or killed
(Redis, PostgreSQL: SIGKILL of a process) inside a node, and the graph resumed
from the stored checkpoint; retention (``sweep``) in bounded batches; pruning
that keeps the values the kept checkpoints read; ``put_writes`` sent at once
by many tasks; what the saver refuses; the PostgreSQL metadata filter served
by its GIN index.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.clock import ManualClock
from statepact.errors import SchemaVersionError, StatePersistenceError
from statepact.integrations.langgraph import StatepactCheckpointSaver
from statepact.storage.redis import LangGraphKeys, glob_escape
from tests.integration._langgraph_graph import build, config

ROOT = Path(__file__).resolve().parents[2]
TENANT = "acme"


@pytest.fixture(params=["memory", "redis", "postgres"])
def backing_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backing(backing_name: str, request: pytest.FixtureRequest) -> Any:
    """The test's ``open_backing`` of that backing (``tests/fixtures``), on ``clock``."""
    return request.getfixturevalue(f"{backing_name}_backing")


@pytest.fixture
async def saver(backing: Any) -> StatepactCheckpointSaver:
    return await StatepactCheckpointSaver.open(backing, tenant=TENANT, ttl=3600)


def _checkpoint(checkpoint_id: str, values: dict[str, Any], versions: dict[str, str]) -> Any:
    return {
        "v": 4,
        "id": checkpoint_id,
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": values,
        "channel_versions": versions,
        "versions_seen": {},
        "updated_channels": None,
    }


async def _put(
    saver: StatepactCheckpointSaver,
    thread_id: str,
    checkpoint_id: str,
    values: dict[str, Any],
    versions: dict[str, str],
    new: dict[str, str],
    parent: str | None = None,
    **metadata: Any,
) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if parent is not None:
        configurable["checkpoint_id"] = parent
    return await saver.aput(
        {"configurable": configurable},
        _checkpoint(checkpoint_id, values, versions),
        {"source": "loop", "step": 0, **metadata},
        new,
    )


async def _stored(backing_name: str, backing: Any, saver: StatepactCheckpointSaver) -> int:
    """How many records of the saver's tenant the backing still holds (rows, keys, entries)."""
    if backing_name == "postgres":
        async with backing.client.connect() as conn:
            total = 0
            for table in ("checkpoints", "blobs", "writes", "threads"):
                total += (
                    await conn.execute(
                        text(f"SELECT count(*) FROM statepact_lg_{table} WHERE tenant = :t"),
                        {"t": saver.tenant},
                    )
                ).scalar_one()
            return int(total)
    if backing_name == "redis":
        prefix = LangGraphKeys(backing.backend.settings.namespace).prefix(saver.tenant)
        return len([key async for key in backing.client.scan_iter(match=glob_escape(prefix) + "*")])
    space = saver._store._tenants.get(saver.tenant)  # type: ignore[attr-defined]
    if space is None:
        return 0
    return len(space.checkpoints) + len(space.blobs) + len(space.written)


async def _blobs(backing_name: str, backing: Any, saver: StatepactCheckpointSaver) -> int:
    """How many channel values (blobs) of the saver's tenant the backing holds."""
    if backing_name == "postgres":
        async with backing.client.connect() as conn:
            found = await conn.execute(
                text("SELECT count(*) FROM statepact_lg_blobs WHERE tenant = :t"),
                {"t": saver.tenant},
            )
            return int(found.scalar_one())
    if backing_name == "redis":
        prefix = LangGraphKeys(backing.backend.settings.namespace).prefix(saver.tenant)
        keys = [key async for key in backing.client.scan_iter(match=glob_escape(prefix) + "bl:*")]
        return sum([await backing.client.hlen(key) for key in keys])
    space = saver._store._tenants.get(saver.tenant)  # type: ignore[attr-defined]
    return 0 if space is None else len(space.blobs)


# -- a graph ---------------------------------------------------------------------


async def test_a_graph_runs_is_interrupted_and_resumes_from_a_new_saver(backing: Any) -> None:
    """A StateGraph runs to an interrupt(); a saver opened afresh resumes it to the end."""
    first = await StatepactCheckpointSaver.open(backing, tenant=TENANT)
    thread = config("t-interrupt")
    result = await build(first).ainvoke({"task": "ship", "ask": True}, thread, durability="sync")
    assert result["log"] == ["plan", "act"]
    assert result["__interrupt__"][0].value == {"question": "ship it?"}

    second = await StatepactCheckpointSaver.open(backing, tenant=TENANT)
    graph = build(second)
    state = await graph.aget_state(thread)
    assert state.next == ("review",)
    done = await graph.ainvoke(Command(resume="yes"), thread, durability="sync")
    assert done["log"] == ["plan", "act", "review"]
    assert done["answer"] == "yes"
    history = [snapshot async for snapshot in graph.aget_state_history(thread)]
    assert len(history) >= 4
    assert (await graph.aget_state(thread)).next == ()


async def test_a_graph_resumes_after_its_task_is_cancelled_inside_a_node(
    saver: StatepactCheckpointSaver, backing: Any
) -> None:
    """A run cancelled inside ``act`` resumes from the checkpoint after ``plan``: plan is
    not run again, act runs to its end, then review."""
    started = asyncio.Event()

    async def hold() -> None:
        started.set()
        await asyncio.Event().wait()

    thread = config("t-cancel")
    run = asyncio.create_task(
        build(saver, gate=hold).ainvoke({"task": "ship"}, thread, durability="sync")
    )
    await asyncio.wait_for(started.wait(), 30)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    fresh = await StatepactCheckpointSaver.open(backing, tenant=TENANT)
    graph = build(fresh)
    assert (await graph.aget_state(thread)).next == ("act",)
    done = await graph.ainvoke(None, thread, durability="sync")
    assert done["log"] == ["plan", "act", "review"]


@pytest.mark.parametrize("backing_name", ["redis", "postgres"])
async def test_a_graph_resumes_after_its_worker_process_is_killed(
    backing_name: str,
    backing: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """A worker process SIGKILLed inside ``act``: another process resumes the thread from the
    stored checkpoint, and ``plan`` ran once."""
    url = (
        request.getfixturevalue("statepact_redis_url")
        if backing_name == "redis"
        else request.getfixturevalue("pg_database_url")
    )
    started = tmp_path / "started"
    thread_id = f"t-kill-{uuid.uuid4().hex[:8]}"
    worker = subprocess.Popen(  # noqa: ASYNC220 - a process the test kills
        [
            sys.executable,
            "-m",
            "tests.integration._langgraph_graph",
            backing_name,
            url,
            thread_id,
            str(started),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert worker.poll() is None, worker.communicate()[0].decode()
            assert time.monotonic() < deadline, "the worker never reached act"
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate()
    assert worker.returncode == -signal.SIGKILL
    saver = await StatepactCheckpointSaver.open(backing, tenant=TENANT)
    graph = build(saver)
    assert (await graph.aget_state(config(thread_id))).next == ("act",)
    done = await graph.ainvoke(None, config(thread_id), durability="sync")
    assert done["log"] == ["plan", "act", "review"]


# -- retention -------------------------------------------------------------------


async def test_sweep_deletes_idle_threads_in_bounded_batches(
    saver: StatepactCheckpointSaver,
    clock: ManualClock,
    backing_name: str,
    backing: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Threads last written more than ``ttl`` ago go whole (checkpoints, blobs, writes),
    ``batch`` per round trip; a thread written since stays."""
    for n in range(5):
        stored = await _put(saver, f"old-{n}", f"c{n}", {"a": [n]}, {"a": "1"}, {"a": "1"})
        await saver.aput_writes(stored, [("a", n)], "task")
    clock.advance(3000)
    await _put(saver, "old-0", "c9", {"a": [9]}, {"a": "2"}, {"a": "2"}, parent="c0")
    await _put(saver, "fresh", "f1", {"a": [1]}, {"a": "1"}, {"a": "1"})
    clock.advance(1000)  # old-1..4: 4000 s idle; old-0 and fresh: 1000 s

    rounds: list[int] = []
    store = saver._store  # type: ignore[attr-defined]
    sweep = store.sweep

    async def counted(tenant: str, cutoff: Any, batch: int) -> int:
        deleted = int(await sweep(tenant, cutoff, batch))
        rounds.append(deleted)
        return deleted

    monkeypatch.setattr(store, "sweep", counted)
    assert await saver.sweep(batch=3) == 4
    assert rounds == [3, 1]
    for n in range(1, 5):
        assert await saver.aget_tuple(config(f"old-{n}")) is None
    kept = await saver.aget_tuple(config("old-0"))
    assert kept is not None and kept.checkpoint["channel_values"] == {"a": [9]}
    assert await saver.aget_tuple(config("fresh")) is not None

    clock.advance(3600)
    assert await saver.sweep(older_than=60) == 2
    assert await _stored(backing_name, backing, saver) == 0


async def test_sweep_needs_an_age(backing: Any) -> None:
    """Without ``ttl`` nor ``older_than`` the sweep refuses, naming the field."""
    saver = await StatepactCheckpointSaver.open(backing, tenant=TENANT)
    with pytest.raises(ValueError, match="older_than"):
        await saver.sweep()
    with pytest.raises(ValueError, match="limit"):
        await saver.sweep(older_than=1, batch=0)


async def test_prune_keeps_the_values_the_kept_checkpoint_reads(
    saver: StatepactCheckpointSaver, backing_name: str, backing: Any
) -> None:
    """keep_latest deletes old checkpoints and the blobs only they read; the newest one
    still reads its unchanged channel from the first checkpoint's blob."""
    await _put(saver, "t", "c1", {"a": "A", "b": 1}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
    await _put(saver, "t", "c2", {"a": "A", "b": 2}, {"a": "1", "b": "2"}, {"b": "2"}, "c1")
    await _put(saver, "t", "c3", {"a": "A", "b": 3}, {"a": "1", "b": "3"}, {"b": "3"}, "c2")
    await saver.aprune(["t"], strategy="keep_latest")
    kept = [t async for t in saver.alist(config("t"))]
    assert [t.checkpoint["id"] for t in kept] == ["c3"]
    assert kept[0].checkpoint["channel_values"] == {"a": "A", "b": 3}
    assert kept[0].parent_config is None
    assert await _blobs(backing_name, backing, saver) == 2  # a@1 and b@3
    # Left: the checkpoint, its two blobs, the thread's write time (or their keys).
    expected = {"memory": 4, "postgres": 4, "redis": 6}[backing_name]
    assert await _stored(backing_name, backing, saver) == expected


async def test_delete_for_runs_keeps_blobs_other_runs_read(
    saver: StatepactCheckpointSaver, backing_name: str, backing: Any
) -> None:
    """A run's checkpoints go; a blob the remaining checkpoint reads stays, one only the
    deleted checkpoints read goes."""
    await _put(saver, "t", "c1", {"a": "A"}, {"a": "1"}, {"a": "1"}, run_id="r1")
    await _put(
        saver, "t", "c2", {"a": "A", "b": 2}, {"a": "1", "b": "1"}, {"b": "1"}, "c1", run_id="r2"
    )
    await _put(saver, "t", "c3", {"a": "Z"}, {"a": "9"}, {"a": "9"}, "c2", run_id="r3")
    await saver.adelete_for_runs(["r1", "r3"])
    left = [t async for t in saver.alist(config("t"))]
    assert [t.checkpoint["id"] for t in left] == ["c2"]
    assert left[0].checkpoint["channel_values"] == {"a": "A", "b": 2}
    assert await _blobs(backing_name, backing, saver) == 2  # a@1 and b@1; a@9 went


# -- writes at once -----------------------------------------------------------------


async def test_put_writes_sent_at_once_store_each_write_once(
    saver: StatepactCheckpointSaver,
) -> None:
    """Twenty tasks sending the same task's writes at once leave one write per index (the
    first stored); twenty distinct tasks leave twenty."""
    stored = await _put(saver, "t", "c1", {}, {}, {})
    await asyncio.gather(
        *(saver.aput_writes(stored, [("x", n), ("y", n)], "same-task") for n in range(20))
    )
    await asyncio.gather(*(saver.aput_writes(stored, [("z", n)], f"task-{n}") for n in range(20)))
    found = await saver.aget_tuple(stored)
    assert found is not None and found.pending_writes is not None
    same = [w for w in found.pending_writes if w[0] == "same-task"]
    assert [w[1] for w in same] == ["x", "y"]
    assert same[0][2] == same[1][2]  # both from the one call that landed first
    assert sorted(w[2] for w in found.pending_writes if w[1] == "z") == list(range(20))


async def test_a_special_write_is_replaced_by_the_latest(saver: StatepactCheckpointSaver) -> None:
    """Errors and interrupts (negative indexes) keep the latest write, not the first."""
    stored = await _put(saver, "t", "c1", {}, {}, {})
    await saver.aput_writes(stored, [("__error__", "first")], "task")
    await saver.aput_writes(stored, [("__error__", "second")], "task")
    found = await saver.aget_tuple(stored)
    assert found is not None and found.pending_writes == [("task", "__error__", "second")]


# -- refusals ---------------------------------------------------------------------


async def test_a_value_over_max_value_bytes_is_refused_before_anything_is_sent(
    saver: StatepactCheckpointSaver, backing_name: str, backing: Any
) -> None:
    """An oversized channel value raises StatePersistenceError(too_large); nothing stored."""
    big = "x" * 300_000
    with pytest.raises(StatePersistenceError, match="max_value_bytes") as caught:
        await _put(saver, "t", "c1", {"a": big}, {"a": "1"}, {"a": "1"})
    assert caught.value.reason == "too_large"
    assert await _stored(backing_name, backing, saver) == 0


async def test_bad_input_is_refused_naming_the_field(saver: StatepactCheckpointSaver) -> None:
    """Missing thread ids, NUL in ids, non-JSON metadata and filters: ValueError/TypeError."""
    with pytest.raises(ValueError, match="thread_id"):
        await saver.aget_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="checkpoint_ns"):
        await saver.aget_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "a\x00"}})
    with pytest.raises(ValueError, match="metadata"):
        await _put(saver, "t", "c1", {}, {}, {}, when=object())
    with pytest.raises(TypeError, match="filter"):
        [t async for t in saver.alist(None, filter=["source"])]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strategy"):
        await saver.aprune(["t"], strategy="some")
    with pytest.raises(TypeError, match="thread_ids"):
        await saver.aprune("t")


async def test_the_synchronous_methods_name_the_async_ones(
    saver: StatepactCheckpointSaver,
) -> None:
    """A synchronous call raises NotImplementedError naming the method to await instead."""
    with pytest.raises(NotImplementedError, match="aget_tuple"):
        saver.get_tuple(config("t"))
    with pytest.raises(NotImplementedError, match="aput"):
        saver.put(config("t"), _checkpoint("c", {}, {}), {}, {})
    with pytest.raises(NotImplementedError, match="alist"):
        saver.list(None)


async def test_tenants_never_see_each_others_threads(saver: StatepactCheckpointSaver) -> None:
    """The same thread id in two tenants is two threads."""
    other = saver.for_tenant("globex")
    await _put(saver, "t", "c1", {"who": "acme"}, {"who": "1"}, {"who": "1"})
    await _put(other, "t", "c1", {"who": "globex"}, {"who": "1"}, {"who": "1"})
    mine, theirs = await saver.aget_tuple(config("t")), await other.aget_tuple(config("t"))
    assert mine is not None and mine.checkpoint["channel_values"] == {"who": "acme"}
    assert theirs is not None and theirs.checkpoint["channel_values"] == {"who": "globex"}
    await other.adelete_thread("t")
    assert await saver.aget_tuple(config("t")) is not None


async def test_list_pages_through_more_than_a_page(saver: StatepactCheckpointSaver) -> None:
    """alist with no limit walks every page, newest first, across threads and namespaces."""
    for n in range(230):
        await _put(saver, f"t{n % 7}", f"c{n:04d}", {}, {}, {}, step=n)
    listed = [t.checkpoint["id"] async for t in saver.alist(None)]
    assert listed == [f"c{n:04d}" for n in reversed(range(230))]
    filtered = [t.metadata["step"] async for t in saver.alist(None, filter={"step": 7})]
    assert filtered == [7]


# -- backing specifics ----------------------------------------------------------------


async def test_open_refuses_postgres_without_the_tables(
    empty_database_url: str, clock: ManualClock
) -> None:
    """A database at head whose saver tables are gone (dropped by hand, or never created by
    an application's own migrations): open() refuses, naming ``alembic upgrade head``; it
    creates nothing."""
    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import migrate, open_backing
    from tests.fixtures.postgres import drop_tables_like

    await migrate.upgrade(empty_database_url, "head")
    await drop_tables_like(empty_database_url, r"statepact\_lg\_%")
    async with await open_backing(PostgresStoreSettings(dsn=empty_database_url), clock=clock) as pg:
        with pytest.raises(SchemaVersionError, match="alembic upgrade head"):
            await StatepactCheckpointSaver.open(pg)
        async with pg.client.connect() as conn:
            found = await conn.execute(text("SELECT to_regclass('statepact_lg_checkpoints')"))
            assert found.scalar() is None


async def test_open_refuses_a_redis_client_that_decodes_responses(
    statepact_redis_url: str, clock: ManualClock
) -> None:
    """Checkpoints are bytes: a client with decode_responses=True is refused at open()."""
    from redis.asyncio import Redis

    from statepact.settings import RedisStoreSettings
    from statepact.storage.redis import open_backing

    client = Redis.from_url(statepact_redis_url, decode_responses=True)
    settings = RedisStoreSettings(durable=False, tx_prefix=f"lg-{uuid.uuid4().hex[:8]}")
    try:
        async with await open_backing(settings, clock=clock, client=client) as redis_backing:
            with pytest.raises(ValueError, match="decode_responses"):
                await StatepactCheckpointSaver.open(redis_backing)
    finally:
        await client.aclose()


async def test_the_metadata_filter_is_served_by_the_gin_index(
    postgres_backing: Any, pg_engine: AsyncEngine
) -> None:
    """On a tenant of 5,000 checkpoints, alist(None, filter=...) finds the few matches through
    ix_statepact_lg_checkpoints_metadata (EXPLAIN of the statement the store sends)."""
    from statepact.integrations.langgraph import _postgres
    from statepact.integrations.langgraph._store import ListQuery

    saver = await StatepactCheckpointSaver.open(postgres_backing, tenant=TENANT)
    async with pg_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO statepact_lg_checkpoints (tenant, thread_id, checkpoint_ns, "
                "checkpoint_id, type, checkpoint, metadata, channels, versions, created_at) "
                "SELECT :t, 't' || (n % 500), '', lpad(n::text, 8, '0'), 'msgpack', '\\x80', "
                "jsonb_build_object('source', 'loop', 'step', n, 'user', 'u' || (n % 1000)), "
                "'{}', '{}', now() FROM generate_series(1, 5000) AS n"
            ),
            {"t": TENANT},
        )
        await conn.execute(text("ANALYZE statepact_lg_checkpoints"))
    filter_ = {"user": "u7"}
    steps = [t.metadata["step"] async for t in saver.alist(None, filter=filter_)]
    assert steps == [4007, 3007, 2007, 1007, 7]
    statement, params = _postgres._read(
        ListQuery(None, None, None, None, None, filter_, b'{"user":"u7"}', 100)
    )
    async with pg_engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        plan = await raw.fetch(
            "EXPLAIN " + statement.sql, *statement.arguments({**params, "p_tenant": TENANT})
        )
    shown = "\n".join(row[0] for row in plan)
    assert "ix_statepact_lg_checkpoints_metadata" in shown, shown


def test_import_statepact_imports_no_langgraph() -> None:
    """``import statepact`` (and its storage packages) loads nothing of LangGraph."""
    probe = (
        "import sys, statepact, statepact.storage.memory, statepact.storage.postgres\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langchain_core', 'ormsgpack')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


async def test_the_saver_runs_on_a_redis_cluster(
    local_cluster: Any, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a three-primary cluster, through a RedisCluster client: the conformance suite
    passes, and two tenants' keys sit in their own slots."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    from statepact.settings import RedisStoreSettings
    from statepact.storage.redis import open_backing

    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in local_cluster.startup_nodes]
    )
    settings = RedisStoreSettings(durable=False, tx_prefix=f"lg-{uuid.uuid4().hex[:8]}")
    try:
        async with await open_backing(settings, clock=clock, client=client) as on_cluster:

            @checkpointer_test(name="StatepactCheckpointSaver on a Redis cluster")
            async def factory() -> Any:
                yield await StatepactCheckpointSaver.open(on_cluster, tenant="acme")

            report = await validate(factory)
            with capsys.disabled():
                print(f"\nlanggraph-checkpoint-conformance on a cluster: {report.to_dict()}")
            assert report.conformance_level() == "FULL", report.to_dict()
            globex = await StatepactCheckpointSaver.open(on_cluster, tenant="globex")
            await _put(globex, "t", "c1", {"a": 1}, {"a": "1"}, {"a": "1"})
            found = await globex.aget_tuple(config("t"))
            assert found is not None and found.checkpoint["channel_values"] == {"a": 1}
    finally:
        await client.aclose()
