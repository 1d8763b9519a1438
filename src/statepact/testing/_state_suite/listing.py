"""Listing, tenants and sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import StateConflictError
from statepact.models import RunRecord, RunStatus, SessionRecord
from statepact.state import StateStore
from statepact.testing._state_suite._common import all_runs, create

__all__ = ["ListingConformance"]


class ListingConformance:
    """Listing, tenants and sessions."""

    # -- listing ---------------------------------------------------------------

    async def test_list_pages_in_seq_order(self, state_store: StateStore) -> None:
        """list_runs pages by seq: limit bounds a page, next resumes after it, the last page
        has next=None."""
        for i in range(12):
            await create(state_store, f"run_{i:02d}")
        seen: list[RunRecord] = []
        sizes: list[int] = []
        after: str | None = None
        while True:
            page = await state_store.list_runs("acme", limit=5, after=after)
            seen.extend(page.items)
            sizes.append(len(page.items))
            if page.next is None:
                break
            after = page.next
        assert sizes == [5, 5, 2]
        assert [r.run_id for r in seen] == [f"run_{i:02d}" for i in range(12)]
        seqs = [r.seq for r in seen if r.seq is not None]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == 12

    async def test_full_last_page_has_no_next(self, state_store: StateStore) -> None:
        """A last page that is exactly full still has next=None."""
        for i in range(10):
            await create(state_store, f"run_{i}")
        first = await state_store.list_runs("acme", limit=5)
        assert first.next is not None
        second = await state_store.list_runs("acme", limit=5, after=first.next)
        assert len(second.items) == 5
        assert second.next is None

    async def test_list_of_empty_tenant(self, state_store: StateStore) -> None:
        """Listing a tenant with no runs gives an empty page with next=None."""
        page = await state_store.list_runs("nobody")
        assert page.items == []
        assert page.next is None

    async def test_list_orders_by_creation_not_id_or_update(self, state_store: StateStore) -> None:
        """Listing follows the order runs were created, whatever their ids or later updates."""
        for run_id in ["zeta", "alpha", "Mu", "beta"]:
            await create(state_store, run_id)
        alpha = await state_store.get_run("acme", "alpha")
        assert alpha is not None
        await state_store.put_run(alpha.model_copy(update={"data": {"updated": True}}))
        await state_store.patch_run("acme", "zeta", iterations=1)
        page = await state_store.list_runs("acme")
        assert [r.run_id for r in page.items] == ["zeta", "alpha", "Mu", "beta"]

    async def test_list_filters_by_session_and_status(self, state_store: StateStore) -> None:
        """list_runs filters by session and/or status, still in seq order."""
        specs = [
            ("r0", "s1", RunStatus.RUNNING),
            ("r1", "s2", RunStatus.RUNNING),
            ("r2", "s1", RunStatus.SUCCEEDED),
            ("r3", None, RunStatus.RUNNING),
            ("r4", "s1", RunStatus.RUNNING),
            ("r5", "s2", RunStatus.FAILED),
            ("r6", "s1", RunStatus.RUNNING),
            ("r7", "s1", RunStatus.CANCELLED),
        ]
        for run_id, session_id, status in specs:
            await create(state_store, run_id, session_id=session_id, status=status)

        async def ids(**filters: Any) -> list[str]:
            return [r.run_id for r in await all_runs(state_store, "acme", **filters)]

        assert await ids(session_id="s1") == ["r0", "r2", "r4", "r6", "r7"]
        assert await ids(status=RunStatus.RUNNING) == ["r0", "r1", "r3", "r4", "r6"]
        assert await ids(status="running", session_id="s1") == ["r0", "r4", "r6"]
        assert await ids(session_id="s2", status="failed") == ["r5"]
        assert await ids(session_id="s3") == []
        assert await ids(status=RunStatus.PENDING) == []

    async def test_status_change_moves_a_run_between_listings(
        self, state_store: StateStore
    ) -> None:
        """After a put changes a run's status it is listed under the new status only."""
        created = await create(state_store, "run_1", status=RunStatus.RUNNING)
        await create(state_store, "run_2", status=RunStatus.RUNNING)
        await state_store.put_run(created.model_copy(update={"status": RunStatus.SUCCEEDED}))
        running = await state_store.list_runs("acme", status="running")
        done = await state_store.list_runs("acme", status="succeeded")
        assert [r.run_id for r in running.items] == ["run_2"]
        assert [r.run_id for r in done.items] == ["run_1"]
        assert done.items[0].seq == created.seq

    async def test_paging_under_concurrent_updates_neither_skips_nor_repeats(
        self, state_store: StateStore
    ) -> None:
        """An update during paging cannot make a run that existed when paging began be skipped
        or repeated."""
        original = [f"run_{i:02d}" for i in range(30)]
        for run_id in original:
            await create(state_store, run_id, status=RunStatus.RUNNING)
        stop = asyncio.Event()
        wrote = asyncio.Event()
        writes = 0  # puts, patches and creates the churn task has completed

        def count_write() -> None:
            nonlocal writes
            writes += 1
            wrote.set()

        async def churn() -> None:
            # Rewrites every run (blob, status, counters) and keeps creating new ones.
            round_ = 0
            try:
                while not stop.is_set():
                    round_ += 1
                    for run_id in original[::-1]:
                        run = await state_store.get_run("acme", run_id)
                        assert run is not None
                        await state_store.put_run(
                            run.model_copy(
                                update={"data": {"round": round_}, "status": RunStatus.SUCCEEDED}
                            )
                        )
                        count_write()
                        await state_store.patch_run("acme", run_id, iterations=1)
                        count_write()
                        await asyncio.sleep(0)
                    await create(state_store, f"new_{round_:03d}")
                    count_write()
                    await asyncio.sleep(0)
            finally:
                wrote.set()  # a churn that died wakes the pager; awaiting it raises why

        # The churn's write count when each page arrived.
        writes_at_page: list[int] = []

        async def page_through() -> list[str]:
            seen: list[str] = []
            after: str | None = None
            while True:
                page = await state_store.list_runs("acme", limit=4, after=after)
                writes_at_page.append(writes)
                seen.extend(r.run_id for r in page.items)
                if page.next is None:
                    return seen
                after = page.next
                # Small pages, and no next page before the churn has completed another write:
                # a server's round trips (or the memory store, which never yields) could
                # otherwise let every page come before the churn's first write.
                while writes == writes_at_page[-1] and not churner.done():
                    wrote.clear()
                    await asyncio.wait_for(wrote.wait(), timeout=30)

        churner = asyncio.create_task(churn())
        try:
            seen = await page_through()
        finally:
            stop.set()
            await churner
        # The churn really wrote between every two pages, or this test would prove nothing.
        assert len(writes_at_page) >= len(original) // 4
        assert writes_at_page[-1] - writes_at_page[0] > 0, "no write landed while paging"
        assert writes_at_page == sorted(set(writes_at_page)), "pages came with no write between"
        assert len(seen) == len(set(seen)), "a run was listed twice"
        assert set(original) <= set(seen), "a run that existed when paging began was skipped"
        assert [s for s in seen if s in set(original)] == original

    async def test_paging_between_updates_and_creates(self, state_store: StateStore) -> None:
        """Runs updated and created between pages: every original run is listed exactly once."""
        original = [f"run_{i:02d}" for i in range(20)]
        for run_id in original:
            await create(state_store, run_id)
        seen: list[str] = []
        after: str | None = None
        created = 0
        while True:
            page = await state_store.list_runs("acme", limit=6, after=after)
            seen.extend(r.run_id for r in page.items)
            # Touch every run before and after the cursor, and add two more.
            for run_id in original:
                await state_store.patch_run("acme", run_id, cursor=1)
            for _ in range(2):
                created += 1
                await create(state_store, f"late_{created:02d}")
            if page.next is None:
                break
            after = page.next
        assert len(seen) == len(set(seen))
        assert [s for s in seen if s.startswith("run_")] == original

    # -- tenants ----------------------------------------------------------------

    async def test_tenants_are_isolated(self, state_store: StateStore) -> None:
        """A tenant never sees another's runs, even 'a:b' beside tenant 'a' with run 'b:x'."""
        one = await create(state_store, "b:x", tenant="a", data={"owner": "a"})
        two = await create(state_store, "x", tenant="a:b", data={"owner": "a:b"})
        assert await state_store.get_run("a", "b:x") == one
        assert await state_store.get_run("a:b", "x") == two
        assert await state_store.get_run("a", "x") is None
        assert await state_store.get_run("a:b", "b:x") is None
        assert [r.run_id for r in (await state_store.list_runs("a")).items] == ["b:x"]
        assert [r.run_id for r in (await state_store.list_runs("a:b")).items] == ["x"]
        await state_store.patch_run("a", "b:x", input_tokens=1)
        stored_two = await state_store.get_run("a:b", "x")
        assert stored_two == two
        assert await state_store.delete_run("a:b", "b:x") is False
        assert await state_store.get_run("a", "b:x") is not None

    async def test_same_run_id_in_two_tenants(self, state_store: StateStore) -> None:
        """The same run id under two tenants is two runs with their own versions and counters."""
        await create(state_store, "run_1", tenant="t1")
        await create(state_store, "run_1", tenant="t2")
        await state_store.patch_run("t1", "run_1", input_tokens=7)
        t1 = await state_store.get_run("t1", "run_1")
        t2 = await state_store.get_run("t2", "run_1")
        assert t1 is not None and t2 is not None
        assert (t1.version, t1.input_tokens) == (2, 7)
        assert (t2.version, t2.input_tokens) == (1, 0)

    # -- sessions ---------------------------------------------------------------

    async def test_get_missing_session_is_none(self, state_store: StateStore) -> None:
        """get_session of a session that is not there returns None."""
        assert await state_store.get_session("acme", "nope") is None

    async def test_session_put_get_and_version(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """Sessions are versioned like runs: version 0 creates, the stored version updates."""
        created = await state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data={"topic": "billing"})
        )
        assert created.version == 1
        assert created.data == {"topic": "billing"}
        assert created.created_at == created.updated_at == clock.now()
        assert isinstance(created.seq, int)
        assert await state_store.get_session("acme", "s1") == created
        clock.advance(2)
        updated = await state_store.put_session(created.model_copy(update={"data": {"n": 2}}))
        assert updated.version == 2
        assert updated.data == {"n": 2}
        assert updated.created_at == created.created_at
        assert updated.updated_at == clock.now()
        assert updated.seq == created.seq
        assert await state_store.get_session("acme", "s1") == updated

    async def test_stale_session_put_is_refused(self, state_store: StateStore) -> None:
        """A stale session put raises StateConflictError(kind='session') with both versions;
        nothing is written."""
        created = await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        current = await state_store.put_session(created.model_copy(update={"data": {"v": 2}}))
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_session(created.model_copy(update={"data": {"v": "stale"}}))
        assert (caught.value.expected, caught.value.actual) == (1, 2)
        assert caught.value.kind == "session"
        assert caught.value.record_id == "s1"
        with pytest.raises(StateConflictError) as again:
            await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        assert (again.value.expected, again.value.actual) == (0, 2)
        with pytest.raises(StateConflictError) as missing:
            await state_store.put_session(SessionRecord(tenant="acme", session_id="s2", version=1))
        assert (missing.value.expected, missing.value.actual) == (1, 0)
        assert await state_store.get_session("acme", "s1") == current
        assert await state_store.get_session("acme", "s2") is None

    async def test_list_sessions_pages_in_seq_order(self, state_store: StateStore) -> None:
        """list_sessions pages in seq order with limit and after; other tenants are not listed."""
        names = ["s-z", "s-a", "s-m", "s-b", "s-y"]
        for name in names:
            await state_store.put_session(SessionRecord(tenant="acme", session_id=name))
        await state_store.put_session(SessionRecord(tenant="other", session_id="s-q"))
        first = await state_store.list_sessions("acme", limit=2)
        assert [s.session_id for s in first.items] == ["s-z", "s-a"]
        assert first.next is not None
        second = await state_store.list_sessions("acme", limit=2, after=first.next)
        assert [s.session_id for s in second.items] == ["s-m", "s-b"]
        assert second.next is not None
        third = await state_store.list_sessions("acme", limit=2, after=second.next)
        assert [s.session_id for s in third.items] == ["s-y"]
        assert third.next is None
        empty = await state_store.list_sessions("nobody")
        assert (empty.items, empty.next) == ([], None)

    async def test_session_indexes_its_runs(self, state_store: StateStore) -> None:
        """A session indexes its runs: list_runs(session_id=) lists them, and moving a run to
        another session moves it between the listings."""
        await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        await state_store.put_session(SessionRecord(tenant="acme", session_id="s2"))
        moving = await create(state_store, "r1", session_id="s1")
        await create(state_store, "r2", session_id="s2")
        await create(state_store, "r3", session_id="s1")
        await create(state_store, "r4")
        await state_store.put_run(moving.model_copy(update={"session_id": "s2"}))

        async def ids(session_id: str) -> list[str]:
            return [r.run_id for r in await all_runs(state_store, "acme", session_id=session_id)]

        assert await ids("s1") == ["r3"]
        assert await ids("s2") == ["r1", "r2"]

    async def test_run_may_name_an_unstored_session(self, state_store: StateStore) -> None:
        """A run may name a session that was never stored; it is listed under that session."""
        created = await create(state_store, "r1", session_id="never-stored")
        assert created.session_id == "never-stored"
        assert await state_store.get_session("acme", "never-stored") is None
        page = await state_store.list_runs("acme", session_id="never-stored")
        assert [r.run_id for r in page.items] == ["r1"]
