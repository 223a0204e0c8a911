"""The plugin of agent-stores-dictdb (entry point ``dictdb`` in the group ``agent_stores``).

Cheap to import: the scheme is registered by an import string, and the port hooks find
the store's class in ``sys.modules``, so nothing of the backend is imported until a
``dictdb://`` URL is opened.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

from agent_stores.backend import KVStore, RegisterBackend, hookimpl

if TYPE_CHECKING:
    from agent_stores.backend import FaultInjector, JournalPort, MemoryPort, SessionPort, StoreURL

    from .kv import DictKV


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "dictdb",
        "agent_stores_dictdb.kv:DictKV.from_url",
        description="example backend: an in-process dict (one process only)",
    )


def _dictdb(kv: KVStore) -> DictKV | None:
    # A DictKV exists only once its module is imported: never import it for other stores.
    module = sys.modules.get("agent_stores_dictdb.kv")
    if module is None or not isinstance(kv, module.DictKV):
        return None
    return cast("DictKV", kv)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    dict_kv = _dictdb(kv)
    if dict_kv is None:
        return None
    from .sessions import DictSessionPort

    return DictSessionPort(dict_kv)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    dict_kv = _dictdb(kv)
    if dict_kv is None:
        return None
    from .memory import DictMemoryPort

    return DictMemoryPort(dict_kv)


@hookimpl
def journal_port(kv: KVStore) -> JournalPort | None:
    dict_kv = _dictdb(kv)
    if dict_kv is None:
        return None
    from .journal import DictJournalPort

    return DictJournalPort(dict_kv)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """The contract's fault mode breaks dictdb requests at the client's transport."""
    if url.scheme != "dictdb":
        return None
    from .faults import DictFaultInjector

    return DictFaultInjector()
