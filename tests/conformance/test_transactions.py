"""Runs ``TransactionConformance`` against every backing.

Each backing's ``{backing}_backend`` fixture lives in ``tests/fixtures``; the
server-backed ones are marked ``integration``.
"""

from __future__ import annotations

import pytest

from statepact.testing.tx_suite import TransactionConformance
from statepact.tx import StorageBackend


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def tx_backend(request: pytest.FixtureRequest) -> StorageBackend:
    backend: StorageBackend = request.getfixturevalue(f"{request.param}_backend")
    return backend


class TestTransactions(TransactionConformance):
    pass
