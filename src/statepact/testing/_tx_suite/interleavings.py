"""Hermitage-style and three-transaction interleavings; the isolation checker on real ones."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from statepact.errors import (
    ConflictError,
)
from statepact.testing.isolation import (
    TxnRecord,
    check_history,
    record_append,
    record_read,
)
from statepact.tx import (
    Transaction,
    TransactionManager,
)

__all__ = ["InterleavingConformance"]

from statepact.testing._tx_suite._common import (
    ISOLATIONS,
    Abort,
    R,
    commit_value,
    names,
    read_value,
)


class InterleavingConformance:
    """Hermitage-style and three-transaction interleavings; the isolation checker on real ones."""

    # -- Hermitage-style interleavings -------------------------------------------------------

    async def _seed(self, manager: TransactionManager, **values: Any) -> None:
        async with manager.transaction() as tx:
            for key, value in values.items():
                tx.write(R, key, value)

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_dirty_write(self, manager: TransactionManager, isolation: str) -> None:
        """G0: two transactions writing the same two keys never leave a mix of both."""
        await self._seed(manager, x=10, y=20)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 11)
        t2.write(R, "x", 12)
        t1.write(R, "y", 21)
        t2.write(R, "y", 22)
        await t1.commit()
        if isolation == "read_committed":
            await t2.commit()
            expected = (12, 22)
        else:
            with pytest.raises(ConflictError):
                await t2.commit()
            expected = (11, 21)
        assert (await read_value(manager, "x"), await read_value(manager, "y")) == expected

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_aborted_read(self, manager: TransactionManager, isolation: str) -> None:
        """G1a: a write of a transaction that rolled back is never read."""
        await self._seed(manager, x=10)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 101)
        assert await t2.read(R, "x") == 10
        await t1.rollback()
        assert await t2.read(R, "x") == 10
        await t2.commit()
        assert await read_value(manager, "x") == 10

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_intermediate_read(self, manager: TransactionManager, isolation: str) -> None:
        """G1b: only a transaction's final write is ever read, and only once committed."""
        await self._seed(manager, x=10)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 101)
        assert await t2.read(R, "x") == 10
        t1.write(R, "x", 11)
        await t1.commit()
        expected = 11 if isolation == "read_committed" else 10
        assert await t2.read(R, "x") == expected
        if isolation == "serializable":
            with pytest.raises(ConflictError):
                await t2.commit()  # what it read was replaced before it committed
        else:
            await t2.commit()

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_circular_information_flow(
        self, manager: TransactionManager, isolation: str
    ) -> None:
        """G1c: two transactions cannot each see the other's uncommitted write."""
        await self._seed(manager, x=10, y=20)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 11)
        t2.write(R, "y", 22)
        assert await t1.read(R, "y") == 20
        assert await t2.read(R, "x") == 10
        await t1.commit()
        if isolation == "serializable":
            # t2 read x, which t1 has since replaced: backward validation refuses it.
            with pytest.raises(ConflictError):
                await t2.commit()
            assert await read_value(manager, "y") == 20
        else:
            await t2.commit()
            assert await read_value(manager, "y") == 22
        assert await read_value(manager, "x") == 11

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_lost_update(self, manager: TransactionManager, isolation: str) -> None:
        """P4: a read-modify-write race loses an update only under read_committed."""
        await self._seed(manager, x=10)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        v1 = await t1.read(R, "x")
        v2 = await t2.read(R, "x")
        t1.write(R, "x", v1 + 1)
        t2.write(R, "x", v2 + 1)
        await t1.commit()
        if isolation == "read_committed":
            await t2.commit()  # the lost update read_committed allows
        else:
            with pytest.raises(ConflictError) as caught:
                await t2.commit()
            assert (caught.value.resource, caught.value.key) == (R, "x")
        assert await read_value(manager, "x") == 11

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_read_skew(self, manager: TransactionManager, isolation: str) -> None:
        """G-single: a reader sees both keys from one moment, except under read_committed."""
        await self._seed(manager, x=50, y=50)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        assert await t1.read(R, "x") == 50
        t2.write(R, "x", 25)
        t2.write(R, "y", 75)
        await t2.commit()
        y = await t1.read(R, "y")
        if isolation == "read_committed":
            assert y == 75  # the skewed total read_committed allows
            await t1.commit()
        else:
            assert y == 50
            if isolation == "serializable":
                with pytest.raises(ConflictError):
                    await t1.commit()  # read x has been replaced since
            else:
                await t1.commit()

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_write_skew(self, manager: TransactionManager, isolation: str) -> None:
        """G2-item: two on-call doctors both leave under snapshot; serializable refuses one."""
        await self._seed(manager, alice=True, bob=True)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        on_call_1 = [await t1.read(R, "alice"), await t1.read(R, "bob")]
        on_call_2 = [await t2.read(R, "alice"), await t2.read(R, "bob")]
        assert on_call_1 == on_call_2 == [True, True]
        t1.write(R, "alice", False)
        t2.write(R, "bob", False)
        await t1.commit()
        if isolation == "serializable":
            with pytest.raises(ConflictError) as caught:
                await t2.commit()
            assert (caught.value.resource, caught.value.key) == (R, "alice")
            assert await read_value(manager, "bob") is True
        else:
            await t2.commit()  # the write skew snapshot allows
            assert await read_value(manager, "bob") is False
        assert await read_value(manager, "alice") is False

    # -- three-transaction interleavings ---------------------------------------------------

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_read_only_anomaly(self, manager: TransactionManager, isolation: str) -> None:
        """Fekete's read-only anomaly: all three commit under snapshot; serializable refuses one."""
        await self._seed(manager, checking=0, savings=0)
        withdraw = await manager.begin(isolation)
        seen = [await withdraw.read(R, "checking"), await withdraw.read(R, "savings")]
        assert seen == [0, 0]
        deposit = await manager.begin(isolation)
        deposit.write(R, "savings", await deposit.read(R, "savings") + 20)
        await deposit.commit()
        report = await manager.begin(isolation)
        # The report sees the deposit but not the withdrawal: deposit, report, withdrawal in
        # any serial order. The withdrawal saw no deposit (and charges the overdraft fee of
        # 1): withdrawal before deposit. If all three commit, no serial order exists.
        assert [await report.read(R, "checking"), await report.read(R, "savings")] == [0, 20]
        await report.commit()
        withdraw.write(R, "checking", seen[0] - 10 - (1 if sum(seen) < 10 else 0))
        if isolation == "serializable":
            with pytest.raises(ConflictError) as caught:
                await withdraw.commit()  # what it read of savings was replaced
            assert (caught.value.resource, caught.value.key) == (R, "savings")
            expected = [0, 20]
        else:
            await withdraw.commit()  # the anomaly: no serial order shows the report [0, 20]
            expected = [-11, 20]
        stored = [await read_value(manager, key) for key in ("checking", "savings")]
        assert stored == expected

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_three_transaction_write_skew(
        self, manager: TransactionManager, isolation: str
    ) -> None:
        """G2 over three: each overwrites what the previous one read; serializable refuses one."""
        await self._seed(manager, x=0, y=0, z=0)
        t1, t2, t3 = [await manager.begin(isolation) for _ in range(3)]
        # Read-write dependencies t1 -> t3 (x), t3 -> t2 (z), t2 -> t1 (y): a cycle.
        t1.write(R, "y", await t1.read(R, "x") + 1)
        t2.write(R, "z", await t2.read(R, "y") + 1)
        t3.write(R, "x", await t3.read(R, "z") + 1)
        await t1.commit()
        if isolation == "serializable":
            with pytest.raises(ConflictError) as caught:
                await t2.commit()  # read y, which t1 has since replaced
            assert (caught.value.resource, caught.value.key) == (R, "y")
            await t3.commit()  # z was never replaced: t1 then t3 is a serial order
            expected = (1, 1, 0)
        else:
            await t2.commit()
            await t3.commit()  # all three read 0: no serial order gives every key 1
            expected = (1, 1, 1)
        stored = tuple([await read_value(manager, key) for key in ("x", "y", "z")])
        assert stored == expected

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_three_transaction_lost_update(
        self, manager: TransactionManager, isolation: str
    ) -> None:
        """Three read-modify-writes of one key: read_committed keeps the last; others the first."""
        await self._seed(manager, counter=0)
        txns = [await manager.begin(isolation) for _ in range(3)]
        for tx, amount in zip(txns, (1, 10, 100), strict=True):
            tx.write(R, "counter", await tx.read(R, "counter") + amount)
        outcomes: list[str] = []
        for tx in txns:
            try:
                await tx.commit()
                outcomes.append("committed")
            except ConflictError as exc:
                assert (exc.resource, exc.key) == (R, "counter")
                outcomes.append("refused")
        if isolation == "read_committed":
            assert outcomes == ["committed"] * 3
            assert await read_value(manager, "counter") == 100  # two updates lost
        else:
            assert outcomes == ["committed", "refused", "refused"]
            assert await read_value(manager, "counter") == 1
        history = await manager.history(R, "counter")
        assert len(history) == 1 + outcomes.count("committed")

    async def test_serializable_validates_reads_of_absent_keys(
        self, manager: TransactionManager
    ) -> None:
        """A key read as absent and created since refuses a serializable commit."""
        t1 = await manager.begin("serializable")
        assert await t1.read(R, "slot-9") is None
        await commit_value(manager, "slot-9", "booked by another")
        t1.write(R, "booking", "slot-9")
        with pytest.raises(ConflictError) as caught:
            await t1.commit()
        assert (caught.value.resource, caught.value.key) == (R, "slot-9")
        assert await read_value(manager, "booking") is None

    async def test_read_committed_reads_the_latest_commit(
        self, manager: TransactionManager
    ) -> None:
        """Under read_committed each read sees the newest committed version."""
        await self._seed(manager, x=1)
        t1 = await manager.begin("read_committed")
        assert await t1.read(R, "x") == 1
        await commit_value(manager, "x", 2)
        assert await t1.read(R, "x") == 2
        await t1.commit()

    # -- the isolation checker on real interleavings --------------------------------------------

    async def _random_history(
        self,
        manager: TransactionManager,
        isolation: str,
        *,
        txns: int = 40,
        keys: int = 4,
        seed: int = 7,
    ) -> list[TxnRecord]:
        """Concurrent random list-append transactions, each attempt recorded, then a final read."""
        rng = random.Random(seed)
        history: list[TxnRecord] = []
        counter = iter(range(1, 1_000_000))

        async def one(n: int) -> None:
            plan = [
                (rng.choice(["append", "read"]), f"k{rng.randrange(keys)}")
                for _ in range(rng.randint(1, 4))
            ]
            doomed = rng.random() < 0.1
            attempts: list[TxnRecord] = []

            async def body(tx: Transaction) -> None:
                record = TxnRecord(f"t{n}.{len(attempts) + 1}")
                attempts.append(record)
                history.append(record)
                for kind, key in plan:
                    if kind == "append":
                        await record_append(tx, record, "lists", key, next(counter))
                    else:
                        await record_read(tx, record, "lists", key)
                    await asyncio.sleep(0)
                if doomed:
                    raise Abort

            try:
                await manager.run(body, isolation=isolation, retries=200)
            except Abort:
                return
            # Only the last attempt committed; the earlier ones were rolled back.
            attempts[-1].committed = True

        await asyncio.gather(*(one(n) for n in range(txns)))
        final = TxnRecord("final", committed=True)
        async with manager.transaction() as tx:
            for k in range(keys):
                await record_read(tx, final, "lists", f"k{k}")
        history.append(final)
        return history

    async def test_isolation_checker_finds_nothing_under_serializable(
        self, manager: TransactionManager
    ) -> None:
        """Concurrent random serializable transactions show no G0, G1 or G2 anomaly."""
        history = await self._random_history(manager, "serializable")
        assert check_history(history) == []
        committed = [r for r in history if r.committed]
        assert len(committed) > 20
        assert any(  # not vacuous: transactions did read each other's appends
            op.kind == "read" and op.value for r in committed for op in r.ops
        )

    async def test_isolation_checker_finds_no_g0_g1_under_weaker_levels(
        self, manager: TransactionManager
    ) -> None:
        """Random snapshot transactions show no G0/G1/G-single; read_committed no G0/G1."""
        snapshot = names(check_history(await self._random_history(manager, "snapshot")))
        assert not snapshot & {"G0", "G1a", "G1b", "G1c", "G-single", "garbage", "lost-append"}
        await manager.backend.clear()
        committed = names(check_history(await self._random_history(manager, "read_committed")))
        assert not committed & {"G0", "G1a", "G1b", "G1c", "garbage"}

    async def test_isolation_checker_catches_write_skew_under_snapshot(
        self, manager: TransactionManager
    ) -> None:
        """The checker reports G2 for a write skew that snapshot isolation lets through."""
        history: list[TxnRecord] = []
        t1 = await manager.begin("snapshot")
        t2 = await manager.begin("snapshot")
        r1, r2 = TxnRecord("t1"), TxnRecord("t2")
        history += [r1, r2]
        for tx, record in ((t1, r1), (t2, r2)):
            await record_read(tx, record, "lists", "x")
            await record_read(tx, record, "lists", "y")
        await record_append(t1, r1, "lists", "x", 1)
        await record_append(t2, r2, "lists", "y", 2)
        await t1.commit()
        r1.committed = True
        await t2.commit()
        r2.committed = True
        final = TxnRecord("final", committed=True)
        async with manager.transaction() as tx:
            await record_read(tx, final, "lists", "x")
            await record_read(tx, final, "lists", "y")
        history.append(final)
        anomalies = check_history(history)
        assert [(a.name, sorted(a.txns)) for a in anomalies] == [("G2", ["t1", "t2"])]
