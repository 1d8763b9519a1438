"""One server behind a :class:`FaultProxy`, as the proxy tests use it: stores and managers whose
every connection goes through the proxy, checkers straight to the server, and the few facts
in which Redis and PostgreSQL differ.

``test_proxy_scenarios.py`` writes each scenario once and runs it on both
(:class:`ProxiedRedis`, :class:`ProxiedPostgres`, reached through the ``proxied``
fixture of ``tests/faults/conftest.py``); ``test_proxy_redis.py`` and
``test_proxy_postgres.py`` hold what only one backing has. Clients notice a stall
after ``timeout`` (redis-py's socket timeout, asyncpg's connect ``timeout`` and
``command_timeout``) and leave retrying to statepact's failover, whose budget each
test passes as a :class:`RetryPolicy`. The first call of each kind through the proxy
is made before a test arms a cut (:meth:`Proxied.manager`, :meth:`Proxied.warm_state`):
Redis answers the first EVALSHA of a script it has not loaded with NOSCRIPT, and
cutting that reply would be a cut before anything applied, not an ambiguous write.
"""

from __future__ import annotations

import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.models import RunRecord
from statepact.queue import WorkQueue
from statepact.settings import PostgresStoreSettings, RedisStoreSettings
from statepact.state import StateStore
from statepact.storage.postgres import PostgresBackend, PostgresStateStore, PostgresWorkQueue
from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue
from statepact.testing.faults import FaultProxy
from statepact.testing.namespaces import clear_namespace
from statepact.tx import StorageBackend, TransactionManager
from tests.faults.conftest import SOCKET_TIMEOUT, fault_redis_client

P = TypeVar("P", bound="Proxied")

# Slack for scheduling on a shared two-core machine, in every bound on elapsed time.
MARGIN = 1.0
# How long asyncpg waits for a connection and for each reply before giving up (Redis's
# clients wait SOCKET_TIMEOUT).
COMMAND_TIMEOUT = 0.5
# A budget that outlasts a test holding the failover's resends out while it changes the server.
RESENDING = RetryPolicy(attempts=40, base_delay=0.05, max_delay=0.2)
# The run the warm-up writes: no marker a test arms matches its bytes.
WARM_UP = RunRecord(tenant="warm-up", run_id="warm-up")


class Proxied(ABC):
    """One backing behind ``proxy``; everything it opens is closed by :meth:`close`."""

    name: ClassVar[str]
    state_store: ClassVar[type[Any]]
    work_queue: ClassVar[type[Any]]
    #: The client's own timeout: no call against a stalled server ends sooner.
    timeout: ClassVar[float]
    #: How long one attempt against a stalled server may take.
    per_attempt: ClassVar[float]
    #: The client timeout as the stall figures note it.
    timeout_note: ClassVar[dict[str, Any]]
    #: The bytes of a ``patch_run("acme", "r1", input_tokens=7)`` request, in order.
    patch_marker: ClassVar[tuple[bytes, ...]]
    #: Whether the stalled state call is a write (a patch, ambiguous when the budget runs
    #: out) or a read.
    stall_writes: ClassVar[bool]
    #: Whether a state error names the tenant (Redis names the call and its tenant; the
    #: PostgreSQL executor names the store).
    errors_name_the_tenant: ClassVar[bool]
    #: Whether idempotency records expire (Redis keeps one ``idempotency_ttl_seconds``;
    #: PostgreSQL keeps them), so a resend can come after its record is gone.
    idempotency_expires: ClassVar[bool]
    #: Versions kept per key, when the backing trims them (Redis's ``history_limit``).
    history_limit: ClassVar[int | None]

    def __init__(self, proxy: FaultProxy, clock: ManualClock) -> None:
        self.proxy = proxy
        self.clock = clock
        self._backends: list[StorageBackend] = []

    def stall_bound(self, policy: RetryPolicy) -> float:
        """The longest a call may take against a stalled server: every attempt waits out the
        client's timeouts, and the backoff between attempts is at most the policy's budget."""
        return policy.attempts * self.per_attempt + policy.budget + MARGIN

    def state(self, policy: RetryPolicy | None = None) -> StateStore:
        """A state store through the proxy with ``policy`` as its failover budget, or straight
        to the server (``None``: for checking what landed and writing around the proxy)."""
        store: StateStore = self.state_store(
            self._client(policy), clock=self.clock, settings=self._settings(policy)
        )
        return store

    def queue(self, policy: RetryPolicy | None = None) -> WorkQueue:
        """A work queue through the proxy with ``policy``, or straight to the server."""
        queue: WorkQueue = self.work_queue(
            self._client(policy), clock=self.clock, settings=self._settings(policy)
        )
        return queue

    @abstractmethod
    def _client(self, policy: RetryPolicy | None) -> Any:
        """The client through the proxy (a policy given) or straight to the server."""

    @abstractmethod
    def _settings(self, policy: RetryPolicy | None) -> Any:
        """The stores' settings, with ``policy`` as their failover budget."""

    def backend(
        self, policy: RetryPolicy | None = None, *, idempotency_ttl: int | None = None
    ) -> StorageBackend:
        """A transaction backend through the proxy with ``policy``, or straight to the server;
        ``idempotency_ttl`` (seconds) where :attr:`idempotency_expires`."""
        backend = self._backend(policy, idempotency_ttl)
        self._backends.append(backend)
        return backend

    @abstractmethod
    def _backend(
        self, policy: RetryPolicy | None, idempotency_ttl: int | None
    ) -> StorageBackend: ...

    async def manager(
        self, policy: RetryPolicy, *, idempotency_ttl: int | None = None
    ) -> TransactionManager:
        """A manager through the proxy whose first commit (an idempotent warm-up, version 1)
        is done."""
        manager = TransactionManager(self.backend(policy, idempotency_ttl=idempotency_ttl))
        async with manager.transaction(idempotency_key="warm-up") as tx:
            tx.write("warm-up", "k", 1)
        return manager

    def direct_manager(self) -> TransactionManager:
        """A manager straight to the server, on the same keys or tables as :meth:`manager`'s."""
        return TransactionManager(self.backend())

    async def warm_state(self, store: StateStore) -> None:
        """A put and a patch of a run of its own, so the calls a test cuts are not the first."""
        await store.put_run(WARM_UP)
        await store.patch_run(WARM_UP.tenant, WARM_UP.run_id)

    @abstractmethod
    async def check_write_rows(self, run_id: str, applied: int) -> None:
        """Where the backing keeps a record of each applied write for good (PostgreSQL:
        ``adk_run_writes``), ``run_id`` has ``applied`` of them."""

    async def close(self) -> None:
        """Heal the proxy, close the backends (releasing what they still lock), then the
        clients."""
        self.proxy.heal()
        try:
            for backend in reversed(self._backends):
                with contextlib.suppress(Exception):
                    await backend.close()
        finally:
            await self._close_clients()

    @abstractmethod
    async def _close_clients(self) -> None: ...


class ProxiedRedis(Proxied):
    """The lane's Redis, under a namespace (and tx prefix) of this test's own."""

    name = "redis"
    state_store = RedisStateStore
    work_queue = RedisWorkQueue
    timeout = SOCKET_TIMEOUT
    per_attempt = SOCKET_TIMEOUT
    timeout_note: ClassVar[dict[str, Any]] = {"socket_timeout_s": SOCKET_TIMEOUT}
    # The RESP encoding of the five deltas "7", "0", "0", "0", "0" ends the patch's arguments.
    patch_marker = (b"$1\r\n7\r\n" + b"$1\r\n0\r\n" * 4,)
    stall_writes = True
    errors_name_the_tenant = True
    idempotency_expires = True
    history_limit = 512  # RedisBackend's default, which the backings here keep

    def __init__(self, proxy: FaultProxy, clock: ManualClock, port: int) -> None:
        super().__init__(proxy, clock)
        self.namespace = f"faults-{uuid.uuid4().hex[:10]}"
        self.client: Redis = fault_redis_client(proxy.port)
        self.direct: Redis = fault_redis_client(port, socket_timeout=5.0)

    def _settings(self, policy: RetryPolicy | None, idempotency_ttl: int | None = None) -> Any:
        # One namespace for this test's state, queue and transaction keys.
        settings = RedisStoreSettings(namespace=self.namespace, tx_prefix=self.namespace)
        return settings.replace(failover=policy, idempotency_ttl_seconds=idempotency_ttl)

    def _client(self, policy: RetryPolicy | None) -> Redis:
        return self.direct if policy is None else self.client

    def _backend(self, policy: RetryPolicy | None, idempotency_ttl: int | None) -> StorageBackend:
        settings = self._settings(policy, idempotency_ttl)
        backend = RedisBackend(self._client(policy), clock=self.clock, settings=settings)
        assert backend.history_limit == self.history_limit
        return backend

    async def check_write_rows(self, run_id: str, applied: int) -> None:
        """Nothing to count: a Redis write's replay key expires after two minutes."""

    async def _close_clients(self) -> None:
        try:
            await clear_namespace(self.direct, self.namespace)
        finally:
            await self.client.aclose()
            await self.direct.aclose()


class ProxiedPostgres(Proxied):
    """A migrated database of this test's own on the lane's PostgreSQL."""

    name = "postgres"
    state_store = PostgresStateStore
    work_queue = PostgresWorkQueue
    timeout = COMMAND_TIMEOUT
    # Each attempt may wait out a connect timeout and a statement timeout.
    per_attempt = 2 * COMMAND_TIMEOUT
    timeout_note: ClassVar[dict[str, Any]] = {"command_timeout_s": COMMAND_TIMEOUT}
    # The patch's parameters carry the tenant and the run id.
    patch_marker = (b"acme", b"r1")
    stall_writes = False
    errors_name_the_tenant = False
    idempotency_expires = False
    history_limit = None

    def __init__(self, proxy: FaultProxy, clock: ManualClock, url: str) -> None:
        super().__init__(proxy, clock)
        self.engine = engine_on(url, port=proxy.port)
        self.direct_engine = engine_on(url, timeout=10.0)

    def _settings(self, policy: RetryPolicy | None) -> Any:
        return PostgresStoreSettings().replace(failover=policy)

    def _client(self, policy: RetryPolicy | None) -> AsyncEngine:
        return self.direct_engine if policy is None else self.engine

    def _backend(self, policy: RetryPolicy | None, idempotency_ttl: int | None) -> StorageBackend:
        assert idempotency_ttl is None, "PostgreSQL keeps idempotency records without expiry"
        return PostgresBackend(
            self._client(policy), clock=self.clock, settings=self._settings(policy)
        )

    async def check_write_rows(self, run_id: str, applied: int) -> None:
        async with self.direct_engine.connect() as conn:
            result = await conn.execute(
                text("SELECT count(*) FROM adk_run_writes WHERE run_id = :r"), {"r": run_id}
            )
            rows = int(result.scalar_one())
        assert rows == applied, f"{run_id}: {rows} rows in adk_run_writes, {applied} applied"

    async def _close_clients(self) -> None:
        try:
            await self.engine.dispose()
        finally:
            await self.direct_engine.dispose()


def engine_on(
    url: str, *, port: int | None = None, timeout: float = COMMAND_TIMEOUT
) -> AsyncEngine:
    """An engine on ``url`` (through the proxy on ``port`` if given) whose client notices a
    stall: asyncpg's connect ``timeout`` and per-statement ``command_timeout``."""
    target = make_url(url)
    if port is not None:
        target = target.set(port=port)
    return create_async_engine(
        target,
        pool_size=5,
        max_overflow=0,
        pool_timeout=5,
        connect_args={"timeout": timeout, "command_timeout": timeout},
    )


@asynccontextmanager
async def behind_proxy(port: int, build: Callable[[FaultProxy], P]) -> AsyncIterator[P]:
    """A proxy in front of the server on ``port``, and the backing ``build`` makes on it."""
    async with FaultProxy(port) as proxy:
        backing = build(proxy)
        try:
            yield backing
        finally:
            await backing.close()
