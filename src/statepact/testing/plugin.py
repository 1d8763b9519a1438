"""The statepact pytest plugin: a ``clock`` fixture and real test servers.

Registered through the ``pytest11`` entry point, so any project that installs
statepact can use these fixtures. It must never import redis or SQLAlchemy at
import time, and never start a server unless a test asks for one.
"""

from __future__ import annotations

import pytest

from statepact.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """A ``ManualClock`` for one test; stores and queues under test must be built with it."""
    return ManualClock()
