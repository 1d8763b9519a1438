"""The floors of ``statepact bench`` do what they say, and stand beside the scenarios
docs/benchmarks.md names, with its targets (memory here; the servers' floors in
tests/integration/test_bench_floors.py)."""

from __future__ import annotations

import asyncio
import re

import pytest

from statepact.cli._bench.floors import Floor, LockedDict, measure_floor
from statepact.cli._bench.measure import MIN_SECONDS
from statepact.cli._bench.report import (
    Against,
    BenchResult,
    format_table,
    format_target,
    targets_met,
)
from statepact.cli._bench.seed import HOT, MemoryDesign, SeedFloor
from statepact.cli._bench.targets import PLAN, WRITE_FLOOR, Floors, beside
from statepact.cli._common import CommandError

# (backing, scenario, floor, target, a peer only the peer harness runs): the targets'
# table of docs/benchmarks.md, row by row.
EXPECTED_PLAN = [
    ("memory", "tx.independent", "seed.memory.independent", 0.3, False),
    ("memory", "tx.hot_key", "seed.memory.hot", None, False),
    ("memory", "tx.read_only", "seed.memory.readonly", None, False),
    ("redis", "tx.independent", "seed.redis.independent", 0.8, False),
    ("redis", "tx.hot_key", "seed.redis.hot", 0.8, False),
    ("redis", "tx.read_only", "seed.redis.readonly", 0.7, False),
    ("redis", "state.get", "redis.ping", 0.8, False),
    ("redis", "state.put", "redis.evalsha_2r2w", 0.8, False),
    ("redis", "state.patch_own", "redis.hincrby_own", 0.8, False),
    ("redis", "queue.worker.c10", "raw EVALSHA", None, False),
    ("redis", "queue.worker.c10", "saq.process", 3.0, True),
    ("postgres", "tx.independent", "seed.pg.txn.independent", 1.0, False),
    ("postgres", "tx.independent", "seed.pg.seedlock.independent", 2.5, False),
    ("postgres", "tx.hot_key", "seed.pg.cas.hot", 0.8, False),
    ("postgres", "tx.read_only", "seed.pg.txn.readonly", 0.7, False),
    ("postgres", "state.get", "pg.sqla.autocommit.select1", 0.7, False),
    ("postgres", "state.put", "pg.sqla.autocommit.update_own", 0.7, False),
    ("postgres", "state.patch_own", "pg.sqla.autocommit.update_own", 0.7, False),
    ("postgres", "queue.enqueue_many", "raw one-row UPDATE", None, False),
    ("postgres", "queue.enqueue_many", "pgqueuer.enqueue.batch", 1.0, True),
    ("postgres", "queue.worker.c10", "raw one-row UPDATE", None, False),
    ("postgres", "queue.worker.c10", "pgqueuer.process", 1.0, True),
]


def test_the_plan_is_the_table_of_targets() -> None:
    """Each scenario stands beside the floors and targets docs/benchmarks.md lists, the
    floor its ratio uses first; any other scenario beside its backing's write floor."""
    plan = [
        (kind, scenario, one.floor, one.target, one.peer)
        for kind, scenarios in PLAN.items()
        for scenario, floors in scenarios.items()
        for one in floors
    ]
    assert plan == EXPECTED_PLAN
    for kind, floor in WRITE_FLOOR.items():
        assert [b.floor for b in beside(kind, "queue.claim_ack.w10")] == [floor]
        assert beside(kind, "queue.claim_cost.t10.q100")[0].target is None


@pytest.mark.parametrize("kind", sorted(PLAN))
def test_every_floor_of_the_plan_is_built_under_its_name(kind: str) -> None:
    """A floor the plan names exists on its backing, and reports under that name."""
    floors = Floors(kind, None, 3, "bench0123abcd")
    names = {b.floor for bs in PLAN[kind].values() for b in bs if not b.peer}
    for name in sorted(names | {WRITE_FLOOR[kind]}):
        assert floors.make(name).name == name
    with pytest.raises(ValueError, match="no floor"):
        floors.make("redis.ping" if kind != "redis" else "pg.sqla.autocommit.select1")


async def test_the_hot_key_design_ends_at_agents_times_ops() -> None:
    """seed.memory.hot: every agent on one key, re-run at once on conflict; each repetition
    ends at exactly agents x ops, and the re-runs are counted."""
    design = MemoryDesign()
    floor = SeedFloor(design, "hot")
    ops, seconds, sent, retries = await measure_floor(floor, 5, 4, None)
    assert design.data[HOT][0] == 5 * 4
    assert ops % (5 * 4) == 0  # whole repetitions of the scenario's shape
    assert seconds >= MIN_SECONDS
    assert sent is None  # memory sends nothing
    assert retries > 0  # the agents yield between read and commit, so they conflict


async def test_the_independent_design_gives_each_agent_its_ops() -> None:
    design = MemoryDesign()
    ops, _, _, retries = await measure_floor(SeedFloor(design, "independent"), 3, 7, None)
    assert [design.data[f"a{agent}"][0] for agent in range(3)] == [7, 7, 7]
    assert design.data[HOT] == (0, 0)
    assert retries == 0
    assert ops % 21 == 0


async def test_a_design_that_loses_updates_fails_the_floor() -> None:
    """A commit that does not compare versions loses updates on the hot key, and the check
    after the repetition fails the bench rather than report a rate."""

    class Blind(MemoryDesign):
        async def commit(self, agent: int, key: str, version: int, value: int) -> bool:
            await asyncio.sleep(0)
            self.data[key] = (value, version + 1)
            return True

    with pytest.raises(CommandError, match=r"seed\.memory\.hot lost an update: .*'hot'"):
        await measure_floor(SeedFloor(Blind(), "hot"), 4, 3, None)


async def test_the_locked_dict_checks_every_count() -> None:
    floor = LockedDict()
    ops, _, _, _ = await measure_floor(floor, 3, 2, None)
    assert ops % (3 * 10) == 0  # a call floor runs max(ops, 10) per caller
    assert floor.table == {0: 10, 1: 10, 2: 10}
    floor.table[1] += 1
    with pytest.raises(CommandError, match=r"dict\+asyncio\.Lock lost an update"):
        await floor.check(3, 10)


async def test_what_a_floor_holds_is_given_back_when_it_fails() -> None:
    """hold() and release() pair up even when a check fails mid-measurement."""

    class Failing(Floor):
        name = "failing"
        held = False

        async def hold(self, callers: int) -> None:
            self.held = True

        async def op(self, caller: int, i: int) -> None:
            pass

        async def check(self, callers: int, per_caller: int) -> None:
            raise self.fail("did nothing")

        async def release(self) -> None:
            self.held = False

    floor = Failing()
    with pytest.raises(CommandError, match="the floor failing did nothing"):
        await measure_floor(floor, 2, 2, None)
    assert floor.held is False


def _result(**fields: object) -> BenchResult:
    base: dict[str, object] = {
        "backing": "postgres",
        "scenario": "tx.independent",
        "label": "tx: independent keys",
        "concurrency": 40,
        "ops": 400,
        "seconds": 1.0,
        "ops_per_s": 400.0,
        "floor": "seed.pg.txn.independent",
        "floor_ops_per_s": 500.0,
        "ratio": 0.8,
        "target": 1.0,
    }
    base.update(fields)
    return BenchResult(**base)  # type: ignore[arg-type]


def test_the_table_has_a_row_per_floor_and_a_target_column() -> None:
    """A further floor or a peer is a row under its scenario; the target says met or not."""
    result = _result(
        also=[
            Against("seed.pg.seedlock.independent", 100.0, 4.0, 2.5),
            Against("pgqueuer.process", None, None, 1.0),
        ]
    )
    lines = format_table([result, _result(scenario="state.patch", target=None)]).splitlines()
    assert lines[0].endswith("x floor  target")
    assert re.search(
        r"\s400\s+seed\.pg\.txn\.independent\s+500\s+0\.800\s+>= 1\.0 not met$", lines[2]
    )
    assert re.fullmatch(
        r"\s+seed\.pg\.seedlock\.independent\s+100\s+4\.000\s+>= 2\.5 met", lines[3]
    )
    assert re.fullmatch(r"\s+pgqueuer\.process\s+not run\s+-\s+>= 1\.0 \(peer\)", lines[4])
    assert re.search(r"\s0\.800$", lines[5])  # no target: nothing in the column
    assert targets_met([result]) == (1, 2)  # the peer is not counted: it did not run


def test_a_target_is_met_at_exactly_its_ratio() -> None:
    assert format_target(Against("f", 10.0, 0.8, 0.8)) == ">= 0.8 met"
    assert format_target(Against("f", 10.0, 0.79, 0.8)) == ">= 0.8 not met"
    assert format_target(Against("f", 10.0, 0.5, None)) == ""
