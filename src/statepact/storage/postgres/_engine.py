"""The PostgreSQL engine factory: the URL statepact connects with, and the pool, JIT and
statement-timeout settings every engine it builds has (docs/backings.md#postgresql).

It builds; it never runs a store's statement (that is ``_client``'s executors).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact.settings import PostgresStoreSettings

__all__ = ["asyncpg_url", "create_engine", "refuse_closed_connections"]


def asyncpg_url(dsn: str) -> URL:
    """The URL statepact's async engines connect with: ``postgresql://`` (or
    ``postgres://``) run through asyncpg, ``postgresql+asyncpg://`` as it is. A URL
    naming another driver is refused with a ``ValueError`` naming ``dsn``: the stores
    run their statements on asyncpg's own connection, and would fail at their first
    call on any other."""
    try:
        url = make_url(dsn)
    except sa_exc.ArgumentError:
        raise ValueError(
            "dsn: not a database URL; use postgresql://user[:password]@host:port/database"
        ) from None
    if url.drivername in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+asyncpg")
    if url.drivername == "postgresql+asyncpg":
        return url
    sync = (
        "; psycopg serves bound() on a sync SQLAlchemy Session (statepact[postgres-sync])"
        if url.drivername.startswith("postgresql+psycopg")
        else ""
    )
    raise ValueError(
        f"dsn: {url.drivername}:// names another driver, and statepact's stores run on "
        "asyncpg (installed by statepact[postgres]): give the same URL as postgresql:// or "
        f"postgresql+asyncpg://{sync}"
    )


def create_engine(settings: PostgresStoreSettings, **engine_kwargs: Any) -> AsyncEngine:
    """An ``AsyncEngine`` sized by ``settings``: pool, overflow and the pool timeout.

    A connection the server closed (a restart, an administrator's kill, a
    pooler recycling it) is replaced at checkout instead of failing the first
    statement, which for a write could not always be sent again: a checkout
    listener (:func:`refuse_closed_connections`) asks asyncpg whether the
    connection is still open, which costs no round trip. SQLAlchemy's
    ``pool_pre_ping`` would ask the server instead, and on asyncpg, before a
    checkout is switched to AUTOCOMMIT, that is ``BEGIN``, ``;`` and
    ``ROLLBACK``: three round trips in front of every one-statement call
    (docs/benchmarks.md, "Round trips"). It stays off
    unless you pass ``pool_pre_ping=True``; a connection whose peer vanished
    without closing it is then found by its first statement, and the failover
    takes over. The pool hands out the connection checked in last
    (``pool_use_lifo``): the few a steady load needs stay warm, with their
    prepared statements and the server's plans for them, and the rest sit idle
    (and may be closed by a server or pooler timeout) instead of taking turns.
    Extra keyword arguments go to ``create_async_engine``.

    PostgreSQL's JIT is turned off for each new connection (``jit = off``) unless
    the role, the database or the connection's options (``connect_args``'
    ``server_settings``) set ``jit`` themselves. Every statement here is short, but
    a claim's estimated cost grows with the tenants waiting (a recursive walk of
    the rotation), and on many tenants it passes ``jit_above_cost``: each claim
    is then compiled by LLVM before it runs, which costs far more than the claim
    (docs/benchmarks.md, "JIT and the claim"). The compiled code is not kept
    between calls, so JIT only ever costs this workload. An engine you build yourself keeps its own
    setting: set ``jit = off`` for the role or the database (docs/operations.md).

    ``settings.statement_timeout`` (30 s by default) is set on each new
    connection whose effective ``statement_timeout`` is 0: in the same query as
    the JIT setting when the connection opens, none per call. A timeout the user
    chose wins: one set for the role or the database, or passed in
    ``connect_args`` (asyncpg's ``server_settings``). It is a session setting:
    behind PgBouncer in transaction mode only a role or database setting reaches
    every server connection (``docs/operations.md``).
    """
    if settings.dsn is None:
        raise ValueError("dsn: PostgresStoreSettings.dsn is needed to create an engine")
    url = asyncpg_url(settings.dsn.get_secret_value())
    options: dict[str, Any] = {
        "pool_size": settings.pool_size,
        "max_overflow": settings.max_overflow,
        "pool_timeout": settings.pool_timeout,
        "pool_pre_ping": False,
        "pool_use_lifo": True,
    }
    options.update(engine_kwargs)
    engine = create_async_engine(url, **options)
    refuse_closed_connections(engine)
    # Set when each connection opens, in one simple-protocol query (no prepared
    # statement, one round trip), and only where nobody chose: a value from the
    # startup options, the role or the database stays. Not startup options of ours:
    # a pooler such as PgBouncer refuses a startup parameter it does not know.
    session = [
        # JIT off (see the docstring) unless chosen anywhere but the server's defaults.
        "SELECT set_config('jit', 'off', false) FROM pg_settings "
        "WHERE name = 'jit' AND source IN ('default', 'configuration file')"
    ]
    if settings.statement_timeout is not None:
        # Literal milliseconds (validated >= 1).
        milliseconds = max(1, round(settings.statement_timeout * 1000))
        session.append(
            f"SELECT set_config('statement_timeout', '{milliseconds}ms', false) "
            "WHERE current_setting('statement_timeout') = '0'"
        )
    script = "; ".join(session)

    def set_session(dbapi_connection: Any, _record: Any) -> None:
        # Outside any transaction, so the session keeps what it sets.
        dbapi_connection.run_async(lambda raw: raw.execute(script))

    event.listen(engine.sync_engine, "connect", set_session)
    return engine


def refuse_closed_connections(engine: AsyncEngine) -> None:
    """Make ``engine``'s pool hand out only connections asyncpg still holds open.

    At checkout a connection asyncpg knows closed (the server ended it while it
    sat in the pool: its socket was read to the end by the event loop) raises
    ``DisconnectionError``, so the pool discards it and checks out another,
    without a round trip. Drivers other than asyncpg are left alone.
    """

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        is_closed = getattr(driver, "is_closed", None)
        if callable(is_closed) and is_closed():
            raise sa_exc.DisconnectionError("the server closed this pooled connection")

    event.listen(engine.sync_engine.pool, "checkout", on_checkout)
