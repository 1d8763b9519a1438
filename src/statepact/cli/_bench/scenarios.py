"""statepact's own scenarios in ``statepact bench``, on one backing: transactions, state
calls, the queue and the ``Worker``; each result is held against the floors beside it
(``targets``). What each scenario is: docs/benchmarks.md#scenarios.

Timing covers the measured calls only; setup (filling a queue) shows on the progress bar
but is not timed. Nothing here touches data outside the namespace the bench created.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from statepact._limits import MAX_ENQUEUE_BATCH
from statepact._retry import RetryPolicy
from statepact.cli._bench.lifecycle import Latencies, cancel_latency, stats_cost
from statepact.cli._bench.measure import (
    RoundTrips,
    commit_marked,
    count_postgres,
    count_redis,
    repeated,
    sent_since,
    settled,
    spread,
    timed,
    warm_postgres,
)
from statepact.cli._bench.report import BenchResult, Progress
from statepact.cli._bench.targets import Floors
from statepact.cli._common import Backings, CommandError
from statepact.models import RunRecord, WorkItem
from statepact.queue import QueuePolicy
from statepact.tx import Transaction, TransactionManager

LEASE_SECONDS = 60.0
#: Items enqueued one at a time to an idle Worker to time its wake-up.
WAKE_SAMPLES = 20


@dataclass(frozen=True)
class BenchParams:
    backings: tuple[str, ...]
    concurrency: int
    ops: int
    tenants: tuple[int, ...]
    queued: tuple[int, ...]
    claims: int
    #: Done items in the queue for the second ``stats()`` cell (``cli/_bench/lifecycle.py``).
    finished: int = 20_000

    @property
    def claim_cells(self) -> list[tuple[int, int]]:
        return [(t, q) for t in self.tenants for q in self.queued if t <= q]


class Runner:
    """statepact's scenarios on one backing, each followed by the floors beside it."""

    def __init__(self, b: Backings, params: BenchParams, progress: Progress, tag: str) -> None:
        self.b = b
        self.p = params
        self.progress = progress
        self.floors = Floors(b.kind, b.raw, params.ops, tag)
        self.results: list[BenchResult] = []
        self.tag = tag
        self.trips: RoundTrips | None = None

    async def count_round_trips(self) -> None:
        """Start counting the round trips of the backing's client (nothing on memory)."""
        if self.b.kind == "memory":
            return
        trips = RoundTrips()
        if self.b.kind == "redis":
            from statepact.storage.redis import load_scripts

            # Loaded now, the timed parts count the steady state (one EVALSHA), not a first
            # call's NOSCRIPT retry, whichever scripts an earlier run left.
            await load_scripts(self.b.raw)
            await count_redis(self.b.raw, trips)
        else:
            await count_postgres(self.b.raw, trips)
            await warm_postgres(self.b.raw, max(self.p.concurrency, 10))
        self.trips = self.floors.trips = trips

    def manager(self, **options: Any) -> TransactionManager:
        """A manager on the backing whose commits' round trips are counted apart (memory
        sends none: its backend is used as it is, so the wrapper costs it nothing)."""
        base = self.b.manager
        backend = base.backend if self.trips is None else commit_marked(base.backend)
        return TransactionManager(backend, clock=base.clock, **options)

    async def timed(
        self, callers: int, per_caller: int, op: Callable[[int, int], Awaitable[object]]
    ) -> tuple[float, tuple[int, int] | None]:
        """``op`` spread over ``callers`` and timed, with the round trips sent meanwhile
        (all, inside commits); None on memory."""
        return await timed(callers, per_caller, op, self.trips, self.progress)

    async def repeated(
        self,
        callers: int,
        per_caller: int,
        op: Callable[[int, int], Awaitable[object]],
        warmed: Callable[[], object] | None = None,
    ) -> tuple[int, float, tuple[int, int] | None]:
        """``op`` measured as its floors are (:func:`measure.repeated`): one untimed op per
        caller, then timed rounds for at least ``MIN_SECONDS``; ops timed, seconds, round
        trips sent while timed. Each caller has run ``1 + ops // callers`` ops in all."""
        return await repeated(callers, per_caller, op, self.trips, self.progress, warmed=warmed)

    async def record(
        self,
        scenario: str,
        label: str,
        *,
        concurrency: int,
        ops: int,
        seconds: float,
        sent: tuple[int, int] | None = None,
        commits: bool = False,
        **extra: Any,
    ) -> None:
        """Keep a scenario's result, held against the floors beside it, measured now."""
        rate = ops / seconds if seconds > 0 else float("inf")
        first, *also = await self.floors.beside(scenario, concurrency, rate, self.progress)
        per_op = None if sent is None else sent[0] / ops
        commit_per_op = None if sent is None or not commits else sent[1] / ops
        self.results.append(
            BenchResult(
                backing=self.b.kind,
                scenario=scenario,
                label=label,
                concurrency=concurrency,
                ops=ops,
                seconds=seconds,
                ops_per_s=rate,
                floor=first.floor,
                floor_ops_per_s=first.floor_ops_per_s or 0.0,
                ratio=first.ratio or 0.0,
                target=first.target,
                also=also,
                extra=extra,
                round_trips_per_op=per_op,
                commit_round_trips_per_op=commit_per_op,
            )
        )
        self.progress.finish_step(f"{rate:,.0f} ops/s")

    # -- transactions -------------------------------------------------------------------

    async def tx_independent(self) -> None:
        c, n = self.p.concurrency, self.p.ops
        self.progress.start(f"{self.b.kind}: tx independent keys ({c} agents x {n})")
        manager = self.manager()
        resource = f"bench_ind_{self.tag}"

        async def commit(agent: int, i: int) -> None:
            async def body(tx: Transaction) -> None:
                current = await tx.read(resource, f"agent-{agent}")
                count = 0 if current is None else int(current["n"])
                tx.write(resource, f"agent-{agent}", {"n": count + 1})

            await manager.run(body)

        ops, seconds, sent = await self.repeated(c, n, commit)
        await self.record(
            "tx.independent",
            f"tx: independent keys ({c} agents x {n})",
            concurrency=c,
            ops=ops,
            seconds=seconds,
            sent=sent,
            commits=True,
        )

    async def tx_hot_key(self) -> None:
        c, n = self.p.concurrency, self.p.ops
        self.progress.start(f"{self.b.kind}: tx one hot key, no backoff ({c} agents x {n})")
        # No backoff: a conflicting commit is re-run at once (the hot-key scenario).
        manager = self.manager(backoff=RetryPolicy(attempts=1, base_delay=0.0, max_delay=0.0))
        resource = f"bench_hot_{self.tag}"
        attempts = 0

        async def commit(_agent: int, _i: int) -> None:
            async def body(tx: Transaction) -> None:
                nonlocal attempts
                attempts += 1
                current = await tx.read(resource, "hot")
                count = 0 if current is None else int(current["n"])
                tx.write(resource, "hot", {"n": count + 1})

            await manager.run(body, retries=100_000)

        warm_up_attempts = 0

        def warmed() -> None:
            nonlocal warm_up_attempts
            warm_up_attempts = attempts

        ops, seconds, sent = await self.repeated(c, n, commit, warmed=warmed)
        async with manager.transaction() as tx:
            final = await tx.read(resource, "hot")
        if final is None or int(final["n"]) != c + ops:
            raise CommandError(
                f"bench: the hot key ended at {final!r}, expected n={c + ops}: a lost update"
            )
        await self.record(
            "tx.hot_key",
            f"tx: one hot key, no backoff ({c} agents x {n})",
            concurrency=c,
            ops=ops,
            seconds=seconds,
            sent=sent,
            commits=True,
            retries=attempts - warm_up_attempts - ops,
        )

    async def tx_read_only(self) -> None:
        c, n = self.p.concurrency, self.p.ops
        self.progress.start(f"{self.b.kind}: tx read-only commits ({c} agents x {n})")
        manager = self.manager()
        resource = f"bench_ro_{self.tag}"
        async with manager.transaction() as tx:
            for agent in range(c):
                tx.write(resource, f"agent-{agent}", {"n": agent})

        async def commit(agent: int, _i: int) -> None:
            async with manager.transaction() as tx:
                await tx.read(resource, f"agent-{agent}")

        ops, seconds, sent = await self.repeated(c, n, commit)
        await self.record(
            "tx.read_only",
            f"tx: read-only commits ({c} agents x {n})",
            concurrency=c,
            ops=ops,
            seconds=seconds,
            sent=sent,
            commits=True,
        )

    # -- state store ----------------------------------------------------------------------

    async def state_ops(self) -> None:
        c = self.p.concurrency
        state = self.b.state
        tenant = f"bench-{self.tag}"
        # Each caller owns one run, so put_run never conflicts and measures the write path.
        versions: dict[int, RunRecord] = {}
        for caller in range(c):
            versions[caller] = await state.put_run(
                RunRecord(tenant=tenant, run_id=f"run-{caller}", data={"step": 0})
            )

        async def get(caller: int, _i: int) -> None:
            await state.get_run(tenant, f"run-{caller}")

        await self.state_calls("state.get", "get_run", get)

        async def put(caller: int, i: int) -> None:
            versions[caller] = await state.put_run(
                versions[caller].model_copy(update={"data": {"step": i + 1}})
            )

        await self.state_calls("state.put", "put_run", put)

        async def patch_own(caller: int, _i: int) -> None:
            await state.patch_run(
                tenant, f"run-{caller}", input_tokens=100, cost="0.0001", iterations=1
            )

        async def each_added_up(each: int) -> None:
            for caller in range(c):
                mine = await state.get_run(tenant, f"run-{caller}")
                if mine is None or mine.iterations != each:
                    raise CommandError(f"bench: patch_run lost updates ({mine!r})")

        await self.state_calls("state.patch_own", "patch_run, own run", patch_own, each_added_up)

        # Every caller patches the SAME run: the counters must add up exactly.
        await state.put_run(RunRecord(tenant=tenant, run_id="shared"))

        async def patch(_caller: int, _i: int) -> None:
            await state.patch_run(tenant, "shared", input_tokens=100, cost="0.0001", iterations=1)

        async def added_up(each: int) -> None:
            final = await state.get_run(tenant, "shared")
            if final is None or final.iterations != c * each:
                raise CommandError(f"bench: patch_run lost updates ({final!r})")

        await self.state_calls("state.patch", "patch_run, one run", patch, added_up)

    async def state_calls(
        self,
        scenario: str,
        what: str,
        op: Callable[[int, int], Awaitable[object]],
        check: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        """One state scenario: ``--concurrency`` callers doing ``op`` ``--ops`` times each, in
        rounds as :meth:`repeated` runs them, then ``check(ops_per_caller)`` (untimed), then
        the floors beside it."""
        c, n = self.p.concurrency, self.p.ops
        self.progress.start(f"{self.b.kind}: state {what} ({c} callers x {n})")
        ops, seconds, sent = await self.repeated(c, n, op)
        if check is not None:
            await check(1 + ops // c)
        await self.record(
            scenario,
            f"state: {what} ({c} callers x {n})",
            concurrency=c,
            ops=ops,
            seconds=seconds,
            sent=sent,
        )

    # -- queue ----------------------------------------------------------------------------

    async def queue_ops(self) -> None:
        total = self.p.concurrency * self.p.ops
        for workers in (1, 10):
            queue = await self.b.new_queue(f"bench-{self.tag}-w{workers}", QueuePolicy())
            per = -(-total // workers)
            self.progress.start(
                f"{self.b.kind}: queue enqueue ({workers} producer(s), {total} items)"
            )

            async def enqueue(worker: int, i: int, q: Any = queue, per: int = per) -> None:
                n = worker * per + i
                if n < total:
                    await q.enqueue(
                        WorkItem(tenant=f"t{n % 10}", item_id=f"item-{n}", payload={"n": n})
                    )

            seconds, sent = await self.timed(workers, per, enqueue)
            await self.record(
                f"queue.enqueue.w{workers}",
                f"queue: enqueue ({workers} producer{'s' if workers > 1 else ''})",
                concurrency=workers,
                ops=total,
                seconds=seconds,
                sent=sent,
            )

            self.progress.start(
                f"{self.b.kind}: queue claim+ack ({workers} worker(s), {total} items)"
            )
            acked = 0

            async def work(worker: int, _i: int, q: Any = queue) -> None:
                nonlocal acked
                lease = await q.claim(f"w{worker}", lease_for=LEASE_SECONDS)
                if lease is not None:
                    await q.ack(lease)
                    acked += 1

            seconds, sent = await self.timed(workers, per, work)
            if acked != total:
                raise CommandError(f"bench: {workers} workers settled {acked} of {total} items")
            await self.record(
                f"queue.claim_ack.w{workers}",
                f"queue: claim+ack ({workers} worker{'s' if workers > 1 else ''})",
                concurrency=workers,
                ops=total,
                seconds=seconds,
                sent=sent,
            )

    async def worker_ops(self) -> None:
        """``enqueue_many`` of the whole batch, a ``Worker`` draining it, and how soon an
        idle worker starts an item enqueued to it (its fallback poll beside it)."""
        from statepact.worker import Job, Worker, WorkerHooks

        total = self.p.concurrency * self.p.ops
        queue = await self.b.new_queue(f"bench-{self.tag}-worker", QueuePolicy())
        items = [
            WorkItem(tenant=f"t{n % 10}", item_id=f"item-{n}", payload={"n": n})
            for n in range(total)
        ]
        self.progress.start(f"{self.b.kind}: queue enqueue_many ({total} items, one call)")
        before = await settled(self.trips)
        started = time.perf_counter()
        for at in range(0, total, MAX_ENQUEUE_BATCH):
            await queue.enqueue_many(items[at : at + MAX_ENQUEUE_BATCH])
        seconds = time.perf_counter() - started
        sent = await sent_since(self.trips, before)
        await self.record(
            "queue.enqueue_many",
            "queue: enqueue_many (one call)",
            concurrency=1,
            ops=total,
            seconds=seconds,
            sent=sent,
        )

        done = 0
        finished = asyncio.Event()
        starts: asyncio.Queue[float] = asyncio.Queue()

        class Count(WorkerHooks):
            def succeeded(self, job: Job, item: WorkItem) -> None:
                nonlocal done
                done += 1
                if done >= total:
                    finished.set()

        async def handler(job: Job) -> None:
            starts.put_nowait(time.perf_counter())

        poll = 10.0
        worker = Worker(queue, default=handler, concurrency=10, poll_interval=poll, reap_every=0)
        worker.add_hooks(Count())
        self.progress.start(f"{self.b.kind}: Worker drains {total} items (concurrency 10)")
        before = await settled(self.trips)
        started = time.perf_counter()
        async with worker:
            await asyncio.wait_for(finished.wait(), timeout=600)
            drained = time.perf_counter() - started
            sent = await sent_since(self.trips, before)
        # Recorded once the worker stopped: the floors beside them see no worker traffic.
        await self.record(
            "queue.worker.c10",
            "queue: Worker drain (concurrency 10)",
            concurrency=10,
            ops=total,
            seconds=drained,
            sent=sent,
        )
        while not starts.empty():
            starts.get_nowait()
        self.progress.start(f"{self.b.kind}: enqueue to handler start, idle Worker")
        latencies: list[float] = []
        idle = Worker(queue, default=handler, concurrency=10, poll_interval=poll, reap_every=0)
        async with idle:
            for n in range(WAKE_SAMPLES):
                await asyncio.sleep(0.02)  # idle again: its last claim found nothing
                sent_at = time.perf_counter()
                await queue.enqueue(WorkItem(tenant="wake", item_id=f"wake-{n}"))
                latencies.append(await asyncio.wait_for(starts.get(), poll * 2) - sent_at)
        latencies.sort()
        wake = Latencies.of(latencies)
        await self.record(
            "queue.worker.wake",
            f"queue: idle Worker, enqueue to start p50 {wake.p50_ms:.1f} ms, "
            f"p99 {wake.p99_ms:.1f} ms (poll {poll:g} s)",
            concurrency=1,
            **wake.fields(2),
            fallback_poll_s=poll,
        )

    async def claim_cost(self, tenants: int, queued: int) -> None:
        queue = await self.b.new_queue(f"bench-{self.tag}-t{tenants}-q{queued}", QueuePolicy())
        self.progress.start(f"{self.b.kind}: fill {queued} items over {tenants} tenants")
        producers = min(self.p.concurrency, queued)
        per = -(-queued // producers)

        async def fill(producer: int, i: int) -> None:
            n = producer * per + i
            if n < queued:
                await queue.enqueue(
                    WorkItem(tenant=f"t{n % tenants}", item_id=f"item-{n}", payload={"n": n})
                )

        await spread(producers, per, fill, self.progress)
        claims = min(self.p.claims, queued)
        self.progress.start(
            f"{self.b.kind}: claim+ack x{claims} at {tenants} tenants, {queued} queued"
        )

        async def work(_worker: int, _i: int) -> None:
            lease = await queue.claim("w0", lease_for=LEASE_SECONDS)
            if lease is None:
                raise CommandError("bench: a claim found nothing on a full queue")
            await queue.ack(lease)

        seconds, sent = await self.timed(1, claims, work)
        await self.record(
            f"queue.claim_cost.t{tenants}.q{queued}",
            f"queue: claim+ack, {tenants:,} tenants, {queued:,} queued",
            concurrency=1,
            ops=claims,
            seconds=seconds,
            sent=sent,
            tenants=tenants,
            queued=queued,
            ms_per_claim_ack=round(seconds / claims * 1000, 3),
        )

    async def run_all(self) -> tuple[list[BenchResult], list[BenchResult]]:
        """Every scenario, each with the floors beside it; the floors' tables are dropped
        whatever happens."""
        try:
            await self.count_round_trips()
            await self.tx_independent()
            await self.tx_hot_key()
            await self.tx_read_only()
            await self.state_ops()
            await self.queue_ops()
            await self.worker_ops()
            await stats_cost(self)
            await cancel_latency(self)
            for tenants, queued in self.p.claim_cells:
                await self.claim_cost(tenants, queued)
        finally:
            await self.floors.close()
        return self.results, self.floors.samples
