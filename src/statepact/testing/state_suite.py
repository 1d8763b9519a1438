"""``StateStoreConformance``: the behaviour every ``StateStore`` backing must show.

Subclass it in a test module and provide two fixtures:

- ``state_store``: a fresh, empty ``StateStore`` built with the test's ``clock``
  and the default ``max_value_bytes``. It must see nothing another test wrote.
- ``clock``: the ``ManualClock`` the store was built with. The class defines it
  as the plugin's ``statepact_clock``, so a fixture built with
  ``statepact_clock`` (or with ``clock``, inside the class) needs nothing more.

::

    import pytest
    from statepact.testing.state_suite import StateStoreConformance

    @pytest.fixture
    def state_store(statepact_clock):
        return MyStateStore(clock=statepact_clock)

    class TestMyStateStore(StateStoreConformance):
        pass

The suite uses the public API and the clock only: never a backing's internals,
never the server's time. It must run unchanged against every backing; memory
(``MemoryStateStore``) is the reference, so a backing that fails a test here is
wrong, not the suite. A known divergence is a strict ``xfail`` in the subclass,
with its reason.

What it pins beyond the protocol docstrings:

- ``seq`` values are opaque increasing integers; only their order is asserted.
- ``patch_run`` always bumps the version, even when every delta is zero.
- A stale put (``expected != stored``) raises
  ``StateConflictError(tenant=, record_id=, kind="run"|"session", expected=, actual=)``;
  ``actual`` is 0 when the record does not exist; creating (version 0) a record
  that exists is a conflict too.
- A counter that would pass ``2**63 - 1`` (cost: nano-units) raises ``ValueError``
  naming it, and nothing is written.
- The last page has ``next=None`` even when it is full.
- A run may name a session that was never stored; a session indexes its runs
  through ``list_runs(tenant, session_id=...)``; moving a run to another session
  moves it between the listings.
- A deleted run can be created again from version 0, with zero counters and a
  new, greater ``seq``.
"""

from __future__ import annotations

import pytest

from statepact.clock import ManualClock
from statepact.testing._state_retention import StateRetentionConformance
from statepact.testing._state_suite.limits import LimitsConformance
from statepact.testing._state_suite.listing import ListingConformance
from statepact.testing._state_suite.records import RecordConformance
from statepact.testing._state_suite.totals import RunTotalsConformance

__all__ = ["StateStoreConformance"]


class StateStoreConformance(
    StateRetentionConformance,
    RecordConformance,
    ListingConformance,
    LimitsConformance,
    RunTotalsConformance,
):
    """One test per promise of ``StateStore``; see the module docstring for the fixtures.

    ``prune_runs`` and ``delete_session`` are pinned by ``StateRetentionConformance``
    (``testing/_state_retention.py``), which this class inherits."""

    @pytest.fixture
    def clock(self, statepact_clock: ManualClock) -> ManualClock:
        """The suite's clock is the plugin's ``statepact_clock``: build the backing with either."""
        return statepact_clock
