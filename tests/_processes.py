"""Worker processes for tests that run statepact across real OS processes.

A worker is a module of ``tests`` run with ``python -m`` from the repository
root, given its JSON spec as the one argument; it talks back in JSON lines on
stdout (``{"event": ...}``) and may read lines from stdin. :func:`spawn` starts
one, :class:`Worker` reads its events, :func:`reap_all` kills whatever is left
at the end of a test. Shared by ``tests/integration/test_tx_processes.py`` and
``tests/integration/test_queue_crash.py``.

This module must never signal a process it did not start (it only ever sees
the ``Worker`` objects its callers made).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["ROOT", "Worker", "reap_all", "say", "spawn"]

ROOT = Path(__file__).resolve().parents[1]


def say(**event: Any) -> None:
    """Worker side: print one JSON event line and flush it."""
    print(json.dumps(event), flush=True)


@dataclass
class Worker:
    """One worker process and the JSON events it printed."""

    process: asyncio.subprocess.Process
    events: list[dict[str, Any]]

    async def next_event(self, timeout: float = 60.0) -> dict[str, Any]:  # noqa: ASYNC109
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise AssertionError(f"worker {self.process.pid} exited early")
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    async def expect(self, name: str, timeout: float = 60.0) -> dict[str, Any]:  # noqa: ASYNC109
        while True:
            event = await self.next_event(timeout)
            if event["event"] == name:
                return event

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()


async def spawn(
    workers: list[Worker], module: str, spec: dict[str, Any], *, stderr: IO[bytes] | None = None
) -> Worker:
    """Start ``python -m <module> <spec as JSON>`` from the repo root; add it to ``workers``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        json.dumps(spec),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )
    worker = Worker(process, [])
    workers.append(worker)
    return worker


async def reap_all(workers: Iterable[Worker]) -> None:
    """Kill every worker still running (resuming a stopped one first) and wait for it."""
    for worker in workers:
        if worker.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGCONT)
                worker.process.kill()
            await worker.process.wait()
