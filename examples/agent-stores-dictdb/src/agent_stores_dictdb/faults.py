"""The fault injector of dictdb: breaks requests at the client's transport, ``DictKV.execute``.

The database answers every request that is not faulted; a fault is what a network and a
busy server do routinely: the request is refused before it is applied (``Unavailable``,
``Reset``: the client sends it again, up to its budget), or it is applied and its reply
never arrives (``LostReply``, writes only: the caller hears BackendUnavailableError and
must find out what happened). Operation names for ``arm``: the KV primitives' (``get``,
``get_many``, ``create``, ``replace``, ``delete``, ``scan``, ``scopes``, ``drop_scope``,
``commit``, ``purge_expired``) and the ports' (``sessions.acquire``, ``sessions.save``,
``memory.read``, ``memory.write``, ``journal.append``).
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_stores.backend import BaseFaultInjector, FaultKind, StoreURL

from .kv import DictKV


class DictFaultInjector(BaseFaultInjector):
    faults: Mapping[str, FaultKind] = {
        "Unavailable": FaultKind.TRANSIENT,
        "Reset": FaultKind.RESET,
        "LostReply": FaultKind.LOST_REPLY,
    }

    async def open_kv(self, url: StoreURL, **options: object) -> DictKV:
        kv = DictKV.from_url(url, **options)
        kv.injector = self
        return kv
