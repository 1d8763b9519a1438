"""``statepact demo``, ``bench`` and ``doctor`` on a real PostgreSQL (and the bench on all three).

The demo and the bench work in a scratch schema that must be gone afterwards;
the demo given both servers tells its story on Redis, then on PostgreSQL;
the doctor must pass a migrated database with a statement_timeout and refuse,
naming the setting and the fix, one without.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.cli import bench, demo, doctor
from statepact.cli._bench.targets import beside
from tests._cli import bench_scenarios, parse, redis_keys, run_statepact, summary_table
from tests.fixtures.postgres import (
    admin_execute,
    database_url,
    drop_database,
    unique_database_name,
)

pytestmark = pytest.mark.integration


async def _schemas(url: str, like: str) -> list[str]:
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT nspname FROM pg_namespace WHERE nspname LIKE :like"), {"like": like}
            )
            return [row[0] for row in rows]
    finally:
        await engine.dispose()


async def test_demo_tells_the_story_on_postgres_and_drops_its_schema(
    statepact_postgres_url: str,
) -> None:
    """State, queue and transactions on PostgreSQL, in a schema that is dropped afterwards."""
    out = io.StringIO()
    args = parse(demo.add_arguments, "--postgres", statepact_postgres_url, "--seed", "4")
    code = await asyncio.to_thread(lambda: demo.command(args, out=out))
    transcript = out.getvalue()
    assert code == 0, transcript
    for point in [
        "round 1 claims: ",
        "CRASHED after step 1",
        "lease expired; back to queued",
        "counters kept from the crashed attempt",
        "dead letter: globex/run-poison after 3 attempts",
        "its commit was refused (ConflictError",
        "spent=12 (= 5 + 7, no lost update)",
        "replayed=True",
        "refused with IdempotencyConflictError",
        "runs: 28 in 3 tenants, 1 failed, 27 succeeded",
    ]:
        assert point in transcript, point
    assert "schema 'statepact_cli_" in transcript
    assert await _schemas(statepact_postgres_url, "statepact_cli_%") == []


#: What the demo must show on each backing: the story as it happens, then the summary.
STORY_AND_SUMMARY = [
    "round 1 claims: ",
    "CRASHED after step 1",
    "lease expired; back to queued",
    "counters kept from the crashed attempt",
    "failed attempt 3 of 3",
    "DEAD-LETTERED",
    "its commit was refused (ConflictError",
    "spent=12 (= 5 + 7, no lost update)",
    "replayed=True",
    "refused with IdempotencyConflictError",
    "runs: 28 in 3 tenants, 1 failed, 27 succeeded",
    "fair claims: the first ",
    "dead letter: globex/run-poison after 3 attempts",
    "conflict: planner and critic raced on budgets/acme",
    "idempotent replay: first commit version",
]


async def test_demo_on_redis_and_postgres_tells_the_story_on_each_in_turn(
    statepact_redis_url: str, statepact_postgres_url: str
) -> None:
    """The installed ``statepact demo --redis URL --postgres URL --seed 1``: the whole story and
    its summary on Redis, then on PostgreSQL, each headed; exit 0; nothing left behind; the
    seed gives both (and memory) the same counters."""
    argv = ["demo", "--redis", statepact_redis_url, "--postgres", statepact_postgres_url]
    result = await asyncio.to_thread(lambda: run_statepact(*argv, "--seed", "1", timeout=300))
    assert result.returncode == 0, result.stdout + result.stderr
    # The plugin's Redis is durable and the schema is fresh: nothing to note on stderr.
    assert result.stderr == ""
    transcript = result.stdout
    assert transcript.startswith("statepact demo on redis, seed 1 (1 of 2)\n")
    head, on_postgres = transcript.split("statepact demo on postgres, seed 1 (2 of 2)\n")
    on_redis = head.removeprefix("statepact demo on redis, seed 1 (1 of 2)\n")
    for kind, section in (("redis", on_redis), ("postgres", on_postgres)):
        for point in STORY_AND_SUMMARY:
            assert section.count(point) >= 1, (kind, point)
        assert f"== summary ({kind}: " in section, kind
        # Four workers claim at once on a server, so the exact shares vary from run to run;
        # what must hold is that the tenants took turns (backlogs 14/9/5, shares level).
        fair = re.search(
            r"^fair claims: the first (\d+) claims, while every tenant had work: "
            r"acme (\d+), globex (\d+), initech (\d+) \(backlog 14/9/5\)",
            section,
            re.M,
        )
        assert fair is not None, kind
        total, *shares = (int(n) for n in fair.groups())
        assert sum(shares) == total, (kind, fair.group(0))
        assert max(shares) - min(shares) <= 2, (kind, fair.group(0))
    assert "namespace 'statepact_cli_" in on_redis
    assert "the demo's namespace was removed from the server" in on_redis
    assert "schema 'statepact_cli_" in on_postgres
    assert "the demo's schema was removed from the server" in on_postgres
    assert transcript.rstrip().endswith("the same story, seed 1, ran on redis and then postgres")
    # --seed repeats the numbers: both servers' tables equal the memory demo's for seed 1.
    memory = io.StringIO()
    args = parse(demo.add_arguments, "--seed", "1")
    assert await asyncio.to_thread(lambda: demo.command(args, out=memory)) == 0
    assert summary_table(on_redis) == summary_table(on_postgres)
    assert summary_table(on_postgres) == summary_table(memory.getvalue())
    # Each server is left as it was found.
    assert await redis_keys(statepact_redis_url, "*statepact_cli_*") == []
    assert await _schemas(statepact_postgres_url, "statepact_cli_%") == []


async def test_bench_reports_every_scenario_on_all_three_backings(
    statepact_postgres_url: str, statepact_redis_url: str
) -> None:
    """Tiny sizes on memory, Redis and PostgreSQL: every scenario with ops/s and ratio."""
    out, err = io.StringIO(), io.StringIO()
    args = parse(
        bench.add_arguments,
        "--backend",
        "memory,redis,postgres",
        "--redis",
        statepact_redis_url,
        "--postgres",
        statepact_postgres_url,
        "--concurrency",
        "3",
        "--ops",
        "2",
        "--tenants",
        "2,10",
        "--queued",
        "10,20",
        "--claims",
        "4",
        "--finished",
        "25",
        "--json",
    )
    code = await asyncio.to_thread(lambda: bench.command(args, out=out, err=err))
    assert code == 0, err.getvalue()
    payload = json.loads(out.getvalue())
    assert set(payload["backings"]) == {"memory", "redis", "postgres"}
    assert "postgres" not in json.dumps(payload["backings"]["memory"])
    scenarios = set(bench_scenarios((2, 10), (10, 20)))
    for backing in ("memory", "redis", "postgres"):
        rows = [r for r in payload["results"] if r["backing"] == backing]
        assert {r["scenario"] for r in rows} == scenarios
        # each stands beside the first floor its plan names (docs/benchmarks.md)
        assert all(r["floor"] == beside(backing, r["scenario"])[0].floor for r in rows)
        for r in rows:
            assert r["ops_per_s"] > 0, r
            assert r["ratio"] == pytest.approx(r["ops_per_s"] / r["floor_ops_per_s"])
    assert await _schemas(statepact_postgres_url, "bench%") == []
    # the table form, too, names every scenario with its numbers
    table = bench.format_table([bench.BenchResult.from_json(r) for r in payload["results"]])
    further = sum(len(r["also"]) for r in payload["results"])
    assert table.count("\n") == len(payload["results"]) + further + 1


@pytest.fixture
async def bare_database(statepact_postgres_url: str) -> AsyncIterator[str]:
    """A new, empty database with no statement_timeout and no statepact tables."""
    name = unique_database_name("doc")
    await admin_execute(statepact_postgres_url, f'CREATE DATABASE "{name}"')
    try:
        yield database_url(statepact_postgres_url, name)
    finally:
        await drop_database(statepact_postgres_url, name)


def _run_doctor(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = doctor.command(parse(doctor.add_arguments, *argv), out=out, err=err)
    assert err.getvalue() == ""
    return code, out.getvalue()


async def test_doctor_passes_a_migrated_database_with_a_statement_timeout(
    pg_database_url: str,
) -> None:
    """Every verify() check and the migration check pass: exit 0."""
    code, out = await asyncio.to_thread(lambda: _run_doctor("--postgres", pg_database_url))
    assert code == 0, out
    assert "ok       schema version: adk_schema holds version" in out
    assert "ok       statement_timeout: statement_timeout is 30s, set for the database" in out
    assert "ok       migrations: at the head revision" in out
    assert "ok       privileges: the role may read and write every statepact table" in out


async def test_doctor_refuses_a_bare_database_naming_both_fixes(bare_database: str) -> None:
    """No tables, and no statement_timeout anywhere (the application sets none either):
    both refused, each with its fix; exit 1."""
    code, out = await asyncio.to_thread(
        lambda: _run_doctor("--postgres", bare_database, "--statement-timeout", "none")
    )
    assert code == 1
    assert "REFUSED  schema version: table 'adk_schema' does not exist" in out
    assert "fix: run `statepact db upgrade` on the same database" in out
    assert "`alembic upgrade head`" in out
    assert "REFUSED  statement_timeout: statement_timeout is 0 (no limit)" in out
    assert "fix: ALTER ROLE <role> SET statement_timeout" in out
    assert "doctor: 2 check(s) refused" in out
    # The application's create_engine (30 s by default) sets the timeout: only the tables.
    code, out = await asyncio.to_thread(lambda: _run_doctor("--postgres", bare_database))
    assert code == 1
    assert "ok       statement_timeout: statement_timeout is 30s, set on each connection" in out
    assert "doctor: 1 check(s) refused" in out


async def test_doctor_refuses_a_migrated_database_without_a_timeout(bare_database: str) -> None:
    """Migrated, but statement_timeout is 0 and the application sets none: only that check
    is refused."""
    from statepact.storage.postgres import migrate

    await migrate.upgrade(bare_database)
    code, out = await asyncio.to_thread(
        lambda: _run_doctor("--postgres", bare_database, "--statement-timeout", "none")
    )
    assert code == 1
    assert "ok       schema version" in out
    assert "REFUSED  statement_timeout" in out
    assert "ok       migrations" in out
    assert "doctor: 1 check(s) refused" in out


async def test_doctor_never_prints_the_password(statepact_postgres_url: str) -> None:
    """A wrong password: refused as unreachable, the password masked everywhere."""
    from sqlalchemy.engine import make_url

    url = make_url(statepact_postgres_url).set(password="hunter2", port=1)
    plain: Any = url.render_as_string(hide_password=False)
    code, out = await asyncio.to_thread(lambda: _run_doctor("--postgres", plain))
    assert code == 1
    assert "REFUSED  reachable: cannot connect" in out
    assert "hunter2" not in out
    assert ":***@" in out
