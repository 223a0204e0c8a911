"""Plugin entry point of agent-stores-postgres (entry-point group ``agent_stores``).

Importing this module must stay cheap: it never imports psycopg. The factories are
import strings resolved only when a ``postgresql://`` URL is opened, and
:func:`kv_from_client` recognises a psycopg pool without importing psycopg_pool (a pool
object can only exist if its module is already loaded).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from agent_stores.backend import RegisterBackend, hookimpl

if TYPE_CHECKING:
    from agent_stores.backend import (
        FaultInjector,
        JournalPort,
        KVStore,
        MemoryPort,
        SessionPort,
        StoreURL,
        VectorPort,
    )

    from .kv import PostgresKV

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


def _postgres(kv: KVStore) -> PostgresKV | None:
    kv_module = sys.modules.get("agent_stores_postgres.kv")
    if kv_module is None or not isinstance(kv, kv_module.PostgresKV):
        return None
    return cast("PostgresKV", kv)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    """The native session port (one statement each way: two round trips per turn)."""
    postgres_kv = _postgres(kv)
    if postgres_kv is None:
        return None
    from .sessions import PostgresSessionPort

    return PostgresSessionPort(postgres_kv)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    """The native memory port (a write with its receipt in one statement)."""
    postgres_kv = _postgres(kv)
    if postgres_kv is None:
        return None
    from .ports import PostgresMemoryPort

    return PostgresMemoryPort(postgres_kv)


@hookimpl
def journal_port(kv: KVStore) -> JournalPort | None:
    """The native journal port (an append in one statement)."""
    postgres_kv = _postgres(kv)
    if postgres_kv is None:
        return None
    from .ports import PostgresJournalPort

    return PostgresJournalPort(postgres_kv)


@hookimpl
def vector_port(kv: KVStore) -> VectorPort | None:
    """The native vector port (pgvector; says itself whether the server has it)."""
    postgres_kv = _postgres(kv)
    if postgres_kv is None:
        return None
    from .vectors import PostgresVectorPort

    return PostgresVectorPort(postgres_kv)


_SCHEMES = frozenset({"postgresql", "postgres"})


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """A :class:`~agent_stores_postgres.faults.PostgresFaultInjector` for a PostgreSQL URL
    (40001, 40P01, 57P01, 08006, lost reply after COMMIT, blackhole)."""
    if url.scheme not in _SCHEMES:
        return None
    from .faults import PostgresFaultInjector

    return PostgresFaultInjector()


@hookimpl
def proxied_url(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """``url`` through a TCP proxy at ``host:port`` (libpq's ``host``/``hostaddr``/``port``
    query options dropped, so the proxy is the only address)."""
    if url.scheme not in _SCHEMES:
        return None
    return url.without_query("host", "hostaddr", "port").set(host=host, port=port)
