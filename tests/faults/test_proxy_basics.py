"""The fault proxy itself, against a real Redis: each fault does what it says, and only that.

These pin the tool the other fault tests rely on: passing is transparent, a
stall delays without losing, a blackhole and a refusal look like a dead server,
a cut closes both sides, and an armed mid-command cut fires on the marked
request only, after the server applied it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis

from statepact.testing.faults import FaultProxy
from statepact.testing.servers import RedisServer
from tests.faults.conftest import SOCKET_TIMEOUT, fault_redis_client

pytestmark = [pytest.mark.integration, pytest.mark.faults]


async def test_passes_traffic_both_ways(fault_redis_server: RedisServer) -> None:
    """Through a passing proxy a client works as if connected directly; bytes are counted."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        client = fault_redis_client(proxy.port)
        try:
            assert await client.set("proxy:pass", "1") is True
            assert await client.get("proxy:pass") == b"1"
        finally:
            await client.aclose()
        assert proxy.stats.accepted == 1
        assert proxy.stats.bytes_up > 0
        assert proxy.stats.bytes_down > 0
        assert proxy.stats.cut == 0


async def test_stall_delays_then_delivers(fault_redis_server: RedisServer) -> None:
    """A stall shorter than the socket timeout delays the reply by the stall and loses nothing."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        client = fault_redis_client(proxy.port, socket_timeout=2.0)
        try:
            await client.ping()
            proxy.stall(0.3)
            began = time.monotonic()
            assert await client.incr("proxy:stall") >= 1
            elapsed = time.monotonic() - began
        finally:
            await client.aclose()
        assert 0.25 <= elapsed < 1.5
        assert proxy.stats.cut == 0


async def test_stall_longer_than_socket_timeout_times_out(
    fault_redis_server: RedisServer,
) -> None:
    """A stall past the client's socket timeout is a redis-py TimeoutError after that timeout."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        client = fault_redis_client(proxy.port)
        try:
            await client.ping()
            proxy.stall(5.0)
            began = time.monotonic()
            with pytest.raises(rex.TimeoutError):
                await client.ping()
            elapsed = time.monotonic() - began
        finally:
            proxy.heal()
            await client.aclose()
        assert SOCKET_TIMEOUT * 0.9 <= elapsed < SOCKET_TIMEOUT + 1.0


async def test_blackhole_answers_nothing_and_heal_cuts_what_it_broke(
    fault_redis_server: RedisServer,
) -> None:
    """Blackholed bytes never arrive; healing cuts the broken connection and traffic resumes."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        client = fault_redis_client(proxy.port)
        direct = fault_redis_client(fault_redis_server.port, socket_timeout=5.0)
        try:
            await client.ping()
            await direct.delete("proxy:hole")
            proxy.blackhole()
            with pytest.raises(rex.TimeoutError):
                await client.set("proxy:hole", "1")
            # The server never saw the write.
            assert await direct.get("proxy:hole") is None
            assert proxy.stats.bytes_dropped > 0
            proxy.heal()
            assert await client.set("proxy:hole", "2") is True
            assert await direct.get("proxy:hole") == b"2"
        finally:
            await client.aclose()
            await direct.aclose()


async def test_refuse_closes_new_connections(fault_redis_server: RedisServer) -> None:
    """While refusing, every connection attempt is counted and closed at once."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        proxy.refuse()
        client = fault_redis_client(proxy.port)
        try:
            began = time.monotonic()
            with pytest.raises(rex.ConnectionError):
                await client.ping()
            assert time.monotonic() - began < SOCKET_TIMEOUT
            assert proxy.stats.refused >= 1
            assert proxy.stats.accepted == proxy.stats.refused
            proxy.heal()
            assert await client.ping() is True
        finally:
            await client.aclose()


async def test_cut_closes_both_sides(fault_redis_server: RedisServer) -> None:
    """A cut closes the client's connection (next call fails) and the server's (it sees a client
    leave)."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        client = fault_redis_client(proxy.port)
        direct = fault_redis_client(fault_redis_server.port, socket_timeout=5.0)
        try:
            await client.client_setname("proxy-cut")
            names = [c.get("name") for c in await direct.client_list()]
            assert "proxy-cut" in names
            assert proxy.cut() == 1
            with pytest.raises(rex.ConnectionError):
                await client.ping()
            for _ in range(100):
                names = [c.get("name") for c in await direct.client_list()]
                if "proxy-cut" not in names:
                    break
                await asyncio.sleep(0.01)
            assert "proxy-cut" not in names
            assert proxy.stats.cut == 1
        finally:
            await client.aclose()
            await direct.aclose()


async def test_cut_after_reply_fires_on_the_marked_request_after_it_applied(
    fault_redis_server: RedisServer,
) -> None:
    """Only the request carrying the markers is cut, after the server applied it; others pass."""
    async with FaultProxy(fault_redis_server.port) as proxy:
        client = fault_redis_client(proxy.port)
        direct: Redis = fault_redis_client(fault_redis_server.port, socket_timeout=5.0)
        try:
            await direct.delete("proxy:amb", "proxy:other")
            armed = proxy.cut_after_reply(b"proxy:amb", b"marker-7")
            # Carries the first marker only: passes.
            assert await client.set("proxy:amb", "marker-1") is True
            assert await client.set("proxy:other", "x") is True
            with pytest.raises(rex.ConnectionError):
                await client.set("proxy:amb", "marker-7")
            await armed.wait(1.0)
            assert armed.swallowed.startswith(b"+OK")
            assert await direct.get("proxy:amb") == b"marker-7"
            # One-shot: the next identical request passes.
            assert await client.set("proxy:amb", "marker-7") is True
            assert proxy.stats.cut == 1
        finally:
            await client.aclose()
            await direct.aclose()


async def test_close_ends_open_connections_quietly(fault_redis_server: RedisServer) -> None:
    """Closing the proxy under an open client connection (passing, stalled or blackholed)
    ends every pump and handler without asyncio reporting an error, even when the close
    itself is cancelled again and again."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        for fault in ("pass", "stall", "blackhole"):
            proxy = await FaultProxy(fault_redis_server.port).start()
            client = fault_redis_client(proxy.port)
            try:
                await client.ping()
                if fault == "stall":
                    proxy.stall(30)
                elif fault == "blackhole":
                    proxy.blackhole()
                closing = asyncio.ensure_future(proxy.close())
                while not closing.done():
                    await asyncio.sleep(0)
                    closing.cancel()
                await asyncio.gather(closing, return_exceptions=True)
                assert proxy.open_connections == 0
            finally:
                await client.aclose()
        await asyncio.sleep(0.05)  # let done-callbacks of the ended tasks run
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
