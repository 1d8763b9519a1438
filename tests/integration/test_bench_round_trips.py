"""``statepact bench`` counts the round trips the library sends per operation.

Tiny bench runs on real servers, in-process, read back as JSON. Every count
below follows from the code, and each is asserted exactly where it is
deterministic:

- Redis: one command or script per call (``get_run`` is a script, ``put_run``
  one, ...); a transaction is ``GET`` of the sequence (begin), ``EVALSHA``
  ``tx_read`` (a snapshot read) and ``EVALSHA`` ``tx_commit``; a read-only one
  skips the commit; a claim is one script (``claim``, the records with it) and an ack
  one (``settle``).
- PostgreSQL: the same shapes counted in statements (AUTOCOMMIT: no ``BEGIN``
  or ``COMMIT``), and nothing else: ``create_engine`` does not pre-ping (on
  asyncpg a pre-ping is ``BEGIN``, ``;`` and ``ROLLBACK`` in front of every
  call; it refuses connections the server closed without a round trip).
- The hot key re-runs conflicting transactions: on Redis every attempt costs
  exactly the three round trips, so the count follows from the retries; on
  PostgreSQL a commit may also be resent after a serialization failure, so
  only the floor (no retries) is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
from typing import Any

import pytest

from statepact.cli import bench

pytestmark = pytest.mark.integration

CONCURRENCY, OPS = 2, 5  # 10 items: the 10-worker claim+ack claims one each, none comes back empty
TINY = [
    "--concurrency",
    str(CONCURRENCY),
    "--ops",
    str(OPS),
    "--tenants",
    "2",
    "--queued",
    "4",
    "--claims",
    "2",
]

# Requests per operation when nothing conflicts, in calls to the backing (scripts on
# Redis, statements on PostgreSQL): all of them, and those inside the backend's commit.
PER_OP: dict[str, tuple[int, int | None]] = {
    "tx.independent": (2, 1),  # the first read (it takes the snapshot), commit
    "tx.read_only": (1, 0),  # the first read; nothing to commit
    "state.get": (1, None),
    "state.put": (1, None),
    "state.patch": (1, None),
    "queue.enqueue.w1": (1, None),
}
CLAIM_ACK = {"redis": 2, "postgres": 2}  # claim + ack


async def _bench_json(*argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([*argv, *TINY, "--json"])
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(lambda: bench.command(args, out=out, err=err))
    assert code == 0, err.getvalue()
    payload: dict[str, Any] = json.loads(out.getvalue())
    return payload


def _by_scenario(payload: dict[str, Any], backing: str) -> dict[str, dict[str, Any]]:
    return {r["scenario"]: r for r in payload["results"] if r["backing"] == backing}


def _check_deterministic(results: dict[str, dict[str, Any]], backing: str, call: float) -> None:
    """Every scenario whose count does not depend on timing, exactly."""
    for scenario, (total, in_commit) in PER_OP.items():
        got = results[scenario]
        assert got["round_trips_per_op"] == total * call, scenario
        assert got["commit_round_trips_per_op"] == (
            None if in_commit is None else in_commit * call
        ), scenario
    # Ten producers at once share round trips (concurrent enqueues go together in one
    # enqueue_many): at most one per item, how many fewer depends on timing.
    shared = results["queue.enqueue.w10"]
    assert 0 < shared["round_trips_per_op"] <= call, shared
    assert shared["commit_round_trips_per_op"] is None
    for scenario, got in results.items():
        if scenario.startswith(("queue.claim_ack", "queue.claim_cost")):
            assert got["round_trips_per_op"] == CLAIM_ACK[backing] * call, scenario
            assert got["commit_round_trips_per_op"] is None
    # The existing keys are all still there.
    assert {"ops_per_s", "floor", "floor_ops_per_s", "ratio", "extra"} <= set(results["state.get"])


async def test_round_trips_on_redis_and_none_on_memory(statepact_redis_url: str) -> None:
    payload = await _bench_json("--backend", "memory,redis", "--redis", statepact_redis_url)
    memory = _by_scenario(payload, "memory")
    assert memory and all(r["round_trips_per_op"] is None for r in memory.values())
    assert all(r["commit_round_trips_per_op"] is None for r in memory.values())

    redis = _by_scenario(payload, "redis")
    _check_deterministic(redis, "redis", 1.0)
    # The floors are one raw command each.
    floors = [f for f in payload["floors"] if f["backing"] == "redis"]
    assert floors and all(f["round_trips_per_op"] == 1.0 for f in floors)
    # Each hot-key attempt, conflicting or not, is read (with the snapshot) + commit.
    hot = redis["tx.hot_key"]
    attempts = CONCURRENCY * OPS + hot["extra"]["retries"]
    assert hot["round_trips_per_op"] == 2 * attempts / (CONCURRENCY * OPS)
    assert hot["commit_round_trips_per_op"] == attempts / (CONCURRENCY * OPS)


async def test_round_trips_on_postgres(pg_database_url: str) -> None:
    payload = await _bench_json("--backend", "postgres", "--postgres", pg_database_url)
    floors = [f for f in payload["floors"] if f["backing"] == "postgres"]
    calls = {f["round_trips_per_op"] for f in floors}
    # One statement per call, and no pre-ping in front of it.
    assert calls == {1.0}, calls
    call = 1.0

    results = _by_scenario(payload, "postgres")
    _check_deterministic(results, "postgres", call)
    hot = results["tx.hot_key"]
    assert hot["round_trips_per_op"] >= 2 * call
    assert hot["commit_round_trips_per_op"] >= 1 * call


def test_the_table_has_a_round_trip_column() -> None:
    """``3.00 (commit 1.00)`` for a transaction, ``1.00`` for a call, ``-`` on memory."""

    def result(backing: str, scenario: str, per_op: float | None, commit: float | None) -> Any:
        return bench.BenchResult(
            backing=backing,
            scenario=scenario,
            label=scenario,
            concurrency=1,
            ops=1,
            seconds=1.0,
            ops_per_s=1.0,
            round_trips_per_op=per_op,
            commit_round_trips_per_op=commit,
        )

    table = bench.format_table(
        [
            result("memory", "state.get", None, None),
            result("redis", "tx.independent", 3.0, 1.0),
            result("redis", "state.get", 1.0, None),
        ]
    ).splitlines()
    # After the operation count, before the rates.
    assert re.search(r"\bops\s+round trips/op\s+ops/s\b", table[0]), table[0]
    assert re.search(r"\s1\s+-\s+1\s", table[2]), table[2]
    assert re.search(r"\s1\s+3\.00 \(commit 1\.00\)\s+1\s", table[3]), table[3]
    assert re.search(r"\s1\s+1\.00\s+1\s", table[4]), table[4]
