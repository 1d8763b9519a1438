"""Get, create, put, patch and delete of runs."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Context, Decimal, localcontext
from typing import Any

import pytest

from statepact._limits import MAX_COUNTER
from statepact.clock import ManualClock
from statepact.errors import RunNotFoundError, StateConflictError
from statepact.models import RunRecord, RunStatus
from statepact.state import StateStore
from statepact.testing._inputs import (
    EACH_HOSTILE_DECIMAL_CONTEXT,
)
from statepact.testing._state_suite._common import bounded, create

__all__ = ["RecordConformance"]


class RecordConformance:
    """Get, create, put, patch and delete of runs."""

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
        created = await create(
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
        created = await create(state_store, "run_1", data={"a": [1, 2, {"b": None}]})
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
        created = await create(state_store, "run_1", data=mine)
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
        created = await create(state_store, "run_1", data={"step": 1})
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
        created = await create(state_store, "run_1", data={"step": 1})
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
        created = await create(state_store, "run_1")
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_run(created.model_copy(update={"version": 7, "data": {"x": 1}}))
        assert (caught.value.expected, caught.value.actual) == (7, 1)
        assert await state_store.get_run("acme", "run_1") == created

    async def test_creating_an_existing_run_is_a_conflict(self, state_store: StateStore) -> None:
        """Creating a run that exists raises StateConflictError(expected=0, actual=1)."""
        created = await create(state_store, "run_1", data={"first": True})
        with pytest.raises(StateConflictError) as caught:
            await create(state_store, "run_1", data={"second": True})
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
            *(create(state_store, "run_1", data={"writer": i}) for i in range(10)),
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
        created = await create(state_store, "run_1")
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
        created = await create(state_store, "run_1")
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
        created = await create(state_store, "run_1")
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
        await create(state_store, "run_1", data={"keep": "me"})
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
        created = await create(state_store, "run_1")
        patched = await state_store.patch_run("acme", "run_1")
        assert patched.version == created.version + 1
        assert patched.input_tokens == 0
        assert patched.cost == Decimal(0)

    async def test_a_patch_makes_an_older_put_stale(self, state_store: StateStore) -> None:
        """A put holding the version from before a patch is refused, not applied over it."""
        created = await create(state_store, "run_1")
        await state_store.patch_run("acme", "run_1", iterations=1)
        with pytest.raises(StateConflictError):
            await state_store.put_run(created.model_copy(update={"status": RunStatus.FAILED}))
        stored = await state_store.get_run("acme", "run_1")
        assert stored is not None
        assert stored.status is RunStatus.PENDING
        assert stored.iterations == 1

    async def test_two_concurrent_patches_both_land(self, state_store: StateStore) -> None:
        """Two workers patching at once both land."""
        await create(state_store, "run_1")
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
        await create(state_store, "run_1")
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
            await create(state_store, run_id)
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
        records = {run_id: await create(state_store, run_id) for run_id in ("a", "b", "c")}
        records.update({f"run_{n}": await create(state_store, f"run_{n}") for n in range(27)})
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
            await create(state_store, f"run_{n}")
        stale = await create(state_store, "stale")
        await state_store.patch_run("acme", "stale", iterations=1)
        await create(state_store, "full")
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
        await create(state_store, "run_1")
        calls = [
            lambda: state_store.patch_run("acme", "run_1", cost=Decimal("0.000000001"))
            for _ in range(1000)
        ]
        await bounded(calls)
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
        await create(state_store, "run_1")
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
        await create(state_store, "run_1")
        await state_store.patch_run("acme", "run_1", **{field: step})
        before = await state_store.patch_run("acme", "run_1", **{field: step})
        small: Any = 2 if field == "input_tokens" else Decimal("0.000000002")
        with pytest.raises(ValueError, match=field):
            await state_store.patch_run("acme", "run_1", iterations=1, **{field: small})
        assert await state_store.get_run("acme", "run_1") == before

    async def test_cost_round_trips_as_exact_decimal(self, state_store: StateStore) -> None:
        """Cost comes back as the exact Decimal that was added, from Decimal, str or int."""
        await create(state_store, "run_1")
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
        created = await create(state_store, "run_1")
        with pytest.raises(error, match="cost"):
            await state_store.patch_run("acme", "run_1", cost=cost)
        assert await state_store.get_run("acme", "run_1") == created

    @EACH_HOSTILE_DECIMAL_CONTEXT
    async def test_cost_is_exact_whatever_the_callers_decimal_context(
        self, state_store: StateStore, context: Context
    ) -> None:
        """cost stays exact to 1e-9 under any decimal context the caller set (a low precision,
        trapped Inexact/Rounded, a tiny Emax): the patch lands once, exactly, and reads back."""
        await create(state_store, "run_1")
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
        await create(state_store, "run_1")
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
        created = await create(state_store, "run_1")
        with pytest.raises(ValueError, match=r"^cost"):
            await state_store.patch_run("acme", "run_1", cost=cost)
        assert await state_store.get_run("acme", "run_1") == created

    @pytest.mark.parametrize("cost", ["0e999999999", "-0", "1." + "0" * 60, "0.100000000000"])
    async def test_an_exact_cost_in_a_long_spelling_lands(
        self, state_store: StateStore, cost: str
    ) -> None:
        """A cost that is exact to 1e-9 lands however it is spelt (zeros, a huge exponent on 0)."""
        await create(state_store, "run_1")
        patched = await state_store.patch_run("acme", "run_1", cost=cost)
        assert patched.cost == Decimal(cost)
        assert patched.version == 2

    # -- delete -----------------------------------------------------------------

    async def test_delete_removes_run_and_index_entries(self, state_store: StateStore) -> None:
        """delete_run removes the run, its counters and its index entries together."""
        await create(state_store, "run_1", session_id="s1", status=RunStatus.RUNNING)
        await create(state_store, "run_2", session_id="s1", status=RunStatus.RUNNING)
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
        await create(state_store, "run_1")
        assert await state_store.delete_run("acme", "run_1") is True
        assert await state_store.delete_run("acme", "run_1") is False

    async def test_deleted_run_can_be_created_again(self, state_store: StateStore) -> None:
        """A deleted run is created again from version 0: zero counters and a greater seq."""
        first = await create(state_store, "run_1")
        await state_store.patch_run("acme", "run_1", input_tokens=5, cost="1.5")
        await state_store.delete_run("acme", "run_1")
        with pytest.raises(StateConflictError) as caught:
            await state_store.put_run(first.model_copy(update={"version": 2}))
        assert caught.value.actual == 0
        again = await create(state_store, "run_1", data={"again": True})
        assert again.version == 1
        assert again.input_tokens == 0
        assert again.cost == Decimal(0)
        assert first.seq is not None and again.seq is not None
        assert again.seq > first.seq
