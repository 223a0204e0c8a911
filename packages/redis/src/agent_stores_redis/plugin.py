"""The agent-stores plugin of agent-stores-redis (entry point ``redis`` in group ``agent_stores``).

Importing this module must stay cheap: it never imports redis-py. URL factories are
import strings resolved only when a Redis URL is opened, and :func:`kv_from_client` only
looks at a client if redis-py is already imported (a client object cannot exist
otherwise). :func:`session_port` gives every session store on a Redis KV the native port
(:class:`agent_stores_redis.sessions.RedisSessionPort`, two round trips per turn) and
:func:`memory_port` the native memory port (:class:`agent_stores_redis.memory.RedisMemoryPort`,
a write with its receipt in one script); :func:`journal_port` gives the checkpointer and
the step store the core's commit port (a log's counter and its entry in one commit
script: one round trip per append).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from agent_stores.backend import KVStore, RegisterBackend, hookimpl

if TYPE_CHECKING:
    from agent_stores.backend import (
        FaultInjector,
        JournalPort,
        MemoryPort,
        SessionPort,
        StoreURL,
    )

    from .kv import RedisKV

FACTORY = "agent_stores_redis.kv:RedisKV.from_url"


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register ``redis``, ``rediss``, ``unix``, ``redis+cluster`` and ``rediss+cluster``."""
    register("redis", FACTORY, description="Redis over TCP (?cluster=true for Redis Cluster)")
    register("rediss", FACTORY, description="Redis over TLS")
    register("unix", FACTORY, description="Redis over a Unix socket")
    register("redis+cluster", FACTORY, description="Redis Cluster over TCP")
    register("rediss+cluster", FACTORY, description="Redis Cluster over TLS")


@hookimpl
def kv_from_client(client: Any, options: dict[str, Any]) -> KVStore | None:
    """Wrap a ready ``redis.asyncio.Redis`` / ``RedisCluster`` (the store never closes it).

    A synchronous redis-py client is refused with a clear error; anything else is not ours.
    """
    if "redis" not in sys.modules:
        return None
    from redis import Redis as SyncRedis
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.cluster import RedisCluster as SyncRedisCluster

    if not isinstance(client, Redis | RedisCluster | SyncRedis | SyncRedisCluster):
        return None
    from .kv import RedisKV

    return RedisKV.from_client(client, **options)


def _redis(kv: KVStore) -> RedisKV | None:
    # A Redis store exists only once its module is imported: never import it here.
    kv_module = sys.modules.get("agent_stores_redis.kv")
    if kv_module is None or not isinstance(kv, kv_module.RedisKV):
        return None
    return cast("RedisKV", kv)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    """The native session port (one script each way: two round trips per turn) for a Redis KV."""
    redis_kv = _redis(kv)
    if redis_kv is None:
        return None
    from .sessions import RedisSessionPort

    return RedisSessionPort(redis_kv)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    """The native memory port (record, receipt index and markers in one script) for a Redis KV."""
    redis_kv = _redis(kv)
    if redis_kv is None:
        return None
    from .memory import RedisMemoryPort

    return RedisMemoryPort(redis_kv)


@hookimpl
def journal_port(kv: KVStore) -> JournalPort | None:
    """The core's commit port for a Redis KV: an append's counter and entry in one script."""
    redis_kv = _redis(kv)
    if redis_kv is None:
        return None
    from agent_stores.backend import CommitJournalPort

    return CommitJournalPort(redis_kv)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """A :class:`~agent_stores_redis.faults.RedisFaultInjector` for a Redis URL (redis-py's
    connection class replaced: reset, LOADING, lost reply, blackhole; TRYAGAIN and MOVED on
    a cluster)."""
    from .config import SCHEMES

    if url.scheme not in SCHEMES:
        return None
    from .faults import RedisFaultInjector

    return RedisFaultInjector(url)


@hookimpl
def proxied_url(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """``url`` through a TCP proxy at ``host:port`` (standalone TCP and TLS URLs).

    None for a Unix socket and for Redis Cluster: a cluster client follows the node
    addresses the cluster announces, so one proxy cannot stand in front of it.
    """
    from .config import SCHEMES, parse_url

    if url.scheme not in SCHEMES:
        return None
    if url.scheme == "unix" or parse_url(url).cluster:
        return None
    return url.set(host=host, port=port)


def kv_from_redis_client(client: Any, options: dict[str, Any] | None = None) -> KVStore:
    """Direct form of :func:`kv_from_client` for callers who skip plugin selection."""
    store = kv_from_client(client, dict(options or {}))
    if store is None:
        raise TypeError(f"not a redis-py client: {type(client).__name__}")
    return store
