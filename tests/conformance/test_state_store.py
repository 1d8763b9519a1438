"""Runs ``StateStoreConformance`` against every backing.

Each backing's ``{backing}_state_store`` fixture lives in ``tests/fixtures``;
the server-backed ones are marked ``integration``.
"""

from __future__ import annotations

import pytest

from statepact.state import StateStore
from statepact.testing.state_suite import StateStoreConformance


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def state_store(request: pytest.FixtureRequest) -> StateStore:
    store: StateStore = request.getfixturevalue(f"{request.param}_state_store")
    return store


class TestStateStore(StateStoreConformance):
    pass
