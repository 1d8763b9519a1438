"""The docs' server examples (``<!-- statepact-docs: needs ... -->``) run against real servers.

Each block gets ``STATEPACT_REDIS_URL`` (the plugin's durable Redis, flushed
after the block) and ``STATEPACT_POSTGRES_URL`` = ``STATEPACT_DATABASE_URL`` (a
fresh database migrated to head and otherwise as PostgreSQL makes one: no
``statement_timeout``, dropped after the block), and runs as a program of its
own, TWICE in a row with nothing cleaned between: a reader runs an example verbatim on a default
database, and runs it again. Each block calls ``asyncio.run`` itself, so the
tests are plain functions with no event loop of their own.

The pages in ``CLEAN_ON_REDIS`` promise that their Redis examples remove what
they wrote: after both runs the Redis database holds no key at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.postgres import (
    create_database,
    drop_database,
    run_in_thread,
    unique_database_name,
)
from tests.unit.test_docs_examples import PROGRAMS, Example, run_example

pytestmark = pytest.mark.integration

SERVER_EXAMPLES = [e for e in PROGRAMS if e.needs]
#: Pages whose Redis examples clean up after themselves, down to the last key.
CLEAN_ON_REDIS = frozenset({"quickstart.md"})


async def _flush(url: str) -> None:
    from redis.asyncio import Redis

    client: Any = Redis.from_url(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


async def _keys(url: str) -> list[bytes]:
    from redis.asyncio import Redis

    client: Any = Redis.from_url(url)
    try:
        return sorted([key async for key in client.scan_iter(count=1000)])
    finally:
        await client.aclose()


@pytest.fixture
def docs_database(statepact_postgres_url: str) -> Iterator[str]:
    """A fresh database at the head revision, with the server's defaults (statement_timeout
    0); dropped after."""
    from statepact.storage.postgres import migrate

    name = unique_database_name("docs")

    async def build() -> str:
        url = await create_database(statepact_postgres_url, name, statement_timeout=None)
        await migrate.upgrade(url)
        return url

    try:
        yield run_in_thread(build)
    finally:
        run_in_thread(lambda: drop_database(statepact_postgres_url, name))


def test_some_examples_need_each_server() -> None:
    """The docs show both servers, so this module has something to run for each, and
    every page promising a clean Redis has a Redis example."""
    assert {server for e in SERVER_EXAMPLES for server in e.needs} == {"redis", "postgres"}
    for page in CLEAN_ON_REDIS:
        assert any(e.page == page and "redis" in e.needs for e in SERVER_EXAMPLES), page


@pytest.mark.parametrize("example", SERVER_EXAMPLES, ids=[e.id for e in SERVER_EXAMPLES])
def test_server_example_runs(
    example: Example, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example runs to the end against the servers it names, its own asserts included,
    and again right after on what the first run left."""
    redis_url: str | None = None
    if "redis" in example.needs:
        redis_url = request.getfixturevalue("statepact_redis_url")
        monkeypatch.setenv("STATEPACT_REDIS_URL", redis_url)
        url = redis_url
        run_in_thread(lambda: _flush(url))  # what an earlier test left is not the example's
    if "postgres" in example.needs:
        database = request.getfixturevalue("docs_database")
        monkeypatch.setenv("STATEPACT_DATABASE_URL", database)
        monkeypatch.setenv("STATEPACT_POSTGRES_URL", database)  # the newer name, same URL
    try:
        run_example(example)
        run_example(example)
        if redis_url is not None and example.page in CLEAN_ON_REDIS:
            url = redis_url
            assert run_in_thread(lambda: _keys(url)) == [], f"{example.id} left keys behind"
    finally:
        if redis_url is not None:
            url = redis_url
            run_in_thread(lambda: _flush(url))
