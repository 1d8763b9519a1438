"""Root conftest: registers the per-backing fixture modules under ``tests/fixtures``.

Server discovery (environment URL, testcontainers, local binaries) comes from
the ``statepact.testing.plugin`` pytest plugin, installed with the package.
"""

pytest_plugins = [
    "tests.fixtures.memory",
    "tests.fixtures.redis",
    "tests.fixtures.postgres",
]
