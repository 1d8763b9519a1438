"""Where a test session's Redis and PostgreSQL come from: statepact's own suites and its users'.

:func:`provide_server` finds a server in the order docs/testing.md gives: the
``STATEPACT_TEST_{POSTGRES,REDIS}_URL`` environment variables; else
testcontainers (official ``postgres`` and ``redis`` images) where a Docker
daemon answers; else the local binaries (:mod:`statepact.testing.local_servers`);
else :class:`ServerUnavailableError` with every reason, which
:func:`missing_server` turns into a skip, or into a failure when
``STATEPACT_REQUIRE_SERVERS=1``. The server classes and the version probes are
re-exported here, so ``from statepact.testing.servers import RedisServer`` works.

This module must never stop a server it did not provide, print a password, or
import redis, SQLAlchemy, asyncpg, testcontainers or pytest at import time.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import socket
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar

from statepact.settings import redact_dsn
from statepact.testing.local_servers import (
    PostgresBinaries,
    PostgresServer,
    RedisServer,
    ServerKind,
    ServerStartError,
    find_postgres_binaries,
    find_redis_server,
    free_port,
    local_unavailable_reason,
)
from statepact.testing.probes import (
    as_asyncpg_url,
    postgres_server_version,
    redis_server_version,
)

__all__ = [
    "ENV_POSTGRES_URL",
    "ENV_REDIS_URL",
    "ENV_REQUIRE_SERVERS",
    "POSTGRES_IMAGE",
    "REDIS_IMAGE",
    "PostgresBinaries",
    "PostgresServer",
    "ProvidedServer",
    "ProviderChoice",
    "RedisServer",
    "ServerKind",
    "ServerStartError",
    "ServerUnavailableError",
    "as_asyncpg_url",
    "choose_provider",
    "docker_unavailable_reason",
    "find_postgres_binaries",
    "find_redis_server",
    "free_port",
    "local_unavailable_reason",
    "missing_server",
    "postgres_server_version",
    "provide_server",
    "redis_server_version",
    "require_servers",
]

Provider = Literal["env", "testcontainers", "local", "missing"]

#: A local server this module starts.
L = TypeVar("L", RedisServer, PostgresServer)

ENV_REDIS_URL = "STATEPACT_TEST_REDIS_URL"
ENV_POSTGRES_URL = "STATEPACT_TEST_POSTGRES_URL"
ENV_REQUIRE_SERVERS = "STATEPACT_REQUIRE_SERVERS"
_ENV_URL: dict[ServerKind, str] = {"redis": ENV_REDIS_URL, "postgres": ENV_POSTGRES_URL}

REDIS_IMAGE = "redis:7"
POSTGRES_IMAGE = "postgres:16"


class ServerUnavailableError(RuntimeError):
    """No provider can give this kind of server; the message lists every reason."""


# -- choosing a provider -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderChoice:
    """Which provider serves a kind of server, and why."""

    kind: ServerKind
    provider: Provider
    reason: str
    url: str | None = None


def require_servers(environ: Mapping[str, str]) -> bool:
    """True when ``STATEPACT_REQUIRE_SERVERS`` asks for a missing server to fail the test."""
    return environ.get(ENV_REQUIRE_SERVERS, "").strip().lower() in ("1", "true", "yes", "on")


def missing_server(reason: str, environ: Mapping[str, str] | None = None) -> NoReturn:
    """Skip the test for ``reason``; fail it instead under ``STATEPACT_REQUIRE_SERVERS=1``."""
    import pytest

    env = os.environ if environ is None else environ
    if require_servers(env):
        pytest.fail(f"{reason} ({ENV_REQUIRE_SERVERS}=1 makes this a failure)", pytrace=False)
    pytest.skip(reason)


def _docker_ping_unix(path: str, timeout: float) -> str | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status = sock.recv(256).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as exc:
        return f"Docker at {path} does not answer ({exc.strerror or exc})"
    if status.split(" ")[1:2] != ["200"]:
        return f"Docker at {path} answered {status!r}"
    return None


def docker_unavailable_reason(
    environ: Mapping[str, str] | None = None, timeout: float = 1.0
) -> str | None:
    """None when testcontainers can be used, else why not.

    Cheap: testcontainers is looked up, not imported; the daemon named by
    ``DOCKER_HOST`` (default ``/var/run/docker.sock``, as docker-py uses) gets
    one ``/_ping``, or for ``tcp://`` one connection.
    """
    env = os.environ if environ is None else environ
    if importlib.util.find_spec("testcontainers") is None:
        return "testcontainers is not installed"
    host = env.get("DOCKER_HOST", "").strip() or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        path = host.removeprefix("unix://")
        if not os.path.exists(path):
            return f"no Docker socket at {path}"
        return _docker_ping_unix(path, timeout)
    if host.startswith("tcp://"):
        address = host.removeprefix("tcp://").split("/", 1)[0]
        name, _, port = address.rpartition(":")
        try:
            with socket.create_connection((name.strip("[]"), int(port)), timeout=timeout):
                return None
        except (OSError, ValueError) as exc:
            return f"Docker at {host} does not answer ({exc})"
    # ssh:// and other forms: no cheap check; let testcontainers try.
    return None


def choose_provider(
    kind: ServerKind,
    environ: Mapping[str, str],
    docker_check: Callable[[], str | None],
    local_check: Callable[[], str | None],
) -> ProviderChoice:
    """The order of docs/testing.md: environment URL, testcontainers, local binaries, none.

    The checks return None when usable, else the reason; each runs only when the
    providers before it are not there.
    """
    variable = _ENV_URL[kind]
    url = environ.get(variable, "").strip()
    if url:
        return ProviderChoice(kind, "env", f"${variable} is set", url=url)
    docker_why = docker_check()
    if docker_why is None:
        return ProviderChoice(kind, "testcontainers", "a Docker daemon answers")
    local_why = local_check()
    if local_why is None:
        return ProviderChoice(kind, "local", f"local binaries ({docker_why})")
    return ProviderChoice(
        kind,
        "missing",
        f"no {kind} server for the tests: ${variable} is not set; {docker_why}; {local_why}",
    )


# -- providing a server for a session ------------------------------------------------------------


@dataclass
class ProvidedServer:
    """A server handed to a test session: where it is, who provided it, and its version."""

    kind: ServerKind
    url: str
    provider: Provider
    version: str
    detail: str
    _close: Callable[[], None] | None = field(default=None, repr=False)

    def close(self) -> None:
        """Stop what we started (nothing for a server from the environment)."""
        close, self._close = self._close, None
        if close is not None:
            close()

    def describe(self) -> str:
        """One line for the end-of-run summary; the URL's password is masked."""
        return (
            f"{self.kind}: {self.version} from {self.provider} ({self.detail}) "
            f"at {redact_dsn(self.url)}"
        )


@contextlib.contextmanager
def _quiet_deprecations() -> Iterator[None]:
    # testcontainers moves its modules between releases and warns about it;
    # under a test suite's "warnings are errors" that would fail every test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _container_class(module: str, name: str) -> Any:
    for path in (f"testcontainers.community.{module}", f"testcontainers.{module}"):
        with _quiet_deprecations():
            try:
                return getattr(importlib.import_module(path), name)
            except (ImportError, AttributeError):
                continue
    raise ServerStartError(f"testcontainers has no {name}")


def _container_redis() -> ProvidedServer:
    container = _container_class("redis", "RedisContainer")(REDIS_IMAGE)
    container.with_command("redis-server --appendonly yes")
    with _quiet_deprecations():
        container.start()
    try:
        host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
        url = f"redis://{host}:{port}/0"
        version, appendonly = redis_server_version(url)
    except BaseException:
        container.stop()
        raise
    return ProvidedServer(
        "redis",
        url,
        "testcontainers",
        version,
        f"image {REDIS_IMAGE}, appendonly {appendonly}",
        container.stop,
    )


def _container_postgres() -> ProvidedServer:
    container = _container_class("postgres", "PostgresContainer")(
        POSTGRES_IMAGE,
        username="postgres",
        password="postgres",  # noqa: S106 - a throwaway container on this machine
        dbname="postgres",
        driver="asyncpg",
    )
    with _quiet_deprecations():
        container.start()
    try:
        url = as_asyncpg_url(container.get_connection_url())
        version = postgres_server_version(url)
    except BaseException:
        container.stop()
        raise
    return ProvidedServer(
        "postgres", url, "testcontainers", version, f"image {POSTGRES_IMAGE}", container.stop
    )


def _started(server: L) -> L:
    """``server`` started, or closed again (its directory removed) when the start fails."""
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


def _local_redis() -> ProvidedServer:
    server = _started(RedisServer(["--appendonly", "yes"]))
    return ProvidedServer(
        "redis",
        server.url,
        "local",
        server.version or "unknown",
        f"{server.binary}, appendonly yes",
        server.close,
    )


def _local_postgres() -> ProvidedServer:
    server = _started(PostgresServer())
    return ProvidedServer(
        "postgres",
        server.url,
        "local",
        server.version or "unknown",
        f"{server.binaries.postgres}, fsync off",
        server.close,
    )


def _from_env(kind: ServerKind, url: str) -> ProvidedServer:
    variable = _ENV_URL[kind]
    if kind == "postgres":
        url = as_asyncpg_url(url)
    try:
        if kind == "redis":
            version, appendonly = redis_server_version(url)
            detail = f"${variable}, appendonly {appendonly}"
        else:
            version, detail = postgres_server_version(url), f"${variable}"
    except Exception as exc:
        raise ServerStartError(
            f"${variable} ({redact_dsn(url)}) does not answer: {type(exc).__name__}: {exc}"
        ) from exc
    return ProvidedServer(kind, url, "env", version, detail)


def provide_server(
    kind: ServerKind,
    environ: Mapping[str, str] | None = None,
    *,
    docker_check: Callable[[], str | None] | None = None,
) -> ProvidedServer:
    """A running server of ``kind`` for a test session; close it when done.

    The Redis is durable (``appendonly yes``) where we start it; the PostgreSQL
    URL is SQLAlchemy asyncpg, for the superuser, database ``postgres``. Raises
    :class:`ServerUnavailableError` when no provider has one, and
    :class:`ServerStartError` when the chosen one fails (an environment URL that
    does not answer is an error, not a skip).
    """
    env = os.environ if environ is None else environ
    choice = choose_provider(
        kind,
        env,
        docker_check or (lambda: docker_unavailable_reason(env)),
        lambda: local_unavailable_reason(kind),
    )
    if choice.provider == "env":
        assert choice.url is not None
        return _from_env(kind, choice.url)
    if choice.provider == "missing":
        raise ServerUnavailableError(choice.reason)
    note = ""
    if choice.provider == "testcontainers":
        try:
            return _container_redis() if kind == "redis" else _container_postgres()
        except Exception as exc:
            # A daemon that answers may still fail to pull or run an image
            # (offline, no permission); local binaries are the next provider.
            failure = f"testcontainers could not start {kind}: {type(exc).__name__}: {exc}"
            local_why = local_unavailable_reason(kind)
            if local_why is not None:
                raise ServerStartError(f"{failure}; and {local_why}") from exc
            note = f"; {failure}"
    server = _local_redis() if kind == "redis" else _local_postgres()
    server.detail += note
    return server
