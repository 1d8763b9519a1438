"""``statepact worker MODULE:OBJECT`` as a subprocess on real Redis and PostgreSQL, SIGTERMed.

Four items are in flight when SIGTERM arrives (``--concurrency 4``): two
handlers finish within the 1 s grace period and are acked, two would sleep a
minute and are cancelled and released (due again, attempt not counted); the
items never claimed stay queued untouched. The process exits 0 within the grace
period plus its shutdown, nothing is left leased, and its output names the
server without a password. Bad targets exit non-zero with one clear line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from statepact.clock import SystemClock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import BaseWorkQueue
from tests._processes import ROOT
from tests.fixtures.redis import unlink_namespace
from tests.integration._worker_app import LOG_ENV

pytestmark = pytest.mark.integration

GRACE = 1.0
PASSWORD = "s3cret-pw"


@pytest.fixture(params=["redis", "postgres"])
def server(request: pytest.FixtureRequest) -> dict[str, str]:
    """Which server, its URL, and (Redis) a namespace of this test's own."""
    if request.param == "redis":
        url: str = request.getfixturevalue("statepact_redis_url")
        return {"kind": "redis", "url": url, "namespace": f"spw{uuid.uuid4().hex[:10]}"}
    from sqlalchemy.engine import make_url

    # The test server trusts loopback connections, so the password is never asked for: it is
    # there to show that the command's output never prints it.
    url = make_url(request.getfixturevalue("pg_database_url")).set(password=PASSWORD)
    return {"kind": "postgres", "url": url.render_as_string(hide_password=False)}


@pytest.fixture
async def served(server: dict[str, str]) -> AsyncIterator[tuple[list[str], BaseWorkQueue]]:
    """The server options for the command, and the test's own view of the same queue."""
    if server["kind"] == "redis":
        from redis.asyncio import Redis

        from statepact.settings import RedisStoreSettings
        from statepact.storage.redis import RedisWorkQueue

        namespace = server["namespace"]
        client = Redis.from_url(server["url"])
        settings = RedisStoreSettings(namespace=namespace, durable=False)
        try:
            yield (
                ["--redis", server["url"], "--namespace", namespace, "--no-durable"],
                RedisWorkQueue(client, clock=SystemClock(), settings=settings),
            )
        finally:
            await unlink_namespace(client, namespace)
        return
    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresWorkQueue, create_engine

    engine = create_engine(PostgresStoreSettings(dsn=server["url"], pool_size=4))
    try:
        yield ["--postgres", server["url"]], PostgresWorkQueue(engine, clock=SystemClock())
    finally:
        await engine.dispose()


async def start(target: str, options: list[str], log: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "statepact.cli",
        "worker",
        target,
        *options,
        cwd=ROOT,
        env={**os.environ, LOG_ENV: str(log)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def test_sigterm_drains_within_the_grace_period_and_leaves_nothing_leased(
    served: tuple[list[str], BaseWorkQueue], tmp_path: Path
) -> None:
    """SIGTERM: handlers that end within the grace period are acked, the rest cancelled and
    released; the process exits 0 and nothing is left leased."""
    options, queue = served
    seconds = {"short-1": 0.4, "short-2": 0.4, "long-1": 60, "long-2": 60}
    for item_id, wait in seconds.items():
        payload: dict[str, Any] = {"task": "sleep", "seconds": wait}
        await queue.enqueue(WorkItem(tenant="t", item_id=item_id, payload=payload, priority=9))
    for n in range(5):
        payload = {"task": "sleep", "seconds": 0}
        await queue.enqueue(WorkItem(tenant="t", item_id=f"later-{n}", payload=payload))
    log = tmp_path / "handlers.log"
    process = await start(
        "tests.integration._worker_app:worker",
        [*options, "--concurrency", "4", "--grace-period", str(GRACE)],
        log,
    )
    try:
        deadline = time.monotonic() + 30
        while len([line for line in lines(log) if line.startswith("start")]) < 4:
            if process.returncode is not None or time.monotonic() > deadline:
                _, err = await process.communicate()
                raise AssertionError(f"the worker did not start 4 handlers: {err.decode()}")
            await asyncio.sleep(0.02)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 30)
        took = time.monotonic() - signalled
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    print(f"\nSIGTERM to exit: {took:.2f} s (grace {GRACE} s)")
    assert took < GRACE + 3
    assert "stopped" in out.decode()
    assert PASSWORD not in out.decode() + err.decode()
    events = set(lines(log))
    assert {"start short-1", "end short-1", "start short-2", "end short-2"} <= events
    assert {"cancelled long-1", "cancelled long-2"} <= events
    assert not any(line.startswith("start later") for line in events)
    stats = await queue.stats()
    assert stats.leased == 0
    for item_id in ("short-1", "short-2"):
        item = await queue.get_item("t", item_id)
        assert item is not None and item.status == ItemStatus.DONE
    # Released at shutdown: the attempt of a handler that ran is kept (issue 33).
    for item_id, attempts in [("long-1", 1), ("long-2", 1), *((f"later-{n}", 0) for n in range(5))]:
        item = await queue.get_item("t", item_id)
        assert item is not None and (item.status, item.attempts) == (ItemStatus.QUEUED, attempts)


async def test_a_factory_is_called_with_the_queue_and_works_it(
    served: tuple[list[str], BaseWorkQueue], tmp_path: Path
) -> None:
    """MODULE:OBJECT naming a factory: it gets the opened queue; its worker acks the items."""
    options, queue = served
    for n in range(3):
        payload = {"task": "sleep", "seconds": 0}
        await queue.enqueue(WorkItem(tenant="t", item_id=f"i{n}", payload=payload))
    log = tmp_path / "handlers.log"
    process = await start("tests.integration._worker_app:make", options, log)
    try:
        deadline = time.monotonic() + 30
        while len([line for line in lines(log) if line.startswith("end")]) < 3:
            assert process.returncode is None and time.monotonic() < deadline, lines(log)
            await asyncio.sleep(0.02)
        process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    assert (
        "concurrency 10, max_attempts 5, backoff 1s to 600s, jitter 0.1, tasks: sleep"
        in out.decode()
    )
    assert PASSWORD not in out.decode() + err.decode()
    if "--postgres" in options:
        assert ":***@" in out.decode()  # the URL is named, its password masked
    stats = await queue.stats()
    assert (stats.queued, stats.leased) == (0, 0)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "is not of the form package.module:name"),
        ("tests.integration.no_such_module:worker", "no module named"),
        ("tests.integration._worker_app:nothing", "has no 'nothing'"),
        ("tests.integration._worker_app:LOG_ENV", "names a str; name a Worker or a factory"),
    ],
)
async def test_a_bad_target_is_one_clear_line(
    statepact_redis_url: str, tmp_path: Path, target: str, message: str
) -> None:
    """A target that is not a Worker or a factory exits 1 with one line saying what is wrong."""
    process = await start(target, ["--redis", statepact_redis_url, "--no-durable"], tmp_path / "l")
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    text = err.decode().strip()
    assert text.startswith("statepact worker: error: MODULE:OBJECT:"), text
    assert message in text
    assert len(text.splitlines()) == 1
