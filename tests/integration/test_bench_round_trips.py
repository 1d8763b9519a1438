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
  call; it refuses connections the server closed without a round trip). Calls
  made at once share statements there (transactions' first reads and commits,
  run puts and patches: ``statepact._shared``), so with two callers those
  counts are at most the shapes' and at least half of them.
- The hot key re-runs conflicting transactions: on Redis every attempt costs
  exactly the three round trips, so the count follows from the retries; on
  PostgreSQL a commit may also be resent after a serialization failure, a
  commit another one of the process doomed is refused unsent, and reads are
  shared, so only "each landed commit was sent, and reads besides" is asserted.
- The floors: a raw call is one round trip; a minimal transaction design's
  attempt is its read and its commit (Redis: ``HMGET``, ``EVALSHA``; PostgreSQL:
  ``SELECT``, then ``BEGIN``, ``SELECT ... FOR UPDATE``, ``UPDATE``, ``COMMIT``, with
  ``pg_advisory_xact_lock`` before them for the global-lock design, or one
  ``UPDATE ... WHERE ver`` for compare-and-set), so the hot key's count follows
  from its re-runs.
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
from statepact.cli._bench.targets import beside

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
    "--finished",
    "10",
]

# Requests per operation when nothing conflicts, in calls to the backing (scripts on
# Redis, statements on PostgreSQL): all of them, and those inside the backend's commit.
PER_OP: dict[str, tuple[int, int | None]] = {
    "tx.independent": (2, 1),  # the first read (it takes the snapshot), commit
    "tx.read_only": (1, 0),  # the first read; nothing to commit
    "state.get": (1, None),
    "state.put": (1, None),
    "state.patch_own": (1, None),
    "state.patch": (1, None),
    "queue.enqueue.w1": (1, None),
}
CLAIM_ACK = {"redis": 2, "postgres": 2}  # claim + ack
# Round trips per operation of each floor (per attempt for the hot key's design).
FLOOR_TRIPS = {
    "redis": {
        "raw EVALSHA": 1,
        "redis.ping": 1,
        "redis.hincrby_own": 1,
        "redis.evalsha_2r2w": 1,
        "seed.redis.independent": 2,
        "seed.redis.readonly": 1,
        "seed.redis.hot": 2,
    },
    "postgres": {
        "raw one-row UPDATE": 1,
        "pg.sqla.autocommit.select1": 1,
        "pg.sqla.autocommit.update_own": 1,
        "seed.pg.txn.independent": 5,
        "seed.pg.seedlock.independent": 6,
        "seed.pg.txn.readonly": 1,
        "seed.pg.cas.hot": 2,
    },
}


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


def _check_deterministic(
    results: dict[str, dict[str, Any]], backing: str, call: float, shared: frozenset[str]
) -> None:
    """Every scenario whose count does not depend on timing, exactly; those in ``shared``
    (calls of the bench's callers may go together) between the share of one caller in
    ``CONCURRENCY`` and the whole count."""
    for scenario, (total, in_commit) in PER_OP.items():
        got = results[scenario]
        if scenario in shared:
            assert total * call / CONCURRENCY <= got["round_trips_per_op"] <= total * call
            if in_commit is not None:
                assert got["commit_round_trips_per_op"] <= in_commit * call, scenario
            continue
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


def _check_floors(payload: dict[str, Any], backing: str) -> None:
    """Each result stands beside the floors of its scenario, each measured right after it
    (a sample per floor), with its ratio and target; a peer has a target and no rate. Each
    floor sample sent what its floor sends."""
    samples = [f for f in payload["floors"] if f["backing"] == backing]
    for result in (r for r in payload["results"] if r["backing"] == backing):
        planned = beside(backing, result["scenario"])
        held = [
            (result["floor"], result["floor_ops_per_s"], result["ratio"], result["target"]),
            *((a["floor"], a["floor_ops_per_s"], a["ratio"], a["target"]) for a in result["also"]),
        ]
        assert [(h[0], h[3]) for h in held] == [(p.floor, p.target) for p in planned]
        measured = [f for f in samples if f["extra"]["after"] == result["scenario"]]
        assert [f["floor"] for f in measured] == [p.floor for p in planned if not p.peer]
        for (name, rate, ratio, _), one in zip(held, planned, strict=True):
            if one.peer:
                assert (rate, ratio) == (None, None), name
                continue
            sample = next(f for f in measured if f["floor"] == name)
            assert rate == sample["ops_per_s"] > 0
            assert ratio == pytest.approx(result["ops_per_s"] / rate)
    assert {f["floor"] for f in samples} == set(FLOOR_TRIPS[backing])
    for sample in samples:
        per_attempt = FLOOR_TRIPS[backing][sample["floor"]]
        attempts = sample["ops"] + sample["extra"].get("retries", 0)
        assert sample["round_trips_per_op"] == per_attempt * attempts / sample["ops"], sample


async def test_round_trips_on_redis_and_none_on_memory(statepact_redis_url: str) -> None:
    payload = await _bench_json("--backend", "memory,redis", "--redis", statepact_redis_url)
    memory = _by_scenario(payload, "memory")
    assert memory and all(r["round_trips_per_op"] is None for r in memory.values())
    assert all(r["commit_round_trips_per_op"] is None for r in memory.values())

    redis = _by_scenario(payload, "redis")
    _check_deterministic(redis, "redis", 1.0, frozenset())
    _check_floors(payload, "redis")
    assert (redis["state.patch_own"]["floor"], redis["state.patch_own"]["target"]) == (
        "redis.hincrby_own",
        0.8,
    )
    assert redis["queue.worker.c10"]["also"] == [
        {"floor": "saq.process", "floor_ops_per_s": None, "ratio": None, "target": 3.0}
    ]
    # Each hot-key attempt, conflicting or not, is read (with the snapshot) + commit.
    hot = redis["tx.hot_key"]
    attempts = hot["ops"] + hot["extra"]["retries"]
    assert hot["round_trips_per_op"] == 2 * attempts / hot["ops"]
    assert hot["commit_round_trips_per_op"] == attempts / hot["ops"]


async def test_round_trips_on_postgres(pg_database_url: str) -> None:
    payload = await _bench_json("--backend", "postgres", "--postgres", pg_database_url)
    # One statement per raw call, and no pre-ping in front of it.
    _check_floors(payload, "postgres")
    call = 1.0

    results = _by_scenario(payload, "postgres")
    shared = frozenset({"tx.independent", "tx.read_only", "state.put", "state.patch_own"})
    _check_deterministic(results, "postgres", call, shared)
    independent = results["tx.independent"]
    assert (independent["floor"], independent["target"]) == ("seed.pg.txn.independent", 1.0)
    assert [(a["floor"], a["target"]) for a in independent["also"]] == [
        ("seed.pg.seedlock.independent", 2.5)
    ]
    assert results["state.get"]["floor"] == "pg.sqla.autocommit.select1"
    # Every commit that landed was sent; one doomed by another is refused unsent, and the
    # reads may be shared: more than the commits, no fixed count.
    hot = results["tx.hot_key"]
    assert hot["commit_round_trips_per_op"] >= 1 * call
    assert hot["round_trips_per_op"] > hot["commit_round_trips_per_op"]


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
