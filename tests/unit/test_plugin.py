"""The server-provider decisions of statepact.testing: order, skip or fail, URLs, Docker check.

No server is started here; the Docker check talks to a socket this test opens.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statepact.testing.plugin import _ServerLog
from statepact.testing.servers import (
    ENV_POSTGRES_URL,
    ENV_REDIS_URL,
    ENV_REQUIRE_SERVERS,
    ProvidedServer,
    as_asyncpg_url,
    choose_provider,
    docker_unavailable_reason,
    missing_server,
    require_servers,
)


def _never() -> str | None:
    raise AssertionError("this provider must not be checked")


def _usable() -> str | None:
    return None


def _why(reason: str) -> Callable[[], str | None]:
    return lambda: reason


def test_plugin_import_loads_no_driver() -> None:
    """Importing the plugin or the server module loads no driver and no testcontainers."""
    code = (
        "import sys, statepact.testing.plugin, statepact.testing.servers\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}"
        " & {'redis', 'sqlalchemy', 'asyncpg', 'testcontainers', 'docker'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_env_url_wins_over_every_other_provider() -> None:
    """An environment URL is used without looking for Docker or binaries."""
    choice = choose_provider("redis", {ENV_REDIS_URL: " redis://h:1/3 "}, _never, _never)
    assert (choice.provider, choice.url) == ("env", "redis://h:1/3")
    assert ENV_REDIS_URL in choice.reason


def test_each_kind_reads_its_own_variable() -> None:
    """The Redis URL variable does not provide PostgreSQL, and the other way round."""
    env = {ENV_REDIS_URL: "redis://h:1/0"}
    assert choose_provider("postgres", env, _usable, _never).provider == "testcontainers"
    env = {ENV_POSTGRES_URL: "postgresql://p@h/db"}
    assert choose_provider("postgres", env, _never, _never).url == "postgresql://p@h/db"
    assert choose_provider("redis", env, _why("no docker"), _usable).provider == "local"


def test_blank_env_url_is_ignored() -> None:
    """A variable set to whitespace counts as unset."""
    assert choose_provider("redis", {ENV_REDIS_URL: "  "}, _usable, _never).provider == (
        "testcontainers"
    )


def test_docker_comes_before_local_binaries() -> None:
    """Where Docker answers, testcontainers is chosen and binaries are not looked for."""
    assert choose_provider("postgres", {}, _usable, _never).provider == "testcontainers"


def test_local_binaries_when_docker_is_missing() -> None:
    """Without Docker, local binaries; the reason says why Docker was passed over."""
    choice = choose_provider("redis", {}, _why("no Docker socket at /x"), _usable)
    assert choice.provider == "local"
    assert "no Docker socket at /x" in choice.reason


def test_missing_lists_every_reason() -> None:
    """With no provider, the reason names the variable, the Docker reason and the binary reason."""
    choice = choose_provider(
        "postgres", {}, _why("testcontainers is not installed"), _why("no initdb")
    )
    assert choice.provider == "missing"
    for part in (ENV_POSTGRES_URL, "testcontainers is not installed", "no initdb"):
        assert part in choice.reason


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True), ("", False), ("0", False)],
)
def test_require_servers_values(value: str, expected: bool) -> None:
    """STATEPACT_REQUIRE_SERVERS accepts 1/true/yes/on, any case."""
    assert require_servers({ENV_REQUIRE_SERVERS: value}) is expected


def test_missing_server_skips_by_default() -> None:
    """Without STATEPACT_REQUIRE_SERVERS a missing server skips, with its reason."""
    with pytest.raises(pytest.skip.Exception, match="no redis-server on PATH"):
        missing_server("no redis-server on PATH", {})


def test_missing_server_fails_when_required() -> None:
    """STATEPACT_REQUIRE_SERVERS=1 turns the skip into a failure that keeps the reason."""
    with pytest.raises(pytest.fail.Exception) as caught:
        missing_server("no redis-server on PATH", {ENV_REQUIRE_SERVERS: "1"})
    assert "no redis-server on PATH" in str(caught.value)
    assert ENV_REQUIRE_SERVERS in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u:pw@h:5/db",
        "postgresql://u:pw@h:5/db",
        "postgresql+psycopg://u:pw@h:5/db",
        "postgresql+asyncpg://u:pw@h:5/db",
    ],
)
def test_postgres_urls_become_asyncpg(url: str) -> None:
    """Every PostgreSQL URL form is handed to tests as an SQLAlchemy asyncpg URL."""
    assert as_asyncpg_url(url) == "postgresql+asyncpg://u:pw@h:5/db"


def test_non_postgres_url_is_refused_without_its_password() -> None:
    """A URL of another database is refused, and the message masks its password."""
    with pytest.raises(ValueError, match="not a PostgreSQL URL") as caught:
        as_asyncpg_url("mysql://u:hunter2@h/db")
    assert "hunter2" not in str(caught.value)


def test_summary_line_masks_password() -> None:
    """The end-of-run line names provider and version but never the password."""
    server = ProvidedServer("postgres", "postgresql+asyncpg://u:hunter2@h:5/db", "env", "16.4", "x")
    line = server.describe()
    assert "hunter2" not in line
    assert "16.4" in line
    assert "from env" in line


def test_server_log_lines() -> None:
    """The summary lists provided servers, missing ones with reasons, and factory servers."""
    log = _ServerLog()
    log.provided.append(ProvidedServer("redis", "redis://h:1/0", "local", "7.0.15", "bin"))
    log.unavailable["postgres"] = "no initdb"
    log.extra["redis"] = ["7.0.15", "7.0.15"]
    lines = log.lines()
    assert lines[0].startswith("redis: 7.0.15 from local")
    assert "postgres: none (no initdb)" in lines
    assert "redis: 2 extra local server(s) started by tests (7.0.15)" in lines


def test_closing_a_provided_server_runs_its_closer_once() -> None:
    """close() stops what the provider started, once."""
    calls: list[int] = []
    server = ProvidedServer("redis", "redis://h:1/0", "local", "7", "x", lambda: calls.append(1))
    server.close()
    server.close()
    assert calls == [1]


# -- the Docker check, against a socket of our own -------------------------------------------


@pytest.fixture
def docker_socket(tmp_path: Path) -> Iterator[Callable[[bytes], str]]:
    """Serve one canned HTTP answer on a unix socket; returns its DOCKER_HOST."""
    path = tmp_path / "d.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    threads: list[threading.Thread] = []

    def serve(answer: bytes) -> str:
        def run() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(answer)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return f"unix://{path}"

    yield serve
    server.close()
    for thread in threads:
        thread.join(5)


def test_docker_that_answers_ping_is_usable(docker_socket: Callable[[bytes], str]) -> None:
    """A daemon answering 200 to /_ping makes testcontainers the provider."""
    host = docker_socket(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
    assert docker_unavailable_reason({"DOCKER_HOST": host}) is None


def test_docker_answering_an_error_is_not_usable(docker_socket: Callable[[bytes], str]) -> None:
    """A daemon answering 500 is passed over, and the reason quotes its answer."""
    host = docker_socket(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    reason = docker_unavailable_reason({"DOCKER_HOST": host})
    assert reason is not None
    assert "500" in reason


def test_docker_socket_that_does_not_exist(tmp_path: Path) -> None:
    """No socket file: the reason names the path."""
    reason = docker_unavailable_reason({"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert reason == f"no Docker socket at {tmp_path}/none.sock"


def test_docker_tcp_host_that_refuses(tmp_path: Path) -> None:
    """A tcp:// DOCKER_HOST with nothing listening is passed over."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    reason = docker_unavailable_reason({"DOCKER_HOST": f"tcp://127.0.0.1:{port}"}, timeout=0.5)
    assert reason is not None
    assert "does not answer" in reason
