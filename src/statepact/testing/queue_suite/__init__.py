"""``WorkQueueConformance``: the behaviour every ``WorkQueue`` backing must show.

Subclass it in a test module and provide these fixtures:

- ``work_queue``: a fresh, empty ``WorkQueue`` built with the test's ``clock``,
  the ``queue_policy`` fixture's policy and the default ``max_value_bytes``.
  It must see nothing another test wrote.
- ``clock``: the ``ManualClock`` the queue was built with. The class defines it
  as the plugin's ``statepact_clock``, so a fixture built with
  ``statepact_clock`` (or with ``clock``, inside the class) needs nothing more.
- ``work_queue_peer`` (optional): a second queue object on the same storage, as
  another process holds it (same server, namespace, clock and policy). The class
  defines it as ``work_queue`` itself; a server backing should override it, so
  pause and cancel notices are shown to cross objects.

``queue_policy`` is defined by this class (:data:`SUITE_POLICY`: three attempts,
backoff 10 s doubling, capped at 40 s, no jitter), so a backing fixture only has
to *take* it: ``def my_work_queue(statepact_clock, queue_policy)``. A test that
needs another policy overrides it with ``@pytest.mark.parametrize("queue_policy",
[...])``, which reaches the backing fixture too. The class also hands its policy
to the plugin's ``statepact_queue_policy``, which the ``statepact_*_work_queue``
fixtures are built with (outside the suite that is ``QueuePolicy()``).

::

    import pytest
    from statepact.testing.queue_suite import WorkQueueConformance

    @pytest.fixture
    def work_queue(statepact_clock, queue_policy):
        return MyWorkQueue(clock=statepact_clock, policy=queue_policy)

    class TestMyWorkQueue(WorkQueueConformance):
        pass

The suite uses the public API and the clock only; it must run unchanged against
every backing, and memory (``MemoryWorkQueue``) is the reference. A known
divergence is a strict ``xfail`` in the subclass, with its reason.

What it pins beyond the protocol docstrings (``MemoryWorkQueue``'s module
docstring has the full list):

- Due is ``available_at <= now``; a lease lapses at ``expires_at <= now``.
- Rotation: the lowest ``(turn, tenant)`` among tenants with due work is served,
  where a tenant's turn is the value of a per-queue counter when it was last
  served (0 if never) and the counter moves on every item claimed; ties go by
  tenant id in code-point order (``"B" < "a" < "b"``).
- Within a tenant: priority, then enqueue order, also for an item that was
  delayed or retried.
- A leased item is never claimed again, even lapsed, until ``reap`` moves it.
  A lapsed lease still settles and heartbeats until then.
- ``reap`` writes ``last_error = "lease expired"`` on every item it moves.
- ``heartbeat`` leaves the item's record (``updated_at`` too) as it was.
- Every write of ``last_error`` (fail, reap, cancel with a reason) appends an entry
  to ``error_history`` (the newest ``MAX_ERROR_HISTORY`` kept); ``requeue`` keeps it.
- ``requeue`` keeps ``last_error``; ``dead_letters`` are ordered by the time
  each item died, then ``item_id``; ``purge_dead`` deletes dead items outright,
  freeing their ids.
- ``stats`` count queued items whether due or not, and omit idle tenants; done
  items are not counted.
- ``next_due`` is the earliest ``available_at`` later than now of a queued item
  (for a tenant with no due work; see ``WorkQueue.next_due``).
- Tokens: each claim and heartbeat gives a token greater than any the item had.
- ``cancel`` sets ``updated_at`` to now and ``last_error`` to the reason (``None``
  too); a cancelled item is never claimed, reaped or requeued, and keeps its id
  until pruned. ``stats`` count cancelled items; a tenant with only those is
  listed.
- ``release(count_attempt=True)`` keeps the attempt and the item is due at
  ``now + delay``.
- Unique keys: ``unique_slot`` decides the slot; it is held while queued or
  leased (and done, with ``unique_for``), freed by dead, cancelled and prune,
  and not taken back by ``requeue``. Within one batch the first item wins.
- ``prune`` deletes an item whose ``updated_at`` is strictly before
  ``now - keep``; two prunes at once delete each item once between them.
- Flow control (``QueueLimits``): a tenant, key or (tenant, key) at its cap, or an
  item a rate would exceed, is passed over and the rotation goes on (the passed
  tenant keeps its turn); every end of a lease (ack, fail, release, reap, cancel)
  frees its slot; a rate holds ``<= weight`` in any window of ``per``, and
  ``next_due`` tells when a held-back item fits. An item heavier than its rate is
  never claimed while the rate holds.
- Paused, ``claim``/``claim_batch`` answer nothing for every queue object on the
  storage; ``resume`` wakes watches.
"""

from __future__ import annotations

from statepact.testing.queue_suite._common import SUITE_POLICY
from statepact.testing.queue_suite.claim import ClaimConformance
from statepact.testing.queue_suite.enqueue import EnqueueConformance
from statepact.testing.queue_suite.history import ErrorHistoryConformance
from statepact.testing.queue_suite.inputs import InputConformance
from statepact.testing.queue_suite.lifecycle import LifecycleConformance
from statepact.testing.queue_suite.limits import FlowControlConformance
from statepact.testing.queue_suite.mappings import MappingConformance
from statepact.testing.queue_suite.operator import OperatorReadsConformance
from statepact.testing.queue_suite.retention import RetentionConformance
from statepact.testing.queue_suite.settle import SettleConformance
from statepact.testing.queue_suite.unique import UniqueConformance

__all__ = ["SUITE_POLICY", "WorkQueueConformance"]


class WorkQueueConformance(
    EnqueueConformance,
    ClaimConformance,
    SettleConformance,
    InputConformance,
    MappingConformance,
    LifecycleConformance,
    UniqueConformance,
    RetentionConformance,
    FlowControlConformance,
    OperatorReadsConformance,
    ErrorHistoryConformance,
):
    """One test per promise of ``WorkQueue``; see the module docstring for the fixtures.

    Each base is the suite's part for one area (``statepact.testing.queue_suite.<area>``).
    """
