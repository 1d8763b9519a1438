"""Shared by the areas of ``TransactionConformance`` (helpers and constants)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statepact.testing.isolation import (
    Anomaly,
)
from statepact.tx import (
    CommitResult,
    Isolation,
    TransactionManager,
)

__all__ = ["ISOLATIONS", "LOCK_WAIT", "Abort", "R", "commit_value", "names", "read_value"]

R = "orders"
ISOLATIONS = [i.value for i in Isolation]
LOCK_WAIT = 0.3  # seconds a test lets a lock wait; real time, not the clock


async def commit_value(manager: TransactionManager, key: str, value: Any) -> CommitResult:
    async with manager.transaction() as tx:
        tx.write(R, key, value)
    return tx.result


async def read_value(manager: TransactionManager, key: str, resource: str = R) -> Any:
    async with manager.transaction() as tx:
        return await tx.read(resource, key)


def names(anomalies: Sequence[Anomaly]) -> set[str]:
    return {a.name for a in anomalies}


class Abort(Exception):
    """Raised by a random transaction chosen to roll back."""
