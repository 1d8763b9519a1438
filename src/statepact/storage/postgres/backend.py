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

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Self, TypedDict, TypeVar, Unpack

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from statepact._cancel import finish
from statepact._retry import RetryPolicy
from statepact.clock import Clock
from statepact.errors import (
    SchemaVersionError,
    StatepactError,
    StatePersistenceError,
)
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres._commits import Commits
from statepact.storage.postgres._direct import DirectExecutor, Prepared, Statements
from statepact.storage.postgres._pool import own_engine, warm
from statepact.storage.postgres._predict import LocalOrder
from statepact.storage.postgres._reads import FirstReads
from statepact.storage.postgres._sql.tx import PING, TxStatements, statements
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Lease,
    LeaseRequest,
    LockMode,
    Refusal,
    Snapshot,
    StoredResource,
    StoredValue,
    StoredVersion,
)

__all__ = ["PostgresBackend"]

_ABSENT = StoredValue(None, 0)


@cache
def _prepared() -> TxStatements[Prepared]:
    """``TxStatements`` compiled once for the driver (``_direct.Prepared``)."""
    return statements().map(Prepared)


T = TypeVar("T")


# -- helpers ------------------------------------------------------------------------------


class PostgresBackendOptions(TypedDict, total=False):
    """The keyword forms of ``PostgresStoreSettings``' transaction fields (``failover`` the
    three ``failover_*``); ``None`` keeps the setting."""

    lock_timeout: float | None
    lock_ttl_seconds: float | None
    serialization_window: int | None
    failover: RetryPolicy | None


def _configured(
    settings: PostgresStoreSettings | None, options: PostgresBackendOptions
) -> PostgresStoreSettings:
    """``settings`` with the keyword options applied: the one place they become settings."""
    return (settings or PostgresStoreSettings()).replace(**options)


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


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
        **options: Unpack[PostgresBackendOptions],
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"engine: must be an SQLAlchemy AsyncEngine, got {type(engine).__name__}"
            )
        self._settings = settings = _configured(settings, options)
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
        self._sql = _prepared()
        self._first_reads = FirstReads(
            self._sql, self._read, lambda work: self._run(work, idempotent=True)
        )
        self._commits = Commits(
            self._sql, lambda work: self._run(work, idempotent=True), LocalOrder()
        )

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine,
        *,
        clock: Clock | None = None,
        settings: PostgresStoreSettings | None = None,
        create_schema: bool = False,
        **options: Unpack[PostgresBackendOptions],
    ) -> Self:
        """A backend on ``engine`` (which the caller keeps owning), after checking the schema.

        Raises ``SchemaVersionError`` when the statepact tables or the commit
        functions are missing, unless ``create_schema`` is set and the tables
        do not exist yet: then the packaged Alembic revisions are applied.
        The option keywords are the constructor's.
        """
        backend = cls(engine, clock=clock, settings=_configured(settings, options))
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
        base, engine = own_engine(
            dsn,
            min_size=min_size,
            max_size=max_size,
            pool_timeout=pool_timeout,
            statement_timeout=statement_timeout,
            engine_options=engine_options,
        )
        settings = _configured(
            base,
            PostgresBackendOptions(
                lock_timeout=lock_timeout,
                lock_ttl_seconds=lock_ttl_seconds,
                serialization_window=serialization_window,
                failover=failover,
            ),
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
            await warm(backend._engine, min_size)
        except BaseException:
            await backend.close()
            raise
        return backend

    @property
    def settings(self) -> PostgresStoreSettings:
        return self._settings

    async def _ensure_schema(self, create: bool) -> None:
        async def present(conn: Statements) -> Any:
            return (await conn.execute(self._sql.schema_present)).one()

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

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def client(self) -> AsyncEngine:
        """The client the calls go through (observability reads where it points)."""
        return self._executor.target

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
            token, sequence = (await conn.execute(self._sql.begin)).one()
            return Snapshot(int(sequence), token)

        snapshot = await self._read(work)
        self._commits.order.taken(snapshot)
        return snapshot

    async def begin_read(
        self, txn_id: str, resource: str, key: str
    ) -> tuple[Snapshot, StoredValue]:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        taken = await self._first_reads.send(resource, key)
        self._commits.order.taken(taken[0])
        return taken

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
            await conn.execute(self._sql.unlock, {"txn_ids": txn_ids})

        try:
            await self._executor.run(work, idempotent=True)
        except StatepactError:
            return

    async def read(self, resource: str, key: str, at: Snapshot | None) -> StoredValue | Refusal:
        async def work(conn: Statements) -> StoredValue | Refusal:
            if at is None:
                result = await conn.execute(
                    self._sql.read_latest, {"resource": resource, "key": key}
                )
            else:
                params = {"resource": resource, "key": key, "snapshot": at.token}
                data, version, pruned = (await conn.execute(self._sql.read_at, params)).one()
                if version is not None:
                    return StoredValue(data, int(version))
                if pruned:
                    return Refusal(
                        "too_old",
                        resource,
                        key,
                        taken_at=at.sequence,
                        reason="dropped from the history by prune_history "
                        f"(history_retention_seconds={self.history_retention:g})",
                    )
                return _ABSENT
            row: Any = result.first()
            if row is None:
                return _ABSENT
            return StoredValue(row[0], int(row[1]))

        return await self._read(work)

    # -- commit -----------------------------------------------------------------------------

    async def commit(self, request: CommitRequest) -> CommitResult | Refusal:
        if self._closed:
            raise RuntimeError("PostgresBackend: closed")
        return await self._commits.commit(request)

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
            return bool((await conn.execute(self._sql.try_lock, params)).scalar_one())

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
            token = (await conn.execute(self._sql.acquire_lease, params)).scalar_one_or_none()
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
            return (await conn.execute(self._sql.renew_lease, params)).first() is not None

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
            return (await conn.execute(self._sql.release_lease, params)).first() is not None

        # Not sent again after a lost reply: a second attempt would answer False.
        return await self._run(work, idempotent=False)

    # -- history, registry, operations ----------------------------------------------------------

    async def history(self, resource: str, key: str, limit: int) -> list[StoredVersion]:
        params = {"resource": resource, "key": key, "limit": limit}

        async def work(conn: Statements) -> list[StoredVersion]:
            rows: Any = (await conn.execute(self._sql.history, params)).all()
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
            return (await conn.execute(self._sql.prune_history, params)).first()

        return await self._run(work, idempotent=True)

    async def register_resource(self, name: str, metadata: str, now: datetime) -> None:
        params = {"p_name": name, "p_metadata": metadata, "p_now": now}

        async def work(conn: Statements) -> None:
            await conn.execute(self._sql.register, params)

        await self._run(work, idempotent=True)

    async def resource_info(self, name: str) -> StoredResource | None:
        async def work(conn: Statements) -> StoredResource | None:
            row: Any = (await conn.execute(self._sql.resource_info, {"name": name})).one()
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
                await conn.execute(PING)
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
            await conn.execute(self._sql.truncate)
            await conn.execute(self._sql.reset_seq)

        await self._run(work, idempotent=True)
        self._locking.clear()
