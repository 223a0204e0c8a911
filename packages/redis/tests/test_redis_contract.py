"""The shared contract suite on Redis: standalone and the 3-master cluster.

Every contract class runs twice (``store_url`` is parametrized), with nothing dropped or
overridden. ``nox -s contract -- redis`` runs the same suite through ``--store-url``;
this module lets ``pytest packages/redis/tests`` run it too.
"""

from __future__ import annotations

import pytest
from agent_stores_contract import (
    CheckpointerContract,
    ConversationContract,
    FaultContract,
    KVContract,
    MemoryContract,
    PortContract,
    SessionContract,
)
from redis_test_support import with_fresh_prefix


class RedisURLs:
    """Runs a contract class on the standalone server and on the cluster."""

    @pytest.fixture(params=["redis", "redis-cluster"])
    def store_url(self, request: pytest.FixtureRequest, redis_urls: dict[str, str]) -> str:
        return with_fresh_prefix(redis_urls[str(request.param)])


class TestRedisKV(RedisURLs, KVContract):
    """The KV CAS contract on Redis."""


class TestRedisSessions(RedisURLs, SessionContract):
    """The session contract on Redis (native fast path when the plugin offers one)."""


class TestRedisMemory(RedisURLs, MemoryContract):
    """The memory contract on Redis."""


class TestRedisCheckpointer(RedisURLs, CheckpointerContract):
    """The checkpointer contract on Redis."""


class TestRedisFaults(RedisURLs, FaultContract):
    """The fault contract on Redis (its own fault injector, the contract's TCP proxy)."""


class TestRedisPorts(RedisURLs, PortContract):
    """The port contract on Redis (its session and memory ports; not atomic on the cluster)."""


class TestRedisConversations(RedisURLs, ConversationContract):
    """Pydantic AI's ConversationStore protocol on Redis (``open_conversations(url)``)."""
