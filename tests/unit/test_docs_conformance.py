"""docs/testing.md's conformance examples work as a user's test modules, not only as programs.

``test_docs_examples`` runs each block as a program, which only defines the
fixtures and classes. Here the blocks are written out as test modules of a
small project and run by pytest in a subprocess, as a user would: the memory
one passes all three suites; the one on the wired classes (PostgreSQL and
Redis) is collected with every test marked ``integration`` (so the no-server
lane leaves it out) without a server being started. Its run against real
servers is tests/integration/test_plugin_fixtures.py's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._inner_pytest import run_pytest_without_servers
from tests.unit.test_docs_examples import ALL

SUITES = ("StateStoreConformance", "WorkQueueConformance", "TransactionConformance")
EXAMPLES = [e for e in ALL if e.page == "testing.md" and all(s in e.code for s in SUITES)]


def _project(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "addopts = --strict-markers\n"
    )
    for example in EXAMPLES:
        name = "server" if example.needs else "memory"
        (tmp_path / f"test_docs_{name}.py").write_text(example.code)


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_pytest_without_servers(tmp_path, "-q", *args, timeout=300)


def test_there_is_a_memory_and_a_server_example() -> None:
    """One block on a backing of your own (memory standing in), one on your servers."""
    assert sorted(tuple(sorted(e.needs)) for e in EXAMPLES) == [(), ("postgres", "redis")]


def test_the_memory_example_passes_every_suite(tmp_path: Path) -> None:
    """All three suites pass on the memory example's fixtures, as written in the docs."""
    _project(tmp_path)
    collected = _pytest(tmp_path, "--collect-only", "test_docs_memory.py").stdout
    for cls in ("TestMyStateStore", "TestMyWorkQueue", "TestMyBackend"):
        assert f"test_docs_memory.py::{cls}::" in collected
    run = _pytest(tmp_path, "test_docs_memory.py")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert f"{collected.count('test_docs_memory.py::')} passed" in run.stdout


def test_the_server_example_is_marked_integration_and_left_out_of_the_lane(tmp_path: Path) -> None:
    """Every test of the server example is marked integration at collection, so
    -m "not integration" runs only the memory example and starts nothing."""
    _project(tmp_path)
    marked = _pytest(tmp_path, "--collect-only", "-m", "integration")
    assert marked.returncode == 0, marked.stdout + marked.stderr
    ids = [line for line in marked.stdout.splitlines() if "::" in line]
    assert ids and all(line.startswith("test_docs_server.py::") for line in ids)
    everything = _pytest(tmp_path, "--collect-only")
    assert len(ids) == everything.stdout.count("test_docs_server.py::")
    lane = _pytest(tmp_path, "-m", "not integration")
    assert lane.returncode == 0, lane.stdout[-3000:] + lane.stderr
    assert f"{len(ids)} deselected" in lane.stdout
    assert "statepact test servers" not in lane.stdout
