"""Questions to a running Redis or PostgreSQL server from synchronous code: its version,
and the URL forms the drivers want.

The server may be one we started (:mod:`statepact.testing.local_servers`), a
container, or one named by the environment (:mod:`statepact.testing.servers`).
Each driver is imported where it is used, never at import time, and a URL's
password is never printed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from statepact.settings import redact_dsn

__all__ = ["as_asyncpg_url", "postgres_server_version", "redis_server_version"]


def _run_in_thread(factory: Callable[[], Coroutine[Any, Any, str]]) -> str:
    """Run a coroutine to completion on a fresh event loop in a helper thread.

    The callers are sync fixtures, which may run while a test's loop is running.
    """
    result: list[str] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="statepact-server-probe", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def as_asyncpg_url(url: str) -> str:
    """Any PostgreSQL URL (``postgres://``, ``postgresql+driver://``...) as SQLAlchemy asyncpg."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+", 1)[0] not in ("postgres", "postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {redact_dsn(url)}")
    return f"postgresql+asyncpg://{rest}"


def _libpq_dsn(url: str) -> str:
    return "postgresql://" + url.partition("://")[2]


def postgres_server_version(url: str, timeout: float = 10.0) -> str:
    """``SHOW server_version`` of the server at ``url`` (any PostgreSQL URL form), via asyncpg."""
    try:
        import asyncpg
    except ImportError:
        return "unknown (asyncpg is not installed)"
    dsn = _libpq_dsn(url)

    async def query() -> str:
        conn = await asyncpg.connect(dsn, timeout=timeout)
        try:
            return str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()

    return _run_in_thread(query)


def redis_server_version(url: str, timeout: float = 10.0) -> tuple[str, str]:
    """``(redis_version, appendonly)`` of the server at ``url``, via redis-py.

    ``appendonly`` is ``"unknown"`` where CONFIG is not allowed (managed Redis).
    """
    import redis

    with redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout
    ) as client:
        info: Mapping[str, Any] = client.info("server")
        version = str(info.get("redis_version", "unknown"))
        try:
            config: Mapping[str, Any] = client.config_get("appendonly")
            appendonly = str(config.get("appendonly", "unknown"))
        except redis.RedisError:
            appendonly = "unknown"
    return version, appendonly
