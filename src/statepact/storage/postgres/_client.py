"""The PostgreSQL boundary: every statement the stores run goes through an executor here.

:class:`EngineExecutor` owns its connections (an ``AsyncEngine`` in
AUTOCOMMIT, or calls taking turns on an ``AsyncConnection``) and waits out a
failover with the one retry policy; :class:`BoundExecutor` runs inside a
transaction the caller opened and never begins, commits, rolls back or retries.
Every driver error becomes a public one here; which becomes what:
docs/backings.md#errors-at-the-postgresql-boundary.

This module must never retry a call whose statement may have reached the
server unless the call is idempotent or ``resend_safe`` (its statement
recognises its own first attempt by a call id), and never put a URL or a
password in a message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from statepact._retry import RetryPolicy, call_with_failover
from statepact.errors import (
    ConflictError,
    DeadlockError,
    OutOfTurnError,
    PoolExhaustedError,
    PreflightError,
    SchemaVersionError,
    StatepactError,
)

__all__ = [
    "BoundExecutor",
    "EngineExecutor",
    "Executor",
    "Failures",
    "FirstAttemptCommitted",
    "Runner",
    "connect_refusal",
    "constraint_of",
    "detail_of",
    "is_connection_error",
    "is_database_error",
    "is_rolled_back",
    "is_unique_violation",
    "lacking_privilege",
    "sqlstate_of",
]

T = TypeVar("T")

# Connection exceptions (class 08), and operator intervention that ends sessions.
_CONNECTION_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "08000", "08001", "08003"})
_ROLLED_BACK_STATES = frozenset({"40001", "40P01"})
_SCHEMA_STATES = frozenset({"42P01", "42703", "42883", "3F000"})


class Runner(Protocol):
    """What a call's work runs its statements on: an ``AsyncConnection`` or an
    ``AsyncSession`` (Core statements, a ``Result``), or the driver's connection under
    ``_direct.DirectExecutor`` (``Prepared`` statements, ``Rows``)."""

    async def execute(self, statement: Any, parameters: Any = None) -> Any: ...


Work = Callable[[Runner], Awaitable[T]]


class FirstAttemptCommitted(Exception):
    """A resend's statement met its own first attempt (the call id's row was committed under it).

    Raised by a store's work when the insert of the call id's row hit its
    primary key: the first attempt was still running on the server when the
    resend arrived, and has committed since. The statement was aborted, nothing
    of the resend applied; the executor sends the call again, and that resend
    finds the row and answers as the first attempt did.
    """


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, looking through SQLAlchemy's and the adapter's wrappers."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if isinstance(state, str) and state:
            return state
        nested = getattr(current, "orig", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return None


def constraint_of(exc: BaseException) -> str | None:
    """The constraint a driver error names (a unique violation's index), if any."""
    for link in _chain(exc):
        name = getattr(link, "constraint_name", None)
        if isinstance(name, str) and name:
            return name
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        nested = getattr(current, "orig", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return out


def detail_of(exc: BaseException) -> dict[str, Any]:
    """The JSON object a server function raised its error with as DETAIL (``{}`` if none):
    how ``statepact_commit`` says what it refused (``_commits.refusal_of``)."""
    for link in _chain(exc):
        detail = getattr(link, "detail", None)
        if isinstance(detail, str) and detail:
            try:
                parsed = json.loads(detail)
            except ValueError:
                return {}
            return parsed if isinstance(parsed, dict) else {}
    return {}


def lacking_privilege(what: str, exc: BaseException) -> str:
    """The reason a call refused with SQLSTATE 42501 gives: the server's message, which
    names the object (never a value), as a DBA needs it, and where the grants are."""
    return (
        f"{what}: the role lacks a privilege ({_chain(exc)[-1]}, SQLSTATE 42501); "
        "grant what docs/operations.md#the-applications-role lists"
    )


def connect_refusal(exc: BaseException) -> str | None:
    """What a refused connection means when the fix is in the URL or on the server: the
    database does not exist (3D000), or the server refused the role or its password
    (28P01, 28000). The server's own message names the database or role, never a
    password. ``None`` for any other failure."""
    state = sqlstate_of(exc)
    said = str(_chain(exc)[-1]).strip().splitlines()
    message = said[0] if said else ""
    if state == "3D000":
        return (
            f"{message or 'the database does not exist'} (SQLSTATE 3D000): create it, or name "
            "an existing database in the URL"
        )
    if state in ("28P01", "28000"):
        return (
            f"the server refused the connection's role or password ({message}, SQLSTATE "
            f"{state}): check the user and password in the URL, and pg_hba.conf"
        )
    return None


def is_pool_exhausted(exc: BaseException) -> bool:
    return isinstance(exc, sa_exc.TimeoutError)


def is_connection_error(exc: BaseException) -> bool:
    """Whether the error says the server could not be reached or the session was lost."""
    if is_pool_exhausted(exc):
        return False
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    state = sqlstate_of(exc)
    if state is not None:
        return state in _CONNECTION_STATES or state.startswith("08")
    for link in _chain(exc):
        if isinstance(link, ConnectionError | OSError | asyncio.TimeoutError | TimeoutError):
            return True
        name = type(link).__name__
        # asyncpg's client-side "connection is closed" / "connection was closed in
        # the middle of operation" carry no SQLSTATE.
        if name in ("ConnectionDoesNotExistError", "InterfaceError") and "closed" in str(link):
            return True
        # A connection whose protocol is stuck mid-message: the server sent an error on its
        # own (57P01/57P02 "terminating connection" as it shut down or crashed) while the
        # connection sat idle, and asyncpg refuses the next statement before sending it.
        if name == "InternalClientError" or (
            name == "InterfaceError" and "another operation is in progress" in str(link)
        ):
            return True
    return False


def is_unique_violation(exc: BaseException) -> bool:
    """A unique violation (SQLSTATE 23505): the statement wrote nothing."""
    return sqlstate_of(exc) == "23505"


def is_database_error(exc: BaseException) -> bool:
    """An error of the server or of the way to it (a refusal, a lost or failed
    connection), not of the caller's code: what a best-effort listener gives up on."""
    return (
        isinstance(exc, OSError | sa_exc.SQLAlchemyError)
        or sqlstate_of(exc) is not None
        or is_connection_error(exc)
    )


def is_rolled_back(exc: BaseException) -> bool:
    """A deadlock or serialization failure: the server aborted the statement, nothing applied."""
    return sqlstate_of(exc) in _ROLLED_BACK_STATES


def _describe(exc: BaseException) -> str:
    state = sqlstate_of(exc)
    root = _chain(exc)[-1]
    return f"{type(root).__name__}" + (f", SQLSTATE {state}" if state else "")


class Failures:
    """How one store names its failures: state and queue raise different public errors."""

    def __init__(self, unavailable: Callable[[str], StatepactError], what: str) -> None:
        self.unavailable = unavailable
        self.what = what

    def give_up(self, exc: BaseException, attempts: int) -> StatepactError:
        return self.unavailable(
            f"PostgreSQL {self.what}: the server stayed unreachable after {attempts} "
            f"attempt(s) ({_describe(exc)}); retry later"
        )

    def retries(
        self, exc: BaseException, *, idempotent: bool, resend_safe: bool, sent: bool
    ) -> bool:
        """Whether an owned call's attempt that raised ``exc`` is sent again (failover).

        A deadlock or serialization failure applied nothing; a resend meeting its own
        first attempt is sent again when the call is ``resend_safe``; a lost connection
        when the call is idempotent, resend-safe, or never reached the server.
        """
        if is_rolled_back(exc):
            return True
        if isinstance(exc, FirstAttemptCommitted):
            return resend_safe
        return is_connection_error(exc) and (idempotent or resend_safe or not sent)

    def ran_out(self, exc: BaseException, attempts: int) -> StatepactError:
        """The public error when the failover budget of ``attempts`` ran out on ``exc``."""
        if is_rolled_back(exc):
            public = self.translate(exc, bound=False)
            assert public is not None
            return public
        if isinstance(exc, FirstAttemptCommitted):
            return self.unavailable(
                f"PostgreSQL {self.what}: an earlier attempt of this write applied it, and "
                "the failover budget ran out before a resend could read the result; read "
                "the record to see it"
            )
        return self.give_up(exc, attempts)

    async def call(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        policy: RetryPolicy,
        idempotent: bool,
        resend_safe: bool,
        sent: Callable[[], bool],
        abandonable: bool = False,
    ) -> T:
        """Run ``attempt`` under the failover of ``policy``, by this store's rules:
        :meth:`retries` decides a resend (``sent()`` says whether the failed attempt
        reached the server), :meth:`translate` names what is not retried, and
        :meth:`ran_out` what the budget ends on. Each attempt runs to its end even if
        the caller is cancelled meanwhile, unless ``abandonable`` (the attempt then
        sees the ``CancelledError`` itself and must leave its connection unused)."""
        return await call_with_failover(
            attempt,
            policy=policy,
            is_transient=lambda exc: self.retries(
                exc, idempotent=idempotent, resend_safe=resend_safe, sent=sent()
            ),
            give_up=lambda exc: self.ran_out(exc, policy.attempts),
            translate=lambda exc: self.translate(exc, bound=False),
            what=self.what,
            backing="postgres",
            shield=not abandonable,
        )

    def unknown_outcome(self, exc: BaseException) -> StatepactError:
        return self.unavailable(
            f"PostgreSQL {self.what}: the connection was lost while the statement was in "
            f"flight ({_describe(exc)}); it may or may not have been applied, so it was "
            "not retried"
        )

    def translate(self, exc: BaseException, *, bound: bool) -> StatepactError | None:
        if isinstance(exc, StatepactError):
            return None
        if is_pool_exhausted(exc):
            return PoolExhaustedError(
                f"PostgreSQL {self.what}: no pooled connection was free within the pool "
                "timeout; the server is fine, this process is over-subscribed: size the pool "
                "to the worker count"
            )
        state = sqlstate_of(exc)
        if state == "40P01":
            return DeadlockError(resource=self.what, key="(statement)")
        if state == "40001":
            return ConflictError(
                f"PostgreSQL {self.what}: the transaction could not be serialized "
                "(SQLSTATE 40001); retry it"
            )
        if state in _SCHEMA_STATES:
            return SchemaVersionError(
                f"PostgreSQL {self.what}: a table, column or function statepact reads is "
                f"missing (SQLSTATE {state}); run `statepact db upgrade` (or `alembic upgrade "
                "head` where the application's Alembic environment applies statepact's "
                "revisions)"
            )
        if state == "42501":
            # Not the server's state but the role's grants: calling again cannot help.
            return PreflightError([lacking_privilege(self.what, exc)], server="PostgreSQL")
        if state == "57014":
            return self.unavailable(
                f"PostgreSQL {self.what}: the statement was cancelled (statement_timeout or "
                "an operator); nothing was applied"
            )
        if is_connection_error(exc):
            return (
                self.unavailable(
                    f"PostgreSQL {self.what}: the connection failed inside the caller's "
                    f"transaction ({_describe(exc)}); roll it back and retry it"
                )
                if bound
                else self.unknown_outcome(exc)
            )
        refusal = connect_refusal(exc)
        if refusal is not None:
            return self.unavailable(f"PostgreSQL {self.what}: {refusal}")
        if isinstance(exc, sa_exc.SQLAlchemyError) or state is not None:
            return self.unavailable(
                f"PostgreSQL {self.what}: the server refused ({_describe(exc)})"
            )
        return None


class Executor(Protocol):
    """What a store runs its calls on. ``abandonable`` marks a read that changes nothing:
    an executor may walk away from it when its caller is cancelled (``DirectExecutor``
    does, closing its connection); the others run it to its end like any call."""

    @property
    def bound(self) -> bool: ...

    @property
    def target(self) -> AsyncEngine | AsyncConnection | AsyncSession:
        """What the calls run on (observability reads its URL, docs/observability.md)."""
        ...

    async def run(
        self,
        work: Work[T],
        *,
        idempotent: bool,
        resend_safe: bool = False,
        abandonable: bool = False,
    ) -> T: ...


class EngineExecutor:
    """Owns its connections: AUTOCOMMIT checkouts from an engine, with failover."""

    bound = False

    def __init__(
        self,
        target: AsyncEngine | AsyncConnection,
        *,
        policy: RetryPolicy,
        unavailable: Callable[[str], StatepactError],
        what: str,
    ) -> None:
        self._policy = policy
        self._failures = Failures(unavailable, what)
        self._lock: asyncio.Lock | None = None
        if isinstance(target, AsyncEngine):
            # One statement per call runs in its own implicit transaction: one round
            # trip instead of BEGIN + statement + COMMIT.
            self._engine: AsyncEngine | None = target.execution_options(
                isolation_level="AUTOCOMMIT"
            )
            self._connection: AsyncConnection | None = None
        elif isinstance(target, AsyncConnection):
            self._engine = None
            self._connection = target
            # One connection runs one statement at a time.
            self._lock = asyncio.Lock()
        else:
            raise TypeError(
                "engine: must be an SQLAlchemy AsyncEngine or AsyncConnection, "
                f"got {type(target).__name__}"
            )

    @property
    def engine(self) -> AsyncEngine | AsyncConnection:
        target = self._engine if self._engine is not None else self._connection
        assert target is not None
        return target

    @property
    def target(self) -> AsyncEngine | AsyncConnection:
        return self.engine

    async def run(
        self,
        work: Work[T],
        *,
        idempotent: bool,
        resend_safe: bool = False,
        abandonable: bool = False,
    ) -> T:
        """Run ``work`` on an owned connection, waiting out a failover within the policy.

        ``idempotent``: running it twice is harmless (a read). ``resend_safe``: a
        write whose statement carries a call id and recognises its own first
        attempt, so sending it again after a lost reply applies it once.
        ``abandonable`` is accepted and not used: every call on SQLAlchemy's
        connection runs to its end.
        """
        sent = False

        async def attempt() -> T:
            nonlocal sent
            sent = False
            if self._engine is not None:
                async with self._engine.connect() as conn:
                    sent = True
                    return await work(conn)
            assert self._connection is not None and self._lock is not None
            async with self._lock:
                conn = self._connection
                if conn.in_transaction():
                    raise ValueError(
                        "engine: the AsyncConnection is inside a transaction; commit it "
                        "first, or use bound(connection) to run inside that transaction"
                    )
                async with conn.begin():
                    sent = True
                    return await work(conn)

        return await self._failures.call(
            attempt,
            policy=self._policy,
            idempotent=idempotent,
            resend_safe=resend_safe,
            sent=lambda: sent,
        )


# The sessions and connections a bound call is running on, by id: a store's and a queue's
# bound adapters over one session are different executors, so the mark is the session's.
_IN_USE: set[int] = set()

_ONE_TASK = (
    "one AsyncSession (or AsyncConnection) serves one task at a time, a sync Session one "
    "thread: give each task its own, or await one call before making the next"
)


class BoundExecutor:
    """Runs inside the caller's open transaction; translates errors, retries nothing."""

    bound = True

    def __init__(
        self,
        target: AsyncSession | AsyncConnection,
        *,
        unavailable: Callable[[str], StatepactError],
        what: str,
    ) -> None:
        if not isinstance(target, AsyncSession | AsyncConnection):
            raise TypeError(
                "session: must be an SQLAlchemy AsyncSession or AsyncConnection whose "
                f"transaction the caller opened, got {type(target).__name__}"
            )
        self._target = target
        self._kind = type(target).__name__
        self._failures = Failures(unavailable, what)

    @property
    def target(self) -> AsyncSession | AsyncConnection:
        return self._target

    def _refuse(self, why: str) -> OutOfTurnError:
        return OutOfTurnError(
            f"PostgreSQL {self._failures.what}, bound: the {self._kind} {why}; nothing was sent"
        )

    def _check_turn(self) -> None:
        """Refuse, before sending, a target that is not inside a usable transaction."""
        target = self._target
        try:
            if isinstance(target, AsyncConnection):
                if target.closed:
                    raise self._refuse("is closed")
                if target.invalidated:
                    raise self._refuse(
                        "lost its server connection inside the transaction (an earlier call "
                        "raised); roll the transaction back and run it again"
                    )
            transaction = target.get_transaction() if target.in_transaction() else None
        except sa_exc.InvalidRequestError as exc:  # never started, or closed under us
            raise self._refuse("is closed") from exc
        if transaction is None:
            raise self._refuse(
                "is not inside a transaction: bound calls run inside one you began "
                "(async with session.begin(): ..., or with session.begin(): ... on a sync "
                "Session) and never begin, commit or roll back one "
                "themselves; a statement sent now would autobegin a transaction nobody commits"
            )
        if not transaction.is_active:
            raise self._refuse(
                "holds a transaction that can no longer run statements; roll it back"
            )

    def _misuse(self, exc: BaseException) -> OutOfTurnError | None:
        """What SQLAlchemy or the server refused because of how the target was used."""
        if sqlstate_of(exc) == "25P02":
            return OutOfTurnError(
                f"PostgreSQL {self._failures.what}, bound: the caller's transaction had already "
                "failed (SQLSTATE 25P02: a statement in it raised earlier), so the server "
                "ignored this call; roll the transaction back and run it again from the start"
            )
        if isinstance(exc, sa_exc.ResourceClosedError):
            return self._refuse("is closed")
        if isinstance(exc, sa_exc.PendingRollbackError):
            return self._refuse(
                "holds a transaction that must be rolled back first (an earlier statement or "
                "connection failed)"
            )
        concurrent = isinstance(exc, sa_exc.IllegalStateChangeError) or any(
            "concurrent operations are not permitted" in str(link)
            or "another operation is in progress" in str(link)
            for link in _chain(exc)
        )
        if concurrent:
            return self._refuse(f"was in use by another task: {_ONE_TASK}")
        if isinstance(exc, sa_exc.InvalidRequestError):
            return self._refuse(
                f"was refused by SQLAlchemy ({type(exc).__name__}): its state does not allow "
                "a statement now; roll its transaction back"
            )
        return None

    async def run(
        self,
        work: Work[T],
        *,
        idempotent: bool,
        resend_safe: bool = False,
        abandonable: bool = False,
    ) -> T:
        key = id(self._target)
        if key in _IN_USE:  # first: mid-call, the target's own state is not settled
            raise self._refuse(f"is running another task's bound call: {_ONE_TASK}")
        self._check_turn()
        _IN_USE.add(key)
        try:
            return await work(self._target)
        except StatepactError:
            raise
        except Exception as exc:
            public = self._misuse(exc) or self._failures.translate(exc, bound=True)
            if public is None:
                raise
            raise public from exc
        finally:
            _IN_USE.discard(key)
