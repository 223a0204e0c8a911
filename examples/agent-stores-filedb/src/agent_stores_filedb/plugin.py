"""The plugin of agent-stores-filedb (entry point ``filedb`` in the group ``agent_stores``).

Imports no more than ``agent_stores.backend``: the scheme is registered by an import
string and each hook recognises the store's class through ``sys.modules``, so nothing of
this backend is imported until a ``filedb://`` URL is opened.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

from agent_stores.backend import KVStore, RegisterBackend, hookimpl

if TYPE_CHECKING:
    from agent_stores.backend import FaultInjector, JournalPort, MemoryPort, SessionPort, StoreURL

    from .kv import FileKV


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "filedb",
        "agent_stores_filedb.kv:FileKV.from_url",
        description="example backend: a folder of files shared by the processes of one machine",
    )


def _file_kv(kv: KVStore) -> FileKV | None:
    module = sys.modules.get("agent_stores_filedb.kv")
    if module is None or not isinstance(kv, module.FileKV):
        return None
    return cast("FileKV", kv)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    store = _file_kv(kv)
    if store is None:
        return None
    from .sessions import FileSessionPort

    return FileSessionPort(store)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    store = _file_kv(kv)
    if store is None:
        return None
    from .memory import FileMemoryPort

    return FileMemoryPort(store)


@hookimpl
def journal_port(kv: KVStore) -> JournalPort | None:
    store = _file_kv(kv)
    if store is None:
        return None
    from .journal import FileJournalPort

    return FileJournalPort(store)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    if url.scheme != "filedb":
        return None
    from .faults import FileFaultInjector

    return FileFaultInjector()
