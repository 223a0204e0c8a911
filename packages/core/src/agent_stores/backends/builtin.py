"""The core's own plugin: registers ``memory://`` and ``sqlite://`` like any third party."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

from ..hookspecs import RegisterBackend, hookimpl

if TYPE_CHECKING:
    from ..checkpointer.port import JournalPort
    from ..faults import FaultInjector
    from ..kv.base import KVStore
    from ..memory.port import MemoryPort
    from ..memory.vector_port import VectorPort
    from ..sessions.port import SessionPort
    from ..url import StoreURL
    from .sqlite import SQLiteKV


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register the embedded backends."""
    register(
        "memory",
        "agent_stores.backends.memory:MemoryKV.from_url",
        description="process-local store (tests, single process)",
    )
    register(
        "sqlite",
        "agent_stores.backends.sqlite:SQLiteKV.from_url",
        description="embedded SQLite file (WAL), safe across processes",
    )


# The SQLite ports: each store write is one transaction (see sqlite_ports.py). A SQLite
# store can only exist once its module is imported, so the hooks look it up in sys.modules
# and import nothing for other backends; memory:// keeps the generic ports.


def _sqlite(kv: KVStore) -> SQLiteKV | None:
    module = sys.modules.get("agent_stores.backends.sqlite")
    if module is None or not isinstance(kv, module.SQLiteKV):
        return None
    return cast("SQLiteKV", kv)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    """The SQLite session port (acquire and save each one transaction) for a SQLite KV."""
    sqlite_kv = _sqlite(kv)
    if sqlite_kv is None:
        return None
    from .sqlite_ports import SQLiteSessionPort

    return SQLiteSessionPort(sqlite_kv)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    """The SQLite memory port (a write with its receipt in one transaction) for a SQLite KV."""
    sqlite_kv = _sqlite(kv)
    if sqlite_kv is None:
        return None
    from .sqlite_ports import SQLiteMemoryPort

    return SQLiteMemoryPort(sqlite_kv)


@hookimpl
def vector_port(kv: KVStore) -> VectorPort | None:
    """The sqlite-vec vector port (beside the KV table, in the same file) for a SQLite KV."""
    sqlite_kv = _sqlite(kv)
    if sqlite_kv is None:
        return None
    from .sqlite_vectors import SQLiteVectorPort

    return SQLiteVectorPort(sqlite_kv)


@hookimpl
def journal_port(kv: KVStore) -> JournalPort | None:
    """The SQLite journal port (an append in one transaction) for a SQLite KV."""
    sqlite_kv = _sqlite(kv)
    if sqlite_kv is None:
        return None
    from .sqlite_ports import SQLiteJournalPort

    return SQLiteJournalPort(sqlite_kv)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """The embedded backends' injector: their transport is the KV API itself."""
    if url.scheme not in ("memory", "sqlite"):
        return None
    from ..kv.faulty import KVFaultInjector

    return KVFaultInjector()
