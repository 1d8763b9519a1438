"""A real Redis Cluster on loopback, for tests: six ``redis-server`` processes we own.

:class:`LocalRedisCluster` starts ``masters * (1 + replicas)`` nodes (three
masters and three replicas by default), each a
:class:`~statepact.testing.local_servers.RedisServer` with ``--cluster-enabled yes``
and ``--appendonly yes`` in its own temporary directory on a free loopback
port (the cluster bus port is chosen free too, not ``port + 10000``), joins them
with ``redis-cli --cluster create ... --cluster-replicas N --cluster-yes``, and
waits until every node says ``cluster_state:ok``, covers all 16384 slots, sees
every other node, and every replica's link to its master is up. Everything it
waits for is bounded by ``startup_timeout``; a cluster that does not form raises
:class:`~statepact.testing.local_servers.ServerStartError` with what was missing.

It can describe itself (:meth:`LocalRedisCluster.nodes`: role, master, slots
per node, from ``CLUSTER NODES``), find the master of a slot, and run a manual
failover (:meth:`LocalRedisCluster.failover`: ``CLUSTER FAILOVER`` sent to a
replica, then wait until every node agrees on the new master).

Talks to the nodes with the few lines of RESP in :mod:`statepact.testing.resp`
(no redis-py, no event loop), so a session-scoped, synchronous fixture can own
one. This module must never bind anything but loopback, never signal a process
it did not start, and never import redis-py at import time.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

from statepact.testing.local_servers import (
    RedisServer,
    ServerStartError,
    find_redis_server,
    free_port,
)
from statepact.testing.resp import RedisReplyError, info_field, redis_call

__all__ = [
    "CLUSTER_SLOTS",
    "ClusterNode",
    "LocalRedisCluster",
    "cluster_unavailable_reason",
    "find_redis_cli",
]

CLUSTER_SLOTS = 16_384
_LOOPBACK = "127.0.0.1"

Role = Literal["master", "replica"]


def find_redis_cli() -> str | None:
    """The ``redis-cli`` binary on PATH, or None."""
    return shutil.which("redis-cli")


def cluster_unavailable_reason() -> str | None:
    """None when a local cluster can be started here, else why not."""
    missing = [
        name
        for name, found in (("redis-server", find_redis_server()), ("redis-cli", find_redis_cli()))
        if found is None
    ]
    if missing:
        return f"cannot start a local Redis Cluster: no {' and no '.join(missing)} on PATH"
    return None


@dataclass(frozen=True)
class ClusterNode:
    """One line of ``CLUSTER NODES`` as some node sees it."""

    node_id: str
    port: int
    role: Role
    master_id: str | None
    slots: tuple[tuple[int, int], ...]
    flags: frozenset[str]
    connected: bool

    @property
    def slot_count(self) -> int:
        return sum(end - start + 1 for start, end in self.slots)

    def owns(self, slot: int) -> bool:
        return any(start <= slot <= end for start, end in self.slots)


def _parse_slots(fields: Sequence[str]) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for item in fields:
        if item.startswith("["):
            continue  # a slot being imported or migrated: not owned yet
        start, _, end = item.partition("-")
        ranges.append((int(start), int(end or start)))
    return tuple(ranges)


def parse_cluster_nodes(text: str) -> list[ClusterNode]:
    """``CLUSTER NODES`` output as :class:`ClusterNode` rows (handshake rows left out)."""
    nodes: list[ClusterNode] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = frozenset(fields[2].split(","))
        if "handshake" in flags or "noaddr" in flags:
            continue
        address = fields[1].split("@", 1)[0].split(",", 1)[0]
        port = int(address.rpartition(":")[2])
        role: Role = "master" if "master" in flags else "replica"
        nodes.append(
            ClusterNode(
                node_id=fields[0],
                port=port,
                role=role,
                master_id=None if fields[3] == "-" else fields[3],
                slots=_parse_slots(fields[8:]),
                flags=flags,
                connected=fields[7] == "connected",
            )
        )
    return nodes


class LocalRedisCluster:
    """A Redis Cluster of local ``redis-server`` processes on loopback; see the module docstring.

    ``args`` are extra ``redis-server`` settings for every node (after ours).
    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a node may be
    unreachable before it is considered failing.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        args: Sequence[str] = (),
        node_timeout_ms: int = 2000,
        startup_timeout: float = 60.0,
        binary: str | None = None,
        cli: str | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("masters: redis-cli --cluster create needs at least 3")
        if replicas < 0:
            raise ValueError("replicas: must not be negative")
        why = cluster_unavailable_reason() if binary is None or cli is None else None
        if why is not None:
            raise ServerStartError(why)
        self.binary = binary or find_redis_server() or "redis-server"
        self.cli = cli or find_redis_cli() or "redis-cli"
        self.masters_wanted = masters
        self.replicas_wanted = replicas
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        self.args = list(args)
        self.servers: list[RedisServer] = []
        self.version: str | None = None
        self.formed_in: float | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def _node_args(self) -> list[str]:
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # The bus port would default to port + 10000, which may be taken or
            # past 65535; a free one is chosen instead.
            "--cluster-port",
            str(free_port()),
            "--appendonly",
            "yes",
            *self.args,
        ]

    def start(self) -> Self:
        """Start the nodes, form the cluster and wait until it serves every slot."""
        if self.servers:
            return self
        began = time.monotonic()
        deadline = began + self.startup_timeout
        total = self.masters_wanted * (1 + self.replicas_wanted)
        try:
            for _ in range(total):
                server = RedisServer(
                    self._node_args(),
                    binary=self.binary,
                    startup_timeout=max(1.0, deadline - time.monotonic()),
                )
                self.servers.append(server)
                server.start()
            self.version = self.servers[0].version
            self._create(deadline)
            self.wait_ok(timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise
        self.formed_in = time.monotonic() - began
        return self

    def _create(self, deadline: float) -> None:
        command = [
            self.cli,
            "--cluster",
            "create",
            *(f"{_LOOPBACK}:{server.port}" for server in self.servers),
            "--cluster-replicas",
            str(self.replicas_wanted),
            "--cluster-yes",
        ]
        log = self.servers[0].dir / "cluster-create.log"
        try:
            with log.open("wb") as out:
                result = subprocess.run(  # noqa: S603 - absolute binary path, no shell
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
        except subprocess.TimeoutExpired as exc:
            raise ServerStartError(
                f"redis-cli --cluster create did not finish within {self.startup_timeout:.0f}s; "
                f"log {log}"
            ) from exc
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise ServerStartError(
                f"redis-cli --cluster create failed with code {result.returncode}:\n{tail}"
            )

    def close(self) -> None:
        """Stop every node and delete its directory."""
        servers, self.servers = self.servers, []
        for server in servers:
            with contextlib.suppress(Exception):
                server.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        ports = ",".join(str(server.port) for server in self.servers)
        return f"<LocalRedisCluster ports={ports or '-'}>"

    # -- what it looks like ------------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node, for ``redis.asyncio.cluster.ClusterNode``."""
        return [(_LOOPBACK, server.port) for server in self.servers]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` of the first node (a cluster client discovers the rest)."""
        return f"redis://{_LOOPBACK}:{self.servers[0].port}"

    def server(self, port: int) -> RedisServer:
        """The :class:`RedisServer` listening on ``port``."""
        for server in self.servers:
            if server.port == port:
                return server
        raise KeyError(f"no node of this cluster on port {port}")

    def call(self, port: int, *args: str, timeout: float = 5.0) -> str | list[str]:
        """One command to one node, over a fresh connection; the reply as text."""
        return redis_call(port, *args, timeout=timeout)

    def info(self, port: int, section: str) -> str:
        reply = self.call(port, "INFO", section)
        return reply if isinstance(reply, str) else "\n".join(reply)

    def nodes(self, port: int | None = None) -> list[ClusterNode]:
        """The cluster as the node on ``port`` (default: the first running one) sees it."""
        asked = port if port is not None else self._any_running_port()
        reply = self.call(asked, "CLUSTER", "NODES")
        return parse_cluster_nodes(reply if isinstance(reply, str) else "\n".join(reply))

    def _any_running_port(self) -> int:
        for server in self.servers:
            if server.running:
                return server.port
        raise ServerStartError("no node of the cluster is running")

    def masters(self, port: int | None = None) -> list[ClusterNode]:
        """Masters that own slots, in slot order."""
        found = [n for n in self.nodes(port) if n.role == "master" and n.slots]
        return sorted(found, key=lambda n: n.slots[0][0])

    def replicas_of(self, master: ClusterNode, port: int | None = None) -> list[ClusterNode]:
        return [n for n in self.nodes(port) if n.master_id == master.node_id]

    def master_of_slot(self, slot: int, port: int | None = None) -> ClusterNode:
        for node in self.masters(port):
            if node.owns(slot):
                return node
        raise KeyError(f"no master owns slot {slot}")

    # -- waiting -------------------------------------------------------------------------

    def _problems(self) -> list[str]:
        """What stops the cluster from being fully formed; empty when it is."""
        problems: list[str] = []
        want_nodes = len(self.servers)
        ids_seen: set[tuple[str, ...]] = set()
        for server in self.servers:
            if not server.running:
                problems.append(f"node {server.port} is not running")
                continue
            try:
                info = self.call(server.port, "CLUSTER", "INFO", timeout=2.0)
                text = info if isinstance(info, str) else "\n".join(info)
                if info_field(text, "cluster_state") != "ok":
                    problems.append(f"node {server.port}: cluster_state is not ok")
                if info_field(text, "cluster_slots_ok") != str(CLUSTER_SLOTS):
                    problems.append(f"node {server.port}: not every slot is ok")
                view = self.nodes(server.port)
                if len(view) != want_nodes or not all(n.connected for n in view):
                    problems.append(f"node {server.port} sees {len(view)} of {want_nodes} nodes")
                masters = [n for n in view if n.role == "master" and n.slots]
                if (
                    len(masters) != self.masters_wanted
                    or sum(n.slot_count for n in masters) != CLUSTER_SLOTS
                    or any("fail" in n.flags or "fail?" in n.flags for n in view)
                ):
                    problems.append(f"node {server.port} does not see a settled set of masters")
                ids_seen.add(tuple(sorted(f"{n.node_id}:{n.role}" for n in view)))
                replication = self.info(server.port, "replication")
                if info_field(replication, "role") == "slave" and (
                    info_field(replication, "master_link_status") != "up"
                ):
                    problems.append(f"replica {server.port}: link to its master is not up")
            except (OSError, RedisReplyError, ValueError) as exc:
                problems.append(f"node {server.port}: {type(exc).__name__}: {exc}")
        if len(ids_seen) > 1:
            problems.append("the nodes disagree about who is master")
        return problems

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every node is ok, sees every node, and agrees on the masters."""
        self._wait(self._problems, timeout, "the cluster to settle")

    def _wait(self, problems: Callable[[], list[str]], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            found = problems()
            if not found:
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"waited {timeout:.1f}s for {what}; still: " + "; ".join(found[:6])
                )
            time.sleep(0.05)

    # -- faults ------------------------------------------------------------------------

    def failover(self, replica_port: int, *, timeout: float = 30.0, force: bool = False) -> float:
        """``CLUSTER FAILOVER`` on the replica at ``replica_port``; wait until it is master.

        Without ``force`` the replica and its master coordinate: the master stops
        accepting writes, the replica catches up to its offset, then takes over,
        so nothing the master acknowledged is lost. Returns the seconds until
        every node agreed on the new master.
        """
        began = time.monotonic()
        args = ["CLUSTER", "FAILOVER"] + (["FORCE"] if force else [])
        reply = self.call(replica_port, *args)
        if reply != "OK":
            raise ServerStartError(f"CLUSTER FAILOVER on {replica_port} answered {reply!r}")

        def problems() -> list[str]:
            found = self._problems()
            with contextlib.suppress(OSError, RedisReplyError, ValueError):
                role = info_field(self.info(replica_port, "replication"), "role")
                if role != "master":
                    found.append(f"node {replica_port} is still {role}")
            return found

        self._wait(problems, timeout, f"the failover to {replica_port}")
        return time.monotonic() - began
