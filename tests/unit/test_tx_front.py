"""The TransactionManager front: argument checks, the transaction life cycle, the fingerprint,
and what it decides without asking the backing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import statepact
from statepact.clock import ManualClock
from statepact.errors import ConflictError
from statepact.storage.memory import MemoryBackend
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    Snapshot,
    TransactionManager,
    WriteRecord,
    fingerprint,
)


class CountingBackend(MemoryBackend):
    """The memory backend, counting the commit requests it receives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[CommitRequest] = []

    async def commit(self, request: CommitRequest) -> CommitResult:
        self.requests.append(request)
        return await super().commit(request)


@pytest.fixture
def backend(clock: ManualClock) -> CountingBackend:
    return CountingBackend(clock=clock)


@pytest.fixture
def manager(backend: CountingBackend) -> TransactionManager:
    return TransactionManager(backend)


def test_public_names() -> None:
    for name in (
        "TransactionManager",
        "Transaction",
        "Isolation",
        "CommitResult",
        "StorageBackend",
    ):
        assert name in statepact.__all__
    # The top-level Lease is the work queue's; the resource lease stays in statepact.tx.
    assert statepact.Lease.__module__ == "statepact.models"
    assert Lease.__module__ == "statepact.tx"
    assert statepact.__all__ == sorted(statepact.__all__)


def test_isolation_accepts_names_and_members() -> None:
    assert Isolation("snapshot") is Isolation.SNAPSHOT
    manager = TransactionManager(MemoryBackend())
    assert manager.transaction(Isolation.SERIALIZABLE).isolation is Isolation.SERIALIZABLE
    assert manager.transaction("read_committed").isolation is Isolation.READ_COMMITTED
    with pytest.raises(TypeError, match="isolation"):
        manager.transaction(3)  # type: ignore[arg-type]


def test_fingerprint_is_canonical() -> None:
    writes = (WriteRecord("r", "a", '{"x":1,"y":2}'), WriteRecord("r", "b", None))
    assert fingerprint(writes) == fingerprint(tuple(writes))
    assert fingerprint(writes) != fingerprint(writes[:1])
    assert fingerprint(writes) != fingerprint((writes[0], WriteRecord("r", "b", "null")))


async def test_commit_request_is_sorted_and_complete(
    manager: TransactionManager, backend: CountingBackend, clock: ManualClock
) -> None:
    lease = await manager.acquire_lease("job", "w1", 10)
    assert lease is not None
    async with manager.transaction("serializable", idempotency_key="k1", fencing=lease) as tx:
        await tx.read("r", "z")
        await tx.read("r", "a")
        tx.write("r", "m", {"b": 1, "a": 2})
        tx.delete("q", "x")
        await tx.read("r", "m")  # own write: not a backing read
    (request,) = backend.requests
    assert [(r.resource, r.key, r.version) for r in request.reads] == [("r", "a", 0), ("r", "z", 0)]
    assert request.writes == (WriteRecord("q", "x", None), WriteRecord("r", "m", '{"a":2,"b":1}'))
    assert request.fingerprint == fingerprint(request.writes)
    assert (request.isolation, request.taken_at, request.fencing) == ("serializable", 0, lease)
    assert request.now == clock.now()
    assert request.txn_id == tx.txn_id


async def test_plain_read_only_commit_skips_the_backing(
    manager: TransactionManager, backend: CountingBackend
) -> None:
    async with manager.transaction("snapshot") as tx:
        await tx.read("r", "k")
    assert tx.result == CommitResult(0)
    assert backend.requests == []
    async with manager.transaction("serializable") as tx:
        await tx.read("r", "k")
    assert len(backend.requests) == 1


async def test_snapshot_reads_are_repeatable_without_asking_again(
    manager: TransactionManager,
) -> None:
    tx = await manager.begin()
    assert await tx.read("r", "k") is None
    async with manager.transaction() as other:
        other.write("r", "k", 1)
    assert await tx.read("r", "k") is None
    await tx.rollback()


async def test_a_finished_transaction_refuses_use(manager: TransactionManager) -> None:
    tx = await manager.begin()
    tx.write("r", "k", 1)
    await tx.commit()
    with pytest.raises(RuntimeError, match="committed"):
        tx.write("r", "k", 2)
    with pytest.raises(RuntimeError, match="committed"):
        await tx.read("r", "k")
    with pytest.raises(RuntimeError):
        await tx.commit()
    await tx.rollback()  # a no-op after commit
    assert tx.result.version == 1
    never = manager.transaction()
    with pytest.raises(RuntimeError, match="not started"):
        _ = never.taken_at
    with pytest.raises(RuntimeError, match="new"):
        await never.read("r", "k")


async def test_async_with_exits_as_the_transaction_stands(manager: TransactionManager) -> None:
    """A clean exit commits an active transaction only; an error rolls back and propagates."""
    async with manager.transaction() as tx:
        tx.write("r", "k", 1)
        await tx.commit()  # committed inside the block: the exit leaves it be
    assert tx.result.version == 1
    with pytest.raises(KeyError):
        async with manager.transaction() as tx:
            tx.write("r", "k", 2)
            await tx.commit()
            raise KeyError("after the commit")  # not suppressed, nothing undone
    assert tx.result.version == 2
    with pytest.raises(KeyError):
        async with manager.transaction() as tx:
            tx.write("r", "k", 3)
            raise KeyError("before the commit")
    assert not tx.active
    async with manager.transaction() as tx:
        assert await tx.read("r", "k") == 2


async def test_failed_commit_ends_the_transaction(
    manager: TransactionManager, backend: CountingBackend
) -> None:
    tx = await manager.begin()
    await tx.lock("r", "k")
    tx.write("r", "k", 1)
    async with manager.transaction() as rival:
        rival.write("r", "k", 2)
    with pytest.raises(ConflictError):
        await tx.commit()
    assert backend.locks.holders(("r", "k")) == {}
    with pytest.raises(RuntimeError, match="failed"):
        _ = tx.result


async def test_run_validates_retries(manager: TransactionManager) -> None:
    async def noop(tx: object) -> int:
        return 7

    with pytest.raises(ValueError, match="retries"):
        await manager.run(noop, retries=-1)
    with pytest.raises(TypeError, match="retries"):
        await manager.run(noop, retries=1.5)  # type: ignore[arg-type]
    assert await manager.run(noop, retries=0) == 7


def test_manager_refuses_a_bad_size_limit() -> None:
    with pytest.raises(ValueError, match="max_value_bytes"):
        TransactionManager(MemoryBackend(), max_value_bytes=0)


@pytest.mark.parametrize(
    ("turn", "error"),
    [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), ("1", TypeError)],
)
def test_manager_refuses_a_bad_hot_key_turn(turn: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="hot_key_turn"):
        TransactionManager(MemoryBackend(), hot_key_turn=turn)  # type: ignore[arg-type]


async def test_renew_refuses_something_that_is_not_a_lease(manager: TransactionManager) -> None:
    with pytest.raises(TypeError, match="lease"):
        await manager.renew_lease("job")  # type: ignore[arg-type]


# -- cancellation --------------------------------------------------------------------------


class SlowBackend(MemoryBackend):
    """The memory backend answering ``begin``, ``commit`` and ``end`` a round trip late: the
    work is done at once (a server that applied it) and the reply takes ``ROUND_TRIP``
    seconds, so a cancellation can land while one of them is in flight."""

    ROUND_TRIP = 0.05
    in_process = False  # its calls suspend, as a server's do: the front must shield them

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.begun: list[str] = []
        self.ended: list[str] = []
        self.in_flight = {call: asyncio.Event() for call in ("begin", "commit", "end")}

    async def _reply(self, call: str) -> None:
        self.in_flight[call].set()
        await asyncio.sleep(self.ROUND_TRIP)

    async def begin(self, txn_id: str) -> Snapshot:
        snapshot = await super().begin(txn_id)
        self.begun.append(txn_id)
        await self._reply("begin")
        return snapshot

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        await self._reply("commit")
        return result

    async def end(self, txn_id: str) -> None:
        await self._reply("end")  # the release is on its way: a cancel here must not stop it
        await super().end(txn_id)
        self.ended.append(txn_id)


async def _cancel_in_flight(backend: SlowBackend, call: Any, during: str) -> asyncio.Task[Any]:
    """Start ``call``, cancel it while the backing's ``during`` reply is in flight, and wait
    for it to finish."""
    task = asyncio.ensure_future(call)
    await backend.in_flight[during].wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return task


async def test_a_cancelled_begin_ends_what_it_started(clock: ManualClock) -> None:
    """A begin cancelled after the backing registered the snapshot ends it again."""
    backend = SlowBackend(clock=clock)
    manager = TransactionManager(backend)
    task = await _cancel_in_flight(backend, manager.begin(), "begin")
    assert task.cancelled()
    assert backend.ended == backend.begun != []


async def test_a_commit_cancelled_in_flight_settles_and_says_so(clock: ManualClock) -> None:
    """A commit cancelled while its reply is in flight: the caller gets CancelledError once
    the commit answered and the transaction ended; ``result`` says it landed."""
    backend = SlowBackend(clock=clock)
    manager = TransactionManager(backend)
    tx = await manager.begin()
    await tx.lock("r", "k")
    tx.write("r", "k", 1)
    task = await _cancel_in_flight(backend, tx.commit(), "commit")
    assert task.cancelled()
    assert tx.result == CommitResult(1)
    assert not tx.active
    assert backend.ended == [tx.txn_id]
    assert backend.locks.holders(("r", "k")) == {}


@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_a_transaction_cancelled_while_it_ends_still_ends(
    clock: ManualClock, ending: str
) -> None:
    """Cancelled while the backing's ``end`` is in flight, a commit or rollback still
    releases the locks and the snapshot before the caller gets CancelledError."""
    backend = SlowBackend(clock=clock)
    manager = TransactionManager(backend)
    tx = await manager.begin()
    await tx.lock("r", "k")
    tx.write("r", "k", 1)
    task = await _cancel_in_flight(backend, getattr(tx, ending)(), "end")
    assert task.cancelled()
    assert backend.ended == [tx.txn_id]
    assert backend.locks.holders(("r", "k")) == {}
    if ending == "commit":
        assert tx.result == CommitResult(1)  # it landed before the cancel
