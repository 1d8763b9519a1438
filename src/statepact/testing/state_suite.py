"""``StateStoreConformance``: the behaviour every ``StateStore`` backing must show.

Subclass it in a test module and provide two fixtures:

- ``state_store``: a fresh, empty ``StateStore`` built with the test's ``clock``
  and the default ``max_value_bytes``. It must see nothing another test wrote.
- ``clock``: the ``ManualClock`` the store was built with. The class defines it
  as the plugin's ``statepact_clock``, so a fixture built with
  ``statepact_clock`` (or with ``clock``, inside the class) needs nothing more.

::

    import pytest
    from statepact.testing.state_suite import StateStoreConformance

    @pytest.fixture
    def state_store(statepact_clock):
        return MyStateStore(clock=statepact_clock)

    class TestMyStateStore(StateStoreConformance):
        pass

The suite uses the public API and the clock only: never a backing's internals,
never the server's time. It must run unchanged against every backing; memory
(``MemoryStateStore``) is the reference, so a backing that fails a test here is
wrong, not the suite. A known divergence is a strict ``xfail`` in the subclass,
with its reason.

What it pins beyond the protocol docstrings:

- ``seq`` values are opaque increasing integers; only their order is asserted.
- ``patch_run`` always bumps the version, even when every delta is zero.
- A stale put (``expected != stored``) raises
  ``StateConflictError(tenant=, record_id=, kind="run"|"session", expected=, actual=)``;
  ``actual`` is 0 when the record does not exist; creating (version 0) a record
  that exists is a conflict too.
- A counter that would pass ``2**63 - 1`` (cost: nano-units) raises ``ValueError``
  naming it, and nothing is written.
- The last page has ``next=None`` even when it is full.
- A run may name a session that was never stored; a session indexes its runs
  through ``list_runs(tenant, session_id=...)``; moving a run to another session
  moves it between the listings.
- A deleted run can be created again from version 0, with zero counters and a
  new, greater ``seq``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, timedelta
from decimal import Context, Decimal, localcontext
from typing import Any, TypeVar

import pytest

from statepact._limits import DEFAULT_MAX_VALUE_BYTES, MAX_COUNTER
from statepact.clock import ManualClock
from statepact.errors import RunNotFoundError, StateConflictError, StatePersistenceError
from statepact.models import RunRecord, RunStatus, SessionRecord
from statepact.state import StateStore
from statepact.testing._inputs import (
    AWARE_ELSEWHERE,
    EACH_ACCEPTED_JSON,
    EACH_BROKEN_CLOCK,
    EACH_HOSTILE_DECIMAL_CONTEXT,
    EACH_REFUSED_JSON,
    LyingInt,
    LyingText,
    Mood,
    assert_plain_json,
    assert_refused_at,
)
from statepact.testing._state_retention import StateRetentionConformance

__all__ = ["StateStoreConformance"]

LIMIT = DEFAULT_MAX_VALUE_BYTES
T = TypeVar("T")


async def _bounded(calls: Sequence[Callable[[], Awaitable[T]]], *, width: int = 50) -> list[T]:
    """Run the calls concurrently, at most ``width`` at a time, in order of results."""
    results: list[T] = []
    for start in range(0, len(calls), width):
        results.extend(await asyncio.gather(*(call() for call in calls[start : start + width])))
    return results


async def _create(
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


async def _all_runs(store: StateStore, tenant: str, **filters: Any) -> list[RunRecord]:
    runs: list[RunRecord] = []
    after: str | None = None
    while True:
        page = await store.list_runs(tenant, limit=3, after=after, **filters)
        runs.extend(page.items)
        if page.next is None:
            return runs
        after = page.next


class StateStoreConformance(StateRetentionConformance):
    """One test per promise of ``StateStore``; see the module docstring for the fixtures.

    ``prune_runs`` and ``delete_session`` are pinned by ``StateRetentionConformance``
    (``testing/_state_retention.py``), which this class inherits."""

    @pytest.fixture
    def clock(self, statepact_clock: ManualClock) -> ManualClock:
        """The suite's clock is the plugin's ``statepact_clock``: build the backing with either."""
        return statepact_clock

    # -- get, create, put ---------------------------------------------------

    async def test_is_a_state_store(self, state_store: StateStore) -> None:
        """The backing satisfies the ``StateStore`` protocol."""
        assert isinstance(state_store, StateStore)

    async def test_get_missing_run_is_none(self, state_store: StateStore) -> None:
        """get_run of a run that is not there returns None."""
        assert await state_store.get_run("acme", "nope") is None

    async def test_create_starts_at_version_one_with_zero_counters(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """Version 0 creates the run: version 1, counters start at zero, seq is assigned."""
        created = await _create(
            state_store, "run_1", session_id="s1", status=RunStatus.RUNNING, data={"step": 1}
        )
        assert created.tenant == "acme"
        assert created.run_id == "run_1"
        assert created.session_id == "s1"
        assert created.status is RunStatus.RUNNING
        assert created.data == {"step": 1}
        assert created.version == 1
        assert (created.input_tokens, created.output_tokens, created.iterations) == (0, 0, 0)
        assert created.cursor == 0
        assert created.cost == Decimal(0)
        assert isinstance(created.seq, int)
        assert created.created_at == created.updated_at == clock.now()

    async def test_put_returns_what_get_returns(self, state_store: StateStore) -> None:
        """put_run returns the stored record, exactly as get_run then reads it."""
        created = await _create(state_store, "run_1", data={"a": [1, 2, {"b": None}]})
        assert await state_store.get_run("acme", "run_1") == created
        updated = await state_store.put_run(
            created.model_copy(update={"data": {"a": "b"}, "status": RunStatus.SUCCEEDED})
        )
        assert await state_store.get_run("acme", "run_1") == updated

    async def test_put_returns_its_data_as_a_read_decodes_it(self, state_store: StateStore) -> None:
        """The data a put returns is what a read decodes (a tuple as a list, text and
        floats as stored), its own copy: the caller changing its dict afterwards changes
        neither the returned record nor the stored run."""
        mine: dict[str, Any] = {"t": (1, 2), "ü": 1.5, "n": {"k": [True, None]}}
        created = await _create(state_store, "run_1", data=mine)
        mine["n"]["k"].append(3)
        expected = {"t": [1, 2], "ü": 1.5, "n": {"k": [True, None]}}
        assert created.data == expected
        assert (await state_store.get_run("acme", "run_1")) == created
        mine = {"again": [mine["t"]]}
        updated = await state_store.put_run(created.model_copy(update={"data": mine}))
        mine["again"].append("later")
        assert updated.data == {"again": [[1, 2]]}
        assert await state_store.get_run("acme", "run_1") == updated

    async def test_put_with_current_version_bumps_it(self, state_store: StateStore) -> None:
        """A put holding the stored version writes blob, status and session, then version+1."""
        created = await _create(state_store, "run_1", data={"step": 1})
        updated = await state_store.put_run(
            created.model_copy(
                update={"data": {"step": 2}, "status": RunStatus.RUNNING, "session_id": "s9"}
            )
        )
        assert updated.version == 2
        assert updated.data == {"step": 2}
        assert updated.status is RunStatus.RUNNING
        assert updated.session_id == "s9"
        assert updated.seq == created.seq
        again = await state_store.put_run(updated.model_copy(update={"session_id": None}))
        assert again.version == 3
        assert again.session_id is None

    async def test_stale_put_is_refused_with_both_versions(self, state_store: StateStore) -> None:
        """A put holding a version the store has moved past raises StateConflictError with both
        numbers, and nothing is written."""
        created = await _create(state_store, "run_1", data={"step": 1})
        await state_store.patch_run("acme", "run_1", input_tokens=5)
        before = await state_store.get_run("acme", "run_1")
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_run(created.model_copy(update={"data": {"step": 99}}))
        assert caught.value.expected == 1
        assert caught.value.actual == 2
        assert caught.value.tenant == "acme"
        assert caught.value.record_id == "run_1"
        assert caught.value.kind == "run"
        assert caught.value.retryable is False
        assert await state_store.get_run("acme", "run_1") == before

    async def test_put_ahead_of_the_store_is_refused(self, state_store: StateStore) -> None:
        """A put holding a version the store never had is a conflict too; nothing is written."""
        created = await _create(state_store, "run_1")
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_run(created.model_copy(update={"version": 7, "data": {"x": 1}}))
        assert (caught.value.expected, caught.value.actual) == (7, 1)
        assert await state_store.get_run("acme", "run_1") == created

    async def test_creating_an_existing_run_is_a_conflict(self, state_store: StateStore) -> None:
        """Creating a run that exists raises StateConflictError(expected=0, actual=1)."""
        created = await _create(state_store, "run_1", data={"first": True})
        with pytest.raises(StateConflictError) as caught:
            await _create(state_store, "run_1", data={"second": True})
        assert (caught.value.expected, caught.value.actual) == (0, 1)
        assert await state_store.get_run("acme", "run_1") == created

    async def test_update_of_a_missing_run_is_a_conflict(self, state_store: StateStore) -> None:
        """A put with version > 0 of a missing run raises StateConflictError(actual=0)."""
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_run(RunRecord(tenant="acme", run_id="ghost", version=3))
        assert (caught.value.expected, caught.value.actual) == (3, 0)
        assert await state_store.get_run("acme", "ghost") is None

    async def test_concurrent_creates_one_wins(self, state_store: StateStore) -> None:
        """Of ten concurrent creates of one run exactly one lands; the rest are conflicts."""
        results = await asyncio.gather(
            *(_create(state_store, "run_1", data={"writer": i}) for i in range(10)),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, RunRecord)]
        losers = [r for r in results if isinstance(r, StateConflictError)]
        assert len(winners) == 1
        assert len(losers) == 9
        assert all((e.expected, e.actual) == (0, 1) for e in losers)
        assert await state_store.get_run("acme", "run_1") == winners[0]

    async def test_concurrent_puts_of_one_version_one_wins(self, state_store: StateStore) -> None:
        """Of ten concurrent puts holding the same version exactly one lands."""
        created = await _create(state_store, "run_1")
        results = await asyncio.gather(
            *(
                state_store.put_run(created.model_copy(update={"data": {"writer": i}}))
                for i in range(10)
            ),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, RunRecord)]
        assert len(winners) == 1
        assert sum(isinstance(r, StateConflictError) for r in results) == 9
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored == winners[0]
        assert stored.version == 2

    async def test_put_never_overwrites_counters(self, state_store: StateStore) -> None:
        """put_run never overwrites the counters, whatever the record it is given holds."""
        created = await _create(state_store, "run_1")
        patched = await state_store.patch_run(
            "acme", "run_1", input_tokens=10, output_tokens=20, cost="0.5", iterations=3, cursor=4
        )
        written = await state_store.put_run(
            patched.model_copy(
                update={
                    "data": {"new": True},
                    "input_tokens": 999,
                    "output_tokens": 0,
                    "cost": Decimal("123.456"),
                    "iterations": 0,
                    "cursor": 77,
                }
            )
        )
        for record in (written, await state_store.get_run("acme", "run_1")):
            assert record is not None
            assert record.data == {"new": True}
            assert (record.input_tokens, record.output_tokens) == (10, 20)
            assert record.cost == Decimal("0.5")
            assert (record.iterations, record.cursor) == (3, 4)
            assert record.seq == created.seq
            assert record.created_at == created.created_at

    async def test_create_with_counters_is_refused(self, state_store: StateStore) -> None:
        """Creating a run with non-zero counters raises ValueError; counters move by patch alone."""
        with pytest.raises(ValueError, match="input_tokens"):
            await state_store.put_run(RunRecord(tenant="acme", run_id="run_1", input_tokens=5))
        assert await state_store.get_run("acme", "run_1") is None

    async def test_put_ignores_a_callers_seq_and_times(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """seq, created_at and updated_at are the store's: a record carrying others changes none."""
        created = await _create(state_store, "run_1")
        clock.advance(5)
        written = await state_store.put_run(
            created.model_copy(
                update={
                    "seq": 10_000,
                    "created_at": clock.now() + timedelta(days=3),
                    "updated_at": clock.now() - timedelta(days=3),
                }
            )
        )
        assert written.seq == created.seq
        assert written.created_at == created.created_at
        assert written.updated_at == clock.now()

    # -- patch ----------------------------------------------------------------

    async def test_patch_adds_deltas_and_bumps_version(self, state_store: StateStore) -> None:
        """patch_run adds the deltas, bumps the version and returns the new record."""
        await _create(state_store, "run_1", data={"keep": "me"})
        first = await state_store.patch_run(
            "acme", "run_1", input_tokens=3, output_tokens=4, cost="0.25", iterations=1, cursor=2
        )
        second = await state_store.patch_run(
            "acme", "run_1", input_tokens=1, cost=Decimal("0.75"), cursor=8
        )
        assert first.version == 2
        assert second.version == 3
        assert (second.input_tokens, second.output_tokens) == (4, 4)
        assert second.cost == Decimal(1)
        assert (second.iterations, second.cursor) == (1, 10)
        assert second.data == {"keep": "me"}
        assert await state_store.get_run("acme", "run_1") == second

    async def test_empty_patch_still_bumps_version(self, state_store: StateStore) -> None:
        """A patch with all deltas zero changes no counter but still bumps the version."""
        created = await _create(state_store, "run_1")
        patched = await state_store.patch_run("acme", "run_1")
        assert patched.version == created.version + 1
        assert patched.input_tokens == 0
        assert patched.cost == Decimal(0)

    async def test_a_patch_makes_an_older_put_stale(self, state_store: StateStore) -> None:
        """A put holding the version from before a patch is refused, not applied over it."""
        created = await _create(state_store, "run_1")
        await state_store.patch_run("acme", "run_1", iterations=1)
        with pytest.raises(StateConflictError):
            await state_store.put_run(created.model_copy(update={"status": RunStatus.FAILED}))
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.status is RunStatus.PENDING
        assert stored.iterations == 1

    async def test_two_concurrent_patches_both_land(self, state_store: StateStore) -> None:
        """Two workers patching at once both land."""
        await _create(state_store, "run_1")
        one, two = await asyncio.gather(
            state_store.patch_run("acme", "run_1", input_tokens=100, cost="0.1"),
            state_store.patch_run("acme", "run_1", input_tokens=23, cost="0.02"),
        )
        assert {one.version, two.version} == {2, 3}
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.input_tokens == 123
        assert stored.cost == Decimal("0.12")
        assert stored.version == 3

    async def test_fifty_concurrent_patches_sum_exactly(self, state_store: StateStore) -> None:
        """Fifty concurrent patches all land: every counter is the exact sum."""
        await _create(state_store, "run_1")
        results = await asyncio.gather(
            *(
                state_store.patch_run(
                    "acme",
                    "run_1",
                    input_tokens=i,
                    output_tokens=2,
                    cost="0.01",
                    iterations=1,
                    cursor=i % 3,
                )
                for i in range(50)
            )
        )
        assert sorted(r.version for r in results) == list(range(2, 52))
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.input_tokens == sum(range(50))
        assert stored.output_tokens == 100
        assert stored.cost == Decimal("0.50")
        assert stored.iterations == 50
        assert stored.cursor == sum(i % 3 for i in range(50))
        assert stored.version == 51

    async def test_concurrent_patches_of_many_runs_each_land_once(
        self, state_store: StateStore
    ) -> None:
        """Thirty workers patching their own runs at once, three rounds, and a run patched
        twice in one round: each call answers its own run as it left it, and every counter
        is the exact sum (a backing may send concurrent writes together, never mixed up)."""
        runs = [f"run_{n}" for n in range(30)]
        for run_id in runs:
            await _create(state_store, run_id)
        for round_ in range(3):
            calls = [(run_id, n + 1) for n, run_id in enumerate(runs)] + [("run_0", 100)]
            results = await asyncio.gather(
                *(
                    state_store.patch_run(
                        "acme", run_id, input_tokens=amount, cost=Decimal(amount) / 1000
                    )
                    for run_id, amount in calls
                )
            )
            for (run_id, _amount), result in zip(calls, results, strict=True):
                assert (result.tenant, result.run_id) == ("acme", run_id)
            for n, result in enumerate(results[1:30], start=1):
                assert result.version == round_ + 2
                assert result.input_tokens == (n + 1) * (round_ + 1)
        for n, run_id in enumerate(runs):
            stored = await state_store.get_run("acme", run_id)
            assert stored is not None
            extra = 300 if n == 0 else 0
            assert stored.input_tokens == 3 * (n + 1) + extra
            assert stored.cost == Decimal(3 * (n + 1) + extra) / 1000
            assert stored.version == (7 if n == 0 else 4)

    async def test_concurrent_puts_of_many_runs_each_land_once(
        self, state_store: StateStore
    ) -> None:
        """Thirty workers putting their own runs at once, three rounds: each call answers its
        own run with its own blob and the next version, and each run keeps its last blob."""
        records = {run_id: await _create(state_store, run_id) for run_id in ("a", "b", "c")}
        records.update({f"run_{n}": await _create(state_store, f"run_{n}") for n in range(27)})
        for round_ in range(3):
            results = await asyncio.gather(
                *(
                    state_store.put_run(
                        record.model_copy(
                            update={"data": {"run": run_id, "round": round_}, "session_id": run_id}
                        )
                    )
                    for run_id, record in records.items()
                )
            )
            for (run_id, record), result in zip(records.items(), results, strict=True):
                assert (result.run_id, result.version) == (run_id, record.version + 1)
                assert (result.data, result.session_id) == (
                    {"run": run_id, "round": round_},
                    run_id,
                )
                records[run_id] = result
        for run_id in records:
            stored = await state_store.get_run("acme", run_id)
            assert stored is not None
            assert (stored.version, stored.data) == (4, {"run": run_id, "round": 2})

    async def test_concurrent_writes_refused_alone_while_the_others_land(
        self, state_store: StateStore
    ) -> None:
        """Among concurrent writes of many runs, a patch of a missing run, a patch past a
        counter's limit and a put of a stale version are refused, each with its own error,
        and change nothing; every other write lands."""
        for n in range(10):
            await _create(state_store, f"run_{n}")
        stale = await _create(state_store, "stale")
        await state_store.patch_run("acme", "stale", iterations=1)
        await _create(state_store, "full")
        for _ in range(2):  # a delta is below 2**62: two come to MAX_COUNTER - 1
            await state_store.patch_run("acme", "full", iterations=2**62 - 1)
        calls = [state_store.patch_run("acme", f"run_{n}", iterations=n + 1) for n in range(5)]
        calls += [
            state_store.patch_run("acme", "missing", iterations=1),
            state_store.patch_run("acme", "full", iterations=2),
            state_store.put_run(stale.model_copy(update={"data": {"lost": True}})),
        ]
        calls += [state_store.patch_run("acme", f"run_{n}", iterations=n + 1) for n in range(5, 10)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[5], RunNotFoundError)
        assert isinstance(results[6], ValueError) and "iterations" in str(results[6])
        assert isinstance(results[7], StateConflictError)
        assert (results[7].expected, results[7].actual) == (stale.version, stale.version + 1)
        landed = results[:5] + results[8:]
        for n, result in enumerate(landed):
            assert isinstance(result, RunRecord)
            assert (result.run_id, result.iterations, result.version) == (f"run_{n}", n + 1, 2)
        assert await state_store.get_run("acme", "missing") is None
        for run_id, version, iterations in (("stale", 2, 1), ("full", 3, MAX_COUNTER - 1)):
            stored = await state_store.get_run("acme", run_id)
            assert stored is not None
            assert (stored.version, stored.iterations, stored.data) == (version, iterations, {})

    async def test_a_thousand_nano_costs_sum_exactly(self, state_store: StateStore) -> None:
        """Cost is exact to 1e-9: 1,000 patches of 0.000000001 sum to exactly 0.000001."""
        await _create(state_store, "run_1")
        calls = [
            lambda: state_store.patch_run("acme", "run_1", cost=Decimal("0.000000001"))
            for _ in range(1000)
        ]
        await _bounded(calls)
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.cost == Decimal("0.000001")
        assert isinstance(stored.cost, Decimal)
        assert stored.version == 1001

    @pytest.mark.parametrize(
        "field", ["input_tokens", "output_tokens", "cost", "iterations", "cursor"]
    )
    async def test_negative_delta_is_refused(self, state_store: StateStore, field: str) -> None:
        """A negative delta raises ValueError naming the counter, and nothing is written."""
        await _create(state_store, "run_1")
        before = await state_store.patch_run("acme", "run_1", input_tokens=1, cost="1")
        with pytest.raises(ValueError, match=field):
            await state_store.patch_run("acme", "run_1", **{field: -1})
        assert await state_store.get_run("acme", "run_1") == before

    async def test_patch_of_missing_run_raises_run_not_found(self, state_store: StateStore) -> None:
        """patch_run of a run that is not there raises RunNotFoundError naming it."""
        with pytest.raises(RunNotFoundError) as caught:
            await state_store.patch_run("acme", "ghost", input_tokens=1)
        assert (caught.value.tenant, caught.value.run_id) == ("acme", "ghost")
        assert caught.value.retryable is False
        assert await state_store.get_run("acme", "ghost") is None

    @pytest.mark.parametrize(
        ("field", "step"),
        [("input_tokens", 2**62 - 1), ("cost", Decimal("4611686018.427387903"))],
    )
    async def test_counter_overflow_is_refused(
        self, state_store: StateStore, field: str, step: Any
    ) -> None:
        """A patch that would take a counter past 2**63-1 raises ValueError naming it; nothing
        is written."""
        await _create(state_store, "run_1")
        await state_store.patch_run("acme", "run_1", **{field: step})
        before = await state_store.patch_run("acme", "run_1", **{field: step})
        small: Any = 2 if field == "input_tokens" else Decimal("0.000000002")
        with pytest.raises(ValueError, match=field):
            await state_store.patch_run("acme", "run_1", iterations=1, **{field: small})
        assert await state_store.get_run("acme", "run_1") == before

    async def test_cost_round_trips_as_exact_decimal(self, state_store: StateStore) -> None:
        """Cost comes back as the exact Decimal that was added, from Decimal, str or int."""
        await _create(state_store, "run_1")
        patched = await state_store.patch_run("acme", "run_1", cost=Decimal("1234.567890123"))
        assert patched.cost == Decimal("1234.567890123")
        patched = await state_store.patch_run("acme", "run_1", cost="0.000000877")
        patched = await state_store.patch_run("acme", "run_1", cost=7)
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert isinstance(stored.cost, Decimal)
        assert stored.cost == Decimal("1241.567891000")
        assert stored == patched

    @pytest.mark.parametrize(
        ("cost", "error"),
        [
            (0.1, TypeError),
            ("0.0000000001", ValueError),
            ("NaN", ValueError),
            ("abc", ValueError),
            (True, TypeError),
        ],
    )
    async def test_inexact_cost_is_refused(
        self, state_store: StateStore, cost: Any, error: type[Exception]
    ) -> None:
        """A float cost, one finer than 1e-9 or not a number is refused naming cost; nothing
        is written."""
        created = await _create(state_store, "run_1")
        with pytest.raises(error, match="cost"):
            await state_store.patch_run("acme", "run_1", cost=cost)
        assert await state_store.get_run("acme", "run_1") == created

    @EACH_HOSTILE_DECIMAL_CONTEXT
    async def test_cost_is_exact_whatever_the_callers_decimal_context(
        self, state_store: StateStore, context: Context
    ) -> None:
        """cost stays exact to 1e-9 under any decimal context the caller set (a low precision,
        trapped Inexact/Rounded, a tiny Emax): the patch lands once, exactly, and reads back."""
        await _create(state_store, "run_1")
        with localcontext(context):
            patched = await state_store.patch_run("acme", "run_1", cost="1.234567891")
            again = await state_store.patch_run("acme", "run_1", cost=Decimal("1234.000000009"))
            stored = await state_store.get_run("acme", "run_1")
            listed = (await state_store.list_runs("acme")).items
        assert str(patched.cost) == "1.234567891"
        assert str(again.cost) == "1235.234567900"
        assert stored == again
        assert listed == [again]
        assert again.version == 3
        assert await state_store.get_run("acme", "run_1") == again

    @EACH_HOSTILE_DECIMAL_CONTEXT
    async def test_cost_limits_hold_whatever_the_callers_decimal_context(
        self, state_store: StateStore, context: Context
    ) -> None:
        """Under a caller's decimal context, a cost finer than 1e-9 and one past the counter's
        limit are still refused naming cost, and a cost at the limit still lands exactly."""
        await _create(state_store, "run_1")
        for _ in range(2):
            await state_store.patch_run("acme", "run_1", cost=Decimal("4611686018.427387903"))
        with localcontext(context):
            with pytest.raises(ValueError, match=r"^cost"):
                await state_store.patch_run("acme", "run_1", cost="0.1234567891")
            at_limit = await state_store.patch_run("acme", "run_1", cost="0.000000001")
            with pytest.raises(ValueError, match=r"^cost"):
                await state_store.patch_run("acme", "run_1", cost="0.000000001")
        assert str(at_limit.cost) == "9223372036.854775807"
        assert await state_store.get_run("acme", "run_1") == at_limit

    @pytest.mark.parametrize(
        "cost",
        [
            "1e999999999",
            "-1e999999999",
            Decimal("1E+999999999"),
            "1e-999999999",
            "1e999999999999999999999",
            "12345678901",
            "1." + "0" * 60 + "1",
        ],
    )
    async def test_a_cost_with_an_extreme_exponent_is_refused_naming_cost(
        self, state_store: StateStore, cost: Any
    ) -> None:
        """A cost with a huge or tiny exponent (or too many digits) is a ValueError naming cost,
        never a decimal signal; nothing is written."""
        created = await _create(state_store, "run_1")
        with pytest.raises(ValueError, match=r"^cost"):
            await state_store.patch_run("acme", "run_1", cost=cost)
        assert await state_store.get_run("acme", "run_1") == created

    @pytest.mark.parametrize("cost", ["0e999999999", "-0", "1." + "0" * 60, "0.100000000000"])
    async def test_an_exact_cost_in_a_long_spelling_lands(
        self, state_store: StateStore, cost: str
    ) -> None:
        """A cost that is exact to 1e-9 lands however it is spelt (zeros, a huge exponent on 0)."""
        await _create(state_store, "run_1")
        patched = await state_store.patch_run("acme", "run_1", cost=cost)
        assert patched.cost == Decimal(cost)
        assert patched.version == 2

    # -- listing ---------------------------------------------------------------

    async def test_list_pages_in_seq_order(self, state_store: StateStore) -> None:
        """list_runs pages by seq: limit bounds a page, next resumes after it, the last page
        has next=None."""
        for i in range(12):
            await _create(state_store, f"run_{i:02d}")
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
            await _create(state_store, f"run_{i}")
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
            await _create(state_store, run_id)
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
            await _create(state_store, run_id, session_id=session_id, status=status)

        async def ids(**filters: Any) -> list[str]:
            return [r.run_id for r in await _all_runs(state_store, "acme", **filters)]

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
        created = await _create(state_store, "run_1", status=RunStatus.RUNNING)
        await _create(state_store, "run_2", status=RunStatus.RUNNING)
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
            await _create(state_store, run_id, status=RunStatus.RUNNING)
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
                    await _create(state_store, f"new_{round_:03d}")
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
            await _create(state_store, run_id)
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
                await _create(state_store, f"late_{created:02d}")
            if page.next is None:
                break
            after = page.next
        assert len(seen) == len(set(seen))
        assert [s for s in seen if s.startswith("run_")] == original

    # -- delete -----------------------------------------------------------------

    async def test_delete_removes_run_and_index_entries(self, state_store: StateStore) -> None:
        """delete_run removes the run, its counters and its index entries together."""
        await _create(state_store, "run_1", session_id="s1", status=RunStatus.RUNNING)
        await _create(state_store, "run_2", session_id="s1", status=RunStatus.RUNNING)
        await state_store.patch_run("acme", "run_1", input_tokens=9)
        assert await state_store.delete_run("acme", "run_1") is True
        assert await state_store.get_run("acme", "run_1") is None
        listings: list[dict[str, Any]] = [{}, {"session_id": "s1"}, {"status": "running"}]
        for filters in listings:
            page = await state_store.list_runs("acme", **filters)
            assert [r.run_id for r in page.items] == ["run_2"], filters
        with pytest.raises(RunNotFoundError):
            await state_store.patch_run("acme", "run_1", input_tokens=1)

    async def test_delete_of_missing_run_is_false(self, state_store: StateStore) -> None:
        """delete_run of a run that is not there returns False; a second delete too."""
        assert await state_store.delete_run("acme", "ghost") is False
        await _create(state_store, "run_1")
        assert await state_store.delete_run("acme", "run_1") is True
        assert await state_store.delete_run("acme", "run_1") is False

    async def test_deleted_run_can_be_created_again(self, state_store: StateStore) -> None:
        """A deleted run is created again from version 0: zero counters and a greater seq."""
        first = await _create(state_store, "run_1")
        await state_store.patch_run("acme", "run_1", input_tokens=5, cost="1.5")
        await state_store.delete_run("acme", "run_1")
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_run(first.model_copy(update={"version": 2}))
        assert caught.value.actual == 0
        again = await _create(state_store, "run_1", data={"again": True})
        assert again.version == 1
        assert again.input_tokens == 0
        assert again.cost == Decimal(0)
        assert first.seq is not None and again.seq is not None
        assert again.seq > first.seq

    # -- tenants ----------------------------------------------------------------

    async def test_tenants_are_isolated(self, state_store: StateStore) -> None:
        """A tenant never sees another's runs, even 'a:b' beside tenant 'a' with run 'b:x'."""
        one = await _create(state_store, "b:x", tenant="a", data={"owner": "a"})
        two = await _create(state_store, "x", tenant="a:b", data={"owner": "a:b"})
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
        await _create(state_store, "run_1", tenant="t1")
        await _create(state_store, "run_1", tenant="t2")
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
        moving = await _create(state_store, "r1", session_id="s1")
        await _create(state_store, "r2", session_id="s2")
        await _create(state_store, "r3", session_id="s1")
        await _create(state_store, "r4")
        await state_store.put_run(moving.model_copy(update={"session_id": "s2"}))

        async def ids(session_id: str) -> list[str]:
            return [r.run_id for r in await _all_runs(state_store, "acme", session_id=session_id)]

        assert await ids("s1") == ["r3"]
        assert await ids("s2") == ["r1", "r2"]

    async def test_run_may_name_an_unstored_session(self, state_store: StateStore) -> None:
        """A run may name a session that was never stored; it is listed under that session."""
        created = await _create(state_store, "r1", session_id="never-stored")
        assert created.session_id == "never-stored"
        assert await state_store.get_session("acme", "never-stored") is None
        page = await state_store.list_runs("acme", session_id="never-stored")
        assert [r.run_id for r in page.items] == ["r1"]

    # -- time ---------------------------------------------------------------------

    async def test_times_come_from_the_injected_clock(
        self, state_store: StateStore, clock: ManualClock
    ) -> None:
        """created_at and updated_at come from the injected clock, never the server's."""
        start = clock.now()
        created = await _create(state_store, "run_1")
        assert created.created_at == start
        assert created.updated_at == start
        clock.advance(timedelta(hours=5, microseconds=7))
        patched = await state_store.patch_run("acme", "run_1", iterations=1)
        assert patched.created_at == start
        assert patched.updated_at == clock.now()
        clock.advance(1.5)
        written = await state_store.put_run(patched.model_copy(update={"data": {"x": 1}}))
        assert written.created_at == start
        assert written.updated_at == clock.now()
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.updated_at == clock.now()
        assert stored.updated_at is not None and stored.updated_at.utcoffset() == timedelta(0)

    @EACH_BROKEN_CLOCK
    async def test_a_clock_without_a_timezone_is_refused_naming_the_clock(
        self,
        state_store: StateStore,
        clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch,
        reading: Any,
        error: type[Exception],
    ) -> None:
        """A clock whose now() is naive or not a datetime is refused naming the clock, by
        every call that reads it, before anything is written."""
        created = await _create(state_store, "run_1")
        session = await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        monkeypatch.setattr(clock, "now", lambda: reading)
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: _create(state_store, "run_2"),
            lambda: state_store.put_run(created.model_copy(update={"data": {"x": 1}})),
            lambda: state_store.patch_run("acme", "run_1", iterations=1),
            lambda: state_store.put_session(SessionRecord(tenant="acme", session_id="s2")),
            lambda: state_store.put_session(session.model_copy(update={"data": {"x": 1}})),
        ]
        for call in calls:
            with pytest.raises(error, match=r"^clock"):
                await call()
        monkeypatch.undo()
        assert await state_store.get_run("acme", "run_1") == created
        assert await state_store.get_run("acme", "run_2") is None
        assert await state_store.get_session("acme", "s1") == session
        assert await state_store.get_session("acme", "s2") is None

    async def test_a_clock_in_another_zone_is_stored_as_utc(
        self, state_store: StateStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An aware reading in another zone is the same instant, stored and returned in UTC."""
        monkeypatch.setattr(clock, "now", lambda: AWARE_ELSEWHERE)
        created = await _create(state_store, "run_1")
        session = await state_store.put_session(SessionRecord(tenant="acme", session_id="s1"))
        fetched = await state_store.get_run("acme", "run_1")
        assert fetched is not None
        for moment in (created.created_at, fetched.updated_at, session.created_at):
            assert moment == AWARE_ELSEWHERE
            assert moment is not None and moment.tzinfo is not None
            assert moment.utcoffset() == timedelta(0) and moment == moment.astimezone(UTC)

    # -- size -------------------------------------------------------------------

    async def test_blob_at_the_limit_is_stored(self, state_store: StateStore) -> None:
        """A blob of exactly max_value_bytes serialized bytes is stored and read back whole."""
        data = {"x": "a" * (LIMIT - len('{"x":""}'))}
        created = await _create(state_store, "run_1", data=data)
        assert created.data == data
        assert await state_store.get_run("acme", "run_1") == created

    async def test_blob_over_the_limit_is_refused(self, state_store: StateStore) -> None:
        """A blob over max_value_bytes raises StatePersistenceError(reason='too_large'), not
        retryable, and nothing is written."""
        big = {"x": "a" * (LIMIT - len('{"x":""}') + 1)}
        with pytest.raises(StatePersistenceError) as caught:
            await _create(state_store, "run_1", data=big)
        assert caught.value.reason == "too_large"
        assert caught.value.retryable is False
        assert await state_store.get_run("acme", "run_1") is None
        assert (await state_store.list_runs("acme")).items == []

        created = await _create(state_store, "run_2", data={"small": True})
        with pytest.raises(StatePersistenceError) as again:
            await state_store.put_run(created.model_copy(update={"data": big}))
        assert again.value.reason == "too_large"
        assert await state_store.get_run("acme", "run_2") == created

        with pytest.raises(StatePersistenceError):
            await state_store.put_session(SessionRecord(tenant="acme", session_id="s1", data=big))
        assert await state_store.get_session("acme", "s1") is None

    async def test_the_limit_counts_utf8_bytes(self, state_store: StateStore) -> None:
        """The size limit counts UTF-8 bytes of the serialized blob, not characters."""
        fits = {"x": "é" * ((LIMIT - len('{"x":""}')) // 2)}
        await _create(state_store, "run_1", data=fits)
        over = {"x": "é" * ((LIMIT - len('{"x":""}')) // 2 + 1)}
        with pytest.raises(StatePersistenceError):
            await _create(state_store, "run_2", data=over)
        assert await state_store.get_run("acme", "run_2") is None

    # -- bad input --------------------------------------------------------------

    @pytest.mark.parametrize(
        ("fields", "named", "error"),
        [
            ({"tenant": ""}, "tenant", ValueError),
            ({"run_id": ""}, "run_id", ValueError),
            ({"run_id": "a\x00b"}, "run_id", ValueError),
            ({"session_id": ""}, "session_id", ValueError),
            ({"data": {"x": float("nan")}}, "data", ValueError),
            ({"data": {"x": [1.0, float("inf")]}}, "data", ValueError),
            ({"data": {"x": {1, 2}}}, "data", ValueError),
            ({"data": {"x": object()}}, "data", ValueError),
            ({"data": {"x": b"bytes"}}, "data", ValueError),
            ({"data": {"x": "nul\x00here"}}, "data", ValueError),
            ({"data": {"x": {1: "int key"}}}, "data", ValueError),
        ],
    )
    async def test_bad_run_is_refused_naming_the_field(
        self,
        state_store: StateStore,
        fields: dict[str, Any],
        named: str,
        error: type[Exception],
    ) -> None:
        """Bad input (empty ids, NUL, NaN, non-JSON values, non-string keys) raises
        ValueError/TypeError naming the field, and nothing is written."""
        values: dict[str, Any] = {"tenant": "acme", "run_id": "run_1", **fields}
        record = RunRecord.model_construct(**values)
        with pytest.raises(error, match=named):
            await state_store.put_run(record)
        assert await state_store.get_run("acme", "run_1") is None
        assert (await state_store.list_runs("acme")).items == []

    @pytest.mark.parametrize("data", [[1, 2], "text", None, 3])
    async def test_blob_that_is_not_an_object_is_refused(
        self, state_store: StateStore, data: Any
    ) -> None:
        """A blob that is not a JSON object raises ValueError naming data; nothing is written."""
        record = RunRecord.model_construct(tenant="acme", run_id="run_1", data=data)
        with pytest.raises(ValueError, match="data"):
            await state_store.put_run(record)
        session = SessionRecord.model_construct(tenant="acme", session_id="s1", data=data)
        with pytest.raises(ValueError, match="data"):
            await state_store.put_session(session)
        assert await state_store.get_run("acme", "run_1") is None
        assert await state_store.get_session("acme", "s1") is None

    @EACH_ACCEPTED_JSON
    async def test_json_values_beyond_dict_and_list_are_stored_as_plain_json(
        self, state_store: StateStore, value: Any, stored: Any
    ) -> None:
        """Any Mapping is a JSON object, a tuple an array, a str/int/float subclass its plain
        value: a run and a session read back plain JSON, the same on every backing."""
        data = {"a": {"b": value}}
        created = await _create(state_store, "run_1", data=data)
        session = await state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data=data)
        )
        fetched = await state_store.get_run("acme", "run_1")
        fetched_session = await state_store.get_session("acme", "s1")
        assert fetched is not None and fetched_session is not None
        for record in (created, fetched, session, fetched_session):
            assert record.data == {"a": {"b": stored}}
            assert_plain_json(record.data, "data")

    @EACH_REFUSED_JSON
    async def test_values_json_cannot_hold_are_refused_naming_where(
        self, state_store: StateStore, value: Any, says: str
    ) -> None:
        """A value JSON cannot hold exactly, at any depth and inside any container, raises
        ValueError naming the path (data['a']['b']...); nothing is written."""
        data = {"a": {"b": value}}
        for call in (
            lambda: state_store.put_run(RunRecord(tenant="acme", run_id="run_1", data=data)),
            lambda: state_store.put_session(
                SessionRecord(tenant="acme", session_id="s1", data=data)
            ),
        ):
            with pytest.raises(ValueError) as caught:
                await call()
            assert_refused_at(caught.value, "data['a']['b']", says)
        assert await state_store.get_run("acme", "run_1") is None
        assert await state_store.get_session("acme", "s1") is None
        assert (await state_store.list_runs("acme")).items == []

    async def test_ids_and_counts_of_subclasses_are_stored_as_plain_values(
        self, state_store: StateStore
    ) -> None:
        """A str subclass id (a StrEnum member, one whose __str__ lies) is its own text and an
        int subclass count its own number, on every backing."""
        record = RunRecord.model_construct(
            **{
                **RunRecord(tenant="acme", run_id="r").model_dump(),
                "tenant": LyingText("acme"),
                "run_id": LyingText("run_1"),
                "session_id": Mood.CALM,
            }
        )
        created = await state_store.put_run(record)
        patched = await state_store.patch_run(
            LyingText("acme"), LyingText("run_1"), iterations=LyingInt(2), cursor=LyingInt(3)
        )
        fetched = await state_store.get_run("acme", "run_1")
        listed = (await state_store.list_runs("acme", session_id="calm")).items
        assert fetched is not None
        assert (created.tenant, created.run_id, created.session_id) == ("acme", "run_1", "calm")
        assert (patched.iterations, patched.cursor) == (2, 3)
        assert fetched == patched and listed == [patched]
        for value in (fetched.tenant, fetched.run_id, fetched.session_id):
            assert type(value) is str
        assert type(fetched.iterations) is int

    async def test_non_string_ids_are_type_errors(self, state_store: StateStore) -> None:
        """An id that is not a str raises TypeError naming it."""
        bad: Any = 42
        with pytest.raises(TypeError, match="tenant"):
            await state_store.get_run(bad, "run_1")
        with pytest.raises(TypeError, match="run_id"):
            await state_store.patch_run("acme", bad, input_tokens=1)
        with pytest.raises(TypeError, match="session_id"):
            await state_store.get_session("acme", bad)
        with pytest.raises(TypeError, match="record"):
            await state_store.put_run(bad)

    @pytest.mark.parametrize(
        ("kwargs", "named"),
        [
            ({"limit": 0}, "limit"),
            ({"limit": 1001}, "limit"),
            ({"after": "not-a-cursor"}, "after"),
            ({"status": "sleeping"}, "status"),
            ({"session_id": ""}, "session_id"),
        ],
    )
    async def test_bad_listing_arguments_are_refused(
        self, state_store: StateStore, kwargs: dict[str, Any], named: str
    ) -> None:
        """A bad limit, cursor, status or session raises ValueError naming it."""
        with pytest.raises(ValueError, match=named):
            await state_store.list_runs("acme", **kwargs)

    # -- round trips --------------------------------------------------------------

    async def test_blob_round_trips_exactly(self, state_store: StateStore) -> None:
        """A blob with unicode, nesting, numbers and nulls reads back exactly as written."""
        nested: dict[str, Any] = {"leaf": True}
        for depth in range(20):
            nested = {f"level{depth}": nested, "list": [depth, [depth, {"d": depth}]]}
        data: dict[str, Any] = {
            "text": "héllo wörld ✓ 日本語 עברית 🦜‍🔥 e\u0301",
            "ключ 🗝": "значение",
            "": "empty key",
            "escapes": 'quote " backslash \\ newline \n tab \t \u2028 \u001f',
            "numbers": [0, -1, 2**53 + 1, -(2**63), 2**100, 0.1, -2.5, 1e-7, 6.02e23, 1.0],
            "flags": [True, False, None],
            "empty": {"object": {}, "list": []},
            "nested": nested,
        }
        created = await _create(state_store, "run_1", data=data)
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        for record in (created, stored):
            assert record.data == data
            numbers = record.data["numbers"]
            assert [type(n) for n in numbers] == [type(n) for n in data["numbers"]]
        session = await state_store.put_session(
            SessionRecord(tenant="acme", session_id="s1", data=data)
        )
        assert session.data == data
        fetched = await state_store.get_session("acme", "s1")
        assert fetched is not None
        assert fetched.data == data

    async def test_unicode_ids_round_trip(self, state_store: StateStore) -> None:
        """Ids may hold any non-NUL unicode, separators included, and round-trip exactly."""
        tenant, run_id, session_id = "ténant:{x}", "rün/1 🦜:{}", "séssion:1"
        created = await _create(state_store, run_id, tenant=tenant, session_id=session_id)
        assert created.tenant == tenant
        assert created.run_id == run_id
        assert await state_store.get_run(tenant, run_id) == created
        page = await state_store.list_runs(tenant, session_id=session_id)
        assert [r.run_id for r in page.items] == [run_id]
