"""``statepact worker --processes N``: N worker processes under one supervisor.

One Python process drives one core: a worker fleet on a many-core host runs one
process per core. The supervisor starts each child as ``statepact worker`` with
the same arguments (each child has its own event loop and connection pool), passes
SIGTERM and SIGINT on to every child and waits for their drains, and restarts a
child that exits while it is not stopping, after a back-off that grows while the
child keeps failing. A child that exits with an error code of its own (not killed
by a signal) within ``FIRST_RUN_GRACE`` of its very first start is a configuration
error (a wrong target, an unreachable server):
the supervisor then stops the others and exits with that child's code instead of
restarting it forever. It never prints a URL: the children print their own
(redacted) banners.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TextIO

__all__ = ["CHILD_ENV", "FIRST_RUN_GRACE", "Supervisor", "child_arguments"]

#: Set in each child's environment: its index, 0 to N-1.
CHILD_ENV = "STATEPACT_WORKER_PROCESS"
#: A child that exits with an error code (not killed by a signal) this soon after its
#: first start stops the supervisor.
FIRST_RUN_GRACE = 5.0
#: Restart back-off: doubles per quick failure up to the cap; reset by a long run.
RESTART_FIRST = 0.5
RESTART_CAP = 30.0
HEALTHY_RUN = 60.0
POLL = 0.1


def child_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` (the ``statepact`` arguments) without ``--processes N`` / ``--processes=N``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes="):
            kept.append(arg)
    return kept


@dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes]
    started: float
    first: bool
    failures: int = 0
    restart_at: float | None = field(default=None)


class Supervisor:
    """Runs ``processes`` copies of ``statepact <arguments>`` until a signal drains them."""

    def __init__(self, arguments: Sequence[str], processes: int, *, out: TextIO) -> None:
        self._arguments = list(arguments)
        self._processes = processes
        self._out = out
        self._children: list[_Child] = []
        self._stopping: int | None = None

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for index in range(self._processes):
                self._children.append(self._start(index, first=True, failures=0))
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_all()

    def _say(self, message: str) -> None:
        print(f"statepact worker supervisor: {message}", file=self._out, flush=True)

    def _start(self, index: int, *, first: bool, failures: int) -> _Child:
        env = {**os.environ, CHILD_ENV: str(index)}
        command = [sys.executable, "-m", "statepact.cli", *self._arguments]
        # Its own process group: a terminal's Ctrl-C reaches the supervisor alone,
        # which passes it on once, so a child never drains twice.
        # This interpreter and the arguments it was itself given; no shell.
        process = subprocess.Popen(command, env=env, start_new_session=True)  # noqa: S603
        self._say(f"process {index} started (pid {process.pid})")
        return _Child(index, process, time.monotonic(), first, failures)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stopping is None:
            self._stopping = signum
            for child in self._children:
                if child.process.poll() is None:
                    child.process.send_signal(signum)

    def _watch(self) -> int:
        code = 0
        while True:
            now = time.monotonic()
            for slot, child in enumerate(self._children):
                returned = child.process.poll()
                if returned is None:
                    continue
                if self._stopping is not None:
                    code = max(code, returned)
                    continue
                if child.restart_at is None:
                    if child.first and returned > 0 and now - child.started < FIRST_RUN_GRACE:
                        self._say(
                            f"process {child.index} exited with code {returned} at start; "
                            "stopping the others"
                        )
                        self._on_signal(signal.SIGTERM, None)
                        code = returned
                        continue
                    failures = 0 if now - child.started >= HEALTHY_RUN else child.failures + 1
                    delay = min(RESTART_FIRST * 2 ** max(failures - 1, 0), RESTART_CAP)
                    self._say(
                        f"process {child.index} (pid {child.process.pid}) exited with code "
                        f"{returned}; restarting it in {delay:g}s"
                    )
                    child.failures = failures
                    child.restart_at = now + delay
                elif now >= child.restart_at:
                    self._children[slot] = self._start(
                        child.index, first=False, failures=child.failures
                    )
            if self._stopping is not None and all(
                child.process.poll() is not None for child in self._children
            ):
                return code
            time.sleep(POLL)

    def _kill_all(self) -> None:
        """Leave no child behind if the supervisor itself is leaving abnormally."""
        for child in self._children:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
