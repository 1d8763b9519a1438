"""The pytest hooks statepact's plugin adds (registered by ``pytest_addhooks``).

Implement them in a ``conftest.py`` or a plugin of yours; see ``docs/testing.md``
("Testing your application").
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_statepact_postgres_template"]


@pytest.hookspec
def pytest_statepact_postgres_template(url: str, config: pytest.Config) -> None:
    """Apply your application's own schema to the template database, once per session.

    ``url`` is the template's SQLAlchemy asyncpg URL: statepact's migrations are
    already applied there and ``statement_timeout`` is set. Run your own
    migrations on it (``alembic upgrade head`` with ``sqlalchemy.url`` pointed
    at it, or ``metadata.create_all``); every per-test database is then cloned
    from it and starts with your tables and data. The hook is called with no
    event loop running, so ``asyncio.run(...)`` may be used inside.

    Every connection must be closed when the hook returns (``await
    engine.dispose()``): PostgreSQL does not clone a database that has
    sessions on it, and the plugin fails the session, naming the hook, if any
    are left.
    """
