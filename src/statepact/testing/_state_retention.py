"""The retention part of ``StateStoreConformance``: ``prune_runs`` and ``delete_session``.

A mixin of the suite (``state_suite.StateStoreConformance`` inherits it), in a module of
its own so the suite stays split by area; it uses the suite's ``state_store`` and
``clock`` fixtures and nothing else.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from statepact._limits import PRUNE_BATCH
from statepact.clock import ManualClock
from statepact.errors import StateConflictError
from statepact.models import RunRecord, RunStatus, SessionRecord
from statepact.state import TERMINAL_RUN_STATUSES, StateStore

__all__ = ["StateRetentionConformance"]

HOUR = timedelta(hours=1)


async def _run(
    store: StateStore,
    run_id: str,
    status: RunStatus,
    *,
    tenant: str = "acme",
    session_id: str | None = None,
) -> RunRecord:
    return await store.put_run(
        RunRecord(tenant=tenant, run_id=run_id, status=status, session_id=session_id)
    )


async def _ids(store: StateStore, tenant: str = "acme", **filters: Any) -> list[str]:
    found: list[str] = []
    after: str | None = None
    while True:
        page = await store.list_runs(tenant, limit=1000, after=after, **filters)
        found.extend(run.run_id for run in page.items)
        if page.next is None:
            return found
        after = page.next


class StateRetentionConformance:
    """``prune_runs`` and ``delete_session`` on every backing."""

    async def test_prune_runs_deletes_old_finished_runs_only(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """prune_runs deletes the runs in a terminal status not written for older_than, and
        keeps the younger ones and the unfinished ones, however old."""
        for status in RunStatus:
            await _run(state_store, f"old_{status.value}", status, session_id="s1")
        clock.advance(2 * HOUR)
        for status in RunStatus:
            await _run(state_store, f"young_{status.value}", status, session_id="s1")
        clock.advance(30 * 60)

        deleted = await state_store.prune_runs(older_than=HOUR)

        assert deleted == len(TERMINAL_RUN_STATUSES)
        kept = {f"young_{s.value}" for s in RunStatus} | {
            f"old_{s.value}" for s in RunStatus if s not in TERMINAL_RUN_STATUSES
        }
        assert set(await _ids(state_store)) == kept
        assert set(await _ids(state_store, session_id="s1")) == kept
        for status in TERMINAL_RUN_STATUSES:
            assert await state_store.get_run("acme", f"old_{status.value}") is None
            listed = await _ids(state_store, status=status)
            assert listed == [f"young_{status.value}"], status
        assert await state_store.prune_runs(older_than=HOUR) == 0

    async def test_prune_runs_judges_a_run_by_its_last_write(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """A run's age is its updated_at: a patch or put keeps an old run from the prune."""
        await _run(state_store, "patched", RunStatus.SUCCEEDED)
        await _run(state_store, "idle", RunStatus.SUCCEEDED)
        clock.advance(2 * HOUR)
        await state_store.patch_run("acme", "patched", iterations=1)
        assert await state_store.prune_runs(older_than=HOUR) == 1
        assert await _ids(state_store) == ["patched"]

    async def test_prune_runs_takes_statuses(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """statuses names what may go, as RunStatus or its string value."""
        for status in RunStatus:
            await _run(state_store, status.value, status)
        clock.advance(2 * HOUR)
        assert await state_store.prune_runs(older_than=HOUR, statuses=["pending", "failed"]) == 2
        assert set(await _ids(state_store)) == {"running", "succeeded", "cancelled"}
        assert await state_store.prune_runs(older_than=HOUR, statuses={RunStatus.RUNNING}) == 1
        assert set(await _ids(state_store)) == {"succeeded", "cancelled"}

    async def test_prune_runs_of_one_tenant_or_every_tenant(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """tenant limits the prune to that tenant; None prunes every tenant."""
        for tenant in ("acme", "globex", "initech"):
            await _run(state_store, "done", RunStatus.SUCCEEDED, tenant=tenant)
            await _run(state_store, "live", RunStatus.RUNNING, tenant=tenant)
        clock.advance(2 * HOUR)
        assert await state_store.prune_runs(older_than=HOUR, tenant="globex") == 1
        assert await _ids(state_store, "globex") == ["live"]
        assert await _ids(state_store, "acme") == ["done", "live"]
        assert await state_store.prune_runs(older_than=HOUR) == 2
        for tenant in ("acme", "globex", "initech"):
            assert await _ids(state_store, tenant) == ["live"], tenant

    async def test_prune_runs_goes_past_one_batch(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """A prune of more runs than one batch looks at deletes them all, the others kept."""
        count = PRUNE_BATCH + 7
        for index in range(count):
            status = RunStatus.RUNNING if index % 100 == 0 else RunStatus.SUCCEEDED
            await _run(state_store, f"run_{index:04d}", status)
        clock.advance(2 * HOUR)
        unfinished = [f"run_{index:04d}" for index in range(0, count, 100)]
        assert await state_store.prune_runs(older_than=HOUR) == count - len(unfinished)
        assert await _ids(state_store) == unfinished

    async def test_a_pruned_run_can_be_created_again(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """A pruned run's id is free: it is created again from version 0."""
        await _run(state_store, "run_1", RunStatus.SUCCEEDED)
        await state_store.patch_run("acme", "run_1", input_tokens=5)
        clock.advance(2 * HOUR)
        assert await state_store.prune_runs(older_than=HOUR) == 1
        again = await _run(state_store, "run_1", RunStatus.PENDING)
        assert again.version == 1
        assert again.input_tokens == 0

    @pytest.mark.parametrize(
        ("arguments", "error", "field"),
        [
            ({"older_than": 3600}, TypeError, "older_than"),
            ({"older_than": -HOUR}, ValueError, "older_than"),
            ({"older_than": HOUR, "statuses": []}, ValueError, "statuses"),
            ({"older_than": HOUR, "statuses": "succeeded"}, TypeError, "statuses"),
            ({"older_than": HOUR, "statuses": ["finished"]}, ValueError, "status"),
            ({"older_than": HOUR, "tenant": ""}, ValueError, "tenant"),
        ],
    )
    async def test_bad_prune_is_refused_naming_the_field(
        self,
        state_store: StateStore,
        clock: ManualClock,
        arguments: dict[str, Any],
        error: type[Exception],
        field: str,
    ) -> None:
        """A bad prune_runs argument is refused naming it, and nothing is deleted."""
        await _run(state_store, "run_1", RunStatus.SUCCEEDED)
        clock.advance(2 * HOUR)
        with pytest.raises(error, match=rf"^{field}"):
            await state_store.prune_runs(**arguments)
        assert await _ids(state_store) == ["run_1"]

    async def test_delete_session_removes_it_and_keeps_its_runs(
        self, state_store: StateStore
    ) -> None:
        """delete_session removes the session from reads and listings; its runs stay."""
        await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        await state_store.put_session(SessionRecord(tenant="acme", session_id="s2"))
        await _run(state_store, "run_1", RunStatus.RUNNING, session_id="s1")
        assert await state_store.delete_session("acme", "s1") is True
        assert await state_store.get_session("acme", "s1") is None
        page = await state_store.list_sessions("acme")
        assert [session.session_id for session in page.items] == ["s2"]
        assert await _ids(state_store, session_id="s1") == ["run_1"]

    async def test_delete_of_a_missing_session_is_false(self, state_store: StateStore) -> None:
        """delete_session of a session that is not there returns False; a second delete too."""
        assert await state_store.delete_session("acme", "ghost") is False
        await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        assert await state_store.delete_session("globex", "s1") is False
        assert await state_store.delete_session("acme", "s1") is True
        assert await state_store.delete_session("acme", "s1") is False

    async def test_a_deleted_session_is_created_again_from_version_zero(
        self, state_store: StateStore
    ) -> None:
        """A deleted session is created again from version 0, with a greater seq."""
        first = await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        await state_store.delete_session("acme", "s1")
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_session(first)
        assert caught.value.actual == 0
        again = await state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data={"again": True})
        )
        assert again.version == 1
        assert first.seq is not None and again.seq is not None
        assert again.seq > first.seq

    async def test_bad_delete_session_is_refused_naming_the_field(
        self, state_store: StateStore
    ) -> None:
        """A bad tenant or session_id is refused naming it."""
        with pytest.raises(ValueError, match=r"^tenant"):
            await state_store.delete_session("", "s1")
        with pytest.raises(ValueError, match=r"^session_id"):
            await state_store.delete_session("acme", "")
