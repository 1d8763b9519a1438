"""``statepact demo``, ``bench`` and ``doctor`` against real servers (the plugin's or our own).

The demo and the bench must leave nothing behind on a server; the doctor must
refuse what ``preflight()``/``verify()`` refuse, name the setting, and exit 1.
"""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from statepact.cli import bench, demo, doctor
from statepact.cli._bench.targets import beside
from statepact.testing.plugin import RedisServerFactory
from statepact.testing.servers import missing_server
from tests._cli import bench_scenarios, parse, redis_keys, summary_table

pytestmark = pytest.mark.integration

redis_asyncio = pytest.importorskip("redis.asyncio")


def _demo_transcript(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = demo.command(parse(demo.add_arguments, *argv), out=out)
    return code, out.getvalue()


STORY = [
    "round 1 claims: ",
    "CRASHED after step 1",
    "lease expired; back to queued",
    "counters kept from the crashed attempt",
    "DEAD-LETTERED",
    "dead letter: globex/run-poison after 3 attempts",
    "its commit was refused (ConflictError",
    "spent=12 (= 5 + 7, no lost update)",
    "replayed=True",
    "refused with IdempotencyConflictError",
    "fair claims: the first 15 claims, while every tenant had work: acme 5, globex 5, initech 5",
]


async def _run_off_loop(fn: Callable[[], Any]) -> Any:
    """The commands run their own event loop (asyncio.run), so call them from a thread."""
    import asyncio

    return await asyncio.to_thread(fn)


async def test_demo_tells_the_story_on_redis_and_cleans_up(statepact_redis_url: str) -> None:
    """The same story as on memory, on Redis, under a namespace that is gone afterwards."""
    code, transcript = await _run_off_loop(
        lambda: _demo_transcript("--redis", statepact_redis_url, "--seed", "2")
    )
    assert code == 0, transcript
    for point in STORY:
        assert point in transcript, point
    assert "namespace 'statepact_cli_" in transcript
    assert await redis_keys(statepact_redis_url, "*statepact_cli_*") == []


async def test_demo_counters_match_memory_for_the_same_seed(statepact_redis_url: str) -> None:
    """``--seed`` repeats the numbers on a server too: the summary table equals memory's."""
    _, on_memory = await _run_off_loop(lambda: _demo_transcript("--seed", "9"))
    _, on_redis = await _run_off_loop(
        lambda: _demo_transcript("--redis", statepact_redis_url, "--seed", "9")
    )
    assert summary_table(on_memory) == summary_table(on_redis)


def _run_doctor(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = doctor.command(parse(doctor.add_arguments, *argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def test_doctor_passes_a_durable_redis(statepact_redis_url: str) -> None:
    """The plugin's Redis (appendonly yes, noeviction) passes every check: exit 0."""
    code, out, err = await _run_off_loop(lambda: _run_doctor("--redis", statepact_redis_url))
    assert code == 0, out + err
    assert "ok       reachable" in out
    assert "ok       eviction" in out
    assert "ok       persistence: appendonly is 'yes'" in out
    assert out.strip().endswith("doctor: every check passed")


async def test_doctor_refuses_a_redis_that_keeps_nothing_on_disk(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """appendonly no with save "": refused, naming both settings and the fix; exit 1."""
    server = statepact_redis_server_factory(["--appendonly", "no", "--save", ""])
    code, out, _ = await _run_off_loop(lambda: _run_doctor("--redis", server.url))
    assert code == 1
    assert "REFUSED  persistence: appendonly is 'no' and save is ''" in out
    assert "fix: turn the append-only file on: appendonly yes" in out
    assert "doctor: 1 check(s) refused" in out
    # --no-durable: the same server is fine for data that can be recreated.
    code, out, _ = await _run_off_loop(lambda: _run_doctor("--redis", server.url, "--no-durable"))
    assert code == 0, out


async def test_doctor_refuses_an_evicting_redis(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """An allkeys-* policy is refused with the policy named and noeviction as the fix."""
    server = statepact_redis_server_factory(["--maxmemory-policy", "allkeys-lru"])
    code, out, _ = await _run_off_loop(lambda: _run_doctor("--redis", server.url))
    assert code == 1
    assert "REFUSED  eviction: maxmemory-policy is 'allkeys-lru'" in out
    assert "fix: set maxmemory-policy noeviction" in out


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


async def test_doctor_refuses_this_machines_redis_on_6379() -> None:
    """This machine's Redis on 6379 keeps nothing on disk: exit 1, naming persistence.

    That Redis is part of this kind of machine: when nothing listens on 6379 the
    test skips with the reason, and fails instead under STATEPACT_REQUIRE_SERVERS=1.
    """
    if not _answers(6379):
        missing_server("no Redis listens on 127.0.0.1:6379 on this machine")
    code, out, _ = await _run_off_loop(lambda: _run_doctor("--redis", "redis://127.0.0.1:6379/0"))
    assert code == 1
    assert "REFUSED  persistence" in out
    assert "appendonly" in out


async def test_doctor_refuses_a_redis_with_rdb_snapshots_only(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """appendonly no with RDB save points: refused, saying what a restart forgets; exit 1."""
    server = statepact_redis_server_factory(["--appendonly", "no", "--save", "3600 1"])
    code, out, _ = await _run_off_loop(lambda: _run_doctor("--redis", server.url))
    assert code == 1
    assert "REFUSED  persistence: appendonly is 'no' and save is '3600 1'" in out
    assert "every write since the last snapshot" in out
    assert "RDB save points alone are not enough" in out


async def test_doctor_says_an_unreachable_redis_is_unreachable_without_its_password() -> None:
    """A closed port: one refused check with the fix, the password masked; exit 1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    code, out, err = await _run_off_loop(lambda: _run_doctor("--redis", url))
    assert code == 1
    assert "REFUSED  reachable: cannot connect" in out
    assert "hunter2" not in out + err
    assert f"redis at redis://:***@127.0.0.1:{port}/0" in out


async def test_bench_on_redis_reports_every_scenario(statepact_redis_url: str) -> None:
    """Tiny sizes on memory and Redis: every scenario with ops/s and its ratio to the floor."""
    out, err = io.StringIO(), io.StringIO()
    args = parse(
        bench.add_arguments,
        "--backend",
        "memory,redis",
        "--redis",
        statepact_redis_url,
        "--concurrency",
        "4",
        "--ops",
        "3",
        "--tenants",
        "2,20",
        "--queued",
        "20,40",
        "--claims",
        "5",
        "--finished",
        "10",
        "--json",
    )
    code = await _run_off_loop(lambda: bench.command(args, out=out, err=err))
    assert code == 0, err.getvalue()
    results = json.loads(out.getvalue())["results"]
    for backing in ("memory", "redis"):
        rows = [r for r in results if r["backing"] == backing]
        scenarios = {r["scenario"] for r in rows}
        assert scenarios >= set(bench_scenarios((2, 20), (20, 40)))
        # each stands beside the first floor its plan names (docs/benchmarks.md)
        assert all(r["floor"] == beside(backing, r["scenario"])[0].floor for r in rows)
        for r in rows:
            assert r["ops_per_s"] > 0
            assert r["ratio"] == pytest.approx(r["ops_per_s"] / r["floor_ops_per_s"])
    assert await redis_keys(statepact_redis_url, "*bench*") == []
