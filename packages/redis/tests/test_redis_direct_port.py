"""SessionStore built directly on a Redis KV store gets the native port, like open_sessions."""

from __future__ import annotations

from agent_stores import open_kv
from agent_stores.sessions import SessionStore
from agent_stores_redis.sessions import RedisSessionPort
from redis_test_support import with_fresh_prefix


async def test_direct_session_store_is_native(standalone_url: str) -> None:
    async with open_kv(with_fresh_prefix(standalone_url)) as kv:
        store = SessionStore(kv)
        assert isinstance(store.storage.port, RedisSessionPort)
