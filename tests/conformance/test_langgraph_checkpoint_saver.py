"""LangGraph's own contract suite, ``langgraph-checkpoint-conformance``, on every backing.

``validate(...)`` runs the suite of each capability (the five base ones and the
three optional ones the saver implements: ``delete_for_runs``, ``copy_thread``,
``prune``) on a fresh ``StatepactCheckpointSaver`` opened on the test's backing;
the report is printed and every capability must be detected and pass. The
server-backed cases are marked ``integration`` by the plugin (their fixtures
reach its servers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from statepact.integrations.langgraph import StatepactCheckpointSaver


@pytest.fixture(params=["memory", "redis", "postgres"])
def backing(request: pytest.FixtureRequest) -> Any:
    """The test's ``open_backing`` on each backing (``tests/fixtures``)."""
    return request.getfixturevalue(f"{request.param}_backing")


async def test_langgraph_conformance_passes_every_capability(
    backing: Any, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """validate(...) on the backing: every capability detected, none with a failed test."""
    backing_name = request.node.callspec.params["backing"]

    @checkpointer_test(name=f"StatepactCheckpointSaver on {backing_name}")
    async def factory() -> AsyncIterator[StatepactCheckpointSaver]:
        yield await StatepactCheckpointSaver.open(backing, tenant="conformance")

    report = await validate(factory, progress=ProgressCallbacks.verbose())
    report.print_report()
    with capsys.disabled():
        print(f"\nlanggraph-checkpoint-conformance on {backing_name}: {report.to_dict()}")
    detected = {name for name, result in report.results.items() if result.detected}
    failures = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert detected == {capability.value for capability in ALL_CAPABILITIES}
    assert failures == {}
    assert report.conformance_level() == "FULL"
