"""``PostgresBackend``: the ``StorageBackend`` under ``TransactionManager``, on PostgreSQL.

Keyed JSON values with their full MVCC history, leases with fencing tokens,
lock rows and durable idempotency records in the ``statepact_*`` tables; every
call is one autocommit statement of ``_sql/tx.py`` (a commit is one call of the
``statepact_commit`` function; a snapshot is taken by the first read's
statement), run on the driver by ``_direct.DirectExecutor``. Transactions'
first reads, and their commits, made while another of their kind is on its way
go together in one statement (``statepact._shared``): the reads share one
snapshot, and commits that touch no common key run the function once each in
one server transaction (any refusal there sends each again alone). How
snapshots see exactly the commits before them, resends and locks:
docs/backings.md#the-commit-function.

This module must never create or alter a table except through the packaged
Alembic revisions (:meth:`PostgresBackend.connect` on an empty database),
never print a DSN, and never let an SQLAlchemy or asyncpg exception out.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from statepact._cancel import finish
from statepact._limits import MAX_BATCH_BYTES, MAX_SHARED_COMMITS, MAX_SHARED_READS
from statepact._retry import RetryPolicy
from statepact._shared import SharedRoundTrips
from statepact.clock import Clock
from statepact.errors import (
    ConflictError,
    DeadlockError,
    FencingError,
    IdempotencyConflictError,
    SchemaVersionError,
    StatepactError,
    StatePersistenceError,
)
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres._client import create_engine, is_rolled_back, sqlstate_of
from statepact.storage.postgres._direct import DirectExecutor, Prepared, Statements
from statepact.storage.postgres._sql import LOCK_NOT_AVAILABLE
from statepact.storage.postgres._sql import tx as sql
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    LeaseRequest,
    LockMode,
    Snapshot,
    StoredResource,
    StoredValue,
    StoredVersion,
)

__all__ = ["PostgresBackend"]

# Compiled once for the driver (_direct.Prepared).
ACQUIRE_LEASE = Prepared(sql.ACQUIRE_LEASE)
BEGIN = Prepared(sql.BEGIN)
BEGIN_READ = Prepared(sql.BEGIN_READ)
BEGIN_READ_MANY = Prepared(sql.BEGIN_READ_MANY)
COMMIT = Prepared(sql.COMMIT)
COMMIT_MANY = Prepared(sql.COMMIT_MANY)
HISTORY = Prepared(sql.HISTORY)
PRUNE_HISTORY = Prepared(sql.PRUNE_HISTORY)
READ_AT = Prepared(sql.READ_AT)
READ_LATEST = Prepared(sql.READ_LATEST)
REGISTER = Prepared(sql.REGISTER)
RELEASE_LEASE = Prepared(sql.RELEASE_LEASE)
RENEW_LEASE = Prepared(sql.RENEW_LEASE)
RESET_SEQ = Prepared(sql.RESET_SEQ)
RESOURCE_INFO = Prepared(sql.RESOURCE_INFO)
TRUNCATE = Prepared(sql.TRUNCATE)
TRY_LOCK = Prepared(sql.TRY_LOCK)
UNLOCK = Prepared(sql.UNLOCK)
_SCHEMA_PRESENT = Prepared(sql.SCHEMA_PRESENT)
_ABSENT = StoredValue(None, 0)

T = TypeVar("T")

# Seconds to open a connection before calling the attempt failed (asyncpg waits 60).
_CONNECT_TIMEOUT = 10.0
_ACCEPTED_DRIVERS = ("postgresql", "postgres", "postgresql+asyncpg")

# -- helpers ------------------------------------------------------------------------------


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


def _detail_of(exc: BaseException) -> dict[str, Any]:
    """The JSON DETAIL the commit function raised with (``{}`` if there is none)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        detail = getattr(current, "detail", None)
        if isinstance(detail, str) and detail:
            try:
                parsed = json.loads(detail)
            except ValueError:
                return {}
            return parsed if isinstance(parsed, dict) else {}
        nested = getattr(current, "orig", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return {}


def _refusal(exc: BaseException) -> StatepactError | None:
    """The public error for a commit the function refused on purpose, else ``None``."""
    state = sqlstate_of(exc)
    if state is None or not state.startswith("SP"):
        return None
    detail = _detail_of(exc)
    resource = detail.get("resource")
    key = detail.get("key")
    if state == "SPF01":
        return FencingError(
            resource=str(resource), token=int(detail["token"]), highest=int(detail["highest"])
        )
    if state == "SPI01":
        return IdempotencyConflictError(str(key))
    if state == "SPC01":
        return ConflictError.write_conflict(
            resource, key, latest=detail.get("latest"), taken_at=detail.get("taken_at")
        )
    if state == "SPC02":
        return ConflictError.read_conflict(
            resource, key, seen=detail.get("seen"), latest=detail.get("latest")
        )
    return ConflictError(
        f"idempotency record {key!r} was removed while the commit ran (SQLSTATE {state}); "
        "retry the transaction"
    )


def _asyncpg_url(dsn: str) -> Any:
    try:
        url = make_url(dsn)
    except sa_exc.ArgumentError as exc:
        raise ValueError("dsn: not a database URL (postgresql://user@host/db)") from exc
    if url.drivername not in _ACCEPTED_DRIVERS:
        raise ValueError(
            f"dsn: the scheme must be postgresql:// or postgresql+asyncpg://, "
            f"got {url.drivername}://"
        )
    return url.set(drivername="postgresql+asyncpg")


def _request_json(request: CommitRequest) -> dict[str, Any]:
    """The commit as the ``statepact_commit`` function reads it (writes and reads sorted)."""
    fencing = request.fencing
    snapshot = request.snapshot
    return {
        "txn_id": request.txn_id,
        "isolation": request.isolation.value,
        # None: the transaction read nothing, its snapshot is the commit point.
        "snapshot": None if snapshot is None else snapshot.token,
        "taken_at": None if snapshot is None else snapshot.sequence,
        "now": request.now.isoformat(),
        "writes": [[w.resource, w.key, w.data] for w in request.writes],
        # Only serializable validates reads: do not ship them otherwise.
        "reads": (
            [[r.resource, r.key, r.version] for r in request.reads]
            if request.isolation is Isolation.SERIALIZABLE
            else []
        ),
        "idempotency_key": request.idempotency_key,
        "fingerprint": request.fingerprint,
        "fencing": None if fencing is None else [fencing.resource, fencing.token],
    }


@dataclass(frozen=True, slots=True)
class _FirstRead:
    """A transaction's first read, waiting to be sent (alone or with others)."""

    resource: str
    key: str


class _Commit:
    """A commit waiting to be sent: its request, every key it touches (two commits of one
    statement share none), and the event it was handed over at (``_LocalOrder``). Its
    text, the request as the function reads it, is made when it is first needed: most
    commits on a hot key are refused before they are sent (``_LocalOrder``)."""

    __slots__ = ("_text", "event", "keys", "request")

    def __init__(self, request: CommitRequest, event: int) -> None:
        keys: list[Hashable] = [(w.resource, w.key) for w in request.writes]
        keys += [(r.resource, r.key) for r in request.reads]
        if request.idempotency_key is not None:
            keys.append(("idempotency", request.idempotency_key))
        self.request = request
        self.keys = tuple(keys)
        self.event = event
        self._text: str | None = None

    def text(self, *, resend: bool = False) -> str:
        """The request as JSON text; ``resend``: marked as one that may have been applied."""
        if resend:
            return json.dumps({**_request_json(self.request), "resend": True})
        if self._text is None:
            self._text = json.dumps(_request_json(self.request))
        return self._text


class _LocalOrder:
    """The order, as this process saw it, of its own snapshots and commits: enough to know,
    without asking the server, that some commits are bound to be refused.

    A commit sent after a snapshot's reply arrived committed after that snapshot was taken,
    so the snapshot does not see it. A later commit that writes one of its keys from that
    snapshot, under ``snapshot`` or ``serializable`` isolation, is one the server refuses
    (first committer wins): this refuses it first, with the same ``ConflictError``, and
    saves the round trip. That is most attempts on a hot key, where the agents read one
    snapshot together and then only one of their commits can land. Events are numbered
    by one counter: a snapshot when its reply arrived, a commit when it was handed over to
    be sent (no later than it was sent). A transaction handed over before (the same
    request sent again) is never refused here: it may have landed, and then the server
    answers with its version. Only the ``remember`` newest snapshots, keys and
    transactions are kept; a transaction forgotten takes its snapshot with it, and what
    is forgotten is left to the server, as is everything other processes do.
    """

    __slots__ = ("_event", "_handed", "_remember", "_taken", "_written")

    def __init__(self, remember: int = 4096) -> None:
        self._event = 0
        self._remember = remember
        self._taken: OrderedDict[str, int] = OrderedDict()  # snapshot token: its event
        # (resource, key): the event of the newest commit known to have written it, and its
        # version.
        self._written: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        # Each transaction handed over: the event of its first hand-over, its snapshot token.
        self._handed: OrderedDict[str, tuple[int, str | None]] = OrderedDict()

    def next_event(self) -> int:
        self._event += 1
        return self._event

    def taken(self, snapshot: Snapshot) -> None:
        """``snapshot``'s reply has arrived. A token seen before keeps its first event: a
        snapshot is its token (PostgreSQL's own, ``xmin:xmax:xip``), and none taken after
        a commit that started after the token's first reply can have that token (that
        commit's transaction id is past its ``xmax``)."""
        if snapshot.token is not None and snapshot.token not in self._taken:
            self._keep(self._taken, snapshot.token, self.next_event())

    def hand_over(self, request: CommitRequest) -> int:
        """``request`` is handed over to be sent: its event; 0 if the same transaction was
        handed over before (never refused, and its landing, whenever that was, not noted)."""
        if request.txn_id in self._handed:
            return 0
        event = self.next_event()
        token = None if request.snapshot is None else request.snapshot.token
        self._handed[request.txn_id] = (event, token)
        if len(self._handed) > self._remember:
            _txn, (_event, forgotten) = self._handed.popitem(last=False)
            if forgotten is not None:
                self._taken.pop(forgotten, None)  # no refusal without its transaction
        return event

    def committed(self, event: int, request: CommitRequest, version: int) -> None:
        """The commit handed over at ``event`` landed at ``version``."""
        if not event:
            return
        for write in request.writes:
            slot = (write.resource, write.key)
            known = self._written.get(slot)
            if known is None or known[0] < event:
                self._keep(self._written, slot, (event, version))

    def refusal(self, request: CommitRequest, event: int | None = None) -> ConflictError | None:
        """The server's refusal of ``request``, if it is certain; else None. ``event``: the
        request's hand-over (None: not handed over yet)."""
        handed = self._handed.get(request.txn_id)
        if handed is not None and handed[0] != event:
            return None  # handed over by an earlier call: it may have landed
        snapshot = request.snapshot
        if (
            snapshot is None
            or snapshot.token is None
            or request.isolation is Isolation.READ_COMMITTED
            or request.idempotency_key is not None  # it may be a replay instead
            or request.fencing is not None  # a stale token is refused first
        ):
            return None
        taken = self._taken.get(snapshot.token)
        if taken is None:
            return None
        for write in request.writes:
            known = self._written.get((write.resource, write.key))
            if known is not None and known[0] > taken:
                return ConflictError.write_conflict(
                    write.resource, write.key, latest=known[1], taken_at=snapshot.sequence
                )
        return None

    def _keep(self, kept: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        kept[key] = value
        kept.move_to_end(key)
        if len(kept) > self._remember:
            kept.popitem(last=False)


def _commit_result(reply: Any) -> CommitResult:
    return CommitResult(int(reply["version"]), replayed=bool(reply["replayed"]))


class PostgresBackend:
    """Transactions' storage on PostgreSQL; see the module docstring for the commit path.

    Built like the PostgreSQL stores: ``PostgresBackend(engine, clock=,
    settings=)`` takes an SQLAlchemy ``AsyncEngine`` on asyncpg whose database
    has the statepact tables at revision statepact_0004 or later, does not check it, and
    leaves the engine to its owner; ``await PostgresBackend.open(engine,
    clock=, settings=)`` checks the schema first (``create_schema=True``
    applies the packaged migrations to a database without the tables);
    :meth:`connect` builds its own engine from a DSN with ``create_engine``,
    then opens, and disposes the engine in :meth:`close`.

    ``settings`` is a ``PostgresStoreSettings``; this backend reads:

    - ``lock_timeout``: the default lock wait in seconds.
    - ``lock_ttl_seconds``: a lock row expires that long after its grant (by
      the server's time), so a crashed holder cannot keep a key forever.
    - ``serialization_window``: accepted for parity with ``MemoryBackend``;
      serializable commits are validated in full under locks instead.
    - ``failover_*``: the retry budget for connection errors (6 attempts).

    The same options are accepted as keywords (``failover=`` a ``RetryPolicy``
    for the ``failover_*`` fields) and win over ``settings``. ``clock`` is the
    clock a ``TransactionManager`` on this backend uses unless given one (else
    ``SystemClock``); never read here (lock rows are stamped with the server's
    ``now()``).
    """

    detects_deadlocks = False
    pins_snapshots = False
    in_process = False

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        lock_timeout: float | None = None,
        lock_ttl_seconds: float | None = None,
        serialization_window: int | None = None,
        failover: RetryPolicy | None = None,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"engine: must be an SQLAlchemy AsyncEngine, got {type(engine).__name__}"
            )
        self._settings = settings = (settings or PostgresStoreSettings()).replace(
            lock_timeout=lock_timeout,
            lock_ttl_seconds=lock_ttl_seconds,
            serialization_window=serialization_window,
            failover=failover,
        )
        self.lock_timeout = settings.lock_timeout
        self.lock_ttl_seconds = settings.lock_ttl_seconds
        self.history_retention: float | None = settings.history_retention_seconds
        self.serialization_window = settings.serialization_window
        self.clock: Clock | None = clock
        self._engine = engine
        self._owns_engine = False
        self._executor = DirectExecutor(
            engine,
            policy=settings.retry_policy,
            unavailable=_unavailable,
            what="transactions",
        )
        # Transactions of this process that asked for a lock; end() releases theirs.
        self._locking: set[str] = set()
        self._closed = False
        self._order = _LocalOrder()
        self._first_reads: SharedRoundTrips[_FirstRead, tuple[Snapshot, StoredValue]] = (
            SharedRoundTrips(
                self._first_read,
                self._first_reads_together,
                keys=lambda _read: (),
                size=lambda read: len(read.resource) + len(read.key),
                max_items=MAX_SHARED_READS,
                max_bytes=MAX_BATCH_BYTES,
                name="statepact-first-reads",
            )
        )
        self._commits: SharedRoundTrips[_Commit, CommitResult | None] = SharedRoundTrips(
            lambda commit: self._commit(commit, resend=False),
            self._commits_together,
            keys=lambda commit: commit.keys,
            size=lambda commit: len(commit.text()),
            max_items=MAX_SHARED_COMMITS,
            max_bytes=MAX_BATCH_BYTES,
            name="statepact-commits",
            # A commit that one of this process's, landed while it waited, dooms.
            refused=lambda commit: self._order.refusal(commit.request, commit.event),
        )

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        create_schema: bool = False,
        lock_timeout: float | None = None,
        lock_ttl_seconds: float | None = None,
        serialization_window: int | None = None,
        failover: RetryPolicy | None = None,
    ) -> Self:
        """A backend on ``engine`` (which the caller keeps owning), after checking the schema.

        Raises ``SchemaVersionError`` when the statepact tables or the commit
        functions are missing, unless ``create_schema`` is set and the tables
        do not exist yet: then the packaged Alembic revisions are applied.
        The option keywords are the constructor's.
        """
        backend = cls(
            engine,
            clock=clock,
            settings=settings,
            lock_timeout=lock_timeout,
            lock_ttl_seconds=lock_ttl_seconds,
            serialization_window=serialization_window,
            failover=failover,
        )
        await backend._ensure_schema(create_schema)
        return backend

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        lock_timeout: float | None = None,
        lock_ttl_seconds: float | None = None,
        serialization_window: int | None = None,
        create_schema: bool = True,
        clock: Clock | None = None,
        failover: RetryPolicy | None = None,
        pool_timeout: float = 30.0,
        statement_timeout: float = 30.0,
        **engine_options: Any,
    ) -> Self:
        """:meth:`open` on a pool of its own of ``min_size``..``max_size`` connections to ``dsn``.

        ``dsn`` is ``postgresql://`` or ``postgresql+asyncpg://`` (always run
        through asyncpg). The options are ``PostgresStoreSettings``' (``None``
        keeps its default: 5 s, 60 s, 512). The connection is verified first
        (failover budget, then ``StatePersistenceError``); if the statepact
        tables do not exist, the packaged Alembic revisions create them
        (``create_schema=False`` raises ``SchemaVersionError`` instead).
        ``pool_timeout`` is the wait for a free pooled connection before
        ``PoolExhaustedError``; ``statement_timeout`` (seconds) is set on every
        connection, and the client gives up on a reply 5 s after it (then fails
        over); opening a connection may take 10 s (``connect_args={"timeout":
        ...}`` changes it). ``engine_options`` go to ``create_async_engine``.
        """
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise ValueError(f"min_size: must be a non-negative int, got {min_size!r}")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size: must be a positive int, got {max_size!r}")
        if min_size > max_size:
            raise ValueError(f"min_size: {min_size} is above max_size {max_size}")
        if not statement_timeout > 0:
            raise ValueError(f"statement_timeout: must be positive, got {statement_timeout}")
        url = _asyncpg_url(dsn)
        settings = PostgresStoreSettings(
            dsn=url.render_as_string(hide_password=False),
            pool_size=max_size,
            max_overflow=0,
            pool_timeout=pool_timeout,
        ).replace(
            lock_timeout=lock_timeout,
            lock_ttl_seconds=lock_ttl_seconds,
            serialization_window=serialization_window,
            failover=failover,
        )
        connect_args = dict(engine_options.pop("connect_args", {}))
        server_settings = dict(connect_args.pop("server_settings", {}))
        server_settings.setdefault("statement_timeout", str(round(statement_timeout * 1000)))
        connect_args["server_settings"] = server_settings
        # The client's own bound, a little longer than the server's: a partitioned
        # server never answers, and a call must fail over instead of hanging.
        connect_args.setdefault("command_timeout", statement_timeout + 5.0)
        connect_args.setdefault("timeout", _CONNECT_TIMEOUT)
        # No pre-ping (create_engine's default): it would add round trips to every
        # checkout; a connection the server closed is refused at checkout for free,
        # and every call here is safe to send again after one that went stale.
        engine = create_engine(
            settings, pool_pre_ping=False, connect_args=connect_args, **engine_options
        )
        try:
            backend = await cls.open(
                engine, clock=clock, settings=settings, create_schema=create_schema
            )
        except BaseException:
            await finish(engine.dispose())
            raise
        backend._owns_engine = True
        try:
            await backend._warm(min_size)
        except BaseException:
            await backend.close()
            raise
        return backend

    @property
    def settings(self) -> PostgresStoreSettings:
        return self._settings

    async def _ensure_schema(self, create: bool) -> None:
        async def present(conn: Statements) -> Any:
            return (await conn.execute(_SCHEMA_PRESENT)).one()

        row = await self._run(present, idempotent=True)
        tables, functions = bool(row[0]), all(row[1:])
        if tables and functions:
            return
        if not tables and create:
            from statepact.storage.postgres import migrate

            try:
                await migrate.upgrade(self._engine)
            except StatepactError:
                raise
            except Exception as exc:
                raise SchemaVersionError(
                    "PostgresBackend: applying the packaged migrations failed "
                    f"({type(exc).__name__}); run `statepact db upgrade` with a role "
                    "allowed to create tables"
                ) from exc
            return
        if tables:
            raise SchemaVersionError(
                "PostgresBackend: the statepact tables are at a revision without the commit "
                "functions and version sequence of revision statepact_0004; run "
                "`statepact db upgrade`",
                expected="statepact_0004",
            )
        raise SchemaVersionError(
            "PostgresBackend: the statepact tables do not exist and create_schema=False; "
            "run `statepact db upgrade` (or connect with create_schema=True)",
            expected="statepact_0004",
        )

    async def _warm(self, count: int) -> None:
        """Open ``count`` pooled connections now rather than on the first calls."""
        if count <= 0:
            return
        engine = self._engine
        opened: list[AsyncConnection] = []
        try:
            for _ in range(count):
                conn = await engine.connect()
                opened.append(conn)
                await conn.execute(sql.PING)
        except Exception:
            return  # warming is an optimisation; the first real call reports any trouble
        finally:
            for conn in opened:
                await conn.close()

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    def __repr__(self) -> str:
        return f"PostgresBackend(lock_timeout={self.lock_timeout:g})"

    async def _run(
        self,
        work: Callable[[Statements], Awaitable[T]],
        *,
        idempotent: bool,
        abandonable: bool = False,
    ) -> T:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        return await self._executor.run(work, idempotent=idempotent, abandonable=abandonable)

    async def _read(self, work: Callable[[Statements], Awaitable[T]]) -> T:
        """A read: it changes nothing, so a cancelled caller does not wait for its reply
        (its connection is closed instead, docs/faults.md "Cancellation")."""
        return await self._run(work, idempotent=True, abandonable=True)

    # -- snapshots and reads ----------------------------------------------------------------

    async def begin(self, txn_id: str) -> Snapshot:
        async def work(conn: Statements) -> Snapshot:
            token, sequence = (await conn.execute(BEGIN)).one()
            return Snapshot(int(sequence), token)

        snapshot = await self._read(work)
        self._order.taken(snapshot)
        return snapshot

    async def begin_read(
        self, txn_id: str, resource: str, key: str
    ) -> tuple[Snapshot, StoredValue]:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        taken = await self._first_reads.send(_FirstRead(resource, key))
        self._order.taken(taken[0])
        return taken

    async def _first_read(self, read: _FirstRead) -> tuple[Snapshot, StoredValue]:
        params = {"resource": read.resource, "key": read.key}

        async def work(conn: Statements) -> tuple[Snapshot, StoredValue]:
            token, sequence, data, version = (await conn.execute(BEGIN_READ, params)).one()
            # No row, or a version-0 placeholder: absent.
            found = StoredValue(data, 0 if version is None else int(version))
            return Snapshot(int(sequence), token), found

        return await self._read(work)

    async def _first_reads_together(
        self, reads: list[_FirstRead]
    ) -> list[tuple[Snapshot, StoredValue]]:
        """Several transactions' first reads in one statement: one snapshot for all of them
        (taken while each of their calls was on its way), each key as it sees it."""
        params = {
            "resources": [read.resource for read in reads],
            "keys": [read.key for read in reads],
        }

        async def work(conn: Statements) -> list[tuple[Snapshot, StoredValue]]:
            answers: list[tuple[Snapshot, StoredValue]] = []
            snapshot: Snapshot | None = None
            for _ord, token, sequence, data, version in (
                await conn.execute(BEGIN_READ_MANY, params)
            ).all():
                if snapshot is None:
                    snapshot = Snapshot(int(sequence), token)
                answers.append(
                    (snapshot, StoredValue(data, 0 if version is None else int(version)))
                )
            return answers

        return await self._run(work, idempotent=True)

    async def end(self, txn_id: str) -> None:
        if txn_id not in self._locking:
            return
        if self._closed:
            return  # close() releases what is left
        await self._unlock([txn_id])
        # Forgotten only once the unlock answered (or the server is gone): a
        # cancellation before that leaves the transaction for the next end() to release.
        self._locking.discard(txn_id)

    async def _unlock(self, txn_ids: list[str]) -> None:
        """Delete the lock rows of ``txn_ids`` in one statement; never raises a backing error.

        An unreachable server is left to the rows' expiry: raising here would
        hide the outcome of a commit that has already happened.
        """

        async def work(conn: Statements) -> None:
            await conn.execute(UNLOCK, {"txn_ids": txn_ids})

        try:
            await self._executor.run(work, idempotent=True)
        except StatepactError:
            return

    async def read(self, resource: str, key: str, at: Snapshot | None) -> StoredValue:
        async def work(conn: Statements) -> StoredValue:
            if at is None:
                result = await conn.execute(READ_LATEST, {"resource": resource, "key": key})
            else:
                params = {"resource": resource, "key": key, "snapshot": at.token}
                data, version, pruned = (await conn.execute(READ_AT, params)).one()
                if version is not None:
                    return StoredValue(data, int(version))
                if pruned:
                    raise ConflictError.snapshot_too_old(
                        resource,
                        key,
                        at=at.sequence,
                        gone="dropped from the history by prune_history "
                        f"(history_retention_seconds={self.history_retention:g})",
                    )
                return _ABSENT
            row: Any = result.first()
            if row is None:
                return _ABSENT
            return StoredValue(row[0], int(row[1]))

        return await self._read(work)

    # -- commit -----------------------------------------------------------------------------

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        refusal = self._order.refusal(request)
        if refusal is not None:
            raise refusal  # what the server would answer (_LocalOrder)
        commit = _Commit(request, self._order.hand_over(request))
        # A commit of this process that lands while this one waits may doom it: the shared
        # round trips then answer it with its refusal, unsent (refused=, asked of every
        # waiting commit as each batch is formed, just before it is sent).
        result = await self._commits.send(commit)
        if result is None:
            # Not applied with the others (one of them was refused): alone, as a resend,
            # since an earlier attempt of the shared statement may have applied it.
            result = await self._commit(commit, resend=True)
        return result

    def _landed(self, commit: _Commit, result: CommitResult) -> CommitResult:
        """Note a commit's result for ``_LocalOrder`` (by its sender, before the next commit
        of its keys is sent); a replay wrote nothing now, its writes are older."""
        if not result.replayed:
            self._order.committed(commit.event, commit.request, result.version)
        return result

    async def _commits_together(self, commits: list[_Commit]) -> list[CommitResult | None]:
        """Several commits in one statement (one server transaction; no key in common), in
        the order of their first key, so that two such statements of two processes lock
        single-key commits in one order. A refusal of any of them (a conflict, a stale
        fence, a deadlock, a row another session holds) applies none: each caller then
        sends its own alone (None), where it may wait for its locks. (Those a landed commit
        of this process dooms never get here: the batch was formed without them.)"""
        answers: list[CommitResult | None] = [None] * len(commits)
        order = sorted(range(len(commits)), key=lambda n: commits[n].keys[:1])
        attempts = 0

        async def work(conn: Statements) -> list[CommitResult | None]:
            nonlocal attempts
            attempts += 1
            requests = [commits[n].text(resend=attempts > 1) for n in order]
            try:
                rows = (await conn.execute(COMMIT_MANY, {"requests": requests})).all()
            except Exception as exc:
                if (
                    _refusal(exc) is not None
                    or is_rolled_back(exc)
                    or sqlstate_of(exc) == LOCK_NOT_AVAILABLE
                ):
                    return answers  # the others None: each sent alone
                raise
            landed = list(answers)
            for place, reply in rows:
                n = order[place - 1]
                landed[n] = self._landed(commits[n], _commit_result(reply))
            return landed

        return await self._run(work, idempotent=True)

    async def _commit(self, commit: _Commit, *, resend: bool) -> CommitResult:
        """One commit alone, one call of the function. ``resend``: it may have been applied
        already (an earlier attempt, or a shared statement): the function looks for it.
        A doomed commit never gets here: ``commit`` and the batching refuse it first."""
        attempts = 1 if resend else 0

        async def work(conn: Statements) -> CommitResult:
            nonlocal attempts
            attempts += 1
            # A second attempt may meet its first one applied (docs/backings.md, "The
            # commit function"): it says so, and the function looks for it.
            sent = commit.text(resend=attempts > 1)
            try:
                reply = (await conn.execute(COMMIT, {"request": sent})).scalar_one()
            except Exception as exc:
                public = _refusal(exc)
                if public is None:
                    raise
                raise public from exc
            return self._landed(commit, _commit_result(reply))

        try:
            # Safe to send again: a resend finds its first attempt (docs/backings.md,
            # "The commit function").
            return await self._run(work, idempotent=True)
        except DeadlockError as exc:
            raise ConflictError(
                "PostgreSQL reported a deadlock inside the commit; nothing was applied, "
                "retry the transaction"
            ) from exc

    # -- locks --------------------------------------------------------------------------------

    async def try_lock(
        self, txn_id: str, resource: str, key: str, mode: LockMode, wait: float
    ) -> bool:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        # Recorded before asking: a grant whose reply is lost is still released by end().
        self._locking.add(txn_id)
        params = {
            "resource": resource,
            "key": key,
            "txn_id": txn_id,
            "mode": mode.value,
            "ttl": timedelta(seconds=self.lock_ttl_seconds),
        }

        async def attempt(conn: Statements) -> bool:
            return bool((await conn.execute(TRY_LOCK, params)).scalar_one())

        # Idempotent: asking again for a lock the transaction holds is a no-op.
        return await self._run(attempt, idempotent=True)

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, request: LeaseRequest) -> Lease | None:
        params = {
            "p_resource": request.resource,
            "p_owner": request.owner,
            "p_expires_at": request.expires_at,
            "p_ttl": request.ttl,
            "p_now": request.now,
        }

        async def work(conn: Statements) -> int | None:
            token = (await conn.execute(ACQUIRE_LEASE, params)).scalar_one_or_none()
            return None if token is None else int(token)

        # Sent again after a lost reply, the same owner re-acquires: its lease gets
        # the newer token, and no other owner can have been granted in between.
        token = await self._run(work, idempotent=True)
        if token is None:
            return None
        return Lease(
            resource=request.resource,
            owner=request.owner,
            token=token,
            expires_at=request.expires_at,
            ttl=request.ttl,
        )

    async def renew_lease(self, lease: Lease, request: LeaseRequest) -> Lease | None:
        params = {
            "p_resource": lease.resource,
            "p_token": lease.token,
            "p_owner": lease.owner,
            "p_now": request.now,
            "p_expires_at": request.expires_at,
            "p_ttl": request.ttl,
        }

        async def work(conn: Statements) -> bool:
            return (await conn.execute(RENEW_LEASE, params)).first() is not None

        if not await self._run(work, idempotent=True):
            return None
        return Lease(
            resource=lease.resource,
            owner=lease.owner,
            token=lease.token,
            expires_at=request.expires_at,
            ttl=request.ttl,
        )

    async def release_lease(self, lease: Lease, now: datetime) -> bool:
        params = {"p_resource": lease.resource, "p_token": lease.token, "p_now": now}

        async def work(conn: Statements) -> bool:
            return (await conn.execute(RELEASE_LEASE, params)).first() is not None

        # Not sent again after a lost reply: a second attempt would answer False.
        return await self._run(work, idempotent=False)

    # -- history, registry, operations ----------------------------------------------------------

    async def history(self, resource: str, key: str, limit: int) -> list[StoredVersion]:
        params = {"resource": resource, "key": key, "limit": limit}

        async def work(conn: Statements) -> list[StoredVersion]:
            rows: Any = (await conn.execute(HISTORY, params)).all()
            return [StoredVersion(int(row[0]), row[1], row[2]) for row in rows]

        return await self._read(work)

    async def prune_history(self, cutoff: datetime, batch: int) -> int:
        params: dict[str, Any] = {
            "after_resource": "",
            "after_key": "",
            "keys": batch,
            "batch": batch,
            "cutoff": cutoff,
        }
        deleted = 0
        while True:
            row = await self._prune_step(dict(params))
            if row is None:
                return deleted
            deleted += int(row[0])
            if int(row[0]) >= batch:
                continue  # the page's keys may hold more: the same page again
            if int(row[1]) < batch:
                return deleted
            params["after_resource"], params["after_key"] = row[2], row[3]

    async def _prune_step(self, params: dict[str, Any]) -> Any:
        """One step of ``prune_history``, its own autocommit statement: nothing is held
        between steps, and a step sent again deletes nothing twice."""

        async def work(conn: Statements) -> Any:
            return (await conn.execute(PRUNE_HISTORY, params)).first()

        return await self._run(work, idempotent=True)

    async def register_resource(self, name: str, metadata: str, now: datetime) -> None:
        params = {"p_name": name, "p_metadata": metadata, "p_now": now}

        async def work(conn: Statements) -> None:
            await conn.execute(REGISTER, params)

        await self._run(work, idempotent=True)

    async def resource_info(self, name: str) -> StoredResource | None:
        async def work(conn: Statements) -> StoredResource | None:
            row: Any = (await conn.execute(RESOURCE_INFO, {"name": name})).one()
            stored_metadata, version, committed_at = row
            if stored_metadata is None and version is None:
                return None
            return StoredResource(
                name=name,
                metadata="{}" if stored_metadata is None else stored_metadata,
                version=0 if version is None else int(version),
                last_commit_at=committed_at,
            )

        return await self._read(work)

    async def health_check(self) -> bool:
        if self._closed:
            return False
        # Twice: a pooled connection the server dropped fails the first ping, and
        # that failure makes the pool replace every connection older than it. Each runs
        # to its end even if the caller is cancelled meanwhile: the checkout may be
        # opening a connection, which asyncpg must not have torn down mid-handshake.
        for _ in range(2):
            if await finish(self._ping()):
                return True
        return False

    async def _ping(self) -> bool:
        try:
            async with self._engine.connect() as conn:
                await conn.execute(sql.PING)
        except Exception:
            return False
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A cleanup: finished even if the caller is cancelled meanwhile.
        await finish(self._release_and_close())

    async def _release_and_close(self) -> None:
        # Transactions of this process that still hold locks will never end now:
        # release their rows rather than leave the keys blocked for lock_ttl_seconds.
        if self._locking:
            await self._unlock(sorted(self._locking))
        self._locking.clear()
        await greenlet_spawn(self._executor.check_in)  # a full pool closes overflow ones: I/O
        if self._owns_engine:
            try:
                await self._engine.dispose()
            except Exception:
                return  # disposing a pool whose server is gone: nothing left to release

    async def clear(self) -> None:
        """Empty the ``statepact_*`` tables (only those) and restart the sequence at 0.

        A test and playground helper: ``TRUNCATE`` waits for running commits and
        is not meant to run beside them.
        """

        async def work(conn: Statements) -> None:
            await conn.execute(TRUNCATE)
            await conn.execute(RESET_SEQ)

        await self._run(work, idempotent=True)
        self._locking.clear()
