"""A TCP fault proxy for tests: sits between a client and a real server, on loopback.

:class:`FaultProxy` listens on ``127.0.0.1`` and forwards every connection to
an upstream server (a Redis, a PostgreSQL). On command it can:

- **pass** traffic (the default, and what :meth:`FaultProxy.heal` returns to);
- **blackhole** it: connections are accepted, bytes are read and never
  forwarded, nothing is answered, as a network partition looks to a client
  (:meth:`FaultProxy.blackhole`); healing closes every connection that lost
  bytes, since neither end can know where its stream stands;
- **stall** it: bytes in both directions are held for N seconds, then
  delivered in order (:meth:`FaultProxy.stall`), as a congested link or a
  paused server looks;
- **refuse** new connections (accept, then close at once), as a server that
  is down looks (:meth:`FaultProxy.refuse`);
- **cut** every open connection, both sides, at once (:meth:`FaultProxy.cut`);
- cut **mid-command**: :meth:`FaultProxy.cut_after_reply` arms a one-shot
  fault that waits for a client to send bytes containing the given markers,
  in order, on one connection (for example an idempotency key, then
  ``COMMIT``), forwards them, lets the server apply and answer, swallows the
  answer and cuts that connection. The server did the work; the client never
  hears it: the *ambiguous commit*.

It runs in the caller's event loop (``async with FaultProxy(port) as proxy``)
and counts what it saw (:class:`ProxyStats`: connections accepted, refused,
cut; bytes each way), so a test can assert, say, that a client made no new
connection attempt.

Markers are matched on the raw byte stream of one connection, across reads.
A reply is "the next bytes the server sends on that connection after the
marked request was forwarded", which is exact for request/response clients
(redis-py, asyncpg) and approximate for pipelined ones.

This module must never listen or connect anywhere but a loopback address,
never touch a process, and never parse or rewrite a protocol beyond the
marker search.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

from statepact._cancel import finish

__all__ = ["ArmedCut", "FaultProxy", "ProxyMode", "ProxyStats"]

ProxyMode = Literal["pass", "blackhole", "refuse"]

_READ_SIZE = 65_536
_LOOPBACK = "127.0.0.1"


def _require_loopback(host: str, what: str) -> str:
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        if host == "localhost":
            return _LOOPBACK
    raise ValueError(f"{what}: {host!r} is not a loopback address; the fault proxy stays local")


@dataclass
class ProxyStats:
    """What the proxy saw since it started (or since :meth:`FaultProxy.reset_stats`)."""

    accepted: int = 0
    """Client connections accepted (every connection attempt that reached the proxy)."""
    refused: int = 0
    """Connections closed at once because the proxy was refusing."""
    cut: int = 0
    """Connections closed by a cut (all kinds: ``cut``, ``cut_after_reply``, healing)."""
    upstream_failures: int = 0
    """Connections closed because the upstream server could not be reached."""
    bytes_up: int = 0
    """Bytes forwarded client → server."""
    bytes_down: int = 0
    """Bytes forwarded server → client."""
    bytes_dropped: int = 0
    """Bytes read and never delivered (blackhole, swallowed replies)."""


@dataclass
class ArmedCut:
    """A one-shot mid-command cut; see :meth:`FaultProxy.cut_after_reply`.

    ``fired`` is set once the reply was swallowed and the connection cut;
    ``swallowed`` holds the bytes the client never received.
    """

    markers: tuple[bytes, ...]
    then: ProxyMode | None = None
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    swallowed: bytes = b""
    connection: int | None = None

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109 - a test's bound
        """Wait until the cut fired; ``TimeoutError`` past ``timeout`` seconds."""
        await asyncio.wait_for(self.fired.wait(), timeout)


class _Link:
    """One proxied connection: the client side, the upstream side and their pumps."""

    def __init__(self, number: int, client: asyncio.StreamWriter) -> None:
        self.number = number
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.lossy = False
        self.closed = False
        # Marker search state for an armed cut: how many markers matched so far,
        # and the tail of the stream kept so a marker split across reads is found.
        self.matched = 0
        self.tail = b""
        self.awaiting_reply: ArmedCut | None = None

    def abort(self) -> None:
        """Close both sides at once (RST where the platform does so on abort)."""
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """An asyncio TCP proxy on 127.0.0.1 that passes, drops, stalls or cuts traffic.

    ``upstream_port`` (on ``upstream_host``, loopback only) is the real server;
    clients connect to :attr:`port`. ``listen_port=0`` picks a free port.
    ``connect_timeout`` bounds the proxy's own connection to the upstream.
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        upstream_host: str = _LOOPBACK,
        listen_port: int = 0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.upstream_host = _require_loopback(upstream_host, "upstream_host")
        self.upstream_port = upstream_port
        self.host = _LOOPBACK
        self._listen_port = listen_port
        self._connect_timeout = connect_timeout
        self._server: asyncio.Server | None = None
        self._links: dict[int, _Link] = {}
        self._next_link = 0
        self._mode: ProxyMode = "pass"
        self._stall_until = 0.0
        self._changed = asyncio.Event()
        self._armed: ArmedCut | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.stats = ProxyStats()

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> Self:
        """Listen; returns the proxy. Idempotent."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, self.host, self._listen_port, reuse_address=True
            )
        return self

    async def close(self) -> None:
        """Stop listening, cut every connection and wait for the pumps to end.

        Finished even if the caller is cancelled meanwhile (the caller then gets
        its ``CancelledError``): a proxy half closed would keep its port and tasks.
        """
        await finish(self._close())

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        links = list(self._links.values())
        for link in links:
            link.abort()
        # Aborted transports end every pump and handler by themselves; only one stuck
        # elsewhere is cancelled (asyncio's streams log a cancelled handler as an error).
        tasks = [task for link in links for task in link.tasks] + list(self._handlers)
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=5.0)
            for task in stuck:
                task.cancel()
            if stuck:
                await asyncio.wait(stuck, timeout=5.0)
        self._links.clear()
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5.0)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The port clients connect to (known once started)."""
        if self._server is None:
            raise RuntimeError("FaultProxy: not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def mode(self) -> ProxyMode:
        return self._mode

    @property
    def open_connections(self) -> int:
        """Connections currently proxied (not yet closed by either side or a cut)."""
        return sum(1 for link in self._links.values() if not link.closed)

    def reset_stats(self) -> ProxyStats:
        """Start counting afresh; returns what was counted so far."""
        old, self.stats = self.stats, ProxyStats()
        return old

    def __repr__(self) -> str:
        where = f"{self.host}:{self._server and self.port}"
        return (
            f"<FaultProxy {where} -> {self.upstream_host}:{self.upstream_port} "
            f"mode={self._mode} open={self.open_connections}>"
        )

    # -- faults -------------------------------------------------------------------

    def _set_mode(self, mode: ProxyMode) -> None:
        self._mode = mode
        self._signal()

    def _signal(self) -> None:
        # Wake every pump holding bytes so it re-reads the mode.
        self._changed.set()
        self._changed = asyncio.Event()

    def heal(self) -> int:
        """Back to passing traffic; ends a stall and a blackhole.

        Connections that lost bytes to a blackhole are cut (their streams are
        broken); returns how many.
        """
        self._stall_until = 0.0
        self._set_mode("pass")
        lossy = [link for link in self._links.values() if link.lossy and not link.closed]
        for link in lossy:
            self._cut_link(link)
        return len(lossy)

    def blackhole(self) -> None:
        """Accept connections and read their bytes, but forward and answer nothing."""
        self._set_mode("blackhole")

    def refuse(self) -> None:
        """Close every new connection at once (open ones are left alone; see :meth:`cut`)."""
        self._set_mode("refuse")

    def stall(self, seconds: float) -> None:
        """Hold every byte, both ways, on open and new connections, for ``seconds``.

        Held bytes are delivered in order when the stall ends (or on
        :meth:`heal`); a client whose socket timeout is shorter gives up first.
        """
        if seconds < 0:
            raise ValueError("seconds: must not be negative")
        self._stall_until = asyncio.get_running_loop().time() + seconds
        self._signal()

    def cut(self) -> int:
        """Close every open connection, both sides, at once; returns how many."""
        links = [link for link in self._links.values() if not link.closed]
        for link in links:
            self._cut_link(link)
        return len(links)

    def cut_after_reply(self, *markers: bytes, then: ProxyMode | None = None) -> ArmedCut:
        """Arm a one-shot ambiguous-commit cut.

        The first connection whose client bytes contain every marker, in
        order, has the request carrying the last marker forwarded; the
        server's next bytes on that connection (its reply) are swallowed and
        the connection is cut. With no markers, the next request on any
        connection is the one. ``then`` switches the proxy to that mode in the
        same instant (``"refuse"`` keeps a client's retry out until
        :meth:`heal`, so a test can change the server in between). Replaces a
        cut that is armed and has not fired.
        """
        armed = ArmedCut(tuple(markers), then=then)
        for link in self._links.values():
            link.matched, link.tail = 0, b""
        self._armed = armed
        return armed

    def disarm(self) -> None:
        """Forget an armed cut that has not fired."""
        self._armed = None

    def _cut_link(self, link: _Link) -> None:
        if not link.closed:
            self.stats.cut += 1
            link.abort()

    # -- forwarding -----------------------------------------------------------------

    async def _hold(self) -> bool:
        """Wait while a stall or a blackhole holds bytes; ``False`` to drop them."""
        loop = asyncio.get_running_loop()
        while True:
            if self._mode == "blackhole":
                return False
            remaining = self._stall_until - loop.time()
            if remaining <= 0:
                return True
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def _passes(self, link: _Link, data: bytes) -> bool:
        """Whether ``data`` goes on, once any stall is over (:meth:`_hold`); bytes a
        blackhole drops are counted, and their connection is lossy from then on."""
        if await self._hold():
            return True
        link.lossy = True
        self.stats.bytes_dropped += len(data)
        return False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        self.stats.accepted += 1
        if self._mode == "refuse":
            self.stats.refused += 1
            writer.transport.abort()
            return
        self._next_link += 1
        link = _Link(self._next_link, writer)
        self._links[link.number] = link
        try:
            if self._mode == "blackhole":
                # A partitioned client gets a TCP connection and silence; it never
                # reaches the server, so healing cannot repair it either.
                link.lossy = True
                await self._drain_into_void(link, reader)
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(self.upstream_host, self.upstream_port),
                    self._connect_timeout,
                )
            except (TimeoutError, OSError):
                self.stats.upstream_failures += 1
                link.abort()
                return
            link.upstream = up_writer
            if link.closed:
                # Cut while we were connecting.
                up_writer.transport.abort()
                return
            down = asyncio.create_task(self._pump_down(link, up_reader))
            link.tasks.append(down)
            await self._pump_up(link, reader, up_writer)
            await down
        finally:
            link.abort()
            self._links.pop(link.number, None)

    async def _drain_into_void(self, link: _Link, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while not link.closed:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break
                self.stats.bytes_dropped += len(data)

    def _match(self, link: _Link, data: bytes) -> bool:
        """Advance the armed markers over client bytes; ``True`` when the last one matched."""
        armed = self._armed
        if armed is None:
            return False
        if not armed.markers:
            return True
        stream = link.tail + data
        position = 0
        while link.matched < len(armed.markers):
            found = stream.find(armed.markers[link.matched], position)
            if found < 0:
                break
            position = found + len(armed.markers[link.matched])
            link.matched += 1
        if link.matched == len(armed.markers):
            return True
        keep = max(len(marker) for marker in armed.markers) - 1
        link.tail = stream[max(position, len(stream) - keep) :] if keep > 0 else b""
        return False

    async def _pump_up(
        self, link: _Link, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter
    ) -> None:
        try:
            while not link.closed:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break
                if not await self._passes(link, data):
                    continue
                if link.closed:
                    break
                armed = self._armed
                if armed is not None and link.awaiting_reply is None and self._match(link, data):
                    # Claim the armed cut for this connection before the server can answer.
                    self._armed = None
                    armed.connection = link.number
                    link.awaiting_reply = armed
                upstream.write(data)
                self.stats.bytes_up += len(data)
                await upstream.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not link.closed and link.awaiting_reply is None:
                # The client went away: pass its close on to the server.
                with contextlib.suppress(OSError, RuntimeError):
                    upstream.write_eof()

    async def _pump_down(self, link: _Link, reader: asyncio.StreamReader) -> None:
        client = link.client
        try:
            while not link.closed:
                data = await reader.read(_READ_SIZE)
                if not data:
                    break
                armed = link.awaiting_reply
                if armed is not None:
                    # The server applied the request and answered; the client never hears it.
                    armed.swallowed = data
                    self.stats.bytes_dropped += len(data)
                    self._cut_link(link)
                    if armed.then is not None:
                        self._set_mode(armed.then)
                    armed.fired.set()
                    return
                if not await self._passes(link, data):
                    continue
                if link.closed:
                    break
                client.write(data)
                self.stats.bytes_down += len(data)
                await client.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # The server closed (or failed): close the client side too.
            link.abort()

    # -- helpers for tests -------------------------------------------------------------

    def connections(self) -> Sequence[int]:
        """Numbers of the connections open now (for messages and assertions)."""
        return [number for number, link in self._links.items() if not link.closed]
