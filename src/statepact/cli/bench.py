"""``statepact bench``: throughput of every protocol, measured against what Python can reach.

Scenarios, on each backing asked for:

- the three transaction scenarios of docs/benchmarks.md: ``--concurrency`` agents each
  committing ``--ops`` times on its own key; the same on ONE hot key with no
  backoff between retries; read-only commits;
- the state store's ``get_run``, ``put_run`` and ``patch_run`` with
  ``--concurrency`` concurrent callers;
- the queue's ``enqueue`` and claim+ack cycles with 1 and 10 workers;
- ``enqueue_many`` of the whole batch in one call, a ``Worker`` (concurrency
  10) draining it, and the enqueue-to-handler-start latency of an idle
  ``Worker`` (p50 and p99 of 20 items, its fallback poll beside them);
- claim cost with the queue holding ``--queued`` items spread over
  ``--tenants`` tenants (each size pair with tenants <= items).

In the same run it measures each backing's floor, what no library call on
that backing can beat from Python: a dict behind an ``asyncio.Lock`` for
memory; a raw ``PING`` (reads) and a one-line ``EVALSHA`` (writes) on the same
redis-py client; a raw ``SELECT 1`` (reads) and a one-row ``UPDATE`` (writes) on
the same SQLAlchemy engine. The floor is measured right after each scenario,
at its concurrency, so both see the same load. Each result is printed as
ops/s and as its ratio to the floor of its kind (reads or writes).

On a server it also counts the round trips the library sent per operation
during the timed part (:class:`RoundTrips`), and for the transaction
scenarios the share sent inside the backend's ``commit``: on Redis every
command or pipeline the bench's redis-py client sends; on PostgreSQL every
statement the bench's SQLAlchemy engine executes, plus every query asyncpg
sends outside them (the pool's pre-ping, ``BEGIN``, ``COMMIT``, ``ROLLBACK``).

Timing uses ``time.perf_counter`` around the measured calls only; setup (filling
a queue) is shown on the progress bar but not timed. This module must never
touch data outside the namespace the bench created, and never print a DSN in
clear.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO, cast

from statepact._limits import MAX_ENQUEUE_BATCH
from statepact._retry import RetryPolicy
from statepact.cli._common import (
    Backings,
    CommandError,
    add_debug_argument,
    add_server_arguments,
    open_backings,
    run_command,
)
from statepact.clock import SystemClock
from statepact.models import RunRecord, WorkItem
from statepact.queue import QueuePolicy
from statepact.tx import (
    CommitRequest,
    CommitResult,
    StorageBackend,
    Transaction,
    TransactionManager,
)

__all__ = ["BenchResult", "Progress", "RoundTrips", "add_arguments", "command", "run_bench"]

DESCRIPTION = """\
Measure statepact on the backings asked for: the transaction scenarios
(independent keys, one hot key without backoff, read-only commits), the state
store's get/put/patch under concurrent callers, the queue's enqueue and
claim+ack with 1 and 10 workers, and claim cost as tenants and queued items
grow. In the same run it measures each backing's floor (a raw round trip that
no library call can beat from Python) and prints every result as ops/s and as
a ratio to that floor. On a server the bench works in a namespace of its own
and removes it afterwards.
"""

BACKINGS = ("memory", "redis", "postgres")
LEASE_SECONDS = 60.0
#: Items enqueued one at a time to an idle Worker to time its wake-up.
WAKE_SAMPLES = 20
FLOOR_MIN_SECONDS = 0.25
#: The one table the bench creates outside the migrations: the PostgreSQL write floor's rows.
FLOOR_TABLE = "bench_floor"


@dataclass
class BenchResult:
    """One measured scenario on one backing."""

    backing: str
    scenario: str
    label: str
    concurrency: int
    ops: int
    seconds: float
    ops_per_s: float
    floor: str = ""
    floor_ops_per_s: float = 0.0
    ratio: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Round trips the library sent per operation in the timed part; None on memory.
    round_trips_per_op: float | None = None
    #: Of those, the ones sent inside the backend's ``commit`` (transaction scenarios only).
    commit_round_trips_per_op: float | None = None


class Progress:
    """A one-line text progress bar on stderr: redrawn in place on a terminal, else one
    line per finished step."""

    def __init__(self, total: int, stream: TextIO | None = None, *, width: int = 28) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._label = ""

    def _draw(self, fraction: float, *, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        overall = min((self.done + fraction) / self.total, 1.0)
        filled = int(overall * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        text = f"[{bar}] {overall * 100:5.1f}% {self._label}"
        self.stream.write("\r" + text[:110].ljust(110))
        self.stream.flush()

    def start(self, label: str) -> None:
        self._label = label
        if self.tty:
            self._draw(0.0, force=True)

    def update(self, fraction: float) -> None:
        """Progress inside the current step, 0..1."""
        if self.tty:
            self._draw(fraction)

    def finish_step(self, note: str = "") -> None:
        self.done += 1
        if self.tty:
            self._draw(0.0, force=True)
        else:
            self.stream.write(
                f"[{self.done}/{self.total}] {self._label}{(' ' + note) if note else ''}\n"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


@dataclass(frozen=True)
class BenchParams:
    backings: tuple[str, ...]
    concurrency: int
    ops: int
    tenants: tuple[int, ...]
    queued: tuple[int, ...]
    claims: int

    @property
    def claim_cells(self) -> list[tuple[int, int]]:
        return [(t, q) for t in self.tenants for q in self.queued if t <= q]


async def _spread(
    callers: int,
    per_caller: int,
    op: Callable[[int, int], Awaitable[object]],
    progress: Progress | None = None,
) -> float:
    """Run ``op(caller, i)`` ``per_caller`` times in each of ``callers`` tasks; seconds taken."""
    total = callers * per_caller
    done = 0

    async def caller(c: int) -> None:
        nonlocal done
        for i in range(per_caller):
            await op(c, i)
            done += 1
            if progress is not None and done % 16 == 0:
                progress.update(done / total)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return time.perf_counter() - started


# -- round trips ------------------------------------------------------------------------

#: Set while a backend's ``commit`` runs, in the task that called it.
_IN_COMMIT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "statepact_bench_in_commit", default=False
)
#: Set while redis-py sets up a fresh connection (HELLO, CLIENT SETINFO, SELECT): not counted.
_CONNECTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "statepact_bench_connecting", default=False
)


class RoundTrips:
    """Round trips one backing's client sent: all of them, and those inside a ``commit``.

    The counting hooks call :meth:`add` once per request sent to the server:
    on Redis one command, one pipeline or one script call; on PostgreSQL one
    statement or one query asyncpg sends by itself (pre-ping, ``BEGIN``,
    ``COMMIT``, ``ROLLBACK``). Opening a connection is not counted, nor is
    asyncpg preparing a statement the first time a pooled connection runs it.
    """

    def __init__(self) -> None:
        self.total = 0
        self.in_commit = 0

    def add(self, *_args: object) -> None:
        self.total += 1
        if _IN_COMMIT.get():
            self.in_commit += 1

    def read(self) -> tuple[int, int]:
        return self.total, self.in_commit


class _CommitMarked:
    """A backend whose ``commit`` marks the round trips sent inside it; all else delegated."""

    def __init__(self, backend: StorageBackend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def commit(self, request: CommitRequest) -> CommitResult:
        token = _IN_COMMIT.set(True)
        try:
            return await self._backend.commit(request)
        finally:
            _IN_COMMIT.reset(token)


def _commit_marked(backend: StorageBackend) -> StorageBackend:
    # The Protocol's other members are all reached through __getattr__.
    return cast("StorageBackend", _CommitMarked(backend))


async def _count_redis(client: Any, trips: RoundTrips) -> None:
    """Count every request ``client`` sends from now on.

    The pool's connection class becomes a subclass whose ``send_packed_command``
    (one call per command, and one per pipeline) counts once; the connections
    already open are closed and dropped so that every later one is of it. The
    commands redis-py sends to set up a fresh connection are not counted.
    """
    pool = client.connection_pool
    base: Any = pool.connection_class

    class Counting(base):  # type: ignore[misc]
        async def on_connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            token = _CONNECTING.set(True)
            try:
                await super().on_connect_check_health(*args, **kwargs)
            finally:
                _CONNECTING.reset(token)

        async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
            if not _CONNECTING.get():
                trips.add()
            await super().send_packed_command(*args, **kwargs)

    pool.connection_class = Counting
    await pool.disconnect()
    pool.reset()


async def _count_postgres(engine: Any, trips: RoundTrips) -> None:
    """Count every statement ``engine`` executes, and every query asyncpg sends by itself.

    SQLAlchemy's ``before_cursor_execute`` fires once per statement (a prepared
    statement run in AUTOCOMMIT is one round trip). asyncpg's query logger
    fires once per query it sends outside them: the pool's pre-ping, and the
    ``BEGIN``/``COMMIT``/``ROLLBACK`` of a connection not in AUTOCOMMIT. The
    logger is added to each connection as it opens, so the pool is emptied
    first. asyncpg calls the logger with ``call_soon``: :func:`_settled` lets
    those calls run before a count is read.
    """
    from sqlalchemy import event

    sync_engine = engine.sync_engine
    event.listen(sync_engine, "before_cursor_execute", trips.add)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(trips.add)

    event.listen(sync_engine, "connect", on_connect)
    await engine.dispose()


async def _warm_postgres(engine: Any, count: int) -> None:
    """Open ``count`` connections at once (at most what the pool keeps) and use each, so
    the timed parts find them pooled.

    SQLAlchemy skips a pre-ping on a connection's first checkout; an engine
    that pre-pings (``create_engine(..., pool_pre_ping=True)``) does so on
    every checkout in the timed parts alike once the pool is warm.
    """
    from sqlalchemy import text

    kept = engine.sync_engine.pool.size()
    opened: list[Any] = []
    try:
        for _ in range(min(count, kept)):
            conn = await engine.connect()
            opened.append(conn)
            await conn.execute(text("SELECT 1"))
    finally:
        for conn in opened:
            await conn.close()


async def _settled(trips: RoundTrips | None) -> tuple[int, int]:
    """The counts once callbacks already scheduled (asyncpg's query logger) have run."""
    if trips is None:
        return 0, 0
    for _ in range(3):
        await asyncio.sleep(0)
    return trips.read()


class _Floors:
    """The floor of one backing, measured right after each scenario at its concurrency.

    Measuring it next to the scenario, rather than once, means both saw the
    same load: on a shared machine a floor taken minutes earlier would make
    every ratio drift with whatever else was running.
    """

    def __init__(self, b: Backings, ops: int, tag: str) -> None:
        self.b = b
        self.ops = ops
        self.tag = tag
        self._ops: dict[str, Callable[[int, int], Awaitable[object]]] = {}
        self.samples: list[BenchResult] = []
        # The backing's round-trip counter, once the runner started it.
        self.trips: RoundTrips | None = None

    def names(self) -> dict[str, str]:
        return {
            "memory": {"read": "dict+asyncio.Lock", "write": "dict+asyncio.Lock"},
            "redis": {"read": "raw PING", "write": "raw EVALSHA"},
            "postgres": {"read": "raw SELECT 1", "write": "raw one-row UPDATE"},
        }[self.b.kind]

    async def measure(self, kind: str, concurrency: int, after: str) -> tuple[str, float]:
        """The floor's name and ops/s at ``concurrency``, measured now (after ``after``)."""
        name = self.names()[kind]
        if kind not in self._ops:
            self._ops[kind] = await self._op(kind)
        op = self._ops[kind]
        per_caller = max(self.ops, 10)
        ops, seconds = 0, 0.0
        sent_before = await _settled(self.trips)
        # Repeat until the floor has run long enough for the clock to be trusted.
        while seconds < FLOOR_MIN_SECONDS:
            seconds += await _spread(concurrency, per_caller, op)
            ops += concurrency * per_caller
        sent_after = await _settled(self.trips)
        rate = ops / seconds
        self.samples.append(
            BenchResult(
                backing=self.b.kind,
                scenario=f"floor.{name}",
                label=f"floor: {name}",
                concurrency=concurrency,
                ops=ops,
                seconds=seconds,
                ops_per_s=rate,
                floor=name,
                floor_ops_per_s=rate,
                ratio=1.0,
                extra={"after": after},
                round_trips_per_op=(
                    None if self.trips is None else (sent_after[0] - sent_before[0]) / ops
                ),
            )
        )
        return name, rate

    async def _op(self, kind: str) -> Callable[[int, int], Awaitable[object]]:
        if self.b.kind == "memory":
            lock = asyncio.Lock()
            table: dict[int, int] = {}

            async def locked_dict(c: int, _i: int) -> None:
                async with lock:
                    table[c] = table.get(c, 0) + 1

            return locked_dict
        if self.b.kind == "redis":
            return await _redis_floor(self.b.raw, kind, self.tag)
        return await _postgres_floor(self.b.raw, kind, self.tag)

    async def close(self) -> None:
        """Remove what the floors created beside the backing (the PostgreSQL floor's table)."""
        if self.b.kind == "postgres" and "write" in self._ops:
            await _drop_postgres_floor(self.b.raw, self.tag)


class _Runner:
    def __init__(self, b: Backings, params: BenchParams, progress: Progress, tag: str) -> None:
        self.b = b
        self.p = params
        self.progress = progress
        self.floors = _Floors(b, params.ops, tag)
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
            await _count_redis(self.b.raw, trips)
        else:
            await _count_postgres(self.b.raw, trips)
            await _warm_postgres(self.b.raw, max(self.p.concurrency, 10))
        self.trips = self.floors.trips = trips

    def manager(self, **options: Any) -> TransactionManager:
        """A manager on the backing whose commits' round trips are counted apart."""
        base = self.b.manager
        return TransactionManager(_commit_marked(base.backend), clock=base.clock, **options)

    async def timed(
        self, callers: int, per_caller: int, op: Callable[[int, int], Awaitable[object]]
    ) -> tuple[float, tuple[int, int] | None]:
        """``_spread`` with the round trips sent meanwhile (all, inside commits); None on
        memory."""
        before = await _settled(self.trips)
        seconds = await _spread(callers, per_caller, op, self.progress)
        after = await _settled(self.trips)
        if self.trips is None:
            return seconds, None
        return seconds, (after[0] - before[0], after[1] - before[1])

    async def record(
        self,
        scenario: str,
        label: str,
        *,
        concurrency: int,
        ops: int,
        seconds: float,
        floor_kind: str,
        sent: tuple[int, int] | None = None,
        commits: bool = False,
        **extra: Any,
    ) -> None:
        floor, floor_rate = await self.floors.measure(floor_kind, concurrency, scenario)
        rate = ops / seconds if seconds > 0 else float("inf")
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
                floor=floor,
                floor_ops_per_s=floor_rate,
                ratio=rate / floor_rate if floor_rate else 0.0,
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

        seconds, sent = await self.timed(c, n, commit)
        await self.record(
            "tx.independent",
            f"tx: independent keys ({c} agents x {n})",
            concurrency=c,
            ops=c * n,
            seconds=seconds,
            floor_kind="write",
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

        seconds, sent = await self.timed(c, n, commit)
        async with manager.transaction() as tx:
            final = await tx.read(resource, "hot")
        if final is None or int(final["n"]) != c * n:
            raise CommandError(
                f"bench: the hot key ended at {final!r}, expected n={c * n}: a lost update"
            )
        await self.record(
            "tx.hot_key",
            f"tx: one hot key, no backoff ({c} agents x {n})",
            concurrency=c,
            ops=c * n,
            seconds=seconds,
            floor_kind="write",
            sent=sent,
            commits=True,
            retries=attempts - c * n,
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

        seconds, sent = await self.timed(c, n, commit)
        await self.record(
            "tx.read_only",
            f"tx: read-only commits ({c} agents x {n})",
            concurrency=c,
            ops=c * n,
            seconds=seconds,
            floor_kind="read",
            sent=sent,
            commits=True,
        )

    # -- state store ----------------------------------------------------------------------

    async def state_ops(self) -> None:
        c, n = self.p.concurrency, self.p.ops
        state = self.b.state
        tenant = f"bench-{self.tag}"
        # Each caller owns one run, so put_run never conflicts and measures the write path.
        versions: dict[int, RunRecord] = {}
        for caller in range(c):
            versions[caller] = await state.put_run(
                RunRecord(tenant=tenant, run_id=f"run-{caller}", data={"step": 0})
            )

        self.progress.start(f"{self.b.kind}: state get_run ({c} callers x {n})")

        async def get(caller: int, _i: int) -> None:
            await state.get_run(tenant, f"run-{caller}")

        seconds, sent = await self.timed(c, n, get)
        await self.record(
            "state.get",
            f"state: get_run ({c} callers x {n})",
            concurrency=c,
            ops=c * n,
            seconds=seconds,
            floor_kind="read",
            sent=sent,
        )

        self.progress.start(f"{self.b.kind}: state put_run ({c} callers x {n})")

        async def put(caller: int, i: int) -> None:
            versions[caller] = await state.put_run(
                versions[caller].model_copy(update={"data": {"step": i + 1}})
            )

        seconds, sent = await self.timed(c, n, put)
        await self.record(
            "state.put",
            f"state: put_run ({c} callers x {n})",
            concurrency=c,
            ops=c * n,
            seconds=seconds,
            floor_kind="write",
            sent=sent,
        )

        self.progress.start(f"{self.b.kind}: state patch_run, one run ({c} callers x {n})")

        # Every caller patches the SAME run: the counters must add up exactly.
        async def patch(_caller: int, _i: int) -> None:
            await state.patch_run(tenant, "run-0", input_tokens=100, cost="0.0001", iterations=1)

        seconds, sent = await self.timed(c, n, patch)
        final = await state.get_run(tenant, "run-0")
        if final is None or final.iterations != c * n:
            raise CommandError(f"bench: patch_run lost updates ({final!r})")
        await self.record(
            "state.patch",
            f"state: patch_run, one run ({c} callers x {n})",
            concurrency=c,
            ops=c * n,
            seconds=seconds,
            floor_kind="write",
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
                floor_kind="write",
                sent=sent,
            )

            self.progress.start(
                f"{self.b.kind}: queue claim+ack ({workers} worker(s), {total} items)"
            )
            settled = 0

            async def work(worker: int, _i: int, q: Any = queue) -> None:
                nonlocal settled
                lease = await q.claim(f"w{worker}", lease_for=LEASE_SECONDS)
                if lease is not None:
                    await q.ack(lease)
                    settled += 1

            seconds, sent = await self.timed(workers, per, work)
            if settled != total:
                raise CommandError(f"bench: {workers} workers settled {settled} of {total} items")
            await self.record(
                f"queue.claim_ack.w{workers}",
                f"queue: claim+ack ({workers} worker{'s' if workers > 1 else ''})",
                concurrency=workers,
                ops=total,
                seconds=seconds,
                floor_kind="write",
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
        before = await _settled(self.trips)
        started = time.perf_counter()
        for at in range(0, total, MAX_ENQUEUE_BATCH):
            await queue.enqueue_many(items[at : at + MAX_ENQUEUE_BATCH])
        seconds = time.perf_counter() - started
        after = await _settled(self.trips)
        await self.record(
            "queue.enqueue_many",
            "queue: enqueue_many (one call)",
            concurrency=1,
            ops=total,
            seconds=seconds,
            floor_kind="write",
            sent=None if self.trips is None else (after[0] - before[0], after[1] - before[1]),
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
        before = await _settled(self.trips)
        started = time.perf_counter()
        async with worker:
            await asyncio.wait_for(finished.wait(), timeout=600)
            drained = time.perf_counter() - started
            after = await _settled(self.trips)
        # Recorded once the worker stopped: the floors beside them see no worker traffic.
        await self.record(
            "queue.worker.c10",
            "queue: Worker drain (concurrency 10)",
            concurrency=10,
            ops=total,
            seconds=drained,
            floor_kind="write",
            sent=None if self.trips is None else (after[0] - before[0], after[1] - before[1]),
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
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] * 1000
        await self.record(
            "queue.worker.wake",
            f"queue: idle Worker, enqueue to start p50 {p50:.1f} ms, p99 {p99:.1f} ms "
            f"(poll {poll:g} s)",
            concurrency=1,
            ops=len(latencies),
            seconds=sum(latencies),
            floor_kind="write",
            p50_ms=round(p50, 2),
            p99_ms=round(p99, 2),
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

        await _spread(producers, per, fill, self.progress)
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
            floor_kind="write",
            sent=sent,
            tenants=tenants,
            queued=queued,
            ms_per_claim_ack=round(seconds / claims * 1000, 3),
        )

    async def run_all(self) -> tuple[list[BenchResult], list[BenchResult]]:
        """Every scenario, then the floors measured beside them; the floors' table is
        dropped whatever happens."""
        try:
            await self.count_round_trips()
            await self.tx_independent()
            await self.tx_hot_key()
            await self.tx_read_only()
            await self.state_ops()
            await self.queue_ops()
            await self.worker_ops()
            for tenants, queued in self.p.claim_cells:
                await self.claim_cost(tenants, queued)
        finally:
            await self.floors.close()
        return self.results, self.floors.samples


async def _redis_floor(redis: Any, kind: str, tag: str) -> Callable[[int, int], Awaitable[object]]:
    """A raw PING (reads) or a one-line EVALSHA INCR (writes) on the backing's own client."""
    if kind == "read":

        async def ping(_caller: int, _i: int) -> None:
            await redis.ping()

        return ping
    sha = await redis.script_load("return redis.call('INCR', KEYS[1])")

    async def evalsha(caller: int, _i: int) -> None:
        # Under the bench's namespace, so its cleanup deletes these keys too.
        await redis.evalsha(sha, 1, f"{tag}:floor:{caller}")

    return evalsha


async def _postgres_floor(
    engine: Any, kind: str, tag: str
) -> Callable[[int, int], Awaitable[object]]:
    """A raw ``SELECT 1`` (reads) or a one-row ``UPDATE`` (writes) on the backing's own engine.

    Both run in AUTOCOMMIT, so each is one statement (no BEGIN, no COMMIT; the
    engine's pre-ping at checkout, when it has one, adds its own round trips, as
    it does for every library call), and each caller updates its own row, so
    the writes never wait on each other. The table (``FLOOR_TABLE``) is named
    with the bench's own scratch schema, ``tag``, rather than left to
    ``search_path``, so it is created nowhere else; :func:`_drop_postgres_floor`
    drops it when the floors are done, before the schema itself goes. It cannot
    be a ``TEMPORARY`` table: the callers run on different pooled connections.
    """
    from sqlalchemy import text

    table = _floor_table(tag)
    if kind == "read":
        statement = text("SELECT 1")

        async def select_one(_caller: int, _i: int) -> None:
            async with engine.connect() as conn:
                auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await auto.execute(statement)

        return select_one
    async with engine.begin() as conn:
        await conn.execute(
            text(f"CREATE TABLE IF NOT EXISTS {table} (id integer PRIMARY KEY, n bigint)")
        )
        await conn.execute(
            text(
                f"INSERT INTO {table} (id, n) SELECT g, 0 FROM generate_series(0, 999) g "
                "ON CONFLICT DO NOTHING"
            )
        )
    update = text(f"UPDATE {table} SET n = n + 1 WHERE id = :id")

    async def update_row(caller: int, _i: int) -> None:
        async with engine.connect() as conn:
            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await auto.execute(update, {"id": caller % 1000})

    return update_row


def _floor_table(tag: str) -> str:
    """The write floor's table, qualified by the bench's scratch schema.

    ``tag`` is ``bench`` and hex digits (``run_bench`` makes it), so quoting it
    as an identifier is safe; anything else is refused rather than interpolated.
    """
    if not tag.isascii() or not tag.replace("_", "").isalnum():
        raise ValueError(f"tag: {tag!r} is not a plain schema name")
    return f'"{tag}".{FLOOR_TABLE}'


async def _drop_postgres_floor(engine: Any, tag: str) -> None:
    """Drop the write floor's table (a no-op when the bench never made it)."""
    from sqlalchemy import text

    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TABLE IF EXISTS {_floor_table(tag)}"))


def steps_per_backing(params: BenchParams) -> int:
    # One step per recorded result: 3 tx + 3 state + 4 queue + 3 worker + 1 per claim-cost
    # cell.
    return 3 + 3 + 4 + 3 + len(params.claim_cells)


async def run_bench(
    params: BenchParams,
    urls: dict[str, str | None],
    *,
    progress: Progress,
) -> tuple[list[BenchResult], list[BenchResult], dict[str, str]]:
    """Every scenario on every backing in ``params``: results, floor samples, where each ran."""
    results: list[BenchResult] = []
    floors: list[BenchResult] = []
    where: dict[str, str] = {}
    for kind in params.backings:
        tag = f"bench{uuid.uuid4().hex[:8]}"
        async with open_backings(
            kind,
            urls.get(kind),
            clock=SystemClock(),
            policy=QueuePolicy(),
            tag=tag,
            notes=progress.stream,
        ) as b:
            where[kind] = b.where
            measured, samples = await _Runner(b, params, progress, tag).run_all()
            results.extend(measured)
            floors.extend(samples)
    return results, floors, where


def format_round_trips(result: BenchResult) -> str:
    """``3.00``, ``3.00 (commit 1.00)`` for a transaction scenario, ``-`` on memory."""
    if result.round_trips_per_op is None:
        return "-"
    text = f"{result.round_trips_per_op:.2f}"
    if result.commit_round_trips_per_op is not None:
        text += f" (commit {result.commit_round_trips_per_op:.2f})"
    return text


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as a fixed-width text table, one row per scenario and backing."""
    headers = (
        "backing",
        "scenario",
        "conc",
        "ops",
        "round trips/op",
        "ops/s",
        "floor",
        "floor ops/s",
        "x floor",
    )
    rows = [
        (
            r.backing,
            r.label,
            str(r.concurrency),
            str(r.ops),
            format_round_trips(r),
            f"{r.ops_per_s:,.0f}",
            r.floor,
            f"{r.floor_ops_per_s:,.0f}",
            f"{r.ratio:.3f}",
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 7, 8}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)


# -- command line -----------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(_positive(part) for part in text.split(",") if part.strip())


def _backings(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in BACKINGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backing {', '.join(unknown) or '(none)'}; choose from {', '.join(BACKINGS)}"
        )
    return tuple(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``statepact bench``."""
    parser.add_argument(
        "--backend",
        type=_backings,
        default=None,
        metavar="LIST",
        help="comma-separated backings to measure: memory, redis, postgres (default: memory, "
        "plus each server given by --redis/--postgres)",
    )
    add_server_arguments(parser, verb="measure on")
    parser.add_argument(
        "--concurrency",
        type=_positive,
        default=40,
        metavar="N",
        help="concurrent agents/callers in the transaction and state scenarios (default 40)",
    )
    parser.add_argument(
        "--ops",
        type=_positive,
        default=10,
        metavar="N",
        help="operations per caller (default 10: 40 agents x 10 commits); the queue "
        "scenarios move concurrency x ops items",
    )
    parser.add_argument(
        "--tenants",
        type=_sizes,
        default=(10, 10_000),
        metavar="LIST",
        help="tenant counts for the claim-cost scenario, comma-separated (default 10,10000)",
    )
    parser.add_argument(
        "--queued",
        type=_sizes,
        default=(100, 100_000),
        metavar="LIST",
        help="queued-item counts for the claim-cost scenario, comma-separated (default "
        "100,100000); pairs with more tenants than items are skipped",
    )
    parser.add_argument(
        "--claims",
        type=_positive,
        default=200,
        metavar="N",
        help="claim+ack cycles timed in each claim-cost cell (default 200)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of a table"
    )
    add_debug_argument(parser)


def params_from(args: argparse.Namespace) -> BenchParams:
    backings: tuple[str, ...] = args.backend or (
        "memory",
        *(("redis",) if args.redis else ()),
        *(("postgres",) if args.postgres else ()),
    )
    for kind in backings:
        if kind != "memory" and not getattr(args, kind):
            raise CommandError(
                f"--backend {kind} needs --{kind} URL (the server to measure); nothing was run"
            )
    return BenchParams(
        backings=backings,
        concurrency=args.concurrency,
        ops=args.ops,
        tenants=args.tenants,
        queued=args.queued,
        claims=args.claims,
    )


def command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``statepact bench`` with parsed ``args``; the exit code."""
    stream = out or sys.stdout

    async def body() -> int:
        params = params_from(args)
        urls = {"redis": args.redis, "postgres": args.postgres}
        progress = Progress(steps_per_backing(params) * len(params.backings), err)
        try:
            results, floors, where = await run_bench(params, urls, progress=progress)
        finally:
            progress.close()
        if args.json:
            payload = {
                "params": {
                    "concurrency": params.concurrency,
                    "ops": params.ops,
                    "tenants": list(params.tenants),
                    "queued": list(params.queued),
                    "claims": params.claims,
                },
                "backings": where,
                "results": [asdict(r) for r in results],
                "floors": [asdict(f) for f in floors],
            }
            print(json.dumps(payload, indent=2), file=stream)
        else:
            for kind, place in where.items():
                print(f"{kind}: {place}", file=stream)
            print(format_table(results), file=stream)
            print(
                "x floor = ops/s divided by the floor's ops/s, measured right after the "
                "scenario at the same concurrency: 1.0 is one raw call per operation",
                file=stream,
            )
            print(
                "round trips/op = requests the library sent per operation in the timed part "
                "(a count, not a timing); (commit N) = those sent inside the backend's commit; "
                "- = memory, which sends none",
                file=stream,
            )
        return 0

    return run_command("bench", body, debug=args.debug, err=err)


def main(argv: list[str] | None = None) -> int:
    """``python -m statepact.cli.bench``: the bench without the rest of the command line."""
    parser = argparse.ArgumentParser(prog="statepact bench", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
