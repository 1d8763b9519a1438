"""PostgresWorkQueue against a real PostgreSQL: concurrent claims, claim cost, races, storage.

The behaviour shared with every backing is the conformance suite's
(``tests/conformance``); this module checks what only PostgreSQL shows: many
workers on many connections, the rows a claim reads (not the backlog, not the
idle tenants), an item queued while a claim of its tenant is in flight, and
the table's storage options.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statepact.clock import ManualClock, read_clock
from statepact.models import ItemStatus, Lease, WorkItem
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import PostgresWorkQueue, _direct
from statepact.storage.postgres.queue import _NEW_FIRST_FROM, _prepared

pytestmark = pytest.mark.integration

LEASE = 30.0


async def _fill(queue: PostgresWorkQueue, tenant: str, count: int, prefix: str = "i") -> None:
    for index in range(count):
        await queue.enqueue(WorkItem(tenant=tenant, item_id=f"{prefix}{index:04d}"))


async def test_ten_workers_on_ten_connections_take_ten_different_items(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """Ten workers claiming at once, each on its own connection, take ten different items."""
    await _fill(postgres_work_queue, "acme", 6)
    await _fill(postgres_work_queue, "beta", 4)
    connections: list[AsyncConnection] = []
    try:
        for _ in range(10):
            connections.append(await pg_engine.connect())
        pids = {
            (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            for conn in connections
        }
        for conn in connections:
            await conn.commit()
        assert len(pids) == 10

        async def worker(index: int, conn: AsyncConnection) -> Lease | None:
            async with conn.begin():
                return await postgres_work_queue.bound(conn).claim(f"w{index}", lease_for=LEASE)

        leases = await asyncio.gather(
            *(worker(index, conn) for index, conn in enumerate(connections))
        )
    finally:
        for conn in connections:
            await conn.close()
    taken = [(lease.item.tenant, lease.item.item_id) for lease in leases if lease is not None]
    assert len(taken) == 10
    assert len(set(taken)) == 10
    assert len({lease.token for lease in leases if lease is not None}) == 10
    assert await postgres_work_queue.claim("late", lease_for=LEASE) is None


async def _open(pg_engine: AsyncEngine, count: int) -> list[AsyncConnection]:
    """``count`` connections, each a distinct server process, idle (no transaction open)."""
    connections = [await pg_engine.connect() for _ in range(count)]
    pids = set()
    for conn in connections:
        pids.add((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        await conn.commit()
    assert len(pids) == count
    return connections


SPREAD_WORKERS = 4
SPREAD_ROUNDS = 12
# How long a worker of a ``held`` round waits for the others before it commits
# anyway: claims that took one tenant wait on its turns row, and the round must
# fail on its assertion rather than hang.
ROUND_WAIT = 5.0


async def _spread_round(
    queue: PostgresWorkQueue, connections: list[AsyncConnection], *, held: bool
) -> list[Lease | None]:
    """Every connection claims at once, each in its own transaction."""
    claimed = 0
    everyone = asyncio.Event()

    async def worker(index: int, conn: AsyncConnection) -> Lease | None:
        nonlocal claimed
        async with conn.begin():
            lease = await queue.bound(conn).claim(f"w{index}", lease_for=LEASE)
            claimed += 1
            if claimed == len(connections):
                everyone.set()
            if held:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(everyone.wait(), timeout=ROUND_WAIT)
            return lease

    return await asyncio.gather(*(worker(index, conn) for index, conn in enumerate(connections)))


@pytest.mark.parametrize("overlap", ["free", "held"])
async def test_workers_claiming_at_once_spread_over_the_tenants_at_the_front(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, overlap: str
) -> None:
    """k workers claiming at once, with k tenants holding due work, take k different tenants.

    ``free``: each claim commits as soon as it returns, so a claim whose
    snapshot predates another's commit may still repeat that tenant: at most
    one repeat a round. ``held``: every claim's transaction stays open until
    the whole round has claimed, so the claims overlap entirely: no repeat.
    Over all rounds, every tenant gets its share.
    """
    k = SPREAD_WORKERS
    tenants = [chr(ord("a") + n) for n in range(k)]
    for tenant in tenants:
        await _fill(postgres_work_queue, tenant, SPREAD_ROUNDS + k)
    least = k if overlap == "held" else k - 1
    connections = await _open(pg_engine, k)
    rounds: list[list[str]] = []
    taken: set[tuple[str, str]] = set()
    try:
        for _ in range(SPREAD_ROUNDS):
            leases = await _spread_round(postgres_work_queue, connections, held=overlap == "held")
            got = [lease for lease in leases if lease is not None]
            assert len(got) == k
            rounds.append([lease.item.tenant for lease in got])
            taken.update((lease.item.tenant, lease.item.item_id) for lease in got)
            assert len(set(rounds[-1])) >= least, rounds
    finally:
        for conn in connections:
            await conn.close()
    assert len(taken) == k * SPREAD_ROUNDS
    shares = Counter(tenant for tenants_of_round in rounds for tenant in tenants_of_round)
    assert set(shares) == set(tenants)
    assert all(abs(share - SPREAD_ROUNDS) <= 2 for share in shares.values()), shares


async def test_a_claim_passes_a_tenant_being_claimed_and_takes_work_when_all_are(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """A claim passes over a tenant whose claim is still open; with every tenant busy it
    still takes an item, from the tenant served longest ago, rather than come back empty."""
    await _fill(postgres_work_queue, "a", 3)
    await _fill(postgres_work_queue, "b", 3)
    first, second, third, last = await _open(pg_engine, 4)

    async def claim(conn: AsyncConnection, worker: str) -> tuple[str, str]:
        lease = await postgres_work_queue.bound(conn).claim(worker, lease_for=LEASE)
        assert lease is not None
        return (lease.item.tenant, lease.item.item_id)

    try:
        for conn in (first, second, third):
            await conn.begin()
        assert await claim(first, "w1") == ("a", "i0000")
        # A claim of a taken after a's claim would wait on a's turns row: bound the wait.
        passing = asyncio.create_task(claim(second, "w2"))
        await asyncio.wait([passing], timeout=ROUND_WAIT)
        passed_over = passing.done()
        # Both tenants busy: the third claim takes a's next item, and waits for the
        # first claim to commit before it sends a to the back.
        fallback = asyncio.create_task(claim(third, "w3"))
        await asyncio.wait([fallback], timeout=0.2)
        await first.commit()
        assert passed_over, "the second claim waited on the first claim's tenant"
        assert await passing == ("b", "i0000")
        assert await fallback == ("a", "i0001")
        await second.commit()
        await third.commit()
        # Committed, the rotation is exact again: b was served longest ago.
        async with last.begin():
            assert await claim(last, "w4") == ("b", "i0001")
    finally:
        for conn in (first, second, third, last):
            await conn.close()


async def test_many_workers_drain_a_queue_each_item_once(
    postgres_work_queue: PostgresWorkQueue,
) -> None:
    """Sixteen workers claiming in batches until empty take every item exactly once."""
    for tenant in ("a", "b", "c"):
        await _fill(postgres_work_queue, tenant, 40)
    taken: Counter[tuple[str, str]] = Counter()

    async def worker(name: str) -> None:
        while True:
            leases = await postgres_work_queue.claim_batch(name, lease_for=LEASE, limit=3)
            if not leases:
                return
            for lease in leases:
                taken[(lease.item.tenant, lease.item.item_id)] += 1
                await postgres_work_queue.ack(lease)

    await asyncio.gather(*(worker(f"w{n}") for n in range(16)))
    assert len(taken) == 120
    assert set(taken.values()) == {1}
    assert (await postgres_work_queue.stats()).tenants == {}


async def test_claim_is_one_statement(
    postgres_work_queue: PostgresWorkQueue, statements: list[str]
) -> None:
    """A claim is one statement, and so is a full batch, however many items and tenants it
    takes (a short one adds one claim per missing item, the last finding nothing); so are
    enqueue_many and ack_many."""
    await _fill(postgres_work_queue, "acme", 2)
    before = len(statements)
    assert await postgres_work_queue.claim("w1", lease_for=LEASE) is not None
    assert len(statements) - before == 1
    before = len(statements)
    leases = await postgres_work_queue.claim_batch("w1", lease_for=LEASE, limit=5)
    assert len(leases) == 1
    # Short of its limit: one more claim looks for the rest and finds nothing.
    assert len(statements) - before == 2
    before = len(statements)
    renewed = await postgres_work_queue.heartbeat(leases[0])
    await postgres_work_queue.ack(renewed)
    assert len(statements) - before == 2
    before = len(statements)
    await postgres_work_queue.enqueue_many(
        [WorkItem(tenant=t, item_id=f"m{i}") for t in "abc" for i in range(7)]
    )
    assert len(statements) - before == 1
    before = len(statements)
    batch = await postgres_work_queue.claim_batch("w1", lease_for=LEASE, limit=20)
    assert len(batch) == 20
    assert len(statements) - before == 1
    before = len(statements)
    done = await postgres_work_queue.ack_many(batch)
    assert all(isinstance(item, WorkItem) for item in done)
    assert len(statements) - before == 1


async def test_a_batch_is_one_statement_and_a_stored_item_in_it_fails_nothing(
    postgres_work_queue: PostgresWorkQueue,
    statements: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of new items is one statement; so is one naming a stored item, which
    fails nothing (a failed statement is an ERROR in the server's log, and idempotent
    re-enqueues are normal) and answers the stored item as it is, the turns counting
    only what was inserted."""
    failed: list[Exception] = []
    recorded = _direct.Statements.execute  # the statements fixture's

    async def execute(self: _direct.Statements, statement: Any, parameters: Any = None) -> Any:
        try:
            return await recorded(self, statement, parameters)
        except Exception as exc:
            failed.append(exc)
            raise

    monkeypatch.setattr(_direct.Statements, "execute", execute)
    before = len(statements)
    fresh = await postgres_work_queue.enqueue_many(
        [WorkItem(tenant=t, item_id=f"n{i}") for t in "ab" for i in range(3)]
    )
    assert len(statements) - before == 1
    lease = await postgres_work_queue.claim("w1", lease_for=LEASE)
    assert lease is not None
    before = len(statements)
    mixed = await postgres_work_queue.enqueue_many(
        [
            WorkItem(tenant="a", item_id="n9"),
            WorkItem(tenant=lease.item.tenant, item_id=lease.item.item_id, payload={"v": 2}),
            WorkItem(tenant="c", item_id="n0"),
        ]
    )
    assert len(statements) - before == 1
    assert mixed[1] == lease.item
    assert [m.status for m in mixed] == [ItemStatus.QUEUED, ItemStatus.LEASED, ItemStatus.QUEUED]
    assert await postgres_work_queue.get_item("a", "n9") == mixed[0]
    stats = await postgres_work_queue.stats()
    assert {t: (s.queued, s.leased) for t, s in stats.tenants.items()} == {
        "a": (3, 1),
        "b": (3, 0),
        "c": (1, 0),
    }
    assert fresh[0].status is ItemStatus.QUEUED
    assert failed == []


async def test_a_bulk_load_is_inserted_without_on_conflict_and_a_stored_item_costs_a_resend(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, statements: list[str]
) -> None:
    """A batch of 1,000 or more goes first without ON CONFLICT (enqueue_new). All new, that
    is its one statement. Naming a stored item, that statement fails and writes nothing,
    and the batch goes again as enqueue_many: the stored item is answered as it is, every
    other is inserted once, and the turns count exactly what was inserted."""
    size = _NEW_FIRST_FROM

    async def turns_queued() -> int:
        async with pg_engine.connect() as conn:
            return int(
                (await conn.execute(text("SELECT sum(queued) FROM adk_queue_turns"))).scalar_one()
            )

    fresh = await postgres_work_queue.enqueue_many(
        [WorkItem(tenant=f"t{i % 4}", item_id=f"b{i}") for i in range(size)]
    )
    assert len(statements) == 1
    assert "ON CONFLICT DO NOTHING" not in statements[0]
    assert all(item.status is ItemStatus.QUEUED for item in fresh)
    lease = await postgres_work_queue.claim("w1", lease_for=LEASE)
    assert lease is not None

    # The leased item sits in the middle of the next batch's insert order.
    batch = [WorkItem(tenant=f"t{i % 4}", item_id=f"c{i}") for i in range(size - 1)]
    batch.insert(size // 2, WorkItem(tenant=lease.item.tenant, item_id=lease.item.item_id))
    del statements[:]
    mixed = await postgres_work_queue.enqueue_many(batch)
    assert len(statements) == 2
    assert "ON CONFLICT DO NOTHING" not in statements[0]
    assert "ON CONFLICT DO NOTHING" in statements[1]
    assert mixed[size // 2] == lease.item
    assert sum(item.status is ItemStatus.QUEUED for item in mixed) == size - 1
    stats = await postgres_work_queue.stats()
    assert (stats.queued, stats.leased) == (2 * size - 2, 1)
    assert await turns_queued() == 2 * size - 2

    # The same batch again: every item is stored; nothing is inserted or counted twice.
    again = await postgres_work_queue.enqueue_many(batch)
    assert again == mixed
    stats = await postgres_work_queue.stats()
    assert (stats.queued, stats.leased) == (2 * size - 2, 1)
    assert await turns_queued() == 2 * size - 2


@pytest.mark.parametrize("extra", [0, _NEW_FIRST_FROM], ids=["small", "bulk"])
async def test_an_item_stored_by_a_concurrent_enqueue_meanwhile_is_answered_as_stored(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, extra: int
) -> None:
    """A caller's transaction has enqueued an item (bound, not committed) that a batch also
    names: the batch's insert waits on that item's key, skips it once the caller commits,
    and the item, stored after the batch's snapshot, is read and answered as stored; the
    batch's other items are stored once. A bulk load's first statement (no ON CONFLICT)
    waits the same way, then fails on the key, writing nothing, and the batch goes again."""
    queue = postgres_work_queue
    filler = [WorkItem(tenant="b", item_id=f"y{i}") for i in range(extra)]
    async with pg_engine.connect() as conn:
        caller = await conn.begin()
        await queue.bound(conn).enqueue(WorkItem(tenant="a", item_id="x1", payload={"by": "c"}))
        batch = asyncio.create_task(
            queue.enqueue_many(
                [
                    WorkItem(tenant="a", item_id="x0"),
                    WorkItem(tenant="a", item_id="x1", payload={"by": "batch"}),
                    WorkItem(tenant="b", item_id="x2"),
                    *filler,
                ]
            )
        )
        await asyncio.sleep(0.3)
        assert not batch.done()  # waiting on the key the caller's transaction holds
        await caller.commit()
    stored = await asyncio.wait_for(batch, 5.0)
    assert [(item.item_id, item.payload) for item in stored[:3]] == [
        ("x0", {}),
        ("x1", {"by": "c"}),
        ("x2", {}),
    ]
    assert [item.item_id for item in stored[3:]] == [item.item_id for item in filler]
    stats = await queue.stats()
    assert {t: s.queued for t, s in stats.tenants.items()} == {"a": 2, "b": 1 + extra}


async def test_a_resent_batch_answers_what_its_first_attempt_stored(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """The executor's resend of a batch whose first attempt committed (its reply lost):
    the insert meets the batch's own rows, and the answer is those rows, stored once,
    each tenant's turn counting them once."""
    queue = postgres_work_queue
    now = read_clock(queue.clock)
    batch = [
        queue._prepare("", WorkItem(tenant=f"t{i % 2}", item_id=f"r{i}"), now, now)
        for i in range(6)
    ]
    first = await queue._enqueue_many(batch)
    again = await queue._enqueue_many(batch)
    assert again == first
    async with pg_engine.connect() as conn:
        rows = await conn.execute(text("SELECT tenant, queued FROM adk_queue_turns"))
        counts = dict(rows.all())
    assert counts == {"t0": 3, "t1": 3}


async def test_purge_dead_is_one_delete_statement(
    postgres_work_queue: PostgresWorkQueue, statements: list[str]
) -> None:
    """purge_dead is one statement, a DELETE of the tenant's dead rows, however many."""
    await _fill(postgres_work_queue, "acme", 30)
    leases = await postgres_work_queue.claim_batch("w1", lease_for=LEASE, limit=30)
    for lease in leases:
        await postgres_work_queue.fail(lease, "poison", retryable=False)
    before = len(statements)
    assert await postgres_work_queue.purge_dead("acme") == 30
    assert len(statements) - before == 1
    assert "DELETE FROM" in statements[-1]
    assert await postgres_work_queue.purge_dead("acme") == 0


async def _counts(conn: AsyncConnection) -> dict[str, tuple[int, int, int]]:
    rows = await conn.execute(
        text(
            "SELECT relname, seq_scan, seq_tup_read, idx_tup_fetch "
            "FROM pg_stat_xact_user_tables WHERE relname IN ('adk_work', 'adk_queue_turns')"
        )
    )
    return {name: (int(a), int(b), int(c)) for name, a, b, c in rows}


async def test_a_claim_reads_neither_idle_tenants_nor_the_backlog(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """With thousands of idle and sleeping tenants and a deep backlog, a claim reads a few rows."""
    async with pg_engine.begin() as conn:
        # 3000 tenants that had work once and have none now, 1000 whose work is all
        # delayed, and a backlog of 5000 delayed items behind the due ones.
        await conn.execute(
            text(
                "INSERT INTO adk_queue_turns (queue, tenant, last_turn, queued, next_due_at, "
                "checked_at) SELECT 'default', 'idle' || g, g, 0, NULL, now() "
                "FROM generate_series(1, 3000) g"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO adk_queue_turns (queue, tenant, last_turn, queued, next_due_at, "
                "checked_at) SELECT 'default', 'sleep' || g, 0, 1, "
                "'2030-01-01', '2026-01-01' FROM generate_series(1, 1000) g"
            )
        )
    await _fill(postgres_work_queue, "busy", 3)
    async with pg_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO adk_work (queue, tenant, item_id, payload, status, available_at, "
                "created_at, updated_at) SELECT 'default', 'busy', 'later' || g, '{}', "
                "'queued', '2030-01-01', now(), now() FROM generate_series(1, 5000) g"
            )
        )
        await conn.execute(text("ANALYZE adk_work"))
        await conn.execute(text("ANALYZE adk_queue_turns"))
    for expected in ("i0000", "i0001"):
        async with pg_engine.connect() as conn:
            await conn.begin()
            before = await _counts(conn)
            lease = await postgres_work_queue.bound(conn).claim("w1", lease_for=LEASE)
            after = await _counts(conn)
            await conn.commit()
        assert lease is not None
        assert lease.item.item_id == expected
        for table in ("adk_work", "adk_queue_turns"):
            seq_scans = after[table][0] - before[table][0]
            fetched = after[table][2] - before[table][2]
            assert seq_scans == 0, table
            assert fetched <= 6, (table, fetched)


async def test_a_batch_claim_reads_its_rows_by_key_whatever_the_statistics_say(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """Statistics taken while the table was empty (a queue filled since its last ANALYZE)
    must not turn a batch claim into a scan of every queued row: the batch's rows are
    found by primary key."""
    async with pg_engine.begin() as conn:
        await conn.execute(text("ANALYZE adk_work"))
    for chunk in range(3):
        await postgres_work_queue.enqueue_many(
            [WorkItem(tenant="busy", item_id=f"b{chunk}-{i:04d}") for i in range(1000)]
        )
    async with pg_engine.connect() as conn:
        await conn.begin()
        before = await _counts(conn)
        leases = await postgres_work_queue.bound(conn).claim_batch("w1", lease_for=LEASE, limit=20)
        after = await _counts(conn)
        await conn.commit()
    assert len(leases) == 20
    fetched = after["adk_work"][2] - before["adk_work"][2]
    assert after["adk_work"][0] == before["adk_work"][0]
    assert fetched <= 100, fetched


async def test_an_item_queued_during_a_claim_of_its_tenant_is_not_stranded(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """An enqueue that commits while a claim of the same tenant waits on it stays claimable."""
    await postgres_work_queue.enqueue(WorkItem(tenant="acme", item_id="first"))
    async with pg_engine.connect() as writer:
        await writer.begin()
        # The enqueue holds the tenant's turns row until it commits.
        await postgres_work_queue.bound(writer).enqueue(WorkItem(tenant="acme", item_id="second"))
        claim = asyncio.create_task(postgres_work_queue.claim("w1", lease_for=LEASE))
        async with pg_engine.connect() as watcher:
            for _ in range(200):
                waiting = (
                    await watcher.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND datname = current_database()"
                        )
                    )
                ).scalar_one()
                await watcher.commit()
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 1, "the claim never waited on the enqueue"
        await writer.commit()
    first = await claim
    assert first is not None
    assert first.item.item_id == "first"
    second = await postgres_work_queue.claim("w2", lease_for=LEASE)
    assert second is not None
    assert second.item.item_id == "second"
    async with pg_engine.connect() as conn:
        queued = (
            await conn.execute(text("SELECT queued FROM adk_queue_turns WHERE tenant = 'acme'"))
        ).scalar_one()
    assert queued == 0


async def test_turn_counts_match_the_items_after_concurrent_traffic(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """Concurrent enqueues, claims, fails and releases leave every turns row's count exact."""
    await asyncio.gather(*(_fill(postgres_work_queue, t, 15) for t in ("a", "b", "c", "d")))

    async def churn(name: str) -> None:
        for step in range(12):
            lease = await postgres_work_queue.claim(name, lease_for=LEASE)
            if lease is None:
                return
            if step % 3 == 0:
                await postgres_work_queue.release(lease)
            elif step % 3 == 1:
                await postgres_work_queue.fail(lease, "boom")
            else:
                await postgres_work_queue.ack(lease)

    await asyncio.gather(
        *(churn(f"w{n}") for n in range(8)),
        *(_fill(postgres_work_queue, "e", 10, prefix="late") for _ in range(1)),
    )
    async with pg_engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT t.tenant, t.queued, "
                    "(SELECT count(*) FROM adk_work w WHERE w.queue = t.queue "
                    "AND w.tenant = t.tenant AND w.status = 'queued'), t.next_due_at, "
                    "(SELECT min(available_at) FROM adk_work w WHERE w.queue = t.queue "
                    "AND w.tenant = t.tenant AND w.status = 'queued') "
                    "FROM adk_queue_turns t"
                )
            )
        ).all()
    assert rows
    for tenant, counted, actual, next_due, earliest in rows:
        assert counted == actual, tenant
        if actual:
            # A lower bound: never later than the earliest queued item.
            assert next_due is not None and next_due <= earliest, tenant
    clock.advance(3600)
    drained = 0
    while await postgres_work_queue.claim("drain", lease_for=LEASE) is not None:
        drained += 1
    assert drained == sum(actual for _tenant, _counted, actual, _n, _e in rows)


async def test_reap_moves_every_lapsed_lease_in_lapse_order(
    postgres_work_queue: PostgresWorkQueue, clock: ManualClock
) -> None:
    """reap moves more lapsed leases than one batch holds, in the order they lapsed."""
    await _fill(postgres_work_queue, "acme", 620)
    first = await postgres_work_queue.claim_batch("w1", lease_for=10, limit=300)
    second = await postgres_work_queue.claim_batch("w2", lease_for=5, limit=320)
    assert len(first) + len(second) == 620
    clock.advance(11)
    moved = await postgres_work_queue.reap()
    assert len(moved) == 620
    assert [item.item_id for item in moved[:320]] == [lease.item.item_id for lease in second]
    assert {item.status for item in moved} == {ItemStatus.QUEUED}
    assert {item.last_error for item in moved} == {"lease expired"}
    stats = await postgres_work_queue.stats()
    assert stats.tenants["acme"].queued == 620


async def test_a_bound_claim_rolled_back_leaves_the_item_queued(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine
) -> None:
    """A claim inside a caller's transaction that rolls back leaves the item as it was."""
    item = await postgres_work_queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    async with pg_engine.connect() as conn:
        await conn.begin()
        lease = await postgres_work_queue.bound(conn).claim("w1", lease_for=LEASE)
        assert lease is not None
        await conn.rollback()
    assert await postgres_work_queue.get_item("acme", "i1") == item
    again = await postgres_work_queue.claim("w2", lease_for=LEASE)
    assert again is not None
    assert again.item.attempts == 1


async def test_work_table_carries_its_vacuum_settings(pg_engine: AsyncEngine) -> None:
    """adk_work is vacuumed aggressively: scale factor 0.01, no cost delay."""
    async with pg_engine.connect() as conn:
        options = (
            await conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'adk_work'"))
        ).scalar_one()
    assert "autovacuum_vacuum_scale_factor=0.01" in options
    assert "autovacuum_vacuum_cost_delay=0" in options


def test_no_queue_statement_binds_a_constant(postgres_work_queue: PostgresWorkQueue) -> None:
    """Every value a queue statement sends is the call's: its numbers are SQL literals, so
    a generic plan can match the partial indexes (WHERE queued > 0) against them."""
    prepared = _prepared(postgres_work_queue.tables)
    for name, statement in prepared.by_name.items():
        constants = [bind for bind, required, _ in statement._order if not required]
        assert constants == [], (name, constants)


def _claim_parameters(queue: PostgresWorkQueue) -> dict[str, Any]:
    """What a claim of up to 10 items by worker w1 sends, now by the queue's clock."""
    moment = read_clock(queue.clock)
    return {
        "p_queue": queue.name,
        "p_now": moment,
        "p_worker": "w1",
        "p_expires_at": moment + timedelta(seconds=LEASE),
        "p_limit": 10,
    }


def _settle_parameters(queue: PostgresWorkQueue) -> dict[str, Any]:
    """What the settles of a lease that is not held send (they match no row)."""
    return {
        "p_queue": queue.name,
        "p_now": read_clock(queue.clock),
        "p_tenant": "t0",
        "p_item_id": "nobody",
        "p_token": -1,
        "p_expires_at": read_clock(queue.clock) + timedelta(seconds=LEASE),
        "p_tenants": ["t0", "t1"],
        "p_item_ids": ["nobody", "none"],
        "p_tokens": [-1, -2],
    }


@pytest.mark.parametrize("statistics", ["none", "of other queues"])
async def test_the_workers_statements_keep_their_generic_plan(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, statistics: str
) -> None:
    """After the five custom plans of a prepared statement PostgreSQL keeps its generic
    plan for what a worker sends per item or batch (claims, acks, heartbeats): none is
    planned again on every call. Also where ANALYZE saw the work table hold only other
    queues' items, the usual state of a deployment with several queues: given the
    queue's name as a constant, the planner then estimated every custom plan cheaper
    than the generic one and planned each call anew (about half of a claim's time); the
    statements read the name through an InitPlan, which no plan can see into."""
    if statistics != "none":
        others = [
            PostgresWorkQueue(pg_engine, settings=PostgresStoreSettings(queue_name=f"other{n}"))
            for n in range(3)
        ]
        for other in others:
            await other.enqueue_many(
                [WorkItem(tenant=f"t{i % 10}", item_id=f"o{i:04d}") for i in range(1000)]
            )
        async with pg_engine.begin() as conn:
            await conn.execute(text("ANALYZE adk_work"))
            await conn.execute(text("ANALYZE adk_queue_turns"))
    await postgres_work_queue.enqueue_many(
        [WorkItem(tenant=f"t{i % 10}", item_id=f"i{i:04d}") for i in range(2000)]
    )
    prepared = _prepared(postgres_work_queue.tables)
    claims = _claim_parameters(postgres_work_queue)
    settles = _settle_parameters(postgres_work_queue)
    cases = [
        (prepared.claim, claims, True),
        (prepared.claim_many, claims, True),
        (prepared.ack_many, settles, False),
        (prepared.ack, settles, False),
        (prepared.heartbeat, settles, False),
    ]
    async with pg_engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        for statement, params, answers in cases:
            for _ in range(8):
                rows = await driver.fetch(statement.sql, *statement.arguments(params))
                assert bool(rows) is answers, statement.sql
            plans = await driver.fetchrow(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement = $1",
                statement.sql,
            )
            assert plans is not None
            assert (plans["custom_plans"], plans["generic_plans"]) == (5, 3), (
                statement.sql[:60],
                dict(plans),
            )


@pytest.mark.parametrize("name", ["claim", "claim_many"])
async def test_a_claim_updates_its_rows_by_ctid_whatever_the_generic_plan_knew(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, name: str
) -> None:
    """A claim's generic plan, made on a small table (as one made early in a process
    that fills the queue later), reaches the rows it locked without scanning the table:
    the single claim its row at the ctid (a TID scan), claim_many its rows at theirs or,
    with the ctids as a filter, by primary key, one probe per row taken. Joined by
    primary key alone such a plan kept a sequential scan of the whole work table for
    claim_batch (130 to 170 ms a claim at 20,000 rows), and for a single claim a scan
    of every queued row through the due index (24 ms a claim at 100,000 queued, in
    `statepact bench`'s claim-cost cells)."""
    # 200 items, never analyzed: by primary key, the plan scanned the table for 50 to 1,000.
    await postgres_work_queue.enqueue_many(
        [WorkItem(tenant=f"t{i % 10}", item_id=f"i{i:04d}") for i in range(200)]
    )
    statement = getattr(_prepared(postgres_work_queue.tables), name)
    values = _claim_parameters(postgres_work_queue)
    async with pg_engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        await driver.execute("SET plan_cache_mode = force_generic_plan")
        await driver.execute(f"PREPARE generic_claim AS {statement.sql}")
        # EXECUTE takes its arguments as literals (no parameters in a utility statement).
        literals = [
            f"'{value.isoformat()}'" if isinstance(value, datetime) else repr(value)
            for value in statement.arguments(values)
        ]
        rows = await driver.fetch(f"EXPLAIN EXECUTE generic_claim({', '.join(literals)})")
        await driver.execute("DEALLOCATE generic_claim")
        await driver.execute("RESET plan_cache_mode")
    plan = "\n".join(row[0] for row in rows)
    update = plan[plan.index("Update on adk_work") : plan.index("Update on adk_queue_turns")]
    scans = [line.split("->")[-1].split("(")[0].strip() for line in update.splitlines()[1:]]
    # The updated table itself (its probes read it under an alias: candidate, rest): the
    # single claim's one row at its ctid; claim_many's at theirs, or (the ctids as a filter)
    # by primary key, one probe per row taken.
    reached = [scan for scan in scans if scan.endswith(" on adk_work")]
    allowed = {"Tid Scan on adk_work"}
    if name == "claim_many":
        allowed.add("Index Scan using pk_adk_work on adk_work")
    assert len(reached) == 1 and reached[0] in allowed, plan


class _TickingClock(ManualClock):
    """A manual clock that moves 1 ms forward at every reading: each enqueue has its own now."""

    def now(self) -> datetime:
        return self.advance(0.001)


async def test_concurrent_enqueues_share_statements_and_are_due_at_once(
    pg_engine: AsyncEngine, statements: list[str]
) -> None:
    """Forty enqueues at once go in a few statements (one alone, the others together), each
    caller gets its own item as stored, and every item is due: the turns rows say so (no
    next_due) and one batch claim takes them all."""
    clock = _TickingClock()
    queue = PostgresWorkQueue(pg_engine, clock=clock)
    await queue.enqueue(WorkItem(tenant="warm", item_id="w"))
    before = len(statements)
    items = [WorkItem(tenant=f"t{n % 4}", item_id=f"i{n}", payload={"n": n}) for n in range(40)]
    stored = await asyncio.gather(*(queue.enqueue(item) for item in items))
    assert 2 <= len(statements) - before < 10, statements[before:]
    assert [(item.tenant, item.item_id, item.payload) for item in stored] == [
        (item.tenant, item.item_id, item.payload) for item in items
    ]
    for item in stored:
        assert await queue.get_item(item.tenant, item.item_id) == item
    assert await queue.next_due() is None
    leases = await queue.claim_batch("w", lease_for=LEASE, limit=100)
    assert len(leases) == 41
    # Inside a caller's transaction nothing is shared: one statement per enqueue.
    async with pg_engine.connect() as conn, conn.begin():
        bound = queue.bound(conn)
        before = len(statements)
        for n in range(3):
            await bound.enqueue(WorkItem(tenant="b", item_id=f"b{n}"))
        assert len(statements) - before == 3
