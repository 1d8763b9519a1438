"""The ``-m "not integration"`` lane starts no server: the plugin marks server tests, and fails
one that reaches a server unmarked.

Each test runs a small inner pytest session in a subprocess, with ``STATEPACT_*``
unset, an empty PATH and a Docker socket that does not exist, under
``--strict-markers`` with no markers of its own registered (the plugin does it).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests._inner_pytest import run_pytest_without_servers

INNER_TESTS = """
import pytest


@pytest.fixture
def my_store(statepact_redis_url):
    return statepact_redis_url


@pytest.fixture
def custom_server():
    return "listed in statepact_server_fixtures"


def test_direct(statepact_postgres_url):
    pass


def test_through_a_fixture(my_store):
    pass


def test_factory(statepact_redis_server_factory):
    pass


class TestSuite:
    def test_in_a_class(self, my_store):
        pass


def test_custom(custom_server):
    pass


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
def backing(request):
    if request.param == "redis":
        return request.getfixturevalue("statepact_redis_url")
    return "memory"


def test_param(backing):
    pass


def test_dynamic_unmarked(request):
    request.getfixturevalue("statepact_redis_url")


def test_dynamic_unmarked_factory(request):
    request.getfixturevalue("statepact_postgres_server_factory")(durable=False)


@pytest.mark.integration
def test_dynamic_marked(request):
    request.getfixturevalue("statepact_redis_url")


def test_clock(statepact_clock):
    assert statepact_clock.now().tzinfo is not None
"""

SERVER_TESTS = {
    "test_direct",
    "test_through_a_fixture",
    "test_factory",
    "TestSuite::test_in_a_class",
    "test_custom",
    "test_param[redis]",
    "test_dynamic_marked",
}


def _run_inner(tmp_path: Path, *args: str, ini: str = "") -> subprocess.CompletedProcess[str]:
    ini = (
        "[pytest]\n"
        "asyncio_default_fixture_loop_scope = function\n"
        "addopts = --strict-markers\n"
        "statepact_server_fixtures = custom_server\n"
    ) + ini
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    return run_pytest_without_servers(tmp_path, "-rfE", *args, "test_inner.py")


def _ids(output: str) -> set[str]:
    return {
        line.strip().removeprefix("test_inner.py::")
        for line in output.splitlines()
        if line.strip().startswith("test_inner.py::")
    }


def test_server_tests_are_marked_at_collection(tmp_path: Path) -> None:
    """Direct, through a fixture, a factory, in a class, an ini-listed fixture: all marked
    integration; an explicitly marked param or test keeps its marker; nothing else is."""
    run = _run_inner(tmp_path, "--collect-only", "-q", "-m", "integration")
    assert run.returncode == 0, run.stdout + run.stderr
    assert _ids(run.stdout) == SERVER_TESTS


def test_the_lane_without_integration_starts_no_server(tmp_path: Path) -> None:
    """-m "not integration": the server tests are deselected, the two that ask for a server
    through getfixturevalue unmarked fail saying so, and no server is looked for."""
    run = _run_inner(tmp_path, "-m", "not integration")
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "2 failed, 2 passed, 7 deselected" in out
    assert "FAILED test_inner.py::test_dynamic_unmarked -" in out
    assert "FAILED test_inner.py::test_dynamic_unmarked_factory -" in out
    assert "asks for a redis server but is not marked 'integration'" in out
    assert "asks for a local postgres server but is not marked 'integration'" in out
    # Nothing was provided or even looked for, so the plugin has no servers to report.
    assert "statepact test servers" not in out
    assert "no redis-server on PATH" not in out


def test_a_run_that_does_not_select_by_the_marker_leaves_unmarked_tests_alone(
    tmp_path: Path,
) -> None:
    """Without -m, a test asking for a server through getfixturevalue unmarked is not failed
    for it: with no Redis anywhere it skips with the providers' reasons, like a marked one.
    (Only the Redis tests run: local PostgreSQL binaries may be found outside PATH.)"""
    run = _run_inner(tmp_path, "-v", "-rs", "-k", "dynamic and not factory")
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "is not marked 'integration'" not in out
    assert "test_inner.py::test_dynamic_unmarked SKIPPED" in out, out
    assert "test_inner.py::test_dynamic_marked SKIPPED" in out, out
    assert "no redis-server on PATH" in out


@pytest.mark.parametrize("registered", [False, True])
def test_the_marker_is_registered_once(tmp_path: Path, registered: bool) -> None:
    """The plugin registers ``integration`` only when the project has not; a project's own
    description of it is kept."""
    ini = "markers =\n    integration: the project's own words\n" if registered else ""
    run = _run_inner(tmp_path, "--markers", ini=ini)
    assert run.returncode == 0, run.stdout + run.stderr
    marker = "@pytest.mark.integration:"
    lines = [line for line in run.stdout.splitlines() if line.startswith(marker)]
    assert len(lines) == 1, lines
    assert ("the project's own words" in lines[0]) is registered
