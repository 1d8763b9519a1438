"""``TransactionConformance``: the behaviour every ``StorageBackend`` must show.

Subclass it in a test module and provide two fixtures:

- ``tx_backend``: an opened, empty ``StorageBackend`` (sequence 0, no values,
  leases, token marks, locks or idempotency records) built with the test's
  ``clock``; it must see nothing another test wrote and retain at least 16
  versions per key in its history (``MemoryBackend(retain_versions=...)``).
- ``clock``: the ``ManualClock`` the backend was built with. The class defines
  it as the plugin's ``statepact_clock``, so a fixture built with
  ``statepact_clock`` (or with ``clock``, inside the class) needs nothing more.

::

    import pytest
    from statepact.testing.tx_suite import TransactionConformance

    @pytest.fixture
    async def tx_backend(statepact_clock):
        backend = MyBackend(clock=statepact_clock)
        yield backend
        await backend.close()

    class TestMyBackend(TransactionConformance):
        pass

The suite uses ``TransactionManager`` over the backend and the clock only,
never a backing's internals nor the server's time. It runs unchanged against
every backing; memory is the reference. A known divergence is a strict
``xfail`` in the subclass, with its reason.

Lock cycles: a backing whose ``detects_deadlocks`` is ``True`` must refuse
exactly one transaction of a two-cycle with ``DeadlockError`` at once; one
whose flag is ``False`` must break the cycle with ``LockTimeoutError``. The
test asserts whichever the backing declares.

Hermitage-style tests script two transactions step by step (after Martin
Kleppmann's Hermitage) and assert what each isolation level allows: dirty
writes and dirty reads never; lost updates refused under ``snapshot`` and
``serializable``; read skew refused under ``snapshot``; write skew allowed under
``snapshot`` and refused under ``serializable``. Three-transaction cases
follow: Fekete, O'Neil and O'Neil's read-only transaction anomaly (allowed
under ``snapshot``, one of the three refused under ``serializable``), a write
skew cycle over three transactions, and a lost update among three writers.
"""

from __future__ import annotations

import pytest

from statepact.clock import ManualClock
from statepact.testing._tx_retention import TransactionRetentionConformance
from statepact.testing._tx_suite.commits import CommitConformance
from statepact.testing._tx_suite.interleavings import InterleavingConformance
from statepact.testing._tx_suite.locks import LockConformance
from statepact.testing._tx_suite.operations import OperationsConformance
from statepact.tx import StorageBackend, TransactionManager

__all__ = ["TransactionConformance"]


class TransactionConformance(
    TransactionRetentionConformance,
    CommitConformance,
    LockConformance,
    InterleavingConformance,
    OperationsConformance,
):
    """The transaction behaviour every ``StorageBackend`` shares (see the module docstring)."""

    @pytest.fixture
    def clock(self, statepact_clock: ManualClock) -> ManualClock:
        """The suite's clock is the plugin's ``statepact_clock``: build the backing with either."""
        return statepact_clock

    @pytest.fixture
    def manager(self, tx_backend: StorageBackend) -> TransactionManager:
        return TransactionManager(tx_backend)
