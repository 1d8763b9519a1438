"""``RedisBackend``: the ``StorageBackend`` under ``TransactionManager``, on Redis.

Keyed JSON values with a capped MVCC history, leases with fencing tokens,
TTL'd locks and TTL'd idempotency records, every key of one backend in one
slot; a commit, a snapshot read, a lock attempt and each lease call is one
script of ``lua/tx/``. Layout, the commit script, replays and locks:
docs/backings.md#the-commit-script.

This module must never format a key (``_keys``), never read a clock, never
decode or re-encode a stored value (the JSON text goes back byte for byte),
and never let a redis-py exception out (``_client``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial
from typing import Any, Self, TypedDict, TypeVar, Unpack

from statepact._cancel import finish
from statepact._retry import RetryPolicy
from statepact.clock import Clock, from_micros, to_micros
from statepact.errors import (
    StatepactError,
    StatePersistenceError,
)
from statepact.settings import RedisStoreSettings
from statepact.storage.redis._client import check_database, create_client
from statepact.storage.redis._keys import TxKeys
from statepact.storage.redis._scripts import TX_SCRIPTS, ScriptCalls
from statepact.storage.redis.preflight import check
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    LeaseRequest,
    LockMode,
    Refusal,
    Snapshot,
    StoredResource,
    StoredValue,
    StoredVersion,
)

__all__ = ["RedisBackend"]

T = TypeVar("T")

# Replies of lua/tx/tx_commit.lua.
_COMMITTED, _REPLAYED, _FENCED, _IDEMPOTENCY_CONFLICT, _CONFLICT = range(5)
_WRITE, _READ = 1, 2
_ABSENT = StoredValue(None, 0)
_TOO_OLD = -1  # lua/tx/tx_read.lua: the version the snapshot needs was trimmed
_CLEAR_BATCH = 500
# The pool of connect()'s own client: its size, and how long a call waits for a
# free connection before PoolExhaustedError (PostgresBackend.connect waits 30 s too).
_POOL_SIZE = 50
_POOL_WAIT = 30.0


class RedisBackendOptions(TypedDict, total=False):
    """The keyword forms of ``RedisStoreSettings``' transaction fields (``prefix`` is
    ``tx_prefix``, ``failover`` the three ``failover_*``); ``None`` keeps the setting."""

    prefix: str | None
    history_limit: int | None
    idempotency_ttl_seconds: int | None
    lock_ttl_seconds: float | None
    lock_timeout: float | None
    failover: RetryPolicy | None


def _configured(
    settings: RedisStoreSettings | None, options: RedisBackendOptions
) -> RedisStoreSettings:
    """``settings`` with the keyword options applied: the one place they become settings."""
    given: dict[str, Any] = dict(options)
    return (settings or RedisStoreSettings()).replace(tx_prefix=given.pop("prefix", None), **given)


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


async def _close_quietly(client: Any) -> None:
    try:
        await client.aclose()
    except Exception:
        return  # closing a client whose server is gone: nothing left to release


def _parse_entry(raw: bytes | str) -> tuple[int, int, str | None]:
    """``(version, committed_at µs, JSON text or None for a delete)`` of an entry."""
    head, _, body = _bytes(raw).partition(b"\x00")
    version, micros, _txn = head.split(b":", 2)
    data = None if body == b"-" else body[1:].decode("utf-8")
    return int(version), int(micros), data


class RedisBackend:
    """Transactions' storage on Redis; see the module docstring for layout and guarantees.

    Built like the Redis stores: ``RedisBackend(redis, clock=, settings=)``
    takes a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` the
    caller owns and does not check the server; ``await RedisBackend.open(redis,
    clock=, settings=)`` runs the persistence preflight first (as the stores'
    ``open()`` does, with ``settings.durable``); :meth:`connect` builds its own
    client from a URL with ``create_client``, then opens, and closes the client
    in :meth:`close`.

    ``settings`` is a ``RedisStoreSettings``; this backend reads:

    - ``tx_prefix``: every key starts with ``{tx_prefix}:``; the braces make it
      the cluster hash tag, so it must not contain braces.
    - ``history_limit``: versions kept per key (at least 1); a snapshot that
      needs a trimmed one gets ``ConflictError`` ("snapshot too old").
    - ``idempotency_ttl_seconds``: how long a commit's idempotency record is
      kept; a replay after that is a new commit.
    - ``lock_ttl_seconds``: how long a lock set lives after its last grant.
    - ``lock_timeout``: the default lock wait in seconds.
    - ``failover_*``: the retry budget for connection errors (6 attempts).

    The same options are accepted as keywords (``prefix=`` for ``tx_prefix``,
    ``failover=`` a ``RetryPolicy`` for the ``failover_*`` fields) and win over
    ``settings``. ``clock`` is the clock a ``TransactionManager`` on this
    backend uses unless given one (else ``SystemClock``); never read here.
    """

    detects_deadlocks = False
    pins_snapshots = False
    in_process = False

    def __init__(
        self,
        redis: Any,
        *,
        clock: Clock | None = None,
        settings: RedisStoreSettings | None = None,
        **options: Unpack[RedisBackendOptions],
    ) -> None:
        self._settings = settings = _configured(settings, options)
        self.history_limit = settings.history_limit
        self.history_retention: float | None = settings.history_retention_seconds
        self.idempotency_ttl_seconds = settings.idempotency_ttl_seconds
        self.lock_ttl_seconds = settings.lock_ttl_seconds
        self.lock_timeout = settings.lock_timeout
        self.clock: Clock | None = clock
        self._keys = TxKeys(settings.tx_prefix)
        self._redis = redis
        self._owns_client = False
        self._scripts = ScriptCalls(redis, TX_SCRIPTS, settings.retry_policy, _unavailable)
        self._failover = self._scripts.failover
        # The lock keys each live transaction of this process asked for; end() releases them.
        self._locks: dict[str, set[str]] = {}
        self._closed = False

    @classmethod
    async def open(
        cls,
        redis: Any,
        *,
        clock: Clock | None = None,
        settings: RedisStoreSettings | None = None,
    ) -> Self:
        """A backend on ``redis`` after ``preflight`` (durability as ``settings.durable``).

        Raises ``PreflightError`` with every reason, or ``StatePersistenceError``
        if the server does not answer within the failover budget.
        """
        backend = cls(redis, clock=clock, settings=settings)
        await check(redis, durable=backend._settings.durable, failover=backend._failover)
        return backend

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        prefix: str | None = None,
        history_limit: int | None = None,
        idempotency_ttl_seconds: int | None = None,
        lock_ttl_seconds: float | None = None,
        lock_timeout: float | None = None,
        durable: bool = True,
        clock: Clock | None = None,
        failover: RetryPolicy | None = None,
        cluster: bool = False,
        **client_options: Any,
    ) -> Self:
        """:meth:`open` on a client of its own for ``url``; closed with the backend.

        The options are ``RedisStoreSettings``' (``prefix`` is ``tx_prefix``;
        ``None`` keeps its default: ``"statepact"``, 512 versions, 30 days, 60 s,
        5 s). The client is :func:`~statepact.storage.redis.create_client`'s, as
        for the other Redis stores: socket timeouts of 5 s and redis-py's own
        retry off, so ``failover`` is the only count of attempts. Its pool holds
        up to 50 connections, and a call that finds them all busy waits up to
        30 s for one (then ``PoolExhaustedError``): a transaction is several
        calls, and many at once should queue, not fail. On a cluster the pool is
        per node and does not wait. ``client_options`` go to ``from_url`` and win
        (``max_connections=``, ``timeout=`` for the wait, ``socket_timeout=``).

        The preflight (shared with the state store) refuses a server that
        evicts keys or, with ``durable=True``, would forget acknowledged writes
        on a crash. ``durable=False`` lifts the persistence check only.
        ``cluster=True`` builds a ``RedisCluster``. Raises ``ValueError`` for a
        URL redis-py cannot read or whose database is not an index
        (``redis://host/x``) or for a refused option (naming it),
        ``PreflightError`` with every reason, or ``StatePersistenceError`` if
        the server does not answer.
        """
        from pydantic import SecretStr

        check_database(url, "url")
        base = RedisStoreSettings(dsn=SecretStr(url), pool_size=_POOL_SIZE, durable=durable)
        settings = _configured(
            base,
            RedisBackendOptions(
                prefix=prefix,
                history_limit=history_limit,
                idempotency_ttl_seconds=idempotency_ttl_seconds,
                lock_ttl_seconds=lock_ttl_seconds,
                lock_timeout=lock_timeout,
                failover=failover,
            ),
        )
        wait = None if cluster else client_options.pop("timeout", _POOL_WAIT)
        try:
            client = create_client(settings, cluster=cluster, pool_wait=wait, **client_options)
        except ValueError as exc:
            raise ValueError(f"url: {str(exc).removeprefix('dsn: ')}") from None
        try:
            backend = await cls.open(client, clock=clock, settings=settings)
        except BaseException:
            await finish(_close_quietly(client))
            raise
        backend._owns_client = True
        return backend

    @property
    def settings(self) -> RedisStoreSettings:
        return self._settings

    @property
    def prefix(self) -> str:
        return self._keys.prefix

    @property
    def client(self) -> Any:
        """The client the calls go through (observability reads where it points)."""
        return self._redis

    def __repr__(self) -> str:
        return f"RedisBackend(prefix={self._keys.prefix!r}, history_limit={self.history_limit})"

    async def _call(
        self, what: str, operation: Callable[[], Awaitable[T]], *, abandonable: bool = False
    ) -> T:
        if self._closed:
            raise RuntimeError("RedisBackend: closed")
        return await self._failover.run(what, operation, abandonable=abandonable)

    async def _script(
        self, name: str, keys: list[str], args: list[str | int], *, abandonable: bool = False
    ) -> Any:
        if self._closed:
            raise RuntimeError("RedisBackend: closed")
        return await self._scripts(name, name, keys, args, read=abandonable)

    # -- snapshots and reads ------------------------------------------------------------

    async def begin(self, txn_id: str) -> Snapshot:
        # Nothing to register: history is capped by count, not by live snapshots.
        raw = await self._call(
            "begin", lambda: self._redis.get(_bytes(self._keys.seq)), abandonable=True
        )
        return Snapshot(0 if raw is None else int(raw))

    async def begin_read(
        self, txn_id: str, resource: str, key: str
    ) -> tuple[Snapshot, StoredValue]:
        # Reads only, registers nothing (as begin and read): a cancelled caller may walk away.
        reply = await self._script(
            "tx_begin_read", [self._keys.seq, self._keys.data(resource)], [key], abandonable=True
        )
        snapshot = Snapshot(int(reply[0]))
        if len(reply) < 2:
            return snapshot, _ABSENT
        version, _, data = _parse_entry(reply[1])
        return snapshot, StoredValue(data, version)

    async def end(self, txn_id: str) -> None:
        keys = self._locks.get(txn_id)
        if not keys:
            self._locks.pop(txn_id, None)
            return
        if self._closed:
            return  # close() releases what is left
        await self._unlock(txn_id, keys)
        # Forgotten only once the unlock answered (or the server is gone): a
        # cancellation before that leaves the keys for the next end() to release.
        self._locks.pop(txn_id, None)

    async def _unlock(self, txn_id: str, keys: set[str]) -> None:
        """Release ``txn_id``'s lock keys in one script; never raises a backing error.

        An unreachable server is left to the locks' TTL: raising here would hide
        the outcome of a commit that has already happened.
        """
        lock_keys = sorted(keys)
        try:
            await self._scripts("tx_unlock", "tx_unlock", lock_keys, [txn_id])
        except StatepactError:
            return

    async def read(self, resource: str, key: str, at: Snapshot | None) -> StoredValue | Refusal:
        data_key = self._keys.data(resource)
        if at is None:
            raw = await self._call(
                "read",
                lambda: self._redis.hget(_bytes(data_key), _bytes(key)),
                abandonable=True,
            )
        else:
            raw = await self._script(
                "tx_read",
                [data_key, self._keys.history(resource, key), self._keys.trimmed(resource)],
                [key, at.sequence],
                abandonable=True,
            )
            if raw == _TOO_OLD:
                return Refusal(
                    "too_old",
                    resource,
                    key,
                    taken_at=at.sequence,
                    reason=f"trimmed from the history (history_limit={self.history_limit})",
                )
        if raw is None:
            return _ABSENT
        version, _, data = _parse_entry(raw)
        return StoredValue(data, version)

    # -- commit ---------------------------------------------------------------------------

    async def commit(self, request: CommitRequest) -> CommitResult | Refusal:
        keys = self._keys
        # Only serializable validates reads; the others need not send them.
        reads = request.reads if request.isolation is Isolation.SERIALIZABLE else ()
        fence = request.fencing
        script_keys = [keys.seq, keys.resources, keys.op(request.txn_id)]
        if request.idempotency_key is not None:
            script_keys.append(keys.idempotency(request.idempotency_key))
        if fence is not None:
            script_keys.append(keys.fence(fence.resource))
        args: list[str | int] = [
            request.isolation.value,
            "" if request.snapshot is None else request.snapshot.sequence,
            to_micros(request.now),
            request.txn_id,
            self.history_limit,
            self.idempotency_ttl_seconds,
            request.fingerprint or "",
            "" if fence is None else fence.token,
            len(request.writes),
            len(reads),
        ]
        for write in request.writes:
            script_keys += [
                keys.meta(write.resource),
                keys.data(write.resource),
                keys.history(write.resource, write.key),
                keys.trimmed(write.resource),
            ]
            body = "-" if write.data is None else "=" + write.data
            args += [write.resource, write.key, body]
        for read in reads:
            script_keys.append(keys.data(read.resource))
            args += [read.key, read.version]

        reply = await self._script("tx_commit", script_keys, args)
        code = int(reply[0])
        if code == _COMMITTED:
            return CommitResult(int(reply[1]))
        if code == _REPLAYED:
            return CommitResult(int(reply[1]), replayed=True)
        if code == _FENCED:
            assert fence is not None
            return Refusal("fenced", fence.resource, seen=fence.token, latest=int(reply[1]))
        if code == _IDEMPOTENCY_CONFLICT:
            assert request.idempotency_key is not None
            return Refusal("idempotency", key=request.idempotency_key)
        which, index, latest = int(reply[1]), int(reply[2]) - 1, int(reply[3])
        if which == _WRITE:
            write = request.writes[index]
            return Refusal(
                "write", write.resource, write.key, latest=latest, taken_at=request.taken_at
            )
        read = reads[index]
        return Refusal("read", read.resource, read.key, seen=read.version, latest=latest)

    # -- locks ------------------------------------------------------------------------------

    async def try_lock(
        self, txn_id: str, resource: str, key: str, mode: LockMode, wait: float
    ) -> bool:
        if self._closed:
            raise RuntimeError("RedisBackend: closed")
        lock_key = self._keys.lock(resource, key)
        # Recorded before asking: a grant whose reply is lost is still released by end().
        self._locks.setdefault(txn_id, set()).add(lock_key)
        args: list[str | int] = [txn_id, mode.value, max(1, round(self.lock_ttl_seconds * 1000))]
        return bool(await self._script("tx_lock", [lock_key], args) == 1)

    # -- leases -----------------------------------------------------------------------------

    async def acquire_lease(self, request: LeaseRequest) -> Lease | None:
        token = await self._script(
            "tx_lease_acquire",
            [self._keys.lease(request.resource), self._keys.fence(request.resource)],
            [
                request.owner,
                to_micros(request.now),
                to_micros(request.expires_at),
                repr(request.ttl),
            ],
        )
        if token is None:
            return None
        return Lease(
            resource=request.resource,
            owner=request.owner,
            token=int(token),
            expires_at=request.expires_at,
            ttl=request.ttl,
        )

    async def renew_lease(self, lease: Lease, request: LeaseRequest) -> Lease | None:
        renewed = await self._script(
            "tx_lease_renew",
            [self._keys.lease(lease.resource)],
            [
                lease.owner,
                lease.token,
                to_micros(request.now),
                to_micros(request.expires_at),
                repr(request.ttl),
            ],
        )
        if renewed != 1:
            return None
        return Lease(
            resource=lease.resource,
            owner=lease.owner,
            token=lease.token,
            expires_at=request.expires_at,
            ttl=request.ttl,
        )

    async def release_lease(self, lease: Lease, now: datetime) -> bool:
        released = await self._script(
            "tx_lease_release", [self._keys.lease(lease.resource)], [lease.token]
        )
        return bool(released == 1)

    # -- history, registry, operations --------------------------------------------------------

    async def history(self, resource: str, key: str, limit: int) -> list[StoredVersion]:
        history_key = _bytes(self._keys.history(resource, key))
        rows = await self._call(
            "history", lambda: self._redis.lrange(history_key, 0, limit - 1), abandonable=True
        )
        out = []
        for raw in rows:
            version, micros, data = _parse_entry(raw)
            out.append(StoredVersion(version, data, from_micros(micros)))
        return out

    async def prune_history(self, cutoff: datetime, batch: int) -> int:
        # Every resource's keys, a page of HSCAN at a time; each page's histories are
        # trimmed by one script (a list holds at most history_limit entries).
        resources_key = _bytes(self._keys.resources)
        names = await self._call(
            "prune_history", lambda: self._redis.smembers(resources_key), abandonable=True
        )
        keys_per_script = max(1, batch // 10)
        dropped = 0
        for raw_name in sorted(names):
            resource = raw_name.decode("utf-8") if isinstance(raw_name, bytes) else raw_name
            dropped += await self._prune_resource(resource, cutoff, keys_per_script)
        return dropped

    async def _prune_resource(self, resource: str, cutoff: datetime, count: int) -> int:
        data_key = _bytes(self._keys.data(resource))
        cursor, dropped = 0, 0
        while True:
            cursor, page = await self._call(
                "prune_history",
                partial(self._redis.hscan, data_key, cursor, count=count),
                abandonable=True,
            )
            keys = sorted(key.decode("utf-8") if isinstance(key, bytes) else key for key in page)
            for start in range(0, len(keys), count):
                chunk = keys[start : start + count]
                dropped += int(
                    await self._script(
                        "tx_prune_history",
                        [
                            self._keys.trimmed(resource),
                            *(self._keys.history(resource, key) for key in chunk),
                        ],
                        [to_micros(cutoff), *chunk],
                    )
                )
            if int(cursor) == 0:
                return dropped

    async def register_resource(self, name: str, metadata: str, now: datetime) -> None:
        await self._script(
            "tx_register", [self._keys.meta(name), self._keys.resources], [name, metadata]
        )

    async def resource_info(self, name: str) -> StoredResource | None:
        meta_key = _bytes(self._keys.meta(name))
        version, at, metadata = await self._call(
            "resource_info",
            lambda: self._redis.hmget(meta_key, ["version", "at", "metadata"]),
            abandonable=True,
        )
        if version is None and metadata is None:
            return None
        return StoredResource(
            name=name,
            metadata="{}" if metadata is None else _bytes(metadata).decode("utf-8"),
            version=0 if version is None else int(version),
            last_commit_at=None if at is None else from_micros(int(at)),
        )

    async def health_check(self) -> bool:
        if self._closed:
            return False
        try:
            return bool(await self._redis.ping())
        except Exception:
            return False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A cleanup: finished even if the caller is cancelled meanwhile.
        await finish(self._release_and_close())

    async def _release_and_close(self) -> None:
        # Transactions of this process that still hold locks will never end now:
        # release their keys rather than leave them blocked for lock_ttl_seconds.
        for txn_id, keys in list(self._locks.items()):
            await self._unlock(txn_id, keys)
        self._locks.clear()
        if self._owns_client:
            await _close_quietly(self._redis)

    async def clear(self) -> None:
        """Delete every key under this backend's prefix (and only those); the sequence restarts.

        A test and playground helper: it SCANs, so it is not atomic against
        concurrent commits.
        """
        pattern = _bytes(self._keys.match_all)

        async def delete_batch() -> None:
            batch: list[bytes] = []
            async for key in self._redis.scan_iter(match=pattern, count=_CLEAR_BATCH):
                batch.append(_bytes(key))
                if len(batch) >= _CLEAR_BATCH:
                    await self._redis.unlink(*batch)
                    batch = []
            if batch:
                await self._redis.unlink(*batch)

        await self._call("clear", delete_batch)
        self._locks.clear()
