"""The statepact pytest plugin: real test servers, and per-test fixtures on them.

Registered through the ``pytest11`` entry point, so any project that installs
statepact can use these fixtures, every one named ``statepact_*`` so none
clashes with a project's own:

- ``statepact_redis_url`` (session): a durable Redis (``appendonly yes``), as
  ``redis://host:port/0``.
- ``statepact_postgres_url`` (session): an SQLAlchemy asyncpg URL of the
  database ``postgres``, for a role allowed to ``CREATE DATABASE``.
- ``statepact_redis_server_factory`` / ``statepact_postgres_server_factory``
  (per test): start extra local servers with their own settings, to stop, kill
  and restart; closed when the test ends.
- The per-test fixtures of :mod:`statepact.testing.fixtures`: ``statepact_clock``,
  a migrated PostgreSQL database cloned from a session template
  (``statepact_postgres_database``), a Redis namespace
  (``statepact_redis_namespace``), and the stores on them, which the classes of
  :mod:`statepact.testing.conformance` run the suites on.

The hook ``pytest_statepact_postgres_template(url, config)``
(:mod:`statepact.testing.hookspecs`) lets a project apply its own migrations to
the template before any test database is cloned from it.

Servers come from the environment, testcontainers or local binaries (see
:mod:`statepact.testing.servers`); the end of the run prints which were used.
When none can be had, a test that needs one is skipped (failed under
``STATEPACT_REQUIRE_SERVERS=1``), and the skip is reported at the test, with its
node id, not at the line of this package that noticed.

The ``integration`` marker makes ``pytest -m "not integration"`` a lane that
starts no server and reaches no network. The plugin registers the marker (if
the project has not), and at collection adds it to every test whose fixture
closure holds a server fixture: the four above (so every fixture built on
them), plus any listed in the ``statepact_server_fixtures`` ini option. A test
that reaches a server through ``request.getfixturevalue`` cannot be seen at
collection: it must carry the marker itself (or its parametrised fixture's
param must). In a run that selects by the marker (``-m`` naming
``integration``), an unmarked test that asks fails before anything is
started; other runs are left alone, so a project that does not use the lane
never has to mark anything.

This module must never import redis or SQLAlchemy at import time, never start a
server unless a test asks for one, and never use async fixtures at session
scope (they would tie the server to one event loop).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from statepact.testing import fixtures, hookspecs
from statepact.testing.local_servers import (
    PostgresServer,
    RedisServer,
    ServerKind,
    ServerStartError,
    local_unavailable_reason,
)
from statepact.testing.servers import (
    ProvidedServer,
    ServerUnavailableError,
    missing_server,
    provide_server,
)

__all__ = [
    "SERVER_FIXTURES",
    "PostgresServerFactory",
    "RedisServerFactory",
    "mark_server_tests",
    "statepact_postgres_server_factory",
    "statepact_postgres_url",
    "statepact_redis_server_factory",
    "statepact_redis_url",
]


#: The plugin's fixtures that start or reach a server: a test using any of them, directly or
#: through other fixtures, is marked ``integration`` at collection.
SERVER_FIXTURES = frozenset(
    {
        "statepact_postgres_server_factory",
        "statepact_postgres_url",
        "statepact_redis_server_factory",
        "statepact_redis_url",
    }
)
INTEGRATION = "integration"
#: The name :mod:`statepact.testing.fixtures` is registered under, beside this plugin.
_FIXTURES_PLUGIN = "statepact.fixtures"
_INI_SERVER_FIXTURES = "statepact_server_fixtures"


class RedisServerFactory(Protocol):
    """Type of the ``statepact_redis_server_factory`` fixture."""

    def __call__(self, args: Sequence[str] = (), *, port: int | None = None) -> RedisServer:
        """A started local ``RedisServer`` with extra command-line ``args``."""
        ...


class PostgresServerFactory(Protocol):
    """Type of the ``statepact_postgres_server_factory`` fixture."""

    def __call__(
        self, *, durable: bool = False, settings: Mapping[str, object] | None = None
    ) -> PostgresServer:
        """A started local ``PostgresServer``; pass ``durable=True`` if the test kills it."""
        ...


@dataclass
class _ServerLog:
    """What this run used, for the summary at the end."""

    provided: list[ProvidedServer] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    extra: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [server.describe() for server in self.provided]
        out += [f"{kind}: none ({reason})" for kind, reason in self.unavailable.items()]
        for kind, versions in self.extra.items():
            out.append(
                f"{kind}: {len(versions)} extra local server(s) started by tests "
                f"({', '.join(sorted(set(versions)))})"
            )
        return out


#: A local server a factory starts.
L = TypeVar("L", RedisServer, PostgresServer)

_LOG_KEY = pytest.StashKey[_ServerLog]()
# The test being run (setup, call and teardown), for the guard in _refuse_unmarked.
_RUNNING_KEY = pytest.StashKey["pytest.Item | None"]()


def _log(config: pytest.Config) -> _ServerLog:
    return config.stash.setdefault(_LOG_KEY, _ServerLog())


def _start_for_test(server: L, started: list[L], log: _ServerLog) -> L:
    """Start ``server`` for a factory: in ``started`` first, so the test's teardown closes
    it even when the start fails; its version in the run's log."""
    started.append(server)
    server.start()
    log.extra.setdefault(server.kind, []).append(server.version or "unknown")
    return server


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Add ``pytest_statepact_postgres_template`` (see :mod:`statepact.testing.hookspecs`)."""
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        _INI_SERVER_FIXTURES,
        type="linelist",
        default=[],
        help="More fixtures that start or reach a server: tests using them are marked "
        "integration, like those using statepact_redis_url or statepact_postgres_url.",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Add the per-test fixtures; register ``integration`` unless the project already has,
    so --strict-markers holds."""
    if not config.pluginmanager.is_registered(fixtures):
        config.pluginmanager.register(fixtures, _FIXTURES_PLUGIN)
    registered = {
        line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")
    }
    if INTEGRATION not in registered:
        config.addinivalue_line(
            "markers",
            f"{INTEGRATION}: needs a real Redis or PostgreSQL server (statepact adds it to "
            "tests whose fixtures start one)",
        )


def mark_server_tests(items: Sequence[pytest.Item], fixtures: Collection[str]) -> int:
    """Add ``integration`` to every item whose fixture closure holds one of ``fixtures``.

    Returns how many items were newly marked. Items already marked are left as they are.
    """
    wanted = frozenset(fixtures)
    marked = 0
    for item in items:
        names = getattr(item, "fixturenames", ())
        if wanted.intersection(names) and item.get_closest_marker(INTEGRATION) is None:
            item.add_marker(INTEGRATION)
            marked += 1
    return marked


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark server tests before ``-m`` selects (pytest's own hook runs after this one)."""
    extra: list[str] = config.getini(_INI_SERVER_FIXTURES)
    mark_server_tests(items, SERVER_FIXTURES.union(extra))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    item.config.stash[_RUNNING_KEY] = item
    try:
        return (yield)
    finally:
        item.config.stash[_RUNNING_KEY] = None


# Where this package lives: a skip raised from here is reported at the test instead.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Report a skip raised inside statepact (no server) at the test that needed the server.

    A skip raised by one of statepact's fixtures is reported at the test's own
    file and line, its message prefixed with the test's node id: the same
    session fixture's skip is raised again, unchanged, for every later test
    that asks, and would otherwise read the same for all of them (or point at
    a line of statepact's, in site-packages).
    """
    report = yield
    longrepr = report.longrepr
    excinfo = call.excinfo
    if report.skipped and excinfo is not None and isinstance(longrepr, tuple):
        # pytest's own "Skipped: " prefix, which its summary strips only at the start.
        message = str(longrepr[2]).removeprefix("Skipped: ")
        if _raised_inside_package(excinfo) and not message.startswith(item.nodeid):
            path, line = item.reportinfo()[:2]
            report.longrepr = (os.fspath(path), (line or 0) + 1, f"{item.nodeid}: {message}")
    return report


def _raised_inside_package(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    for entry in excinfo.traceback:
        try:
            if Path(entry.path).resolve().is_relative_to(_PACKAGE_DIR):
                return True
        except (OSError, ValueError):
            continue
    return False


def _refuse_unmarked(config: pytest.Config, what: str) -> None:
    """Fail the running test if it reaches a server without the ``integration`` marker.

    Only a test that asks through ``request.getfixturevalue`` can get here unmarked:
    the rest were marked at collection. Only in a run whose ``-m`` names the
    marker: failing (not skipping) keeps the ``-m "not integration"`` lane
    honest (it must never start a server), while a run that does not select by
    the marker has nothing to protect and leaves the test alone.
    """
    if INTEGRATION not in (config.getoption("markexpr", "") or ""):
        return  # not a run that selects by the marker: nothing to keep honest
    item = config.stash.get(_RUNNING_KEY, None)
    if item is not None and item.get_closest_marker(INTEGRATION) is None:
        pytest.fail(
            f"{item.nodeid} asks for {what} but is not marked {INTEGRATION!r}; a test that "
            "reaches a server through request.getfixturevalue must carry "
            f"@pytest.mark.{INTEGRATION} itself (or its fixture param must), so that "
            f'-m "not {INTEGRATION}" stays a lane that starts no server',
            pytrace=False,
        )


def _session_server(request: pytest.FixtureRequest, kind: ServerKind) -> Iterator[str]:
    _refuse_unmarked(request.config, f"a {kind} server")
    log = _log(request.config)
    try:
        server = provide_server(kind)
    except ServerUnavailableError as exc:
        log.unavailable[kind] = str(exc)
        missing_server(str(exc))
    except ServerStartError as exc:
        log.unavailable[kind] = "failed to start: " + str(exc).splitlines()[0]
        raise
    log.provided.append(server)
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture(scope="session")
def statepact_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a durable Redis (``appendonly yes``) shared by the session; tests may FLUSHDB it."""
    yield from _session_server(request, "redis")


@pytest.fixture(scope="session")
def statepact_postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """SQLAlchemy asyncpg URL of database ``postgres`` on a server where we may CREATE DATABASE."""
    yield from _session_server(request, "postgres")


def _need_local(request: pytest.FixtureRequest, kind: ServerKind) -> None:
    why = local_unavailable_reason(kind)
    if why is not None:
        reason = f"cannot start a local {kind} server with its own settings: {why}"
        _log(request.config).unavailable.setdefault(f"{kind} (factory)", reason)
        missing_server(reason, os.environ)


@pytest.fixture
def statepact_redis_server_factory(request: pytest.FixtureRequest) -> Iterator[RedisServerFactory]:
    """Start local ``RedisServer``s with their own arguments; each is closed after the test.

    Example: ``statepact_redis_server_factory(["--maxmemory-policy", "allkeys-lru"])``.
    Always local binaries: a server from the environment cannot take new settings.
    """
    started: list[RedisServer] = []
    log = _log(request.config)

    def factory(args: Sequence[str] = (), *, port: int | None = None) -> RedisServer:
        _refuse_unmarked(request.config, "a local redis server")
        _need_local(request, "redis")
        return _start_for_test(RedisServer(args, port=port), started, log)

    yield factory
    for server in reversed(started):
        server.close()


@pytest.fixture
def statepact_postgres_server_factory(
    request: pytest.FixtureRequest,
) -> Iterator[PostgresServerFactory]:
    """Start local ``PostgresServer``s; each is closed after the test.

    Pass ``durable=True`` when the test kills the server: the fast default
    settings lose committed data on a crash.
    """
    started: list[PostgresServer] = []
    log = _log(request.config)

    def factory(
        *, durable: bool = False, settings: Mapping[str, object] | None = None
    ) -> PostgresServer:
        _refuse_unmarked(request.config, "a local postgres server")
        _need_local(request, "postgres")
        return _start_for_test(PostgresServer(durable=durable, settings=settings), started, log)

    yield factory
    for server in reversed(started):
        server.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which servers the run used, who provided them, and their versions."""
    log = terminalreporter.config.stash.get(_LOG_KEY, None)
    if log is None:
        return
    lines = log.lines()
    if lines:
        terminalreporter.section("statepact test servers")
        for line in lines:
            terminalreporter.write_line(line)
