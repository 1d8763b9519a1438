"""The test servers themselves, for real: they answer, restart on the same port with their data,
die when killed, and the session fixtures honour the environment URLs.

Each test starts its own servers (or uses the session ones); none touches a
server it did not start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
import redis

from statepact.testing.plugin import PostgresServerFactory, RedisServerFactory
from statepact.testing.servers import ENV_POSTGRES_URL, ENV_REDIS_URL, PostgresServer, RedisServer

pytestmark = pytest.mark.integration


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5, decode_responses=True)


async def _pg(server: PostgresServer) -> asyncpg.Connection:
    return await asyncpg.connect(server.dsn, timeout=10)


def _owner_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


# -- Redis -------------------------------------------------------------------------------------


def test_redis_server_answers_on_loopback_with_its_version() -> None:
    """A started RedisServer answers PING at .url and reports the version INFO gives."""
    with RedisServer() as server, _client(server) as client:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert client.ping() is True
        assert server.version == client.info("server")["redis_version"]
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert server.dir.is_dir()
    assert not server.dir.exists()
    assert not server.running


def test_redis_factory_applies_custom_settings(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """Extra arguments reach the server: eviction policy, no AOF and no snapshots."""
    lru = statepact_redis_server_factory(["--maxmemory-policy", "allkeys-lru"])
    bare = statepact_redis_server_factory(["--appendonly", "no", "--save", ""])
    with _client(lru) as client:
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"
    with _client(bare) as client:
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert client.config_get("save")["save"] == ""
    assert bare.config_get("save") == ""
    assert lru.port != bare.port


def test_redis_graceful_restart_keeps_aof_data_and_port(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """stop() then start(): same port, and what the append-only file holds is back."""
    server = statepact_redis_server_factory(["--appendonly", "yes", "--save", ""])
    port, old_pid = server.port, server.pid
    with _client(server) as client:
        client.set("kept", "yes")
    server.restart()
    assert server.port == port
    assert server.pid != old_pid
    with _client(server) as client:
        assert client.get("kept") == "yes"


def test_redis_kill_loses_nothing_fsynced_and_restarts_on_same_port(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """kill() is a crash: the server stops answering; start() brings back every fsynced write."""
    server = statepact_redis_server_factory(
        ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    )
    port = server.port
    with _client(server) as client:
        client.rpush("items", *[str(i) for i in range(50)])
    server.kill()
    assert not server.running
    with _client(server) as client, pytest.raises(redis.ConnectionError):
        client.ping()
    server.start()
    assert server.port == port
    with _client(server) as client:
        assert client.lrange("items", 0, -1) == [str(i) for i in range(50)]


def test_redis_without_persistence_forgets_on_kill(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """Without AOF or snapshots, a killed server comes back empty (the restart is real)."""
    server = statepact_redis_server_factory(["--appendonly", "no", "--save", ""])
    with _client(server) as client:
        client.set("lost", "1")
    server.kill()
    server.start()
    with _client(server) as client:
        assert client.get("lost") is None


# -- PostgreSQL ---------------------------------------------------------------------------------


async def test_postgres_server_answers_with_its_version(
    statepact_postgres_server_factory: PostgresServerFactory,
) -> None:
    """A PostgresServer answers at .url, reports SHOW server_version, and is fast by default."""
    server = statepact_postgres_server_factory()
    assert server.url == f"postgresql+asyncpg://postgres@127.0.0.1:{server.port}/postgres"
    conn = await _pg(server)
    try:
        assert await conn.fetchval("SHOW server_version") == server.version
        assert await conn.fetchval("SHOW fsync") == "off"
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
        assert await conn.fetchval("SELECT current_user") == "postgres"
    finally:
        await conn.close()
    assert server.pid is not None
    if os.geteuid() == 0:
        # PostgreSQL refuses root: as root we run it as the postgres user.
        import pwd

        assert _owner_uid(server.pid) == pwd.getpwnam("postgres").pw_uid


async def test_postgres_kill_keeps_committed_rows_and_port(
    statepact_postgres_server_factory: PostgresServerFactory,
) -> None:
    """A durable server killed with SIGKILL recovers every committed row on the same port."""
    server = statepact_postgres_server_factory(durable=True)
    port = server.port
    conn = await _pg(server)
    try:
        assert await conn.fetchval("SHOW fsync") == "on"
        await conn.execute("CREATE TABLE t (n int)")
        await conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    finally:
        await conn.close()
    server.kill()
    assert not server.running
    with pytest.raises(OSError):
        await asyncpg.connect(server.dsn, timeout=2)
    server.start()
    assert server.port == port
    conn = await _pg(server)
    try:
        assert await conn.fetchval("SELECT count(*) FROM t") == 100
    finally:
        await conn.close()


async def test_postgres_graceful_restart_with_a_client_connected(
    statepact_postgres_server_factory: PostgresServerFactory,
) -> None:
    """restart() does not wait for connected clients, and keeps port and data."""
    server = statepact_postgres_server_factory(settings={"max_connections": 20})
    conn = await _pg(server)
    await conn.execute("CREATE TABLE kept (n int)")
    port = server.port
    began = time.monotonic()
    server.restart()
    # A "smart" shutdown would wait for our client until the kill fallback (30 s).
    assert time.monotonic() - began < 10
    assert server.port == port
    assert conn.is_closed() or not await _still_usable(conn)
    await conn.close()
    fresh = await _pg(server)
    try:
        assert await fresh.fetchval("SELECT count(*) FROM kept") == 0
        assert await fresh.fetchval("SHOW max_connections") == "20"
    finally:
        await fresh.close()


async def _still_usable(conn: asyncpg.Connection) -> bool:
    try:
        await conn.fetchval("SELECT 1")
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
        return False
    return True


def test_closed_postgres_leaves_no_directory(
    statepact_postgres_server_factory: PostgresServerFactory,
) -> None:
    """close() after a kill removes the directory; the object refuses to start again."""
    server = statepact_postgres_server_factory(durable=True)
    server.kill()
    server.close()
    assert not server.dir.exists()
    with pytest.raises(RuntimeError, match="was closed"):
        server.start()


# -- the session fixtures and the environment ------------------------------------------------


def test_session_redis_is_durable(statepact_redis_url: str) -> None:
    """The session Redis keeps an append-only file, so preflight accepts it."""
    with redis.Redis.from_url(statepact_redis_url, decode_responses=True) as client:
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.ping() is True


async def test_session_postgres_may_create_databases(statepact_postgres_url: str) -> None:
    """The session PostgreSQL URL is SQLAlchemy asyncpg, and its role may CREATE DATABASE."""
    assert statepact_postgres_url.startswith("postgresql+asyncpg://")
    dsn = "postgresql://" + statepact_postgres_url.partition("://")[2]
    name = f"statepact_servers_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.execute(f'DROP DATABASE "{name}"')
    finally:
        await conn.close()


INNER_TESTS = """
import os

def test_urls(statepact_redis_url, statepact_postgres_url):
    assert statepact_redis_url == os.environ["WANT_REDIS"]
    assert statepact_postgres_url == os.environ["WANT_POSTGRES"]
"""


def test_environment_urls_win(tmp_path: Path, statepact_postgres_url: str) -> None:
    """With both URL variables set, the fixtures hand them out (PostgreSQL as asyncpg)."""
    plain_pg = "postgresql://" + statepact_postgres_url.partition("://")[2]
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    with RedisServer(["--appendonly", "yes"]) as redis_server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEPACT_", "PYTEST_"))}
        env |= {
            ENV_REDIS_URL: redis_server.url,
            ENV_POSTGRES_URL: plain_pg,
            "WANT_REDIS": redis_server.url,
            "WANT_POSTGRES": statepact_postgres_url,
            # Would be found otherwise; the environment must win before anyone looks.
            "STATEPACT_REQUIRE_SERVERS": "1",
        }
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_inner.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert f"from env ($STATEPACT_TEST_REDIS_URL, appendonly yes) at {redis_server.url}" in (
        run.stdout
    )
    assert "from env ($STATEPACT_TEST_POSTGRES_URL)" in run.stdout
