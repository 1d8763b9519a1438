"""Fixtures of the fault lane: servers the tests own, Redis clients tuned to notice a stall,
and the figures every fault test reports.

Every server here is started by these fixtures on a free loopback port (never
the machine's own Redis or PostgreSQL, never an environment URL: a test that
kills, restarts or cuts off a server must own it). A missing binary skips the
test, or fails it under ``STATEPACT_REQUIRE_SERVERS=1``.

Figures: a test calls ``fault_figures.record(...)`` with what it injected and
what it counted; at the end of the session they are written to
``<pytest basetemp>/fault-figures.json`` and printed in the terminal summary.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.testing.cluster import LocalRedisCluster, cluster_unavailable_reason
from statepact.testing.servers import (
    PostgresServer,
    RedisServer,
    ServerStartError,
    local_unavailable_reason,
    missing_server,
)

if TYPE_CHECKING:
    from tests.faults._proxied import Proxied, ProxiedPostgres, ProxiedRedis

# The failover budget of the fault tests: small, so a test that outlasts it is short.
FAST_FAILOVER = RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.2)
# How long a Redis client waits for a reply before it calls the connection dead.
SOCKET_TIMEOUT = 0.5


@dataclass
class FaultFigure:
    """One fault scenario's outcome, as docs/faults.md tabulates it."""

    scenario: str
    backing: str
    faults: int
    acknowledged: int
    found: int
    lost: int
    duplicates: int
    ambiguous: int = 0
    seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


class FaultFigures:
    """Collects :class:`FaultFigure` rows for one session."""

    def __init__(self) -> None:
        self.rows: list[FaultFigure] = []

    def record(self, figure: FaultFigure) -> FaultFigure:
        self.rows.append(figure)
        return figure

    def outcome(
        self,
        scenario: str,
        backing: str,
        *,
        acknowledged: int,
        found: int,
        ambiguous: int = 0,
        faults: int = 1,
        seconds: float = 0.0,
        **notes: Any,
    ) -> FaultFigure:
        """Record a scenario from its counts: lost is what was acknowledged and not found,
        duplicates what was found beyond the acknowledged and the ambiguous."""
        return self.record(
            FaultFigure(
                scenario=scenario,
                backing=backing,
                faults=faults,
                acknowledged=acknowledged,
                found=found,
                lost=max(0, acknowledged - found),
                duplicates=max(0, found - acknowledged - ambiguous),
                ambiguous=ambiguous,
                seconds=seconds,
                notes=notes,
            )
        )

    def as_json(self) -> str:
        return json.dumps([asdict(row) for row in self.rows], indent=2, default=str)

    def lines(self) -> list[str]:
        head = (
            f"{'scenario':<44} {'backing':<9} {'faults':>6} {'acked':>6} {'found':>6} "
            f"{'lost':>4} {'dup':>3} {'ambig':>5} {'secs':>6}"
        )
        out = [head]
        for r in self.rows:
            out.append(
                f"{r.scenario[:44]:<44} {r.backing:<9} {r.faults:>6} {r.acknowledged:>6} "
                f"{r.found:>6} {r.lost:>4} {r.duplicates:>3} {r.ambiguous:>5} {r.seconds:>6.1f}"
            )
            if r.notes:
                out.append("    " + json.dumps(r.notes, default=str, sort_keys=True))
        return out


_FIGURES = pytest.StashKey[FaultFigures]()
_FIGURES_PATH = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def fault_figures(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> FaultFigures:
    """The session's figures; written to JSON and printed when the session ends."""
    figures = request.config.stash.setdefault(_FIGURES, FaultFigures())
    request.config.stash[_FIGURES_PATH] = tmp_path_factory.getbasetemp() / "fault-figures.json"
    return figures


def pytest_sessionfinish(session: pytest.Session) -> None:
    figures = session.config.stash.get(_FIGURES, None)
    path = session.config.stash.get(_FIGURES_PATH, None)
    if figures and figures.rows and path is not None:
        path.write_text(figures.as_json() + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = terminalreporter.config.stash.get(_FIGURES, None)
    if not figures or not figures.rows:
        return
    terminalreporter.section("statepact fault figures")
    for line in figures.lines():
        terminalreporter.write_line(line)
    path = terminalreporter.config.stash.get(_FIGURES_PATH, None)
    if path is not None:
        terminalreporter.write_line(f"written to {path}")


# -- servers the lane owns ----------------------------------------------------------------


def need_local(kind: str) -> None:
    """Skip (or fail under STATEPACT_REQUIRE_SERVERS=1) when local ``kind`` binaries are missing."""
    why = local_unavailable_reason("redis" if kind == "redis" else "postgres")
    if why is not None:
        missing_server(f"the fault lane starts its own {kind} server: {why}", os.environ)


S = TypeVar("S", RedisServer, PostgresServer)


def started(server: S) -> Iterator[S]:
    """A fixture's body for ``server``: started (closed at once if it cannot start), yielded,
    closed."""
    try:
        server.start()
    except ServerStartError:
        server.close()
        raise
    yield server
    server.close()


@pytest.fixture(scope="session")
def fault_redis_server() -> Iterator[RedisServer]:
    """A Redis of our own for the proxy tests (no persistence: nothing here restarts it)."""
    need_local("redis")
    yield from started(RedisServer(["--appendonly", "no", "--save", ""]))


@pytest.fixture(scope="session")
def fault_postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL of our own for the proxy tests (fast settings: nothing here kills it)."""
    need_local("postgres")
    yield from started(PostgresServer())


def fault_redis_client(port: int, *, socket_timeout: float = SOCKET_TIMEOUT) -> Redis:
    """A client that notices a dead or stalled connection and leaves retrying to statepact.

    redis-py 8's defaults are a 5 s socket timeout and its own 10 retries of
    every connection error or timeout, which would turn a stall into a minute
    of silence before statepact's failover even starts counting.
    """
    return Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
    )


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A real Redis Cluster (three masters, three replicas, AOF on), started once per session.

    Startup is bounded (60 s); without redis-server and redis-cli the tests
    that use it skip, or fail under STATEPACT_REQUIRE_SERVERS=1.
    """
    why = cluster_unavailable_reason()
    if why is not None:
        missing_server(why, os.environ)
    cluster = LocalRedisCluster(masters=3, replicas=1, startup_timeout=60.0)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


# -- PostgreSQL databases on the lane's own server ----------------------------------------------


@pytest.fixture(scope="session")
def fault_pg_template(fault_postgres_server: PostgresServer) -> str:
    """A database on the lane's server with the packaged migrations applied, to clone per test.

    The server is the lane's own and is closed with the session, so the
    template is never dropped separately.
    """
    from statepact.storage.postgres import migrate
    from tests.fixtures.postgres import create_database, run_in_thread, unique_database_name

    name = unique_database_name("ftpl")

    async def build() -> None:
        url = await create_database(fault_postgres_server.url, name)
        await migrate.upgrade(url)

    run_in_thread(build)
    return name


@pytest.fixture
async def fault_pg_url(
    fault_postgres_server: PostgresServer, fault_pg_template: str
) -> AsyncIterator[str]:
    """A fresh migrated database (cloned from the template) on the lane's server; dropped after."""
    from tests.fixtures.postgres import create_database, drop_database, unique_database_name

    name = unique_database_name("f")
    url = await create_database(fault_postgres_server.url, name, template=fault_pg_template)
    try:
        yield url
    finally:
        await drop_database(fault_postgres_server.url, name)


# -- a backing behind a fault proxy (tests/faults/_proxied.py) ---------------------------------


def lane_server(request: pytest.FixtureRequest, kind: str) -> tuple[int, str]:
    """The port of the lane's own ``kind`` server and a URL to use on it: for PostgreSQL a
    fresh migrated database of this test's own (``fault_pg_url``)."""
    if kind == "redis":
        redis: RedisServer = request.getfixturevalue("fault_redis_server")
        return redis.port, redis.url
    postgres: PostgresServer = request.getfixturevalue("fault_postgres_server")
    return postgres.port, request.getfixturevalue("fault_pg_url")


@pytest.fixture
async def proxied_redis(
    fault_redis_server: RedisServer, clock: ManualClock
) -> AsyncIterator[ProxiedRedis]:
    """The lane's Redis behind a fault proxy, under a namespace of this test's own."""
    from tests.faults._proxied import ProxiedRedis, behind_proxy

    port = fault_redis_server.port
    async with behind_proxy(port, lambda proxy: ProxiedRedis(proxy, clock, port)) as backing:
        yield backing


@pytest.fixture
async def proxied_postgres(
    fault_postgres_server: PostgresServer, fault_pg_url: str, clock: ManualClock
) -> AsyncIterator[ProxiedPostgres]:
    """The lane's PostgreSQL behind a fault proxy, on a migrated database of this test's own."""
    from tests.faults._proxied import ProxiedPostgres, behind_proxy

    port = fault_postgres_server.port
    async with behind_proxy(
        port, lambda proxy: ProxiedPostgres(proxy, clock, fault_pg_url)
    ) as backing:
        yield backing


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def proxied(request: pytest.FixtureRequest) -> Proxied:
    """Each server backing in turn behind a fault proxy: ``proxied_redis``, ``proxied_postgres``."""
    backing: Proxied = request.getfixturevalue(f"proxied_{request.param}")
    return backing
