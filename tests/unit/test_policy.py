"""QueuePolicy: one decision about retries, backoff and the dead letter for every backing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from statepact.models import ItemStatus
from statepact.queue import FailOutcome, QueuePolicy

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_defaults() -> None:
    policy = QueuePolicy()
    assert (policy.max_attempts, policy.backoff_base, policy.backoff_cap, policy.jitter) == (
        5,
        1.0,
        600.0,
        0.1,
    )


def test_is_frozen_and_strict() -> None:
    policy = QueuePolicy()
    with pytest.raises(ValidationError):
        policy.max_attempts = 9  # type: ignore[misc]
    with pytest.raises(ValidationError, match="retries"):
        QueuePolicy(retries=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_base": 0}, "backoff_base"),
        ({"backoff_cap": 0}, "backoff_cap"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"backoff_base": 10, "backoff_cap": 5}, "backoff_cap"),
    ],
)
def test_refuses_nonsense(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        QueuePolicy(**fields)  # type: ignore[arg-type]


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    policy = QueuePolicy(backoff_base=2, backoff_cap=30, jitter=0)
    delays = [policy.retry_delay(n).total_seconds() for n in range(1, 7)]
    assert delays == [2, 4, 8, 16, 30, 30]


def test_backoff_survives_huge_attempt_counts() -> None:
    policy = QueuePolicy(backoff_base=1, backoff_cap=600, jitter=0)
    assert policy.retry_delay(10_000) == timedelta(seconds=600)
    assert policy.retry_delay(0) == timedelta(seconds=1)


def test_jitter_shortens_by_up_to_its_fraction() -> None:
    policy = QueuePolicy(backoff_base=10, backoff_cap=100, jitter=0.5)
    assert policy.retry_delay(1, rand=0.0) == timedelta(seconds=10)
    assert policy.retry_delay(1, rand=1.0) == timedelta(seconds=5)
    drawn = [policy.retry_delay(2).total_seconds() for _ in range(200)]
    assert all(10 <= d <= 20 for d in drawn)
    assert len(set(drawn)) > 1


def test_a_retryable_failure_below_max_attempts_is_retried_after_backoff() -> None:
    policy = QueuePolicy(max_attempts=3, backoff_base=10, jitter=0)
    assert policy.after_failure(1, NOW, retryable=True) == FailOutcome(
        dead=False, available_at=NOW + timedelta(seconds=10)
    )
    assert policy.after_failure(2, NOW, retryable=True) == FailOutcome(
        dead=False, available_at=NOW + timedelta(seconds=20)
    )


def test_max_attempts_or_non_retryable_dead_letters_now() -> None:
    policy = QueuePolicy(max_attempts=3, backoff_base=10, jitter=0)
    assert policy.after_failure(3, NOW, retryable=True) == FailOutcome(dead=True, available_at=NOW)
    assert policy.after_failure(7, NOW, retryable=True).dead is True
    assert policy.after_failure(1, NOW, retryable=False) == FailOutcome(dead=True, available_at=NOW)


def test_a_lapse_is_dead_at_max_attempts() -> None:
    policy = QueuePolicy(max_attempts=2)
    assert policy.lapse_is_dead(1) is False
    assert policy.lapse_is_dead(2) is True
    assert policy.lapse_is_dead(3) is True


@pytest.mark.parametrize(
    "keep", [timedelta(seconds=-1), -5, "soon"], ids=["negative", "negative-int", "text"]
)
def test_policy_refuses_a_bad_keep_naming_it(keep: object) -> None:
    """keep_done/keep_cancelled/keep_dead refuse what is not a duration >= 0."""
    for field in ("keep_done", "keep_cancelled", "keep_dead"):
        with pytest.raises(ValueError, match=field):
            QueuePolicy(**{field: keep})  # type: ignore[arg-type]


def test_prune_cutoffs_leave_out_what_is_kept_forever() -> None:
    """A status kept forever (None) has no cutoff; the others are now - keep."""
    now = datetime(2024, 1, 1, tzinfo=UTC)
    policy = QueuePolicy(keep_done=timedelta(hours=1), keep_cancelled=None)
    assert policy.prune_cutoffs(now) == {
        ItemStatus.DONE: now - timedelta(hours=1),
        ItemStatus.DEAD: now - timedelta(days=7),
    }
    assert QueuePolicy(keep_done=None, keep_cancelled=None, keep_dead=None).prune_cutoffs(now) == {}
