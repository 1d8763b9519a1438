"""Root conftest: registers the per-backing fixture modules under ``tests/fixtures``.

Server discovery (environment URL, testcontainers, local binaries) and the
per-test fixtures come from the ``statepact.testing.plugin`` pytest plugin,
installed with the package. The plugin marks ``integration`` every test whose
fixtures reach its servers; this file adds the fixtures of this repository that
start servers of their own, so ``pytest -m "not integration"`` starts none (see
docs/testing.md). It also names the plugin's ``statepact_clock`` ``clock``, the
name this repository's tests use (the plugin itself defines no bare name).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings as hypothesis_settings

from statepact.clock import ManualClock
from statepact.testing.plugin import mark_server_tests

# CI draws the same Hypothesis examples on every run (STATEPACT_HYPOTHESIS_PROFILE=ci, set by
# .ci/run), so a red build is seen again when it is re-run; a developer's run draws new ones
# (the default profile) and keeps what failed in .hypothesis/ to replay it first.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("STATEPACT_HYPOTHESIS_PROFILE", "default"))

pytest_plugins = [
    "tests.fixtures.memory",
    "tests.fixtures.redis",
    "tests.fixtures.postgres",
]

#: Fixtures here that start servers without the plugin's fixtures (tests/faults, the cluster
#: tests); tests reaching the plugin's servers through tests/fixtures are marked by the plugin.
REPO_SERVER_FIXTURES = frozenset(
    {"cluster", "fault_postgres_server", "fault_redis_server", "local_cluster", "redis_cluster"}
)


@pytest.fixture
def clock(statepact_clock: ManualClock) -> ManualClock:
    """The test's ``ManualClock``: the plugin's ``statepact_clock`` under this tree's name."""
    return statepact_clock


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_server_tests(items, REPO_SERVER_FIXTURES)
