"""Runs ``WorkQueueConformance`` against every backing.

Each backing's ``{backing}_work_queue(clock, queue_policy)`` fixture lives in
``tests/fixtures``; the server-backed ones are marked ``integration``.
"""

from __future__ import annotations

import pytest

from statepact.queue import WorkQueue
from statepact.testing.queue_suite import WorkQueueConformance


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def work_queue(request: pytest.FixtureRequest) -> WorkQueue:
    queue: WorkQueue = request.getfixturevalue(f"{request.param}_work_queue")
    return queue


class TestWorkQueue(WorkQueueConformance):
    pass
