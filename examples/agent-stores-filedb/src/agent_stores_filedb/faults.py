"""The fault injector of the contract's fault mode: faults at the client's transport.

A folder has no network, so the faults are made where a client sends its requests
(``FileKV.execute``, through the ``transport`` it is opened with): ``Busy`` refuses a
request before it is applied (the lock not had in time; the client sends it again within
its budget), ``LostReply`` applies a write and loses its reply (the caller sees
``BackendUnavailableError`` and must find out what happened). The client never re-sends
a request whose reply was lost, so ``resends_writes`` stays False.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agent_stores.backend import (
    BackendUnavailableError,
    BaseFaultInjector,
    FaultKind,
    KVStore,
    StoreURL,
)

from .kv import FileKV, FolderBusyError, Request

T = TypeVar("T")


class FileFaultInjector(BaseFaultInjector):
    faults: Mapping[str, FaultKind] = {
        "Busy": FaultKind.TRANSIENT,
        "LostReply": FaultKind.LOST_REPLY,
    }

    async def open_kv(self, url: StoreURL, **options: Any) -> KVStore:
        return FileKV.from_url(url, transport=self.intercept, **options)

    async def intercept(self, request: Request, send: Callable[[], Awaitable[T]]) -> T:
        self.count_request(request.operation)
        fault = self.next_fault(request.operation, eligible=None if request.writes else ["Busy"])
        if fault == "Busy":
            raise FolderBusyError(f"injected: {request.operation} refused, the folder is busy")
        reply = await send()
        if fault == "LostReply":
            raise BackendUnavailableError(
                detail=f"injected: the reply to {request.operation} was lost"
            )
        return reply
