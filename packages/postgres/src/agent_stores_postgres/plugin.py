"""Plugin entry point of agent-stores-postgres (entry-point group ``agent_stores``).

Importing this module must stay cheap: it never imports psycopg. The factories are
import strings resolved only when a ``postgresql://`` URL is opened, and
:func:`kv_from_client` recognises a psycopg pool without importing psycopg_pool (a pool
object can only exist if its module is already loaded).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from agent_stores.hookspecs import RegisterBackend, hookimpl

if TYPE_CHECKING:
    from agent_stores.kv.base import KVStore
    from agent_stores.url import StoreURL

FACTORY = "agent_stores_postgres.kv:PostgresKV.from_url"


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register ``postgresql://`` and its alias ``postgres://``."""
    register("postgresql", FACTORY, description="PostgreSQL via psycopg 3 (async pool)")
    register("postgres", FACTORY, description="PostgreSQL via psycopg 3 (alias of postgresql)")


@hookimpl
def kv_from_client(client: Any, options: dict[str, Any]) -> KVStore | None:
    """Wrap a ready ``psycopg_pool.AsyncConnectionPool``; the store never closes it."""
    pool_module = sys.modules.get("psycopg_pool")
    if pool_module is None or not isinstance(client, pool_module.AsyncConnectionPool):
        return None
    from .kv import PostgresKV

    return PostgresKV.from_pool(client, **options)


@hookimpl
def session_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The native session store (two round trips per turn) for a PostgreSQL KV, else None."""
    kv_module = sys.modules.get("agent_stores_postgres.kv")
    if kv_module is None or not isinstance(kv, kv_module.PostgresKV):
        return None
    from .sessions import PostgresSessionStore

    return PostgresSessionStore(kv, **options)


@hookimpl
def memory_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The memory store with the native port (a write in one statement) for a PostgreSQL KV."""
    kv_module = sys.modules.get("agent_stores_postgres.kv")
    if kv_module is None or not isinstance(kv, kv_module.PostgresKV):
        return None
    from agent_stores.memory import KVMemoryStore

    from .ports import PostgresMemoryPort

    return KVMemoryStore(kv, port=PostgresMemoryPort(kv), **options)


@hookimpl
def checkpointer(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The checkpointer with the native port (an append in one statement) for a PostgreSQL KV."""
    kv_module = sys.modules.get("agent_stores_postgres.kv")
    if kv_module is None or not isinstance(kv, kv_module.PostgresKV):
        return None
    from agent_stores.checkpointer import Checkpointer

    from .ports import PostgresJournalPort

    return Checkpointer(kv, port=PostgresJournalPort(kv), **options)
