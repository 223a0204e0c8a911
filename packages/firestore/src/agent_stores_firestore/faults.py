"""Firestore's routine faults, injected at the gRPC channel (a ``grpc.aio`` client interceptor).

:class:`FirestoreFaultInjector` is the backend's
:class:`~agent_stores.faults.FaultInjector` (the ``fault_injector`` hook of
:mod:`agent_stores_firestore.plugin`). :meth:`~FirestoreFaultInjector.open_kv` opens a
:class:`~agent_stores_firestore.kv.FirestoreKV` whose own gRPC channel carries the injector's
interceptor, so every request of the store passes through it and the real server (the
emulator) answers every request that is not faulted. Nothing above the channel is replaced:
the errors reach google-api-core's error mapping and the store's retries exactly as the
service's own would.

Faults (name: kind):

* ``ABORTED`` (conflict), ``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, ``DEADLINE_EXCEEDED``,
  ``INTERNAL`` (transient): the request is not sent; the call fails with that status.
* ``RESET`` (reset): the request is not sent; the call fails as a broken connection does
  (UNAVAILABLE, "Connection reset by peer").
* ``LOST_REPLY`` and ``LOST_REPLY_DEADLINE`` (lost_reply, ``Commit`` only): the commit is
  sent and applied by the server, then the caller gets UNAVAILABLE ("Socket closed") or
  DEADLINE_EXCEEDED instead of its reply.
* ``BLACKHOLE`` (blackhole): the request is not sent and no answer comes: the call waits
  out its own gRPC timeout and fails with DEADLINE_EXCEEDED (for a whole silent server,
  put a TCP proxy in front of the emulator: the ``proxied_url`` hook).

Operations (for :meth:`arm`'s ``operation``): the gRPC method names the store calls,
``Commit`` (every write), ``BatchGetDocuments`` (point reads), ``RunQuery`` (scans) and
``ListDocuments``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc  # type: ignore[import-untyped]
from agent_stores.backend import BaseFaultInjector, FaultKind

if TYPE_CHECKING:
    from agent_stores.backend import KVStore, StoreURL

FAULTS: Mapping[str, FaultKind] = {
    "ABORTED": FaultKind.CONFLICT,
    "UNAVAILABLE": FaultKind.TRANSIENT,
    "RESOURCE_EXHAUSTED": FaultKind.TRANSIENT,
    "DEADLINE_EXCEEDED": FaultKind.TRANSIENT,
    "INTERNAL": FaultKind.TRANSIENT,
    "RESET": FaultKind.RESET,
    "LOST_REPLY": FaultKind.LOST_REPLY,
    "LOST_REPLY_DEADLINE": FaultKind.LOST_REPLY,
    "BLACKHOLE": FaultKind.BLACKHOLE,
}

#: Faults a request can carry whatever it is; the lost replies only on a ``Commit``.
_ANY_REQUEST = frozenset(f for f, kind in FAULTS.items() if kind is not FaultKind.LOST_REPLY)
_COMMIT = frozenset(FAULTS)

#: The status and message the caller sees for each fault (as the service or gRPC words them).
_STATUS: Mapping[str, tuple[grpc.StatusCode, str]] = {
    "ABORTED": (
        grpc.StatusCode.ABORTED,
        "Too much contention on these documents. Please try again.",
    ),
    "UNAVAILABLE": (grpc.StatusCode.UNAVAILABLE, "The service is currently unavailable."),
    "RESOURCE_EXHAUSTED": (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Quota exceeded (injected).",
    ),
    "DEADLINE_EXCEEDED": (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
    "INTERNAL": (grpc.StatusCode.INTERNAL, "Internal error encountered."),
    "RESET": (grpc.StatusCode.UNAVAILABLE, "recvmsg:Connection reset by peer"),
    "LOST_REPLY": (grpc.StatusCode.UNAVAILABLE, "Socket closed"),
    "LOST_REPLY_DEADLINE": (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
    "BLACKHOLE": (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
}


def _error(fault: str) -> grpc.aio.AioRpcError:
    code, message = _STATUS[fault]
    return grpc.aio.AioRpcError(
        code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details=message,
        debug_error_string=f"injected by agent_stores_firestore.faults: {fault}",
    )


def _operation(details: Any) -> str:
    method = details.method
    if isinstance(method, bytes):
        method = method.decode("ascii", "replace")
    return str(method).rsplit("/", 1)[-1]


async def _before(injector: FirestoreFaultInjector, details: Any) -> str | None:
    """The fault for this request; raises the ones that stop it before it is sent."""
    operation = _operation(details)
    injector.count_request(operation)
    eligible = _COMMIT if operation == "Commit" else _ANY_REQUEST
    fault = injector.next_fault(operation, eligible=eligible)
    if fault is None or FAULTS[fault] is FaultKind.LOST_REPLY:
        return fault
    if fault == "BLACKHOLE":
        # Nothing ever answers: the call lasts its whole timeout (forever without one).
        if details.timeout is None:
            await asyncio.Event().wait()
        await asyncio.sleep(details.timeout)
    raise _error(fault)


# grpc.aio files an interceptor under the first of its kinds only: one class per kind.


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Commit and ListDocuments: every fault, a lost reply on a Commit."""

    def __init__(self, injector: FirestoreFaultInjector) -> None:
        self._injector = injector

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        fault = await _before(self._injector, details)
        call = await continuation(details, request)
        if fault is None:
            return call
        # A lost reply: the server applies the commit; the caller never learns it.
        await call
        raise _error(fault)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """BatchGetDocuments and RunQuery: faults before the request is sent."""

    def __init__(self, injector: FirestoreFaultInjector) -> None:
        self._injector = injector

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        await _before(self._injector, details)
        return await continuation(details, request)


class FirestoreFaultInjector(BaseFaultInjector):
    """Injects Firestore's routine gRPC faults into the stores it opens (see the module doc)."""

    faults = FAULTS
    #: ABORTED and RESOURCE_EXHAUSTED were not applied; UNAVAILABLE, DEADLINE_EXCEEDED and
    #: INTERNAL may come after a write ran (see ``agent_stores_firestore.kv._classify``).
    rejections: frozenset[str] | None = frozenset({"ABORTED", "RESOURCE_EXHAUSTED"})

    def __init__(self) -> None:
        super().__init__()
        #: The ``grpc.aio`` client interceptors to put on a channel (one per call kind).
        self.interceptors: list[Any] = [_UnaryUnary(self), _UnaryStream(self)]

    async def open_kv(self, url: StoreURL | str, **options: Any) -> KVStore:
        """A :class:`~agent_stores_firestore.kv.FirestoreKV` for ``url`` whose channel carries
        this injector's interceptor (options as for ``FirestoreKV.from_url``)."""
        from .kv import FirestoreKV

        options = dict(options)
        interceptors = [*(options.pop("interceptors", None) or ()), *self.interceptors]
        return FirestoreKV.from_url(url, interceptors=interceptors, **options)


__all__ = ["FAULTS", "FirestoreFaultInjector"]
