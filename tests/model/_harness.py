"""The harness of the model-based, fuzz and security lanes: one event loop per run, empty
stores per example on every backing, and one way to compare what two calls did.

Hypothesis' stateful API is synchronous and every statepact call is async, so a
:class:`LoopRunner` owns ONE event loop for one machine run (one example) and
drives each call through it. Every client a :class:`Backing` opens for that run
is opened inside that loop and closed before the loop is, so nothing (a
connection, a pending task) outlives its example.

A backing opens *empty* stores each time it is asked, all three through its
``open_backing`` (the one wiring of a backing, as the CLI and the docs use it):

- memory builds new objects;
- Redis opens a client on the session server (``statepact_redis_url``), FLUSHes
  that database (the plugin's own server, or the one the environment named for
  tests) and uses a namespace/prefix no earlier example used;
- PostgreSQL opens an engine on the test database the PostgreSQL fixtures
  provide and empties the tables first (TRUNCATE), so an example sees nothing
  an earlier one wrote.

Outcomes: :func:`attempt` turns a call into an :class:`Outcome`, either the
normalized value or a summary of a *documented* error (a ``StatepactError``,
``ValueError`` or ``TypeError``). Anything else (a driver's exception) is not
caught: the test fails with it, which is the point.

This module must never mock or fake a server, never FLUSHALL, and never touch a
database it was not handed.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from pydantic import SecretStr

from statepact.clock import ManualClock
from statepact.errors import (
    LeaseLostError,
    RunNotFoundError,
    StateConflictError,
    StatepactError,
    StatePersistenceError,
)
from statepact.models import Lease, Page, QueueStats, RunRecord, SessionRecord, WorkItem
from statepact.queue import QueuePolicy, WorkQueue
from statepact.settings import MemoryStoreSettings
from statepact.state import StateStore
from statepact.storage import Backing as BackingSet
from statepact.tx import StorageBackend

T = TypeVar("T")
Closer = Callable[[], Awaitable[None]]
Snapshot = Callable[[], Awaitable[Any]]

# Errors a public call may raise on purpose; anything else escaping a call is a bug.
DOCUMENTED = (StatepactError, ValueError, TypeError)

_names = itertools.count(1)


def fresh_name(prefix: str) -> str:
    """A namespace/prefix no other example of this process used."""
    return f"{prefix}{next(_names)}"


# -- one loop per run ------------------------------------------------------------------


class LoopRunner:
    """One event loop for one machine run; every async call of the run goes through it."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._closers: list[Closer] = []

    def run(self, awaitable: Awaitable[T]) -> T:
        async def _await() -> T:
            return await awaitable

        return self._loop.run_until_complete(_await())

    def open(self, opening: Awaitable[Opened[T]]) -> Opened[T]:
        """Open a store in this loop and remember to close it in :meth:`close`."""
        opened = self.run(opening)
        self._closers.append(opened.close)
        return opened

    def close(self) -> None:
        try:
            while self._closers:
                self.run(self._closers.pop()())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()


# -- backings ------------------------------------------------------------------------------


async def _nothing() -> None:
    return None


@dataclass
class Opened(Generic[T]):
    """A store opened for one run: ``close`` releases it; ``raw`` (servers only) reads every
    key or row the store owns, for the "a refused call changes nothing" checks."""

    value: T
    close: Closer = _nothing
    raw: Snapshot | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Backing(Protocol):
    """Opens empty stores of one backing, inside the caller's running loop."""

    name: str

    async def state_store(self, clock: ManualClock) -> Opened[StateStore]: ...

    async def work_queue(self, clock: ManualClock, policy: QueuePolicy) -> Opened[WorkQueue]: ...

    async def tx_backend(self, clock: ManualClock) -> Opened[StorageBackend]: ...


Parts = tuple[Opened[StateStore], Opened[WorkQueue], Opened[StorageBackend]]


def _parts(backing: BackingSet[Any, Any, Any], raw: Snapshot | None = None) -> Parts:
    """The three stores of one ``open_backing``, each closing the whole backing."""
    return (
        Opened(backing.state, close=backing.close, raw=raw),
        Opened(backing.queue, close=backing.close, raw=raw),
        Opened(backing.backend, close=backing.close, raw=raw),
    )


class _OpensBacking:
    """A ``Backing`` whose stores come from one ``open_backing`` per open (``_open``)."""

    async def _open(self, clock: ManualClock, policy: QueuePolicy | None = None) -> Parts:
        raise NotImplementedError

    async def state_store(self, clock: ManualClock) -> Opened[StateStore]:
        return (await self._open(clock))[0]

    async def work_queue(self, clock: ManualClock, policy: QueuePolicy) -> Opened[WorkQueue]:
        return (await self._open(clock, policy))[1]

    async def tx_backend(self, clock: ManualClock) -> Opened[StorageBackend]:
        return (await self._open(clock))[2]


class MemoryBacking(_OpensBacking):
    name = "memory"

    async def _open(self, clock: ManualClock, policy: QueuePolicy | None = None) -> Parts:
        from statepact.storage.memory import open_backing

        # As the memory_backend fixture builds it: GC on, 64 versions kept per key.
        settings = MemoryStoreSettings(retain_versions=64)
        return _parts(await open_backing(settings, clock=clock, policy=policy))


class RedisBacking(_OpensBacking):
    """Redis stores on the session server; each open FLUSHes the test database first."""

    name = "redis"

    def __init__(self, url: str) -> None:
        self.url = url

    async def _open(self, clock: ManualClock, policy: QueuePolicy | None = None) -> Parts:
        from statepact.storage.redis import RedisStoreSettings, open_backing

        name = fresh_name("mdl")
        # durable=False: open() checks eviction only; the server may be any the environment
        # names for tests.
        settings = RedisStoreSettings(
            dsn=SecretStr(self.url), namespace=name, tx_prefix=name, durable=False
        )
        backing = await open_backing(settings, clock=clock, policy=policy)
        client = backing.client
        await client.flushdb()

        async def snapshot() -> Any:
            return await redis_contents(client)

        return _parts(backing, snapshot)


class PostgresBacking(_OpensBacking):
    """PostgreSQL stores on a database of the test's own; each open empties the tables first."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        self.url = url

    async def _open(self, clock: ManualClock, policy: QueuePolicy | None = None) -> Parts:
        from sqlalchemy import text

        from statepact.storage.postgres import PostgresStoreSettings, open_backing

        # Lock rows expire by the server's time (as Redis's lock TTL does), so the
        # machine moving this clock never frees a live holder's lock.
        settings = PostgresStoreSettings(
            dsn=SecretStr(self.url), pool_size=4, max_overflow=4, pool_timeout=10.0
        )
        backing = await open_backing(settings, clock=clock, policy=policy)
        engine = backing.client
        async with engine.begin() as conn:
            await conn.execute(text(f"TRUNCATE {', '.join(POSTGRES_STATE_TABLES)}"))
        await backing.backend.clear()

        async def snapshot() -> Any:
            return await postgres_contents(engine)

        return _parts(backing, snapshot)


# The tables the state store and the queue write (adk_schema holds the version: kept).
POSTGRES_STATE_TABLES = (
    "adk_runs",
    "adk_sessions",
    "adk_work",
    "adk_queue_turns",
    "adk_queue_control",
    "adk_run_writes",
)


async def postgres_contents(engine: Any) -> dict[str, list[str]]:
    """Every row of every table of the database, as sorted JSON texts per table."""
    from sqlalchemy import text

    contents: dict[str, list[str]] = {}
    async with engine.connect() as conn:
        names = (
            await conn.execute(
                text(
                    "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) "
                    "FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
                    "AND table_schema NOT IN ('pg_catalog', 'information_schema')"
                )
            )
        ).scalars()
        for table in sorted(names):
            rows = await conn.execute(text(f"SELECT to_jsonb(t)::text FROM {table} t"))
            contents[table] = sorted(rows.scalars())
    return contents


async def redis_contents(client: Any) -> dict[bytes, Any]:
    """Every key of the client's database: its type, full contents and whether it expires
    (a replay record or a lock may vanish on its own between two snapshots)."""
    contents: dict[bytes, Any] = {}
    async for key in client.scan_iter(count=1000):
        kind = await client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            value: Any = await client.get(key)
        elif kind == "hash":
            value = sorted((await client.hgetall(key)).items())
        elif kind == "zset":
            value = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            value = sorted(await client.smembers(key))
        elif kind == "list":
            value = await client.lrange(key, 0, -1)
        else:
            value = kind
        contents[key] = {"kind": kind, "value": value, "expires": await client.pttl(key) > 0}
    return contents


def raw_changes(before: dict[Any, Any], after: dict[Any, Any]) -> list[str]:
    """The keys or tables that differ, leaving out expiring keys that have expired."""
    changed = []
    for key in set(before) | set(after):
        was, now = before.get(key), after.get(key)
        if was == now:
            continue
        if now is None and isinstance(was, dict) and was.get("expires"):
            continue
        changed.append(str(key)[:100])
    return sorted(changed)


# -- rule budgets ------------------------------------------------------------------------------
# Hypothesis likes runs that repeat one rule (fifty enqueues in a row); a budget per
# rule and run makes every run mix its rules. The machine keeps ``self.used``, a
# Counter that each budgeted rule bumps when it runs.


def within_budget(name: str, limit: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A precondition: rule ``name`` ran fewer than ``limit`` times in this run."""
    from hypothesis.stateful import precondition

    return precondition(lambda machine: machine.used[name] < limit)


# -- outcomes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a call did: ``ok`` with the normalized value, or the summary of the error raised."""

    ok: bool
    value: Any
    # The error itself, for checks beyond the summary; not part of the comparison.
    error: BaseException | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        return f"ok({self.value!r})" if self.ok else f"raised{self.value!r}"


def error_summary(exc: BaseException) -> tuple[Any, ...]:
    """The parts of an error two backings must agree on: its type and the fields it names."""
    name = type(exc).__name__
    if isinstance(exc, StateConflictError):
        return (name, exc.kind, exc.tenant, exc.record_id, exc.expected, exc.actual)
    if isinstance(exc, RunNotFoundError):
        return (name, exc.tenant, exc.run_id)
    if isinstance(exc, StatePersistenceError):
        return (name, exc.reason)
    if isinstance(exc, LeaseLostError):
        return (name, exc.item_id)
    if isinstance(exc, StatepactError):
        return (name,)
    # ValueError/TypeError: the message starts with the field it names ("tenant: ...").
    return (name, str(exc).split(":", 1)[0])


async def attempt(call: Awaitable[T], normalize: Callable[[T], Any]) -> tuple[Outcome, T | None]:
    """Await ``call``: its normalized value, or the summary of a documented error."""
    try:
        value = await call
    except DOCUMENTED as exc:
        return Outcome(False, error_summary(exc), exc), None
    return Outcome(True, normalize(value)), value


def attempt_sync(call: Callable[[], T], normalize: Callable[[T], Any]) -> tuple[Outcome, T | None]:
    try:
        value = call()
    except DOCUMENTED as exc:
        return Outcome(False, error_summary(exc), exc), None
    return Outcome(True, normalize(value)), value


def compare(
    runner: LoopRunner,
    name: str,
    what: str,
    real: Callable[[], Awaitable[Any]],
    ref: Callable[[], Awaitable[Any]],
    model: Callable[[], Any],
    form: Callable[[Any], Any] = lambda value: value,
) -> tuple[dict[str, Outcome], dict[str, Any]]:
    """Make one call on the backing ``name``, on memory and on the plain model; they must agree.

    Returns the three outcomes and the three raw values, keyed ``real``, ``ref``, ``model``.
    """
    real_outcome, real_value = runner.run(attempt(real(), form))
    ref_outcome, ref_value = runner.run(attempt(ref(), form))
    model_outcome, model_value = attempt_sync(model, form)
    assert ref_outcome == model_outcome, (
        f"memory disagrees with the plain model on {what}:\n{ref_outcome}\n{model_outcome}"
    )
    assert real_outcome == ref_outcome, (
        f"{name} disagrees with memory on {what}:\n{name}: {real_outcome}\nmemory: {ref_outcome}"
    )
    return (
        {"real": real_outcome, "ref": ref_outcome, "model": model_outcome},
        {"real": real_value, "ref": ref_value, "model": model_value},
    )


# -- normal forms -------------------------------------------------------------------------------
# ``seq`` and lease tokens are opaque: the protocols promise their order, not their
# values, so they are left out here and their order is checked by the machines.


def run_form(record: RunRecord | None) -> Any:
    return None if record is None else record.model_dump(exclude={"seq"})


def session_form(record: SessionRecord | None) -> Any:
    return None if record is None else record.model_dump(exclude={"seq"})


def page_form(page: Page[Any]) -> Any:
    return ([item.model_dump(exclude={"seq"}) for item in page.items], page.next is None)


def item_form(item: WorkItem | None) -> Any:
    return None if item is None else item.model_dump()


def lease_form(lease: Lease | None) -> Any:
    if lease is None:
        return None
    return {
        "item": lease.item.model_dump(),
        "worker_id": lease.worker_id,
        "expires_at": lease.expires_at,
        "lease_seconds": lease.lease_seconds,
    }


def stats_form(stats: QueueStats) -> Any:
    return stats.model_dump()


def same(value: Any) -> Any:
    return value


# -- fixtures ---------------------------------------------------------------------------------
# Imported by tests/model/conftest.py and tests/fuzz/conftest.py. The tests using them
# are synchronous (they run their own loop), so only synchronous fixtures feed them.

BACKINGS = [
    pytest.param("memory"),
    pytest.param("redis", marks=pytest.mark.integration),
    pytest.param("postgres", marks=pytest.mark.integration),
]


@pytest.fixture
def memory_model_backing() -> Backing:
    return MemoryBacking()


@pytest.fixture
def redis_model_backing(statepact_redis_url: str) -> Backing:
    return RedisBacking(statepact_redis_url)


@pytest.fixture(params=BACKINGS)
def model_backing(request: pytest.FixtureRequest) -> Backing:
    """Each backing in turn, reached as ``{backing}_model_backing`` (as tests/conformance does)."""
    backing: Backing = request.getfixturevalue(f"{request.param}_model_backing")
    return backing


@pytest.fixture
def postgres_model_backing(
    statepact_postgres_url: str, statepact_postgres_template: str
) -> Iterator[Backing]:
    """A database of this test's own, cloned from the migrated template; dropped after."""
    from tests.fixtures.postgres import (
        create_database,
        drop_database,
        run_in_thread,
        unique_database_name,
    )

    name = unique_database_name("model")
    url = run_in_thread(
        lambda: create_database(statepact_postgres_url, name, template=statepact_postgres_template)
    )
    try:
        yield PostgresBacking(url)
    finally:
        run_in_thread(lambda: drop_database(statepact_postgres_url, name))


# -- lockstep machines --------------------------------------------------------------------------
# What the model machines (tests/model/test_*_model.py) share: the settings they run under,
# a base that owns the run's loop and clock and compares one call on all three, the walk
# through every page of a listing, and the test body that runs a machine on one backing.


def machine_settings(max_examples: int, steps: int) -> settings:
    """``max_examples`` runs of up to ``steps`` steps, no deadline (servers are slow)."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


class LockstepMachine(RuleBasedStateMachine):
    """Drives ``backing`` (``self.real``), the memory reference (``self.ref``) and a plain
    model in lockstep; a subclass opens ``real`` (through ``self.runner``) and ``ref`` on
    ``self.clock``, and keeps ``self.used`` for :func:`within_budget`."""

    backing: ClassVar[Backing]
    real: Any
    ref: Any

    def __init__(self) -> None:
        super().__init__()
        self.runner = LoopRunner()
        self.clock = ManualClock()
        self.used: Counter[str] = Counter()

    def teardown(self) -> None:
        self.runner.close()

    def compare(
        self,
        what: str,
        call: Callable[[Any], Awaitable[Any]],
        model_call: Callable[[], Any],
        form: Callable[[Any], Any] = same,
    ) -> tuple[Outcome, dict[str, Any]]:
        """``call`` on the backing's store and on memory's, ``model_call`` on the model; they
        must agree. Returns the backing's outcome and the three raw values."""
        outcomes, values = self.compare_each(
            what, lambda: call(self.real), lambda: call(self.ref), model_call, form
        )
        return outcomes["real"], values

    def compare_each(
        self,
        what: str,
        real_call: Callable[[], Awaitable[Any]],
        ref_call: Callable[[], Awaitable[Any]],
        model_call: Callable[[], Any],
        form: Callable[[Any], Any] = same,
    ) -> tuple[dict[str, Outcome], dict[str, Any]]:
        """One call each, when the backing's and memory's differ by more than the store (a
        transaction or a lease of their own); see :func:`compare`."""
        return compare(self.runner, self.backing.name, what, real_call, ref_call, model_call, form)


def run_machine(machine: type[LockstepMachine], backing: Backing, run: settings) -> None:
    """Run ``machine`` against ``backing`` under ``run``."""
    bound = type(f"{machine.__name__}_{backing.name}", (machine,), {"backing": backing})
    run_state_machine_as_test(bound, settings=run)


# A store's listing walk stops here, so a cursor that never ends fails instead of hanging.
MOST_PAGES = 20


async def walk_pages(page_after: Callable[[str | None], Awaitable[Page[T]]]) -> list[Page[T]]:
    """Every page of a listing, following its cursors (at most ``MOST_PAGES``)."""
    pages: list[Page[T]] = []
    after: str | None = None
    while len(pages) < MOST_PAGES:
        page = await page_after(after)
        pages.append(page)
        if page.next is None:
            break
        after = page.next
    return pages


def walk_model_pages(page_after: Callable[[str | None], Page[T]]) -> list[Page[T]]:
    """Every page of the plain model's listing."""
    pages: list[Page[T]] = []
    after: str | None = None
    while True:
        page = page_after(after)
        pages.append(page)
        if page.next is None:
            return pages
        after = page.next
