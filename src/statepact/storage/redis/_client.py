"""The Redis boundary: every call to the server goes through :class:`Failover`.

It retries connection errors only, with the one retry policy
(``statepact._retry``), and turns every redis-py exception into the public
error tree; which error becomes what: docs/backings.md#errors-at-the-redis-boundary.
:func:`create_client` builds the client the settings describe, redis-py's own
retry off.

This module must never retry anything but a transient error, and never put a
URL or a password in a message.
"""

from __future__ import annotations

import asyncio
import importlib
import weakref
from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any, Literal, TypeVar, overload
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis import exceptions as rex
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from statepact._retry import RetryPolicy, call_with_failover
from statepact.errors import PoolExhaustedError, PreflightError, StatepactError
from statepact.settings import RedisStoreSettings, redact_dsn

__all__ = [
    "CallGate",
    "Failover",
    "as_text",
    "bounded_writes",
    "check_database",
    "create_client",
    "gate_of",
    "is_pool_exhausted",
    "is_transient",
    "is_write_race",
    "pooled_connection",
    "unprobed_connection",
]

T = TypeVar("T")


def is_pool_exhausted(exc: BaseException) -> bool:
    """Whether redis-py failed to hand out a pooled connection (not a server problem)."""
    if isinstance(exc, rex.MaxConnectionsError):
        return True
    # redis-py before 8 raises a plain ConnectionError from a full ConnectionPool.
    if type(exc) is rex.ConnectionError and str(exc) == "Too many connections":
        return True
    # BlockingConnectionPool raises a plain ConnectionError from the timeout of its wait.
    return (
        type(exc) is rex.ConnectionError
        and isinstance(exc.__cause__, asyncio.TimeoutError | TimeoutError)
        and "No connection available" in str(exc)
    )


def is_write_race(exc: BaseException) -> bool:
    """A connection closed under a write, leaked by redis-py as a bare ``AttributeError`` or
    ``TypeError`` about ``None`` from its own connection code or asyncio's transport.

    redis-py 8.1 does not turn these into ``ConnectionError`` (redis/redis-py#3546,
    #4287); a cluster client meets them when a failover makes it drop connections
    another call is writing on. Nothing was sent, so it is a dropped connection.
    """
    if not isinstance(exc, AttributeError | TypeError) or "NoneType" not in str(exc):
        return False
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return False
    module = str(frame.tb_frame.f_globals.get("__name__", ""))
    return module.startswith(("redis.", "asyncio."))


def is_transient(exc: BaseException) -> bool:
    """Whether waiting and calling again can help: the server is (re)starting or moving."""
    if is_pool_exhausted(exc):
        return False
    if is_write_race(exc):
        return True
    if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError):
        return False
    # BusyLoadingError (LOADING) is a ConnectionError; ClusterError covers CLUSTERDOWN,
    # MASTERDOWN and redis-py giving up on a moving cluster.
    if isinstance(
        exc,
        rex.ConnectionError
        | rex.TimeoutError
        | rex.ReadOnlyError
        | rex.TryAgainError
        | rex.ClusterError
        | rex.SlotNotCoveredError,
    ):
        return True
    # A socket error redis-py did not wrap.
    return isinstance(exc, ConnectionError | asyncio.TimeoutError | TimeoutError)


def as_text(value: Any) -> str:
    """A reply element as ``str``, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


class CallGate:
    """At most ``size`` calls at once on a client whose pool holds ``size`` connections; a
    call beyond waits up to ``wait`` seconds for one to end, then ``PoolExhaustedError``.

    What redis-py's ``BlockingConnectionPool`` does, for a fraction of its cost per
    call: a free slot is taken without suspending (no condition variable, no timer).
    Every statepact call holds one connection at a time, so the pool underneath (one
    that does not wait) never runs out while the calls go through the gate.
    """

    def __init__(self, size: int, wait: float) -> None:
        self.size = size
        self.wait = wait
        self._slots = asyncio.Semaphore(size)

    async def run(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        slots = self._slots
        if slots.locked():
            try:
                async with asyncio.timeout(self.wait):
                    await slots.acquire()
            except TimeoutError:
                raise PoolExhaustedError(
                    f"no free Redis connection for {what} within {self.wait:g} s: every "
                    "connection of the pool is in use; size the pool to the concurrent calls"
                ) from None
        else:
            await slots.acquire()  # free: returns without suspending
        try:
            return await operation()
        finally:
            slots.release()


def bounded_writes(base: type[Any]) -> type[Any]:
    """``base`` (a redis-py asyncio connection class) whose writes are bounded by an
    ``asyncio.timeout`` of ``socket_timeout`` instead of an ``asyncio.wait_for``.

    redis-py bounds every write with ``wait_for`` when ``socket_timeout`` is set,
    which on Python 3.11 runs the write in a task of its own: a task per call,
    more CPU than the rest of a short command. Here the write runs in the caller's
    task under a timeout (none at all for a write that fits below the transport's
    high-water mark, which cannot wait); a write that stalls past ``socket_timeout`` drops
    the connection and raises redis-py's ``TimeoutError`` (so the failover budget
    waits the server out), an OS error drops it and raises ``ConnectionError``,
    and anything else (a cancellation) drops it and goes on. A dropped connection
    is aborted, not closed: the part of the command still buffered is thrown
    away, so the server never receives (and runs) a command whose caller was
    told it failed. One class per base.
    """
    made = _BOUNDED.get(base)
    if made is None:
        made = _BOUNDED[base] = _bounded_writes(base)
    return made


_BOUNDED: dict[type[Any], type[Any]] = {}


def _bounded_writes(base: type[Any]) -> type[Any]:
    async def send_packed_command(
        self: Any, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        if not self.is_connected:
            if hasattr(self, "connect_check_health"):  # redis-py 6 and later
                await self.connect_check_health(check_health=False)
            else:
                await self.connect()
        if check_health:
            await self.check_health()
        if isinstance(command, str):
            command = command.encode()
        chunks = [command] if isinstance(command, bytes) else list(command)
        try:
            if _fits(self._writer, chunks):
                # Below the high-water mark the write cannot wait (drain returns at once):
                # no timer to set and cancel, which is most of a short command's write.
                await self._send_packed_command(chunks)
            else:
                async with asyncio.timeout(self.socket_timeout or None):
                    await self._send_packed_command(chunks)
        except BaseException as exc:
            # Part of the command may be buffered or sent: drop what is buffered with the
            # socket (a graceful close would flush the rest and let the server run it).
            writer = self._writer
            if writer is not None:
                writer.transport.abort()
            await self.disconnect(nowait=True)
            if isinstance(exc, TimeoutError):
                if exc.errno is not None:  # ETIMEDOUT from the OS: a dead connection
                    raise rex.ConnectionError(f"Error {exc.errno} while writing to socket") from exc
                raise rex.TimeoutError("Timeout writing to socket") from None
            if isinstance(exc, OSError):
                raise rex.ConnectionError(
                    f"Error {exc.errno or 'UNKNOWN'} while writing to socket"
                ) from exc
            raise

    return type(
        f"BoundedWrites{base.__name__}",
        (base,),
        {"send_packed_command": send_packed_command, "__module__": __name__},
    )


def _fits(writer: asyncio.StreamWriter | None, chunks: list[bytes]) -> bool:
    """Whether writing ``chunks`` leaves ``writer``'s buffer at or below its high-water mark,
    so that the ``drain`` after the write returns without waiting for the server."""
    if writer is None:
        return False  # redis-py raises its own error: the bounded path reports it
    transport = writer.transport
    limits = getattr(transport, "get_write_buffer_limits", None)
    if limits is None:
        return False
    high: int = limits()[1]
    room = high - transport.get_write_buffer_size()
    return sum(map(len, chunks)) <= room


# redis-py before 8 probes a pooled connection for unread data while holding the pool's
# lock, and the probe suspends (a read under a zero timeout): every call on the client
# waits its turn for that lock, one loop iteration each. redis-py 8 probes outside the
# lock without suspending.
_PROBE_HOLDS_THE_POOL = int(redis.__version__.split(".", 1)[0]) < 8


def _import_pool_metrics() -> ModuleType | None:
    """redis-py 8's pool metrics recorder; ``None`` before 8, which records none."""
    try:
        return importlib.import_module("redis.asyncio.observability.recorder")
    except ImportError:  # pragma: no cover - redis-py before 8
        return None


_pool_metrics = _import_pool_metrics()


def _pool_does_more(pool: Any) -> bool:
    """Whether ``pool.get_connection()`` does something for ``pool`` that
    :func:`unprobed_connection` does not.

    redis-py 8 also counts the connection in its pool metrics (once its
    observability is on: it has looked for a collector and found one, or has not
    looked yet), and hands push notifications waiting on a connection to the
    maintenance handler (RESP3 only: a RESP2 connection gets none). Either makes
    the pool's own call the one to use; anything this does not recognise does too.
    """
    if pool.connection_kwargs.get("protocol") not in (None, 2, "2"):
        return True
    if _pool_metrics is None:
        return False
    resolved = getattr(_pool_metrics, "_async_collector_resolved", None)
    collector = getattr(_pool_metrics, "_async_metrics_collector", None)
    return resolved is not True or collector is not None


async def pooled_connection(pool: Any) -> Any:
    """A connection of ``pool`` (a single-server client's pool) ready to send on; give it
    back with ``await pool.release(connection)``.

    For a plain ``ConnectionPool`` this is :func:`unprobed_connection`: before
    redis-py 8 the pool's probe would make every call wait its turn (above), and on 8
    its ``get_connection()`` does more than a script needs to hand out the same
    connection (its lock, its connect-with-retry and probe, four metric calls that
    record nothing while observability is off). Where the pool's call does more
    (:func:`_pool_does_more`), and for a ``BlockingConnectionPool`` (it probes
    outside its lock, and waits for a free connection), it is the pool's own
    ``get_connection()``.
    """
    if type(pool) is ConnectionPool and (_PROBE_HOLDS_THE_POOL or not _pool_does_more(pool)):
        return await unprobed_connection(pool)
    return await pool.get_connection()


async def unprobed_connection(pool: Any) -> Any:
    """A connection of ``pool`` taken without the pool's probe for unread data.

    A free connection (or a new one) is connected if it is not, and connected again
    if its server closed it (the end of its stream, or an error on it, is already
    known). The probe's other finding, unread data, cannot happen on a connection
    handed back to the pool: redis-py drops a connection whose reply was not read
    to its end (an error, a cancellation), as :func:`bounded_writes` does for a
    write that failed. A pool that is full raises as ``get_connection()`` does.
    """
    connection = pool.get_available_connection()  # no await: nothing runs in between
    try:
        stream = connection._reader
        if stream is not None and (stream.at_eof() or stream.exception() is not None):
            await connection.disconnect(nowait=True)
        if not connection.is_connected:
            await connection.connect()
    except BaseException:
        await pool.release(connection)
        raise
    return connection


# The gates of the clients create_client built with pool_wait: every statepact store,
# queue and backend on such a client goes through its one gate.
_GATES: weakref.WeakKeyDictionary[Any, CallGate] = weakref.WeakKeyDictionary()


def gate_of(redis: Any) -> CallGate | None:
    """The gate :func:`create_client` gave ``redis`` (``pool_wait``), if any."""
    return _GATES.get(redis)


class Failover:
    """Runs operations against Redis within a retry budget, translating its errors.

    ``unavailable(message)`` builds the public error of this backing for a
    server that cannot serve the call (``StatePersistenceError`` or
    ``QueueUnavailableError``).
    """

    def __init__(
        self,
        policy: RetryPolicy,
        unavailable: Callable[[str], StatepactError],
        gate: CallGate | None = None,
    ) -> None:
        self._policy = policy
        self._unavailable = unavailable
        self._gate = gate

    @property
    def policy(self) -> RetryPolicy:
        return self._policy

    async def run(
        self, what: str, operation: Callable[[], Awaitable[T]], *, abandonable: bool = False
    ) -> T:
        """Run ``operation`` (one call to Redis; ``what`` names it in messages).

        ``abandonable``: a read the caller may walk away from. It is not shielded
        from the caller's cancellation (redis-py drops a connection whose reply
        was abandoned, so none is misread); anything else runs to its end first.
        """

        def give_up(exc: BaseException) -> StatepactError:
            return self._unavailable(
                f"Redis did not answer {what} after {self._policy.attempts} attempts "
                f"({type(exc).__name__}); the server is down or failing over, retry later"
            )

        def translate(exc: BaseException) -> StatepactError | None:
            if is_pool_exhausted(exc):
                return PoolExhaustedError(
                    f"no free Redis connection for {what}: every connection of the pool is "
                    "in use; size the pool to the number of concurrent calls"
                )
            if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError):
                return self._unavailable(
                    f"Redis refused the connection's credentials for {what} ({type(exc).__name__})"
                )
            if isinstance(exc, rex.NoPermissionError):
                # The ACL user's rules, not the server's state: calling again cannot help.
                # Redis's reply names the command or says it is a key (never a value).
                return PreflightError(
                    [
                        f"{what}: the Redis user lacks an ACL permission ({exc}); allow what "
                        "docs/operations.md#redis-acl-users lists"
                    ],
                    server="Redis",
                )
            if isinstance(exc, rex.OutOfMemoryError):
                return self._unavailable(
                    f"Redis is out of memory (maxmemory reached) and refused {what}"
                )
            if isinstance(exc, rex.RedisError):
                return self._unavailable(f"Redis failed {what}: {type(exc).__name__}: {exc}")
            return None

        gate = self._gate
        attempt = operation if gate is None else (lambda: gate.run(what, operation))
        return await call_with_failover(
            attempt,
            policy=self._policy,
            is_transient=is_transient,
            give_up=give_up,
            translate=translate,
            what=what,
            backing="redis",
            shield=not abandonable,
        )


def check_database(url: str, field: str) -> None:
    """Refuse a URL whose database is not an index (``ValueError`` naming ``field``).

    redis-py reads ``redis://host/x`` (and ``/1x``, ``/-1``) as database 0, or
    ``/1/2`` as 12, without a word; a typo would then write into someone
    else's database. The path (``redis://``, ``rediss://``) and ``?db=`` may
    each name one, as digits, and must agree. The message shows the URL with
    its password masked.
    """
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query, keep_blank_values=True)
    except ValueError:
        return  # not a URL at all: from_url says so
    named: list[str] = []
    if parts.scheme in ("redis", "rediss") and parts.path not in ("", "/"):
        named.append(unquote(parts.path).removeprefix("/"))
    named += query.get("db", [])
    for database in named:
        if not (database.isascii() and database.isdigit()):
            raise ValueError(
                f"{field}: {redact_dsn(url)!r} names database {database!r}, which is not an "
                "index; use redis://[:password@]host:port/<n> with n a number such as 0"
            )
    if len({int(database) for database in named}) > 1:
        raise ValueError(
            f"{field}: {redact_dsn(url)!r} names database both {named[0]!r} and {named[1]!r} "
            "(in the path and in ?db=); name it once"
        )


@overload
def create_client(
    settings: RedisStoreSettings,
    *,
    cluster: Literal[False] = False,
    pool_wait: float | None = None,
    **client_options: Any,
) -> Redis: ...


@overload
def create_client(
    settings: RedisStoreSettings,
    *,
    cluster: Literal[True],
    pool_wait: float | None = None,
    **client_options: Any,
) -> RedisCluster: ...


@overload
def create_client(
    settings: RedisStoreSettings,
    *,
    cluster: bool,
    pool_wait: float | None = None,
    **client_options: Any,
) -> Redis | RedisCluster: ...


def create_client(
    settings: RedisStoreSettings,
    *,
    cluster: bool = False,
    pool_wait: float | None = None,
    **client_options: Any,
) -> Redis | RedisCluster:
    """A redis-py asyncio client for ``settings.dsn``, sized and timed by ``settings``.

    - ``max_connections`` is ``settings.pool_size``, on a pool that does not
      wait: a call beyond it raises ``PoolExhaustedError`` at once; with
      ``pool_wait`` (seconds) it waits that long for a free connection first
      (through a :class:`CallGate` the stores, queues and backends built on the
      client share; not on a cluster, whose per-node pools cannot wait);
    - ``socket_timeout`` and ``socket_connect_timeout`` come from the settings,
      so a stalled server becomes a dropped connection the failover budget
      waits out, instead of a call that never returns (on a single server the
      write is bounded in the caller's task, see :func:`bounded_writes`);
    - redis-py's own retry is off (``Retry(NoBackoff(), 0)``), so
      ``settings.failover_attempts`` is the only count of attempts.

    ``cluster=True`` builds a ``RedisCluster`` from the same URL (any node;
    the others are discovered): ``pool_size`` is then per node, and redis-py's
    cluster retry is kept, since it re-reads the slot map between its attempts.
    Extra keyword arguments go to ``from_url`` and win over the above. The
    caller owns the client: ``await client.aclose()`` when done. Raises
    ``ValueError`` (naming the URL with its password masked) for a missing or
    unreadable DSN, or one whose database is not an index (``redis://host/x``
    is refused, not read as database 0); nothing connects until the first call.
    """
    if settings.dsn is None:
        raise ValueError("dsn: RedisStoreSettings.dsn is needed to create a client")
    if pool_wait is not None and (cluster or not pool_wait >= 0):
        raise ValueError(
            f"pool_wait: must be seconds >= 0 on a single-server client, got {pool_wait!r}"
            + (" with cluster=True" if cluster else "")
        )
    check_database(settings.dsn.get_secret_value(), "dsn")
    options: dict[str, Any] = {
        "max_connections": settings.pool_size,
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_connect_timeout,
    }
    if not cluster:
        options["retry"] = Retry(NoBackoff(), 0)
    options.update(client_options)
    url = settings.dsn.get_secret_value()
    try:
        client: Redis | RedisCluster
        if cluster:
            client = RedisCluster.from_url(url, **options)
        else:
            client = Redis.from_url(url, **options)
            pool = client.connection_pool
            pool.connection_class = bounded_writes(pool.connection_class)
            if pool_wait is not None:
                _GATES[client] = CallGate(settings.pool_size, pool_wait)
    except ValueError:
        # ``from None``: redis-py's message or its cause may quote the URL.
        raise ValueError(
            f"dsn: {redact_dsn(settings.dsn)!r} is not a Redis URL; use "
            "redis://[user:password@]host:port/db, rediss:// for TLS, or unix://path"
        ) from None
    return client
