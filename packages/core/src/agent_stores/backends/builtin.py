"""The core's own plugin: registers ``memory://`` and ``sqlite://`` like any third party."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..hookspecs import RegisterBackend, hookimpl

if TYPE_CHECKING:
    from ..kv.base import KVStore
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


# The SQLite ports: each store write is one transaction (see sqlite_ports.py). The hooks
# import nothing until a SQLite store is opened; memory:// keeps the generic ports.


def _sqlite(kv: Any) -> bool:
    from .sqlite import SQLiteKV

    return isinstance(kv, SQLiteKV)


@hookimpl
def session_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The session store with the SQLite port for a SQLite KV, else None."""
    if not _sqlite(kv):
        return None
    from ..sessions import SessionStore
    from .sqlite_ports import SQLiteSessionPort

    return SessionStore(kv, port=SQLiteSessionPort(cast("SQLiteKV", kv)), **options)


@hookimpl
def memory_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The memory store with the SQLite port for a SQLite KV, else None."""
    if not _sqlite(kv):
        return None
    from ..memory import KVMemoryStore
    from .sqlite_ports import SQLiteMemoryPort

    return KVMemoryStore(kv, port=SQLiteMemoryPort(cast("SQLiteKV", kv)), **options)


@hookimpl
def checkpointer(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The checkpointer with the SQLite port for a SQLite KV, else None."""
    if not _sqlite(kv):
        return None
    from ..checkpointer import Checkpointer
    from .sqlite_ports import SQLiteJournalPort

    return Checkpointer(kv, port=SQLiteJournalPort(cast("SQLiteKV", kv)), **options)
