"""``PostgresBackend``: the ``StorageBackend`` under ``TransactionManager``, on PostgreSQL.

Keyed JSON values with their full MVCC history, resource leases with fencing
tokens, pessimistic lock rows and durable idempotency records, in the
``statepact_*`` tables of ``schema.py`` (SQLAlchemy Core over asyncpg). The
front (``statepact.tx``) has validated, encoded and size-checked everything and
read the clock; this module stores what it is told and hands the JSON text back
verbatim (``json`` columns keep the text as sent).

Round trips. Every call is ONE autocommit statement on a pooled connection (no
BEGIN, no COMMIT): ``begin`` reads ``statepact_meta.seq``; a latest read is the
``statepact_values`` row; a snapshot read is the newest ``statepact_history``
row with ``version <= taken_at`` (a backward scan of the primary key); a
commit is ``SELECT statepact_commit(:request)``, a PL/pgSQL function created by
Alembic revision 0002 that checks fencing, claims the idempotency key, locks,
validates and applies in one server-side transaction; a lock attempt is
``statepact_try_lock(...)``; each lease call is one ``INSERT ... ON CONFLICT``
or ``UPDATE ... RETURNING``. ``end`` costs nothing unless the transaction
took pessimistic locks.

The commit path, and why version order is commit order. The seed serialised
whole commits on one advisory lock. Here a commit locks only what it touches,
in this order: the fencing lease row (``FOR SHARE``: an acquisition cannot
issue a token until the commit is over), the idempotency key (its unique index
entry: a concurrent commit with the same key waits, then replays), each
written key (``FOR NO KEY UPDATE``) and, for ``serializable``, each read key
(``FOR SHARE``) in ``(resource, key)`` byte order, creating a version-0
placeholder row for a key that has none so that absence is lockable too. Then
it validates, and only then takes the one global serialisation point:
``UPDATE statepact_meta SET seq = seq + 1 RETURNING seq``. That row lock is
held through the writes of values and history and the COMMIT, so:

- the commit that got ``n`` is visible before the commit that gets ``n + 1``
  can even read the meta row (the second waits on the row lock, which
  PostgreSQL releases only after the first transaction is visible). Version
  order is commit order;
- ``begin`` reads ``seq`` in its own statement: every commit numbered at or
  below it is already visible, and every commit still in flight will get a
  larger number. A snapshot read ``version <= taken_at`` therefore sees
  exactly the commits that finished before ``begin``, never a later one and
  never a hole: consistent snapshots, linearizable commits;
- independent commits overlap in everything but that short tail (lock, validate,
  write, commit); commits that touch the same keys queue on the key rows, and
  the second one sees the first one's version (first committer wins).

``serializable`` is full backward validation under locks: every read and
written key is locked at commit and every read version is checked current, so
the commit is equivalent to running at its commit point (strict two-phase
locking at commit). That is why the process-local serialization-graph audit of
the memory backing is not run here, and ``serialization_window`` is accepted
for signature compatibility only. A read-only ``serializable`` commit checks
its read versions in one statement and takes no lock or sequence number.

Lost replies. A commit is safe to send again: with an idempotency key, the
record carries the ``txn_id`` that claimed it (the same transaction sent again
gets its result with ``replayed=False``, another one a replay); without one,
the function finds its own first attempt by ``txn_id`` in the history of its
first written key (looked up only when that key moved past the snapshot). A
commit whose connection died after it applied is never applied twice,
whichever attempt reaches the rows first. The executor
(``_client.EngineExecutor``) retries connection errors within the failover
budget, then raises ``StatePersistenceError(reason="unavailable")``; a pool
timeout is ``PoolExhaustedError`` at once. A deadlock or serialization failure
reported by PostgreSQL inside a commit is a ``ConflictError``.

Locks are rows in ``statepact_locks``: a transaction spans several pooled
calls, so a lock cannot be a session lock. Each attempt is one statement that
never waits; the front polls it with backoff until its timeout
(``LockTimeoutError``; there is no wait-for graph, so ``detects_deadlocks`` is
``False`` and a cycle ends as a timeout). A lock row expires
``lock_ttl_seconds`` after it was granted, by the server's ``now()`` (as a
Redis lock's PX TTL runs on Redis's clock), so a crashed process frees its
keys and a host whose clock runs ahead cannot take a live holder's lock; a
holder slower than the TTL can lose its lock unknowingly. The lock rows a
transaction may hold are tracked in this process until ``end`` deleted them;
``close`` deletes those of transactions still live. Lease times are bound
parameters from the injected clock, never the server's ``now()``.

This module must never create or alter a table except through the packaged
Alembic revisions (:meth:`PostgresBackend.connect` on an empty database), never
print a DSN, and never let an SQLAlchemy or asyncpg exception out.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Self, TypeVar

from sqlalchemy import (
    Boolean,
    Interval,
    Row,
    Text,
    bindparam,
    cast,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import JSON

from statepact._cancel import finish
from statepact._retry import RetryPolicy
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
from statepact.storage.postgres._client import EngineExecutor, Runner, create_engine, sqlstate_of
from statepact.storage.postgres.schema import metadata
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    LeaseRequest,
    LockMode,
    StoredResource,
    StoredValue,
    StoredVersion,
)

__all__ = ["PostgresBackend"]

T = TypeVar("T")

# Seconds to open a connection before calling the attempt failed (asyncpg waits 60).
_CONNECT_TIMEOUT = 10.0
_ACCEPTED_DRIVERS = ("postgresql", "postgres", "postgresql+asyncpg")
# Everything PostgresBackend needs from revision 0002 on.
_REQUIRED_FUNCTIONS = (
    "statepact_commit(jsonb)",
    "statepact_try_lock(text, text, text, text, timestamptz, timestamptz)",
)

_meta = metadata.tables["statepact_meta"]
_values = metadata.tables["statepact_values"]
_history = metadata.tables["statepact_history"]
_resources = metadata.tables["statepact_resources"]
_leases = metadata.tables["statepact_leases"]
_locks = metadata.tables["statepact_locks"]
#: Every table ``clear`` empties (and nothing else).
BACKEND_TABLES = (
    "statepact_history",
    "statepact_idempotency",
    "statepact_leases",
    "statepact_locks",
    "statepact_resources",
    "statepact_values",
)


# -- statements ---------------------------------------------------------------------------
#
# Built once from the schema's Table objects; every value is a bound parameter.
# JSON columns are read back as text (CAST(... AS TEXT) of a json column is the
# stored text byte for byte) and written from text, never through a Python dict.


def _stmt_begin() -> Any:
    return select(_meta.c.seq).where(_meta.c.id == 1)


def _stmt_read_latest() -> Any:
    return select(cast(_values.c.data, Text), _values.c.version).where(
        _values.c.resource == bindparam("resource"), _values.c.key == bindparam("key")
    )


def _stmt_read_at() -> Any:
    return (
        select(cast(_history.c.data, Text), _history.c.version)
        .where(
            _history.c.resource == bindparam("resource"),
            _history.c.key == bindparam("key"),
            _history.c.version <= bindparam("at"),
        )
        .order_by(_history.c.version.desc())
        .limit(1)
    )


def _stmt_history() -> Any:
    return (
        select(_history.c.version, cast(_history.c.data, Text), _history.c.committed_at)
        .where(_history.c.resource == bindparam("resource"), _history.c.key == bindparam("key"))
        .order_by(_history.c.version.desc())
        .limit(bindparam("limit"))
    )


def _stmt_commit() -> Any:
    return select(func.statepact_commit(bindparam("request", type_=JSONB), type_=JSONB))


def _stmt_try_lock() -> Any:
    # The server's time, as Redis's PX TTL: a lock row's expiry must not depend on which
    # host's clock asked (one running ahead would take a live holder's lock). now() is
    # the statement's start in autocommit, one value for both arguments.
    return select(
        func.statepact_try_lock(
            bindparam("resource", type_=Text),
            bindparam("key", type_=Text),
            bindparam("txn_id", type_=Text),
            bindparam("mode", type_=Text),
            func.now(),
            func.now() + bindparam("ttl", type_=Interval),
            type_=Boolean,
        )
    )


def _stmt_unlock() -> Any:
    return delete(_locks).where(_locks.c.txn_id.in_(bindparam("txn_ids", expanding=True)))


def _stmt_acquire_lease() -> Any:
    stmt = insert(_leases).values(
        resource=bindparam("p_resource"),
        owner=bindparam("p_owner"),
        token=1,
        expires_at=bindparam("p_expires_at"),
        ttl=bindparam("p_ttl"),
        updated_at=bindparam("p_now"),
    )
    # ON CONFLICT DO UPDATE locks the row: two acquisitions of one resource
    # are serialised, and the WHERE sees the winner's lease.
    return stmt.on_conflict_do_update(
        index_elements=[_leases.c.resource],
        set_={
            "owner": stmt.excluded.owner,
            "token": _leases.c.token + 1,
            "expires_at": stmt.excluded.expires_at,
            "ttl": stmt.excluded.ttl,
            "updated_at": stmt.excluded.updated_at,
        },
        where=(
            _leases.c.owner.is_(None)
            | (_leases.c.expires_at <= bindparam("p_now"))
            | (_leases.c.owner == stmt.excluded.owner)
        ),
    ).returning(_leases.c.token)


def _stmt_renew_lease() -> Any:
    return (
        update(_leases)
        .where(
            _leases.c.resource == bindparam("p_resource"),
            _leases.c.token == bindparam("p_token"),
            _leases.c.owner == bindparam("p_owner"),
            _leases.c.expires_at > bindparam("p_now"),
        )
        .values(
            expires_at=bindparam("p_expires_at"),
            ttl=bindparam("p_ttl"),
            updated_at=bindparam("p_now"),
        )
        .returning(_leases.c.token)
    )


def _stmt_release_lease() -> Any:
    # The row stays: its token is the high-water mark the next lease counts from.
    return (
        update(_leases)
        .where(
            _leases.c.resource == bindparam("p_resource"),
            _leases.c.token == bindparam("p_token"),
            _leases.c.owner.is_not(None),
        )
        .values(owner=None, expires_at=None, ttl=None, updated_at=bindparam("p_now"))
        .returning(_leases.c.token)
    )


def _stmt_register() -> Any:
    stmt = insert(_resources).values(
        name=bindparam("p_name"),
        metadata=cast(bindparam("p_metadata", type_=Text), JSON),
        registered_at=bindparam("p_now"),
    )
    return stmt.on_conflict_do_update(
        index_elements=[_resources.c.name],
        set_={"metadata": stmt.excluded.metadata, "registered_at": stmt.excluded.registered_at},
    )


def _stmt_resource_info() -> Any:
    # A resource's version is its newest written key (schema.py: no hot per-resource row).
    newest = (
        select(_values.c.version, _values.c.committed_at)
        .where(_values.c.resource == bindparam("name"), _values.c.version > 0)
        .order_by(_values.c.version.desc())
        .limit(1)
        .subquery()
    )
    registered = (
        select(cast(_resources.c.metadata, Text).label("metadata"))
        .where(_resources.c.name == bindparam("name"))
        .subquery()
    )
    one = select(text("1 AS one")).subquery()
    return (
        select(registered.c.metadata, newest.c.version, newest.c.committed_at)
        .select_from(one)
        .outerjoin(registered, text("true"))
        .outerjoin(newest, text("true"))
    )


def _stmt_schema_present() -> Any:
    return select(
        func.to_regclass("statepact_meta").is_not(None),
        *(func.to_regprocedure(signature).is_not(None) for signature in _REQUIRED_FUNCTIONS),
    )


_BEGIN = _stmt_begin()
_READ_LATEST = _stmt_read_latest()
_READ_AT = _stmt_read_at()
_HISTORY = _stmt_history()
_COMMIT = _stmt_commit()
_TRY_LOCK = _stmt_try_lock()
_UNLOCK = _stmt_unlock()
_ACQUIRE_LEASE = _stmt_acquire_lease()
_RENEW_LEASE = _stmt_renew_lease()
_RELEASE_LEASE = _stmt_release_lease()
_REGISTER = _stmt_register()
_RESOURCE_INFO = _stmt_resource_info()
_SCHEMA_PRESENT = _stmt_schema_present()
_TRUNCATE = text(f"TRUNCATE {', '.join(BACKEND_TABLES)}")
_RESET_SEQ = update(_meta).where(_meta.c.id == 1).values(seq=0)
_PING = text("SELECT 1")


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
    return {
        "txn_id": request.txn_id,
        "isolation": request.isolation.value,
        "taken_at": request.taken_at,
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


class PostgresBackend:
    """Transactions' storage on PostgreSQL; see the module docstring for the commit path.

    Built like the PostgreSQL stores: ``PostgresBackend(engine, clock=,
    settings=)`` takes an SQLAlchemy ``AsyncEngine`` on asyncpg whose database
    has the statepact tables at revision 0002 or later, does not check it, and
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
        self.serialization_window = settings.serialization_window
        self.clock: Clock | None = clock
        self._engine = engine
        self._owns_engine = False
        self._executor = EngineExecutor(
            engine,
            policy=settings.retry_policy,
            unavailable=_unavailable,
            what="transactions",
        )
        # Transactions of this process that asked for a lock; end() releases theirs.
        self._locking: set[str] = set()
        self._closed = False

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
        async def present(conn: Runner) -> Row[Any]:
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
                "functions (revision 0002); run `statepact db upgrade`",
                expected="0002",
            )
        raise SchemaVersionError(
            "PostgresBackend: the statepact tables do not exist and create_schema=False; "
            "run `statepact db upgrade` (or connect with create_schema=True)",
            expected="0002",
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
                await conn.execute(_PING)
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

    async def _run(self, work: Callable[[Runner], Awaitable[T]], *, idempotent: bool) -> T:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        return await self._executor.run(work, idempotent=idempotent)

    # -- snapshots and reads ----------------------------------------------------------------

    async def begin(self, txn_id: str) -> int:
        async def work(conn: Runner) -> int:
            return int((await conn.execute(_BEGIN)).scalar_one())

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

        async def work(conn: Runner) -> None:
            await conn.execute(_UNLOCK, {"txn_ids": txn_ids})

        try:
            await self._executor.run(work, idempotent=True)
        except StatepactError:
            return

    async def read(self, resource: str, key: str, at: int | None) -> StoredValue:
        async def work(conn: Runner) -> StoredValue:
            if at is None:
                result = await conn.execute(_READ_LATEST, {"resource": resource, "key": key})
            else:
                result = await conn.execute(_READ_AT, {"resource": resource, "key": key, "at": at})
            row: Any = result.first()
            if row is None:
                return StoredValue(None, 0)
            return StoredValue(row[0], int(row[1]))

        return await self._run(work, idempotent=True)

    # -- commit -----------------------------------------------------------------------------

    async def commit(self, request: CommitRequest) -> CommitResult:
        payload = _request_json(request)

        async def work(conn: Runner) -> CommitResult:
            try:
                reply = (await conn.execute(_COMMIT, {"request": payload})).scalar_one()
            except sa_exc.DBAPIError as exc:
                public = _refusal(exc)
                if public is None:
                    raise
                raise public from exc
            return CommitResult(int(reply["version"]), replayed=bool(reply["replayed"]))

        try:
            # Safe to send again (see "Lost replies" in the module docstring).
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

        async def attempt(conn: Runner) -> bool:
            return bool((await conn.execute(_TRY_LOCK, params)).scalar_one())

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

        async def work(conn: Runner) -> int | None:
            token = (await conn.execute(_ACQUIRE_LEASE, params)).scalar_one_or_none()
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

        async def work(conn: Runner) -> bool:
            return (await conn.execute(_RENEW_LEASE, params)).first() is not None

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

        async def work(conn: Runner) -> bool:
            return (await conn.execute(_RELEASE_LEASE, params)).first() is not None

        # Not sent again after a lost reply: a second attempt would answer False.
        return await self._run(work, idempotent=False)

    # -- history, registry, operations ----------------------------------------------------------

    async def history(self, resource: str, key: str, limit: int) -> list[StoredVersion]:
        params = {"resource": resource, "key": key, "limit": limit}

        async def work(conn: Runner) -> list[StoredVersion]:
            rows: Any = (await conn.execute(_HISTORY, params)).all()
            return [StoredVersion(int(row[0]), row[1], row[2]) for row in rows]

        return await self._run(work, idempotent=True)

    async def register_resource(self, name: str, metadata: str, now: datetime) -> None:
        params = {"p_name": name, "p_metadata": metadata, "p_now": now}

        async def work(conn: Runner) -> None:
            await conn.execute(_REGISTER, params)

        await self._run(work, idempotent=True)

    async def resource_info(self, name: str) -> StoredResource | None:
        async def work(conn: Runner) -> StoredResource | None:
            row: Any = (await conn.execute(_RESOURCE_INFO, {"name": name})).one()
            stored_metadata, version, committed_at = row
            if stored_metadata is None and version is None:
                return None
            return StoredResource(
                name=name,
                metadata="{}" if stored_metadata is None else stored_metadata,
                version=0 if version is None else int(version),
                last_commit_at=committed_at,
            )

        return await self._run(work, idempotent=True)

    async def health_check(self) -> bool:
        if self._closed:
            return False
        # Twice: a pooled connection the server dropped fails the first ping, and
        # that failure makes the pool replace every connection older than it.
        for _ in range(2):
            if await self._ping():
                return True
        return False

    async def _ping(self) -> bool:
        try:
            async with self._engine.connect() as conn:
                await conn.execute(_PING)
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

        async def work(conn: Runner) -> None:
            await conn.execute(_TRUNCATE)
            await conn.execute(_RESET_SEQ)

        await self._run(work, idempotent=True)
        self._locking.clear()
