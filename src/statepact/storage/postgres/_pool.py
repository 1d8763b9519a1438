"""The engine a ``PostgresBackend.connect`` builds and owns: its pool bounds, the
statement timeout on every connection, the client's own bound on a reply, and the
connections it opens at once."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres._engine import asyncpg_url, create_engine
from statepact.storage.postgres._sql.tx import PING

__all__ = ["own_engine", "warm"]

# Seconds to open a connection before calling the attempt failed (asyncpg waits 60).
_CONNECT_TIMEOUT = 10.0


def own_engine(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    pool_timeout: float,
    statement_timeout: float,
    engine_options: dict[str, Any],
) -> tuple[PostgresStoreSettings, AsyncEngine]:
    """The settings of a pool of ``max_size`` connections to ``dsn`` and its engine;
    each bad argument raises ``ValueError`` naming it, before anything is built."""
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise ValueError(f"min_size: must be a non-negative int, got {min_size!r}")
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"max_size: must be a positive int, got {max_size!r}")
    if min_size > max_size:
        raise ValueError(f"min_size: {min_size} is above max_size {max_size}")
    if not statement_timeout > 0:
        raise ValueError(f"statement_timeout: must be positive, got {statement_timeout}")
    url = asyncpg_url(dsn)
    settings = PostgresStoreSettings(
        dsn=url.render_as_string(hide_password=False),
        pool_size=max_size,
        max_overflow=0,
        pool_timeout=pool_timeout,
    )
    options = dict(engine_options)
    connect_args = dict(options.pop("connect_args", {}))
    server_settings = dict(connect_args.pop("server_settings", {}))
    server_settings.setdefault("statement_timeout", str(round(statement_timeout * 1000)))
    connect_args["server_settings"] = server_settings
    # The client's own bound, a little longer than the server's: a partitioned
    # server never answers, and a call must fail over instead of hanging.
    connect_args.setdefault("command_timeout", statement_timeout + 5.0)
    connect_args.setdefault("timeout", _CONNECT_TIMEOUT)
    # No pre-ping (create_engine's default): it would add round trips to every
    # checkout; a connection the server closed is refused at checkout for free,
    # and every call a backend sends is safe to send again after one that went stale.
    engine = create_engine(settings, pool_pre_ping=False, connect_args=connect_args, **options)
    return settings, engine


async def warm(engine: AsyncEngine, count: int) -> None:
    """Open ``count`` pooled connections now rather than on the first calls."""
    if count <= 0:
        return
    opened: list[AsyncConnection] = []
    try:
        for _ in range(count):
            conn = await engine.connect()
            opened.append(conn)
            await conn.execute(PING)
    except Exception:
        return  # warming is an optimisation; the first real call reports any trouble
    finally:
        for conn in opened:
            await conn.close()
