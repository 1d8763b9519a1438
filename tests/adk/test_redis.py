"""The ADK session service on Redis: an app's keys (its runs' too) are one cluster slot, each
call is one script, an append sent again is applied once, and the whole contract holds on a
real cluster."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from statepact.clock import ManualClock
from statepact.integrations.adk import StatepactSessionService
from statepact.models import RunStatus
from statepact.storage import Backing
from statepact.storage.redis import AdkKeys, RedisStoreSettings, StateKeys, open_backing
from statepact.testing.cluster import LocalRedisCluster
from tests.adk._contract import APP, USER, SessionServiceContract, event, resend_an_append
from tests.fixtures.redis import ObservedRedis


def test_every_key_of_an_app_is_in_its_runs_slot() -> None:
    """AdkKeys of an app carry the hash tag of StateKeys' tenant of that name: sessions,
    events, scopes, indexes and the session's run are one slot, whatever the ids."""
    for app, user, session in (("acme", "ada", "s1"), ("a{b}", "{u}", "x:y"), ("é", "ü", "ñ")):
        k, runs = AdkKeys("ns"), StateKeys("ns")
        run_id = StatepactSessionService.run_id(user, session)
        keys = [
            k.session(app, user, session),
            k.state(app, user, session),
            k.events(app, user, session),
            k.timestamps(app, user, session),
            k.app_state(app),
            k.user_state(app, user),
            k.seq(app),
            k.sessions(app),
            k.user_sessions(app, user),
            k.idle(app),
            k.heads(app),
            k.op(app, "call"),
            runs.run_meta(app, run_id),
            runs.run(app, run_id),
            runs.seq(app),
            runs.runs(app),
            runs.runs_by_status(app, RunStatus.RUNNING),
            runs.runs_by_session(app, user),
            runs.runs_by_session_status(app, user, RunStatus.RUNNING),
        ]
        assert len({key_slot(key.encode("utf-8")) for key in keys}) == 1, app
    assert key_slot(AdkKeys().seq("a").encode()) != key_slot(AdkKeys().seq("b").encode())


@pytest.mark.integration
async def test_each_call_is_one_script(observed_redis: ObservedRedis, clock: ManualClock) -> None:
    """create, append, get, a page and the user state: one round trip each."""
    settings = RedisStoreSettings(durable=False, tx_prefix=f"t{uuid.uuid4().hex[:8]}")
    async with await open_backing(settings, clock=clock, client=observed_redis.client) as backing:
        service = await StatepactSessionService.open(backing)
        session = await service.create_session(app_name=APP, user_id=USER)  # loads the script
        await service.append_event(session, event())
        await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        await service.list_sessions_page(app_name=APP)
        await observed_redis.reset()
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(session, event({"k": 1, "app:a": 1, "user:u": 1}, usage=(1, 1)))
        await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        await service.list_sessions_page(app_name=APP)
        await service.get_user_state(app_name=APP, user_id=USER)
        assert await observed_redis.round_trips() == ["EVALSHA"] * 4 + ["HGETALL"]


@pytest.mark.integration
async def test_an_append_sent_again_is_applied_once(
    redis_backing: Backing[Any, Any, Any], clock: ManualClock
) -> None:
    """The same append (its call id) sent twice answers the version it made both times and
    stores one event, counted once."""
    await resend_an_append(redis_backing, clock)


@pytest.mark.integration
@pytest.mark.slow
class TestOnRedisCluster(SessionServiceContract):
    """The whole contract on a three-master cluster: any script touching two slots fails."""

    @pytest.fixture
    async def backing(
        self, local_cluster: LocalRedisCluster, clock: ManualClock
    ) -> AsyncIterator[Backing[Any, Any, Any]]:
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in local_cluster.startup_nodes]
        )
        settings = RedisStoreSettings(
            namespace=f"c{uuid.uuid4().hex[:10]}",
            tx_prefix=f"t{uuid.uuid4().hex[:10]}",
            durable=False,
        )
        try:
            async with await open_backing(settings, clock=clock, client=client) as backing:
                yield backing
        finally:
            await client.aclose()
