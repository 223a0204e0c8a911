"""The session contract on Redis through the generic KV port.

Session stores built as a user builds them take the Redis session port (one Lua script
each way); ``nox -s contract -- redis`` runs that path on the standalone server and the
cluster. Here the same contract runs with the core's generic port on the standalone
server (``store_path = "generic"``). The memory port's generic path runs in
``test_redis_memory_port``; the checkpointer has no Redis port.
"""

from __future__ import annotations

import pytest
from agent_stores_contract import SessionContract
from redis_test_support import with_fresh_prefix


class TestRedisSessionsGeneric(SessionContract):
    """The session contract on standalone Redis through the generic KV port."""

    store_path = "generic"

    @pytest.fixture
    def store_url(self, redis_urls: dict[str, str]) -> str:
        return with_fresh_prefix(redis_urls["redis"])
