"""The size of a PostgreSQL prune step after one took a measured time (``next_batch``)."""

from __future__ import annotations

import pytest

from statepact._limits import PRUNE_BATCH
from statepact.storage.postgres._queue_support import (
    PRUNE_MAX_BATCH,
    PRUNE_MIN_BATCH,
    PRUNE_STEP,
    next_batch,
)


def test_a_step_on_target_keeps_its_size() -> None:
    """A step that took PRUNE_STEP is followed by one of the same size."""
    assert next_batch(200, PRUNE_STEP) == 200


@pytest.mark.parametrize(("took", "expected"), [(PRUNE_STEP * 10, 150), (PRUNE_STEP / 10, 500)])
def test_a_step_changes_by_at_most_half_or_double(took: float, expected: int) -> None:
    """However far off the target a step was, the next is at least half and at most twice
    its size (300 rows: 150 after a slow one, 600 capped at PRUNE_BATCH after a quick one)."""
    assert PRUNE_MAX_BATCH == PRUNE_BATCH == 500
    assert next_batch(300, took) == expected


def test_steps_stay_within_their_bounds() -> None:
    """No step is sized under PRUNE_MIN_BATCH or over PRUNE_MAX_BATCH rows, even after
    one that took no measurable time."""
    assert next_batch(PRUNE_MIN_BATCH, 10.0) == PRUNE_MIN_BATCH
    assert next_batch(PRUNE_MAX_BATCH, 0.0) == PRUNE_MAX_BATCH
