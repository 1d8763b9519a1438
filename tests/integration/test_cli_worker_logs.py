"""``statepact worker`` as an operator runs it: the installed console script in a process of
its own, an application module in a directory of its own, real Redis and PostgreSQL.

- With no flag, a handler that raises, is retried and is dead-lettered prints a line
  for each on stderr (the worker's and the queue's log records, INFO and above), with
  no traceback; ``--log-level debug`` adds the traceback, ``--log-format json`` prints
  one JSON object per line carrying the records' fields.
- The queue's policy: the options, else the policy the Worker carries, else the
  default; a factory's Worker carrying another policy than its queue's is refused.
- The quickstart's worker (``docs/quickstart.md``, the ``app.py`` block) runs verbatim
  both ways: ``python app.py``, and ``statepact worker app:worker`` from the
  environment's URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from statepact.clock import SystemClock
from statepact.models import ItemStatus, RunStatus, WorkItem
from statepact.queue import BaseWorkQueue
from tests._cli import start_statepact
from tests.unit.test_docs_examples import recipe_file

pytestmark = pytest.mark.integration

SERVER_VARIABLES = ("STATEPACT_REDIS_URL", "STATEPACT_POSTGRES_URL", "STATEPACT_DATABASE_URL")

FAILING_APP = """
from statepact.queue import QueuePolicy, WorkQueue
from statepact.worker import Job, Worker


async def boom(job: Job) -> None:
    raise ValueError(f"the model returned no JSON for {job.item.item_id}")


worker = Worker(handlers={"boom": boom}, poll_interval=0.05, reap_every=0)

# What Worker(policy=...) carries: the command reads it when no option overrides it.
carrying = Worker(
    handlers={"boom": boom},
    poll_interval=0.05,
    reap_every=0,
    policy=QueuePolicy(max_attempts=3, backoff_base=0.05, backoff_cap=0.1, jitter=0),
)


def factory(queue: WorkQueue) -> Worker:
    return Worker(
        queue,
        handlers={"boom": boom},
        poll_interval=0.05,
        reap_every=0,
        policy=QueuePolicy(max_attempts=2),
    )
"""


def clean_environment(**more: str) -> dict[str, str]:
    """This process's environment without the server variables, plus ``more``."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARIABLES}
    return {**env, **more}


@dataclass
class Served:
    kind: str
    options: list[str]  # where the queue is, for the command
    queue: BaseWorkQueue  # the test's own view of the same queue


@asynccontextmanager
async def serve(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """A queue of its own on the test's server of ``kind``, named for the command."""
    queue_name = f"q{uuid.uuid4().hex[:8]}"
    if kind == "redis":
        from redis.asyncio import Redis

        from statepact.settings import RedisStoreSettings
        from statepact.storage.redis import RedisWorkQueue
        from tests.fixtures.redis import unlink_namespace

        url: str = request.getfixturevalue("statepact_redis_url")
        namespace = f"spl{uuid.uuid4().hex[:10]}"
        client = Redis.from_url(url)
        settings = RedisStoreSettings(namespace=namespace, durable=False, queue_name=queue_name)
        try:
            yield Served(
                "redis",
                ["--redis", url, "--namespace", namespace, "--no-durable", "--queue", queue_name],
                RedisWorkQueue(client, clock=SystemClock(), settings=settings),
            )
        finally:
            await unlink_namespace(client, namespace)
        return
    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresWorkQueue, create_engine

    database: str = request.getfixturevalue("pg_database_url")
    pg = PostgresStoreSettings(dsn=database, pool_size=2, queue_name=queue_name)
    engine = create_engine(pg)
    try:
        yield Served(
            "postgres",
            ["--postgres", database, "--queue", queue_name],
            PostgresWorkQueue(engine, clock=SystemClock(), settings=pg),
        )
    finally:
        await engine.dispose()


@pytest.fixture(params=["postgres", "redis"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    async with serve(request.param, request) as queue:
        yield queue


@pytest.fixture
async def pg_served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """PostgreSQL only: what the test shows is the command's, the same on either server."""
    async with serve("postgres", request) as queue:
        yield queue


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "failing_app.py").write_text(FAILING_APP)
    return tmp_path


async def run_worker_until(
    argv: list[str], cwd: Path, done: asyncio.Future[None] | None, env: dict[str, str]
) -> tuple[int, str, str]:
    """The installed ``statepact worker ...`` in ``cwd``, SIGTERMed once ``done`` is set
    (or at once when the process ends first); its exit code, stdout and stderr."""
    process = await start_statepact("worker", *argv, cwd=cwd, env=env)
    try:
        ended = asyncio.ensure_future(process.wait())
        waiting = {ended} if done is None else {ended, done}
        await asyncio.wait(waiting, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def dead_after(queue: BaseWorkQueue, item_id: str) -> asyncio.Future[None]:
    """A future set once ``item_id`` is dead (checked every 50 ms)."""

    async def watch() -> None:
        while True:
            item = await queue.get_item("t", item_id)
            if item is not None and item.status == ItemStatus.DEAD:
                return
            await asyncio.sleep(0.05)

    return asyncio.ensure_future(watch())


async def test_a_failing_handler_prints_its_failure_retry_and_dead_letter_with_no_flag(
    served: Served, app_dir: Path
) -> None:
    """Two attempts: each failure, the retry and the dead letter are a line on stderr, at
    the default level, without a traceback; the banner shows the policy in force."""
    await served.queue.enqueue(WorkItem(tenant="t", item_id="poison", payload={"task": "boom"}))
    done = await dead_after(served.queue, "poison")
    options = ["--max-attempts", "2", "--backoff-base", "0.05", "--backoff-cap", "0.1"]
    code, out, err = await run_worker_until(
        ["failing_app:worker", *served.options, *options], app_dir, done, clean_environment()
    )
    assert code == 0, err
    print(f"\n{served.kind} stderr:\n{err}")
    lines = err.splitlines()
    raised = [line for line in lines if "raised ValueError: the model returned no JSON" in line]
    assert len(raised) == 2, err
    assert all(" WARNING statepact.worker: " in line for line in raised)
    (retried,) = [line for line in lines if "failed attempt 1, retried at" in line]
    assert " INFO statepact.queue: " in retried and "item 'poison' of tenant 't'" in retried
    (dead,) = [line for line in lines if "dead-lettered after 2 attempt(s)" in line]
    assert " WARNING statepact.queue: " in dead and "the model returned no JSON" in dead
    assert "Traceback" not in err
    assert "max_attempts 2, backoff 0.05s to 0.1s" in out.splitlines()[0]
    assert (await served.queue.get_item("t", "poison")).status == ItemStatus.DEAD  # type: ignore[union-attr]


async def test_debug_adds_tracebacks_and_json_carries_the_fields(
    pg_served: Served, app_dir: Path
) -> None:
    """``--log-level debug``: the handler's traceback. ``--log-format json``: every stderr
    line one JSON object; the dead letter's carries queue, tenant, item id, attempts."""
    served = pg_served
    options = ["--max-attempts", "1"]
    await served.queue.enqueue(WorkItem(tenant="t", item_id="d1", payload={"task": "boom"}))
    done = await dead_after(served.queue, "d1")
    argv = ["failing_app:worker", *served.options, *options, "--log-level", "debug"]
    code, _, err = await run_worker_until(argv, app_dir, done, clean_environment())
    assert code == 0, err
    assert "Traceback (most recent call last)" in err
    assert 'raise ValueError(f"the model returned no JSON' in err

    await served.queue.enqueue(WorkItem(tenant="t", item_id="j1", payload={"task": "boom"}))
    done = await dead_after(served.queue, "j1")
    argv = ["failing_app:worker", *served.options, *options, "--log-format", "json"]
    code, _, err = await run_worker_until(argv, app_dir, done, clean_environment())
    assert code == 0, err
    records = [json.loads(line) for line in err.splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    (dead,) = [r for r in records if "dead-lettered" in r["message"]]
    assert dead["level"] == "WARNING" and dead["logger"] == "statepact.queue"
    assert (dead["queue"], dead["tenant"], dead["item_id"], dead["attempts"]) == (
        served.queue.name,
        "t",
        "j1",
        1,
    )
    (raised,) = [r for r in records if "raised" in r["message"]]
    assert raised["exception"].startswith("ValueError: the model returned no JSON")
    assert "traceback" not in raised


async def test_the_policy_is_the_options_then_the_workers_then_the_default(
    pg_served: Served, app_dir: Path
) -> None:
    """The Worker carrying max_attempts 3 dead-letters after 3; ``--max-attempts 1`` over
    the same Worker after 1; a factory's Worker with another policy is refused."""
    served = pg_served
    await served.queue.enqueue(WorkItem(tenant="t", item_id="p3", payload={"task": "boom"}))
    done = await dead_after(served.queue, "p3")
    code, out, err = await run_worker_until(
        ["failing_app:carrying", *served.options], app_dir, done, clean_environment()
    )
    assert code == 0, err
    assert "max_attempts 3, backoff 0.05s to 0.1s, jitter 0" in out
    assert (await served.queue.get_item("t", "p3")).attempts == 3  # type: ignore[union-attr]

    await served.queue.enqueue(WorkItem(tenant="t", item_id="p1", payload={"task": "boom"}))
    done = await dead_after(served.queue, "p1")
    argv = ["failing_app:carrying", *served.options, "--max-attempts", "1"]
    code, out, err = await run_worker_until(argv, app_dir, done, clean_environment())
    assert code == 0, err
    assert "max_attempts 1, backoff 0.05s to 0.1s" in out  # the rest still the Worker's
    assert (await served.queue.get_item("t", "p1")).attempts == 1  # type: ignore[union-attr]

    code, out, err = await run_worker_until(
        ["failing_app:factory", *served.options], app_dir, None, clean_environment()
    )
    assert code == 1
    assert "the factory's Worker carries a policy (max_attempts 2" in err
    assert "other than its queue's (max_attempts 5" in err


async def test_the_quickstart_worker_runs_both_ways(pg_database_url: str, tmp_path: Path) -> None:
    """docs/quickstart.md's app.py, verbatim: ``python app.py`` works three runs off; then
    ``statepact worker app:worker --queue quickstart``, reading ``STATEPACT_POSTGRES_URL``,
    works off three more enqueued from here, and drains on SIGTERM."""
    from statepact import PostgresStoreSettings, RunRecord
    from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue, create_engine

    (tmp_path / "app.py").write_text(recipe_file("app.py"))
    env = clean_environment(STATEPACT_POSTGRES_URL=pg_database_url)
    program = await asyncio.create_subprocess_exec(
        sys.executable,
        "app.py",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(program.communicate(), 120)
    assert program.returncode == 0, err.decode()
    assert out.decode().strip() == "3 runs summarised"

    settings = PostgresStoreSettings(dsn=pg_database_url, queue_name="quickstart", pool_size=2)
    engine = create_engine(settings)
    state = PostgresStateStore(engine, settings=settings)
    queue = PostgresWorkQueue(engine, settings=settings)
    try:
        run_ids = [f"cli-{n}" for n in range(3)]
        for run_id in run_ids:
            await state.put_run(RunRecord(tenant="acme", run_id=run_id))
            payload = {"task": "summarise", "run_id": run_id}
            await queue.enqueue(WorkItem(tenant="acme", item_id=run_id, payload=payload))

        async def all_done() -> None:
            while True:
                items = [await queue.get_item("acme", run_id) for run_id in run_ids]
                if all(i is not None and i.status == ItemStatus.DONE for i in items):
                    return
                await asyncio.sleep(0.05)

        started = time.monotonic()
        code, out, err = await run_worker_until(
            ["app:worker", "--queue", "quickstart"],
            tmp_path,
            asyncio.ensure_future(all_done()),
            env,
        )
        assert code == 0, err
        print(f"\nstatepact worker app:worker: {time.monotonic() - started:.1f} s\n{err}")
        assert out.splitlines()[-1].endswith("stopped")
        assert "tasks: summarise" in out
        for run_id in run_ids:
            run = await state.get_run("acme", run_id)
            assert run is not None
            assert (run.status, run.iterations, run.input_tokens) == (RunStatus.SUCCEEDED, 1, 1200)
    finally:
        await engine.dispose()


def test_the_quickstart_block_is_a_module_for_both(tmp_path: Path) -> None:
    """No server: the block defines ``worker`` (a Worker with no queue, for the command)
    and runs ``main()`` only as a program."""
    source = textwrap.dedent(recipe_file("app.py"))
    assert "worker = Worker(" in source
    assert 'if __name__ == "__main__":' in source
    assert '"version": 2' not in source
