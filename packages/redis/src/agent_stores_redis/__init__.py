"""agent-stores-redis: the Redis and Redis Cluster backend of agent-stores.

Installing the distribution is enough: ``redis://``, ``rediss://``, ``unix://``,
``redis+cluster://`` and ``rediss+cluster://`` URLs then work with
``agent_stores.connect`` / ``open_sessions`` / ``open_memory`` / ``open_checkpointer``,
and a ready ``redis.asyncio.Redis`` or ``RedisCluster`` can be passed instead of a URL.

Attributes are imported lazily so that loading the plugin does not import redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import RedisSettings, parse_url
    from .kv import RedisKV

_LAZY = {
    "RedisKV": "agent_stores_redis.kv",
    "RedisSettings": "agent_stores_redis.config",
    "parse_url": "agent_stores_redis.config",
}

__all__ = ["RedisKV", "RedisSettings", "parse_url"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
