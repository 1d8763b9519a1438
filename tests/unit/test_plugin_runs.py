"""The plugin inside a real pytest run where no server can be found: skip, or fail when required.

Each test runs a small inner pytest session in a subprocess with an empty PATH
and a Docker socket that does not exist, so no provider has a Redis.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._inner_pytest import run_pytest_without_servers

INNER_TESTS = """
def test_wants_redis(statepact_redis_url):
    assert statepact_redis_url.startswith("redis://")

def test_wants_custom_redis(statepact_redis_server_factory):
    statepact_redis_server_factory(["--maxmemory-policy", "allkeys-lru"])

def test_clock_is_there(statepact_clock):
    assert statepact_clock.now().tzinfo is not None
"""


def _run_inner(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    ini = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    return run_pytest_without_servers(tmp_path, "-rsE", "test_inner.py", env=env)


def test_missing_redis_skips_with_every_reason(tmp_path: Path) -> None:
    """No URL, no Docker, no binary: tests that need Redis skip and say why; the rest run."""
    run = _run_inner(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 2 skipped" in run.stdout
    assert "STATEPACT_TEST_REDIS_URL is not set" in run.stdout
    assert "no Docker socket at" in run.stdout
    assert "no redis-server on PATH" in run.stdout
    assert "statepact test servers" in run.stdout
    assert "redis: none (" in run.stdout


def test_missing_redis_fails_when_servers_are_required(tmp_path: Path) -> None:
    """STATEPACT_REQUIRE_SERVERS=1: both Redis tests fail instead of skipping, with the reason."""
    run = _run_inner(tmp_path, STATEPACT_REQUIRE_SERVERS="1")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed, 1 error" in run.stdout
    assert "no redis-server on PATH" in run.stdout
    assert "STATEPACT_REQUIRE_SERVERS=1 makes this a failure" in run.stdout
