"""``StateStoreConformance``'s part: ``run_totals``, a tenant's runs over a window.

``run_totals`` belongs to statepact's own stores (``BaseStateStore``), not to the
``StateStore`` protocol: a store without it skips these tests.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from statepact import state as state_module
from statepact.clock import ManualClock
from statepact.models import RunRecord, RunStatus
from statepact.state import BaseStateStore, StateStore

__all__ = ["RunTotalsConformance"]


def _operator(store: StateStore) -> BaseStateStore:
    if not isinstance(store, BaseStateStore):
        pytest.skip("run_totals belongs to statepact's own stores")
    return store


class RunTotalsConformance:
    """``run_totals``: exact counts and sums of the runs created since a time."""

    async def test_run_totals_sum_the_runs_created_since(
        self, state_store: StateStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """run_totals count the tenant's runs created at or after since, per status, and
        sum their counters exactly, past one page of runs; status and session filter."""
        store = _operator(state_store)
        monkeypatch.setattr(state_module, "_TOTALS_PAGE", 2)
        start = clock.now()
        await store.put_run(RunRecord(tenant="acme", run_id="early", status=RunStatus.RUNNING))
        await store.patch_run("acme", "early", input_tokens=1000)
        clock.advance(3600)
        since = clock.now()
        for index, status in enumerate(
            [RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.FAILED, None]
        ):
            run_id = f"r{index}"
            session = "s1" if index < 2 else None
            record = RunRecord(
                tenant="acme", run_id=run_id, status=status or RunStatus.PENDING, session_id=session
            )
            await store.put_run(record)
            await store.patch_run(
                "acme", run_id, input_tokens=10, output_tokens=index, cost="0.25", iterations=1
            )
            clock.advance(1)
        await store.put_run(RunRecord(tenant="globex", run_id="other"))
        await store.patch_run("acme", "early", input_tokens=5)  # updated late, created early

        totals = await store.run_totals("acme", since=since)
        assert (totals.tenant, totals.since, totals.runs) == ("acme", since, 5)
        assert (totals.input_tokens, totals.output_tokens, totals.iterations) == (50, 10, 5)
        assert totals.cost == Decimal("1.25")
        assert totals.by_status == {"failed": 1, "pending": 1, "running": 1, "succeeded": 2}
        assert (await store.run_totals("acme", since=start)).input_tokens == 1055
        succeeded = await store.run_totals("acme", since=since, status="succeeded")
        assert (succeeded.runs, succeeded.output_tokens) == (2, 3)
        of_session = await store.run_totals("acme", since=since, session_id="s1")
        assert (of_session.runs, of_session.by_status) == (2, {"running": 1, "succeeded": 1})
        later = await store.run_totals("acme", since=clock.now() + timedelta(seconds=1))
        assert (later.runs, later.cost, later.by_status) == (0, Decimal(0), {})
        assert (await store.run_totals("nobody", since=start)).runs == 0
        with pytest.raises(TypeError, match="since"):
            await store.run_totals("acme", since=since.replace(tzinfo=None))
