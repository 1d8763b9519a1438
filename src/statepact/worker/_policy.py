"""Which retry policy a worker's queue runs with: the one rule, in one place.

Field by field, the first that says: what the command line gave
(``statepact worker --max-attempts ...``), else the policy the ``Worker``
carries (``Worker(policy=)``), else the queue's own (the ``policy=`` it was
opened with; ``QueuePolicy()``'s defaults without one). The queue applies the
policy in every fail and reap, so the worker never overrides it after the
queue is open: ``statepact worker`` opens the queue with what this settles,
and ``Worker.bind`` refuses a queue running another. See docs/worker.md,
"Retry policy". This module must never touch a queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from statepact.queue import QueuePolicy

__all__ = ["PolicyMismatchError", "describe_policy", "require_policy", "settle_policy"]


def describe_policy(policy: QueuePolicy) -> str:
    """One line for logs and errors: ``max_attempts 5, backoff 1s to 600s, jitter 0.1``."""
    return (
        f"max_attempts {policy.max_attempts}, backoff {policy.backoff_base:g}s to "
        f"{policy.backoff_cap:g}s, jitter {policy.jitter:g}"
    )


class PolicyMismatchError(ValueError):
    """``Worker(policy=)`` bound to a queue opened with another policy."""

    def __init__(self, wanted: QueuePolicy, runs: QueuePolicy) -> None:
        self.wanted = wanted
        self.runs = runs
        super().__init__(
            f"policy: this Worker's policy ({describe_policy(wanted)}) is not its queue's "
            f"({describe_policy(runs)}); open the queue with policy=worker.policy, or leave "
            "Worker(policy=) unset"
        )


def require_policy(policy: object) -> QueuePolicy | None:
    """``Worker(policy=)``: a ``QueuePolicy`` or ``None``; anything else a ``TypeError``."""
    if policy is None or isinstance(policy, QueuePolicy):
        return policy
    raise TypeError(f"policy: must be a QueuePolicy or None, got {type(policy).__name__}")


def settle_policy(
    given: Mapping[str, object],
    carried: QueuePolicy | None,
    queue: QueuePolicy | None = None,
) -> QueuePolicy:
    """The policy to run with: ``given`` (``QueuePolicy`` fields set on the command line)
    over ``carried`` (the Worker's) over ``queue`` (the queue's, else the defaults). Raises
    pydantic's ``ValidationError`` for a value the policy refuses."""
    base = (carried or queue or QueuePolicy()).model_dump()
    chosen = {field: value for field, value in given.items() if value is not None}
    return QueuePolicy.model_validate({**base, **chosen})
