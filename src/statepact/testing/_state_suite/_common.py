"""Shared by the areas of ``StateStoreConformance`` (helpers and constants)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact.models import RunRecord, RunStatus
from statepact.state import StateStore

__all__ = ["LIMIT", "T", "all_runs", "bounded", "create"]

LIMIT = DEFAULT_MAX_VALUE_BYTES
T = TypeVar("T")


async def bounded(calls: Sequence[Callable[[], Awaitable[T]]], *, width: int = 50) -> list[T]:
    """Run the calls concurrently, at most ``width`` at a time, in order of results."""
    results: list[T] = []
    for start in range(0, len(calls), width):
        results.extend(await asyncio.gather(*(call() for call in calls[start : start + width])))
    return results


async def create(
    store: StateStore,
    run_id: str,
    *,
    tenant: str = "acme",
    session_id: str | None = None,
    status: RunStatus = RunStatus.PENDING,
    data: dict[str, Any] | None = None,
) -> RunRecord:
    return await store.put_run(
        RunRecord(
            tenant=tenant, run_id=run_id, session_id=session_id, status=status, data=data or {}
        )
    )


async def all_runs(store: StateStore, tenant: str, **filters: Any) -> list[RunRecord]:
    runs: list[RunRecord] = []
    after: str | None = None
    while True:
        page = await store.list_runs(tenant, limit=3, after=after, **filters)
        runs.extend(page.items)
        if page.next is None:
            return runs
        after = page.next
