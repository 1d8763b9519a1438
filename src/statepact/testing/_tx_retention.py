"""The history-retention part of ``TransactionConformance``: ``prune_history``.

A mixin of the suite (``tx_suite.TransactionConformance`` inherits it), in a module of
its own so the suite stays split by area; it uses the suite's ``manager`` and ``clock``
fixtures and nothing else.
"""

from __future__ import annotations

from typing import Any

from statepact.clock import ManualClock
from statepact.errors import ConflictError
from statepact.tx import TransactionManager

__all__ = ["TransactionRetentionConformance"]

R = "retained"


async def _commit(manager: TransactionManager, key: str, value: Any) -> int:
    async with manager.transaction() as tx:
        tx.write(R, key, value)
    return tx.result.version


async def _latest(manager: TransactionManager, key: str) -> Any:
    async with manager.transaction() as tx:
        return await tx.read(R, key)


def _retention(manager: TransactionManager) -> float | None:
    retention: float | None = getattr(manager.backend, "history_retention", None)
    return retention


class TransactionRetentionConformance:
    """``TransactionManager.prune_history`` on every backing."""

    async def test_a_snapshot_older_than_the_retention_is_refused_after_a_prune(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """After prune_history, a snapshot that needed a dropped version gets ConflictError
        (never an older value, never "absent"); one that sees the newest version committed
        before the cutoff, and a young one, read what they read before. A backing that
        pins snapshots (memory: no retention) keeps what the old one needs."""
        retention = _retention(manager)
        await _commit(manager, "k", "v1")
        old = await manager.begin("snapshot")
        clock.advance(10)
        await _commit(manager, "k", "v2")
        clock.advance(10)
        kept = await _commit(manager, "k", "v3")
        seeing_kept = await manager.begin("snapshot")
        clock.advance((retention or 3600) + 60)
        fourth = await _commit(manager, "k", "v4")
        young = await manager.begin("snapshot")
        fifth = await _commit(manager, "k", "v5")

        pruned = await manager.prune_history()

        assert await seeing_kept.read(R, "k") == "v3"
        assert await young.read(R, "k") == "v4"
        assert await _latest(manager, "k") == "v5"
        if retention is None:
            assert await old.read(R, "k") == "v1"
        else:
            assert pruned == 2
            try:
                value = await old.read(R, "k")
            except ConflictError as refused:
                assert refused.resource == R
                assert refused.key == "k"
                assert "snapshot too old" in str(refused)
            else:
                raise AssertionError(f"a snapshot older than the retention read {value!r}")
            history = await manager.history(R, "k")
            assert [entry.version for entry in history] == [fifth, fourth, kept]
        for transaction in (old, seeing_kept, young):
            await transaction.rollback()

    async def test_prune_history_keeps_what_the_retention_covers(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """prune_history drops nothing committed within the retention, nor a key's only
        version however old; a second prune finds nothing more."""
        retention = _retention(manager) or 3600
        await _commit(manager, "once", {"n": 1})
        clock.advance(retention * 2)
        for n in range(3):
            await _commit(manager, "recent", {"n": n})
        assert await manager.prune_history() == 0
        assert [e.value for e in await manager.history(R, "once")] == [{"n": 1}]
        assert len(await manager.history(R, "recent")) == 3
        assert await _latest(manager, "once") == {"n": 1}
        assert await manager.prune_history() == 0
