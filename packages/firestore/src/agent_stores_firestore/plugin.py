"""The agent-stores plugin of agent-stores-firestore (entry point ``firestore`` in group ``agent_stores``).

Importing this module must stay cheap: it never imports google-cloud-firestore. The
factory is an import string resolved only when a ``firestore://`` URL is opened, and
:func:`kv_from_client` only looks at a client if the Firestore library is already
imported (a client object cannot exist otherwise). A warm session turn takes its lease in
one Commit (:func:`session_port`, :mod:`~agent_stores_firestore.sessions`); a memory
write commits its record, receipt index entry and directory markers in one Commit
(:func:`memory_port`, the core's transaction port over
:meth:`FirestoreKV.transact`), and search by meaning runs on the native vector port
(:mod:`~agent_stores_firestore.vectors`, ``find_nearest``); the checkpointer appends to a
run's journal or step log in one Commit (:func:`journal_port`, the core's commit port). For the contract's fault mode it offers
:class:`~agent_stores_firestore.faults.FirestoreFaultInjector` (``fault_injector``, a gRPC
interceptor) and ``proxied_url`` (an emulator URL through a TCP proxy).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

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

    from .kv import FirestoreKV

FACTORY = "agent_stores_firestore.kv:FirestoreKV.from_url"


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register ``firestore://PROJECT/COLLECTION``."""
    register(
        "firestore",
        FACTORY,
        description="Google Cloud Firestore (Native mode) via google-cloud-firestore AsyncClient",
    )


@hookimpl
def kv_from_client(client: Any, options: dict[str, Any]) -> KVStore | None:
    """Wrap a ready ``google.cloud.firestore.AsyncClient`` (the store never closes it).

    A synchronous ``Client`` is refused with a clear error; anything else is not ours.
    """
    module = sys.modules.get("google.cloud.firestore_v1")
    if module is None or not isinstance(client, module.AsyncClient | module.Client):
        return None
    from .kv import FirestoreKV

    return FirestoreKV.from_client(client, **options)


def _is_firestore(kv: KVStore) -> TypeGuard[FirestoreKV]:
    """Whether ``kv`` is a Firestore store (never imports the store's module: one exists
    only once that module was imported)."""
    kv_module = sys.modules.get("agent_stores_firestore.kv")
    return kv_module is not None and isinstance(kv, kv_module.FirestoreKV)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    """The native session port (two requests per warm turn) for a Firestore KV."""
    if not _is_firestore(kv):
        return None
    from .sessions import FirestoreSessionPort

    return FirestoreSessionPort(kv)


@hookimpl
def journal_port(kv: KVStore) -> JournalPort | None:
    """Counter and entry of an append in one Commit (the core's commit port)."""
    if not _is_firestore(kv):
        return None
    from agent_stores.backend import CommitJournalPort

    return CommitJournalPort(kv)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    """Record, receipt index entry and markers of a memory write in one Commit."""
    if not _is_firestore(kv):
        return None
    from agent_stores.backend import TransactMemoryPort

    return TransactMemoryPort(kv)


@hookimpl
def vector_port(kv: KVStore) -> VectorPort | None:
    """The native vector port (``find_nearest``, exact reads for small scopes)."""
    if not _is_firestore(kv):
        return None
    from .vectors import FirestoreVectorPort

    return FirestoreVectorPort(kv)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """The Firestore fault injector (gRPC interceptor) for ``firestore://`` URLs."""
    if url.scheme != "firestore":
        return None
    from .faults import FirestoreFaultInjector

    return FirestoreFaultInjector()


@hookimpl
def proxied_url(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """``url`` through a plain TCP proxy at ``host:port``: only an emulator URL (plaintext
    gRPC, ``emulator_host``) can be; the real service is TLS to Google's endpoint."""
    if url.scheme != "firestore" or url.query_get("emulator_host") is None:
        return None
    return url.with_query(emulator_host=f"{host}:{port}")


@hookimpl
def server_address(url: StoreURL) -> tuple[str, int] | None:
    """The emulator's ``(host, port)`` from ``emulator_host`` (the address the contract's
    proxy forwards to); None for the real service and other schemes."""
    if url.scheme != "firestore":
        return None
    raw = url.query_get("emulator_host")
    if raw is None:
        return None
    host, _, port = raw.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)
