"""Test servers this process starts: ``redis-server`` and PostgreSQL binaries in a temporary
directory, on a free loopback port.

:class:`RedisServer` and :class:`PostgresServer` start, stop gracefully, die
(``kill()``: SIGKILL, as a crash would) and start again on the same port and
data, which is what fault tests need. Which server a test session gets, and
from where, is :mod:`statepact.testing.servers` (docs/testing.md).

This module must never signal or stop a process it did not start, bind anything
but loopback, or import redis, SQLAlchemy or asyncpg at import time.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, Self

from statepact.testing.probes import postgres_server_version
from statepact.testing.resp import RedisReplyError, info_field, redis_call, redis_text

__all__ = [
    "PostgresBinaries",
    "PostgresServer",
    "RedisServer",
    "ServerKind",
    "ServerStartError",
    "find_postgres_binaries",
    "find_redis_server",
    "free_port",
    "local_unavailable_reason",
]

ServerKind = Literal["redis", "postgres"]

_LOOPBACK = "127.0.0.1"
_POSTGRES_GLOB = "/usr/lib/postgresql/*/bin"
# Settings that make a throwaway PostgreSQL fast; they lose committed data when
# its processes die, so a server that a test kills must run without them.
_FAST_POSTGRES_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class ServerStartError(RuntimeError):
    """A test server did not come up (the message carries the end of its log)."""


class _PortTakenError(ServerStartError):
    """The server could not bind its port (someone took it after we chose it)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# Every server this process started and has not closed; closed at exit so a
# crashed test run does not leave servers behind.
_LIVE: set[_LocalServer] = set()


@atexit.register
def _close_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.close()


class _LocalServer:
    """What a locally started server shares: directory, port, process, lifecycle."""

    kind: ClassVar[ServerKind]
    _stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(self, *, port: int | None, startup_timeout: float) -> None:
        self._port_fixed = port is not None
        self.port: int = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.dir = Path(tempfile.mkdtemp(prefix=f"statepact-{self.kind}-"))
        self.log_path = self.dir / f"{self.kind}.log"
        self.version: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_once = False
        self._closed = False
        _LIVE.add(self)

    # -- what a subclass provides ------------------------------------------------

    def _prepare(self) -> None:
        """One-time setup before the first start (initdb)."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _popen_extra(self) -> dict[str, Any]:
        return {}

    def _answers(self, pid: int) -> bool:
        """True once the process with ``pid`` serves requests on ``self.port``."""
        raise NotImplementedError

    def _query_version(self) -> str:
        raise NotImplementedError

    def _port_taken(self, log: str) -> bool:
        return "Address already in use" in log

    # -- lifecycle -----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Start the server (same port and data as before, if it ran) and wait until it answers."""
        if self._closed:
            raise ServerStartError(f"{self.kind} server in {self.dir} was closed")
        if self.running:
            return self
        self._prepare()
        attempts = 1 if (self._port_fixed or self._started_once) else 3
        for attempt in range(attempts):
            try:
                self._spawn_and_wait()
                break
            except _PortTakenError:
                # Only the first start may move: a restart must keep its port.
                if attempt + 1 == attempts:
                    raise
                self.port = free_port()
        self._started_once = True
        if self.version is None:
            self.version = self._query_version()
        return self

    def _spawn_and_wait(self) -> None:
        with self.log_path.open("ab") as log:
            # The child keeps its own copy of the log descriptor; ours closes here.
            self._proc = subprocess.Popen(  # noqa: S603 - absolute binary path, no shell
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                # Own process group, so kill() reaches forked children too.
                start_new_session=True,
                **self._popen_extra(),
            )
        proc = self._proc
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = proc.poll()
            if code is not None:
                self._proc = None
                tail = _log_tail(self.log_path)
                error = _PortTakenError if self._port_taken(tail) else ServerStartError
                raise error(
                    f"{self.kind} server exited with code {code} while starting on port "
                    f"{self.port}; log {self.log_path}:\n{tail}"
                )
            if self._answers(proc.pid):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(
                    f"{self.kind} server did not answer on port {self.port} within "
                    f"{self.startup_timeout:.0f}s; log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> None:
        """Shut the server down gracefully, keeping its data; kill it past ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(self._stop_signal)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server and everything it forked, as a crash would; data stays."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._kill_tree(proc.pid)
        proc.wait()
        self._proc = None

    def _kill_tree(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def restart(self) -> Self:
        """Stop gracefully and start again on the same port and data."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and delete its directory; the object cannot start again."""
        if self._closed:
            return
        try:
            self.stop()
        finally:
            self._closed = True
            _LIVE.discard(self)
            self._after_close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _after_close(self) -> None:
        """Release what a killed server leaves outside its directory."""

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
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} port={self.port} {state} dir={self.dir}>"


# -- Redis ---------------------------------------------------------------------------


def find_redis_server() -> str | None:
    """The ``redis-server`` binary on PATH, or None."""
    return shutil.which("redis-server")


class RedisServer(_LocalServer):
    """A ``redis-server`` on a free loopback port, in its own temporary directory.

    ``args`` are extra command-line settings, for example ``["--appendonly",
    "yes"]``, ``["--maxmemory-policy", "allkeys-lru"]`` or ``["--save", ""]``;
    they come after ours, so they win, but ``--port``, ``--bind`` and ``--dir``
    must not be among them. ``start()`` after ``stop()`` or ``kill()`` reuses the
    port and the directory, so an append-only file survives the restart.
    """

    kind: ClassVar[ServerKind] = "redis"

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        binary: str | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise ServerStartError("no redis-server on PATH")
        self.binary = found
        self.args = list(args)
        super().__init__(port=port, startup_timeout=startup_timeout)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{_LOOPBACK}:{self.port}/0"

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--bind",
            _LOOPBACK,
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            *self.args,
        ]

    def _answers(self, pid: int) -> bool:
        try:
            if redis_text(self.port, "PING") != "PONG":
                return False
            # Someone else's server could hold the port while ours is failing to bind.
            return info_field(redis_text(self.port, "INFO", "server"), "process_id") == str(pid)
        except (OSError, RedisReplyError, ValueError):
            return False

    def _query_version(self) -> str:
        info = redis_text(self.port, "INFO", "server", timeout=5.0)
        return info_field(info, "redis_version") or "unknown"

    def config_get(self, name: str) -> str:
        """One ``CONFIG GET`` value of the running server (empty when there is none)."""
        reply = redis_call(self.port, "CONFIG", "GET", name, timeout=5.0)
        return reply[1] if isinstance(reply, list) and len(reply) > 1 else ""


# -- PostgreSQL ------------------------------------------------------------------------


@dataclass(frozen=True)
class PostgresBinaries:
    """Where ``initdb`` and ``postgres`` were found."""

    initdb: str
    postgres: str


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_postgres_binaries() -> PostgresBinaries | None:
    """``initdb`` and ``postgres`` from PATH, else the newest ``/usr/lib/postgresql/*/bin``."""
    initdb, postgres = shutil.which("initdb"), shutil.which("postgres")
    if initdb and postgres:
        return PostgresBinaries(initdb=initdb, postgres=postgres)
    for bindir in sorted(glob.glob(_POSTGRES_GLOB), key=_version_key, reverse=True):
        initdb, postgres = os.path.join(bindir, "initdb"), os.path.join(bindir, "postgres")
        if os.access(initdb, os.X_OK) and os.access(postgres, os.X_OK):
            return PostgresBinaries(initdb=initdb, postgres=postgres)
    return None


def _postgres_account() -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as: None for ourselves, ``postgres`` when we are root.

    PostgreSQL refuses to run as root.
    """
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError as exc:
        raise ServerStartError(
            "PostgreSQL refuses to run as root and there is no 'postgres' user to run it as"
        ) from exc


def _children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc (empty where there is no /proc)."""
    children: list[int] = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(Path(stat).parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2 :][:1] not in ("Z", "X", "")


def _pg_format(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


class PostgresServer(_LocalServer):
    """A PostgreSQL cluster made with ``initdb`` in a temporary directory, on a free loopback port.

    Trust authentication; the superuser is ``postgres``; ``.url`` is an
    SQLAlchemy asyncpg URL of the ``postgres`` database. With ``durable=False``
    (the default) it runs with ``fsync``, ``synchronous_commit`` and
    ``full_page_writes`` off, which is fast and loses data when its processes
    die: a test that calls ``kill()`` must pass ``durable=True``. ``settings``
    are extra ``-c name=value`` server settings. When run as root it runs as the
    ``postgres`` user and the directory belongs to that user.
    """

    kind: ClassVar[ServerKind] = "postgres"
    # SIGINT is PostgreSQL's "fast" shutdown: it does not wait for clients to leave.
    _stop_signal: ClassVar[signal.Signals] = signal.SIGINT

    def __init__(
        self,
        *,
        durable: bool = False,
        settings: Mapping[str, object] | None = None,
        port: int | None = None,
        binaries: PostgresBinaries | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        found = binaries or find_postgres_binaries()
        if found is None:
            raise ServerStartError(f"no initdb and postgres on PATH or under {_POSTGRES_GLOB}")
        self.binaries = found
        self.durable = durable
        self.settings: dict[str, str] = {} if durable else dict(_FAST_POSTGRES_SETTINGS)
        self.settings.update({k: _pg_format(v) for k, v in (settings or {}).items()})
        self._account = _postgres_account()
        super().__init__(port=port, startup_timeout=startup_timeout)
        if self._account is not None:
            os.chown(self.dir, self._account.pw_uid, self._account.pw_gid)
        self.data_dir = self.dir / "data"

    @property
    def url(self) -> str:
        """``postgresql+asyncpg://postgres@127.0.0.1:PORT/postgres``."""
        return f"postgresql+asyncpg://postgres@{_LOOPBACK}:{self.port}/postgres"

    @property
    def dsn(self) -> str:
        """The same server as a libpq/asyncpg DSN: ``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return f"postgresql://postgres@{_LOOPBACK}:{self.port}/postgres"

    def _popen_extra(self) -> dict[str, Any]:
        if self._account is None:
            return {}
        return {
            "user": self._account.pw_uid,
            "group": self._account.pw_gid,
            "extra_groups": [],
            "env": {**os.environ, "HOME": self._account.pw_dir, "USER": "postgres"},
        }

    def _prepare(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        command = [
            self.binaries.initdb,
            "--pgdata",
            str(self.data_dir),
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            # Throwaway cluster: not syncing initdb's files saves a second or more.
            "--no-sync",
        ]
        with self.log_path.open("ab") as log:
            result = subprocess.run(  # noqa: S603 - absolute binary path, no shell
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                check=False,
                timeout=120,
                **self._popen_extra(),
            )
        if result.returncode != 0:
            raise ServerStartError(
                f"initdb failed with code {result.returncode}; log {self.log_path}:\n"
                f"{_log_tail(self.log_path)}"
            )

    def _command(self) -> list[str]:
        command = [
            self.binaries.postgres,
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={_LOOPBACK}",
            # Our own socket directory: the system one may not be writable, and
            # sharing it would put our socket beside a system server's.
            "-c",
            f"unix_socket_directories={self.dir}",
            "-c",
            "max_connections=200",
        ]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        return command

    def _answers(self, pid: int) -> bool:
        # postmaster.pid names the running postmaster on its first line and says
        # "ready" on its eighth once connections are accepted; a file left by a
        # killed server names a dead pid, so it cannot be mistaken for ours.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        if len(lines) < 8 or lines[0].strip() != str(pid) or lines[7].strip() != "ready":
            return False
        try:
            with socket.create_connection((_LOOPBACK, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def _query_version(self) -> str:
        return postgres_server_version(self.dsn)

    def _kill_tree(self, pid: int) -> None:
        # Backends are their own session leaders, so a process-group kill misses
        # them, and a backend left alive keeps the shared memory that a restart
        # needs. Freeze the postmaster so it forks nothing new, then kill all.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        children = _children_of(pid)
        super()._kill_tree(pid)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while any(_alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _after_close(self) -> None:
        # A killed postmaster leaves its System V segment behind; a restart would
        # reuse it, but a closed server never restarts, so remove it here.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return
        ipcrm = shutil.which("ipcrm")
        if len(lines) < 7 or ipcrm is None:
            return
        parts = lines[6].split()
        if len(parts) == 2 and parts[1].isdigit():
            subprocess.run(  # noqa: S603 - absolute binary path, no shell
                [ipcrm, "-m", parts[1]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
                timeout=10,
            )


def local_unavailable_reason(kind: ServerKind) -> str | None:
    """None when the local binaries for ``kind`` can run here, else why not."""
    if kind == "redis":
        return None if find_redis_server() else "no redis-server on PATH"
    if find_postgres_binaries() is None:
        return f"no initdb and postgres on PATH or under {_POSTGRES_GLOB}"
    try:
        _postgres_account()
    except ServerStartError as exc:
        return str(exc)
    return None
