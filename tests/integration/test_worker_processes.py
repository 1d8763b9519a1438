"""``statepact worker --processes N`` on real Redis and PostgreSQL, as a subprocess.

The supervisor starts N children, each a ``statepact worker`` with its own loop and
pool: both children take items; a SIGKILLed child is restarted and the queue still
drains; SIGTERM drains every child and the supervisor exits 0 with nothing leased;
a child that cannot start stops the supervisor with its code instead of a restart
loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from statepact.models import ItemStatus, WorkItem
from statepact.queue import BaseWorkQueue
from tests._processes import ROOT
from tests.integration._worker_app import LOG_ENV
from tests.integration.test_worker_cli import served, server  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

TARGET = "tests.integration._processes_app:worker"


async def start(options: list[str], log: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "statepact.cli",
        "worker",
        TARGET,
        *options,
        cwd=ROOT,
        env={**os.environ, LOG_ENV: str(log)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def ran(log: Path) -> dict[str, str]:
    """item id -> the pid that ran it."""
    if not log.exists():
        return {}
    return {item: pid for pid, item in (line.split() for line in log.read_text().splitlines())}


async def until(check: object, process: asyncio.subprocess.Process, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():  # type: ignore[operator]
        if process.returncode is not None or time.monotonic() > deadline:
            if process.returncode is None:
                process.kill()
            out, err = await process.communicate()
            raise AssertionError(f"{what}: {out.decode()}{err.decode()[-2000:]}")
        await asyncio.sleep(0.05)


async def enqueue(queue: BaseWorkQueue, prefix: str, count: int, seconds: float) -> None:
    await queue.enqueue_many(
        [
            WorkItem(
                tenant=f"t{n % 3}",
                item_id=f"{prefix}{n}",
                payload={"task": "record", "seconds": seconds},
            )
            for n in range(count)
        ]
    )


async def test_children_share_the_queue_a_killed_one_comes_back_and_sigterm_drains_all(
    served: tuple[list[str], BaseWorkQueue],  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    options, queue = served
    log = tmp_path / "ran.log"
    process = await start([*options, "--processes", "2"], log)
    try:
        await enqueue(queue, "a", 40, 0.05)
        await until(lambda: len(ran(log)) == 40, process, "40 items were not all run")
        first_pids = set(ran(log).values())
        assert len(first_pids) == 2, f"both children take items: {first_pids}"

        victim = int(sorted(first_pids)[0])
        os.kill(victim, signal.SIGKILL)
        await enqueue(queue, "b", 40, 0.05)
        await until(
            lambda: sum(item.startswith("b") for item in ran(log)) == 40,
            process,
            "the second 40 were not all run after a child was killed",
        )
        later = {pid for item, pid in ran(log).items() if item.startswith("b")}
        assert str(victim) not in later

        await enqueue(queue, "c", 4, 30)  # still running when SIGTERM comes
        await asyncio.sleep(1.0)  # claimed by then: the children poll every 0.05 s
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 30)
        took = time.monotonic() - signalled
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = out.decode()
    assert process.returncode == 0, err.decode()[-2000:]
    print(f"\nSIGTERM to the supervisor's exit: {took:.2f} s (grace 1 s)")
    assert took < 1 + 5
    assert text.count("started (pid") == 3, text  # two children, then the restarted one
    assert f"(pid {victim}) exited with code -9; restarting it" in text
    assert text.count(": stopped") == 2, text  # both living children drained
    stats = await queue.stats()
    assert stats.leased == 0
    for n in range(4):
        item = await queue.get_item(f"t{n % 3}", f"c{n}")
        assert item is not None and item.status == ItemStatus.QUEUED


async def test_a_child_that_cannot_start_stops_the_supervisor(
    statepact_redis_url: str, tmp_path: Path
) -> None:
    """A wrong target fails in every child at once: the supervisor exits 1, no restart loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "statepact.cli",
        "worker",
        "tests.integration._processes_app:nothing",
        "--redis",
        statepact_redis_url,
        "--no-durable",
        "--processes",
        "2",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    assert "exited with code 1 at start; stopping the others" in out.decode()
    assert "restarting" not in out.decode()
    assert "has no 'nothing'" in err.decode()


async def test_processes_below_one_is_refused(statepact_redis_url: str, tmp_path: Path) -> None:
    process = await start(
        ["--redis", statepact_redis_url, "--no-durable", "--processes", "0"], tmp_path / "l"
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    assert "--processes: must be 1 or more, got 0" in err.decode()
