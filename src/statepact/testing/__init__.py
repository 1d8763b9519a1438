"""Test support for statepact and for its users' own test suites.

- Conformance suites, one per protocol, to subclass in a test module and run
  against any backing by providing its fixture (``state_store``,
  ``work_queue``, ``tx_backend``) built with the plugin's ``statepact_clock``;
  ``statepact.testing.conformance`` has them already wired to statepact's
  backings on the test servers.
- Server providers: a real Redis and PostgreSQL from an environment URL,
  testcontainers, or local binaries, as a pytest plugin (``statepact.testing.plugin``,
  registered automatically when statepact is installed), with per-test
  fixtures on them (``statepact.testing.fixtures``: a PostgreSQL database
  cloned from a migrated template, a Redis namespace, the stores on both).

Importing this package imports neither redis nor SQLAlchemy.
"""

from statepact.clock import ManualClock

__all__ = ["ManualClock"]
