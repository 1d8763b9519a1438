"""The plugin's fixtures in a user's project where no server can be found.

An inner pytest run (no servers: empty PATH, no Docker) stands for a user's
suite: every fixture the plugin defines is named ``statepact_*``; a test that
needs a database or a namespace is skipped with a reason that names the test
and points at its line, not at statepact's own files; with
``STATEPACT_REQUIRE_SERVERS=1`` it errors instead; and a conftest may implement
the ``pytest_statepact_postgres_template`` hook (pytest knows it).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import statepact
from tests._inner_pytest import run_pytest_without_servers

INI = "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"

# No PostgreSQL on this machine either: the empty PATH hides redis-server, and this hides the
# binaries the local provider would find under /usr/lib/postgresql.
CONFTEST = """
import statepact.testing.local_servers

statepact.testing.local_servers._POSTGRES_GLOB = "/nonexistent/postgresql/*/bin"


def pytest_statepact_postgres_template(url, config):
    raise AssertionError("never called: there is no server")
"""

TESTS = """
def test_needs_a_database(statepact_postgres_database):
    pass


def test_needs_a_namespace(statepact_redis_namespace):
    pass


def test_needs_nothing(statepact_clock, statepact_memory_state_store):
    assert statepact_memory_state_store.clock is statepact_clock
"""

#: What the plugin gives a user's tests; every one must be there, and nothing unprefixed.
EXPECTED = {
    "statepact_clock",
    "statepact_memory_backend",
    "statepact_memory_state_store",
    "statepact_memory_work_queue",
    "statepact_postgres_backend",
    "statepact_postgres_database",
    "statepact_postgres_engine",
    "statepact_postgres_server_factory",
    "statepact_postgres_settings",
    "statepact_postgres_state_store",
    "statepact_postgres_template",
    "statepact_postgres_url",
    "statepact_postgres_work_queue",
    "statepact_queue_policy",
    "statepact_redis_backend",
    "statepact_redis_client",
    "statepact_redis_namespace",
    "statepact_redis_server_factory",
    "statepact_redis_settings",
    "statepact_redis_state_store",
    "statepact_redis_url",
    "statepact_redis_work_queue",
}


def _project(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_app.py").write_text(TESTS)
    return tmp_path


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_pytest_without_servers(_project(tmp_path), *args, env=env)


def test_every_fixture_of_the_plugin_is_prefixed(tmp_path: Path) -> None:
    """``pytest --fixtures`` lists, from statepact's package, exactly the expected names,
    each starting with ``statepact_``: no bare ``clock`` or ``queue_policy`` to clash with."""
    run = _run(tmp_path, "--fixtures", "-v")
    assert run.returncode == 0, run.stdout + run.stderr
    package = str(Path(statepact.__file__).parent)
    ours = set()
    for line in run.stdout.splitlines():
        match = re.match(r"^(\w+)(?: \[\w+ scope\])? -- (\S+?):\d+$", line)
        # pytest prints the path relative to the inner run's directory where it can.
        if match and str((tmp_path / match.group(2)).resolve()).startswith(package):
            ours.add(match.group(1))
    assert ours == EXPECTED
    assert all(name.startswith("statepact_") for name in ours)


def test_a_missing_server_skips_naming_the_users_test(tmp_path: Path) -> None:
    """The skip lines point at test_app.py and carry each test's node id; none points into
    statepact's own files; the test that needs no server passes."""
    run = _run(tmp_path, "-rs")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 2 skipped" in run.stdout
    skipped = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, run.stdout
    assert any(
        line.startswith("SKIPPED [1] test_app.py:2: test_app.py::test_needs_a_database: ")
        for line in skipped
    ), skipped
    assert any(
        line.startswith("SKIPPED [1] test_app.py:6: test_app.py::test_needs_a_namespace: ")
        for line in skipped
    ), skipped
    assert not any("statepact/" in line or "site-packages" in line for line in skipped)
    assert "Skipped:" not in run.stdout
    assert all(": no postgres server" in line or ": no redis server" in line for line in skipped)


def test_a_missing_server_fails_when_servers_are_required(tmp_path: Path) -> None:
    """STATEPACT_REQUIRE_SERVERS=1: both tests error at setup, saying why; none is skipped."""
    run = _run(tmp_path, "-rE", STATEPACT_REQUIRE_SERVERS="1")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed, 2 errors" in run.stdout
    assert "skipped" not in run.stdout
    assert "STATEPACT_REQUIRE_SERVERS=1 makes this a failure" in run.stdout
