"""Azure Cosmos DB's routine faults, injected at the azure-core transport (the fault mode).

:class:`CosmosFaultInjector` opens :class:`~agent_stores_cosmos.kv.CosmosKV` stores whose
``CosmosClient`` sends every request through :class:`FaultTransport`, a wrapper around
azure-core's own ``AioHttpTransport`` (the SDK's documented ``transport=`` extension
point). The real server answers every request that is not faulted; a faulted one gets
what Azure would send, through the same SDK code paths:

=============  =============  ===================================================================
fault          kind           what the SDK sees
=============  =============  ===================================================================
``429``        transient      429 with ``x-ms-retry-after-ms`` and substatus 3200 (request rate)
``449``        conflict       449 "retry with" (a concurrent update inside the service)
``408``        transient      408 request timeout
``410``        transient      410 with substatus 1002 (partition key range gone: a split)
``500``        transient      500 internal server error
``503``        transient      503 service unavailable
``reset``      reset          ``ServiceRequestError`` around ``ClientOSError(ECONNRESET)``;
                              the request never reaches the server
``lost_reply`` lost_reply     the write reaches the server and is applied, then the SDK
                              sees ``ServiceRequestError`` around ``ServerDisconnectedError``
                              — exactly what azure-core reports when a reply is cut
``stale_read`` stale_read     a point read answered with the item's previous version (its
                              body and ETag), or, after a delete, its last version
``blackhole``  blackhole      no answer: the request waits for the SDK's read timeout, then
                              ``ServiceResponseTimeoutError``
=============  =============  ===================================================================

Operations (for :meth:`arm`'s ``operation``): ``read`` (a point read of an item),
``write`` (create, replace, upsert, patch or delete of an item) and ``query`` (queries
and ``read_items``). Account, database, container and partition-map requests are never
faulted. ``lost_reply`` only hits writes. ``stale_read`` hits point reads of an item
whose previous version the transport has seen (it keeps the last two bodies per item,
keyed by collection, partition key value ``pk`` and id), and queries, whose returned
documents are each replaced by their previous version where one is known.
"""

from __future__ import annotations

import asyncio
import errno
import json
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from agent_stores.backend import BaseFaultInjector, FaultKind, KVStore, StoreURL
from azure.core.exceptions import ServiceRequestError, ServiceResponseTimeoutError
from azure.core.pipeline.transport import (
    AioHttpTransport,
    AsyncHttpResponse,
    AsyncHttpTransport,
    HttpRequest,
)
from azure.core.utils import CaseInsensitiveDict

from .kv import CosmosKV

#: status, substatus and message of each HTTP fault, as the service sends them
HTTP_FAULTS: dict[str, tuple[int, int, str]] = {
    "429": (429, 3200, "Request rate is large. More Request Units may be needed."),
    "449": (
        449,
        0,
        "Conflicting request to resource has been attempted. Retry to avoid conflicts.",
    ),
    "408": (408, 0, "Request timed out."),
    "410": (410, 1002, "The requested partition key range is gone (it was split)."),
    "500": (500, 0, "Unknown server error occurred when processing this request."),
    "503": (503, 0, "The service is currently unavailable."),
}

FAULTS: dict[str, FaultKind] = {
    "429": FaultKind.TRANSIENT,
    "449": FaultKind.CONFLICT,
    "408": FaultKind.TRANSIENT,
    "410": FaultKind.TRANSIENT,
    "500": FaultKind.TRANSIENT,
    "503": FaultKind.TRANSIENT,
    "reset": FaultKind.RESET,
    "lost_reply": FaultKind.LOST_REPLY,
    "stale_read": FaultKind.STALE_READ,
    "blackhole": FaultKind.BLACKHOLE,
}

_ANY_REQUEST = frozenset({*HTTP_FAULTS, "reset", "blackhole"})
_PK_HEADER = "x-ms-documentdb-partitionkey"
#: the wait of a blackholed request when the SDK gives no read timeout (azure-core's default)
_DEFAULT_READ_TIMEOUT = 300.0


class _FaultResponse(AsyncHttpResponse):
    """A response made by the injector (a fault, or a stale body): what the SDK parses."""

    def __init__(
        self, request: HttpRequest, status: int, headers: Mapping[str, str], body: bytes
    ) -> None:
        super().__init__(request, None)
        self.status_code = status
        self.headers = CaseInsensitiveDict(headers)
        self.reason = "injected"
        self.content_type = self.headers.get("Content-Type")
        self._body = body

    def body(self) -> bytes:
        return self._body

    async def load_body(self) -> None:
        """Nothing to load: the body is in memory."""


class _Item:
    """The last two bodies the transport saw for one item (None: deleted)."""

    __slots__ = ("current", "previous")

    def __init__(self) -> None:
        self.current: dict[str, Any] | None = None
        self.previous: dict[str, Any] | None = None


class FaultTransport(AsyncHttpTransport[HttpRequest, AsyncHttpResponse]):
    """An azure-core transport that carries out :class:`CosmosFaultInjector`'s faults."""

    def __init__(
        self,
        injector: CosmosFaultInjector,
        inner: AsyncHttpTransport[HttpRequest, AsyncHttpResponse] | None = None,
    ) -> None:
        self.injector = injector
        self.inner: Any = inner if inner is not None else AioHttpTransport()

    async def __aenter__(self) -> FaultTransport:
        await self.inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.inner.__aexit__(exc_type, exc_value, traceback)

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def send(self, request: Any, **kwargs: Any) -> Any:
        operation, item = _classify(request)
        self.injector.count_request(_request_name(request, operation))
        if operation is None:
            return await self.inner.send(request, **kwargs)
        eligible = set(_ANY_REQUEST)
        if operation == "write":
            eligible.add("lost_reply")
        if operation == "read" and item is not None and self.injector.has_previous(item):
            eligible.add("stale_read")
        if operation == "query" and self.injector.has_history():
            eligible.add("stale_read")
        fault = self.injector.next_fault(operation, eligible=eligible)
        if fault in HTTP_FAULTS:
            return self._http_fault(request, fault)
        if fault == "reset":
            err: aiohttp.ClientError = aiohttp.ClientOSError(
                errno.ECONNRESET, "Connection reset by peer (injected)"
            )
            raise ServiceRequestError(err, error=err)
        if fault == "blackhole":
            timeout = kwargs.get("read_timeout") or getattr(
                getattr(self.inner, "connection_config", None), "read_timeout", None
            )
            await asyncio.sleep(float(timeout or _DEFAULT_READ_TIMEOUT))
            raise ServiceResponseTimeoutError("Timeout on reading data from socket (injected)")
        response = await self.inner.send(request, **kwargs)
        self.injector.observe(request, item, response)
        if fault == "lost_reply":
            cut = aiohttp.ServerDisconnectedError("reply lost (injected)")
            raise ServiceRequestError(cut, error=cut)
        if fault == "stale_read" and operation == "query":
            return self._stale_query(request, response)
        if fault == "stale_read" and item is not None:
            stale = self.injector.previous_body(item)
            if stale is not None:
                headers = dict(response.headers)
                headers["etag"] = str(stale.get("_etag", ""))
                headers["Content-Type"] = "application/json"
                headers.pop("Content-Encoding", None)
                return _FaultResponse(request, 200, headers, json.dumps(stale).encode())
        return response

    def _stale_query(self, request: Any, response: Any) -> Any:
        """A query answered by a lagging replica: each document it returns whose previous
        version the transport has seen is replaced by that version."""
        if int(getattr(response, "status_code", 0) or 0) != 200:
            return response
        try:
            page = json.loads(response.body() or b"null")
        except (ValueError, UnicodeDecodeError):
            return response
        documents = page.get("Documents") if isinstance(page, dict) else None
        if not isinstance(documents, list):
            return response
        collection = _collection(request)
        page["Documents"] = [
            (self.injector.previous_body(_item_key(collection, doc)) or doc)
            if isinstance(doc, dict) and "_etag" in doc
            else doc
            for doc in documents
        ]
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        headers.pop("Content-Encoding", None)
        return _FaultResponse(request, 200, headers, json.dumps(page).encode())

    def _http_fault(self, request: Any, fault: str) -> _FaultResponse:
        status, substatus, message = HTTP_FAULTS[fault]
        headers = {
            "Content-Type": "application/json",
            "x-ms-substatus": str(substatus),
            "x-ms-activity-id": "00000000-0000-0000-0000-000000000000",
            "x-ms-request-charge": "0",
        }
        if status == 429:
            headers["x-ms-retry-after-ms"] = str(self.injector.retry_after_ms)
        body = json.dumps({"code": str(status), "message": message}).encode()
        return _FaultResponse(request, status, headers, body)


def _collection(request: Any) -> str:
    path = unquote(urlsplit(str(request.url)).path).rstrip("/")
    return path.rpartition("/docs")[0]


def _partition_value(header: Any) -> str:
    """The partition key value from the SDK's header (a JSON list), as the item holds it."""
    if header is None:
        return ""
    try:
        parsed = json.loads(str(header))
    except ValueError:
        return str(header)
    if isinstance(parsed, list) and len(parsed) == 1:
        return str(parsed[0])
    return str(parsed)


def _item_key(collection: str, body: Mapping[str, Any]) -> tuple[str, str, str]:
    return (collection, str(body.get("pk", "")), str(body.get("id", "")))


def _classify(request: Any) -> tuple[str | None, tuple[str, str, str] | None]:
    """``(operation, item)`` of a request: operation None for account/database/container
    requests; ``item`` = (collection path, partition key header, id) for point requests."""
    path = unquote(urlsplit(str(request.url)).path).rstrip("/")
    head, sep, tail = path.rpartition("/docs")
    if not sep:
        return None, None
    headers = request.headers
    method = str(request.method).upper()
    pk = _partition_value(headers.get(_PK_HEADER))
    if tail == "":
        # POST to the collection's docs: a query (or read_items) or a create.
        is_query = str(headers.get("x-ms-documentdb-isquery", "")).lower() == "true" or (
            "query" in str(headers.get("Content-Type", ""))
        )
        if method == "POST" and not is_query:
            return "write", (head, pk, "")
        return "query", None
    item = (head, pk, tail.lstrip("/"))
    if method == "GET":
        return "read", item
    return "write", item


def _request_name(request: Any, operation: str | None) -> str:
    """What a request does, as counted: ``read``, ``query``, ``create``, ``replace``,
    ``patch``, ``delete``, ``batch`` (a transactional batch), or for a request that is not
    about items its resource type (``account``, ``dbs``, ``colls``, ``pkranges``...)."""
    method = str(request.method).upper()
    if operation is None:
        segments = [s for s in urlsplit(str(request.url)).path.split("/") if s]
        resource = segments[-1] if len(segments) % 2 else segments[-2] if segments else ""
        return f"{method} {resource or 'account'}"
    if operation != "write":
        return operation
    if str(request.headers.get("x-ms-cosmos-is-batch-request", "")).lower() == "true":
        return "batch"
    return {"POST": "create", "PUT": "replace", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


class CosmosFaultInjector(BaseFaultInjector):
    """Azure Cosmos DB's routine faults at the azure-core transport (see the module doc)."""

    faults: Mapping[str, FaultKind] = FAULTS
    #: Throttled, retry-with, gone and unavailable are rejections; after a 408 or a 500 a
    #: write may have been applied (the store treats them so), so they are not.
    rejections: frozenset[str] | None = frozenset({"429", "449", "410", "503"})

    def __init__(self, *, retry_after_ms: int = 50) -> None:
        super().__init__()
        #: the ``x-ms-retry-after-ms`` of an injected 429
        self.retry_after_ms = retry_after_ms
        self._items: dict[tuple[str, str, str], _Item] = {}
        self._items_lock = threading.Lock()

    async def open_kv(self, url: StoreURL | str, **options: Any) -> KVStore:
        """A :class:`CosmosKV` for ``url`` whose requests pass through this injector."""
        kv = CosmosKV.from_url(url, **options)
        kv._transport = FaultTransport(self)
        return kv

    def transport(self) -> FaultTransport:
        """A transport for a ``CosmosClient`` of your own (``CosmosClient(…, transport=…)``)."""
        return FaultTransport(self)

    # -- the item history stale reads are served from ------------------------------------

    def has_previous(self, item: tuple[str, str, str]) -> bool:
        with self._items_lock:
            found = self._items.get(item)
            return found is not None and found.previous is not None

    def has_history(self) -> bool:
        with self._items_lock:
            return any(found.previous is not None for found in self._items.values())

    def previous_body(self, item: tuple[str, str, str]) -> dict[str, Any] | None:
        with self._items_lock:
            found = self._items.get(item)
            return None if found is None else found.previous

    def observe(self, request: Any, item: tuple[str, str, str] | None, response: Any) -> None:
        """Remember the body a successful item request returned (or that it deleted one)."""
        if item is None:
            return
        status = int(getattr(response, "status_code", 0) or 0)
        method = str(request.method).upper()
        body: dict[str, Any] | None = None
        if method == "DELETE":
            if status != 204:
                return
        elif status in (200, 201):
            try:
                parsed = json.loads(response.body() or b"null")
            except (ValueError, UnicodeDecodeError):
                return
            if not isinstance(parsed, dict) or "_etag" not in parsed:
                return
            body = parsed
            item = _item_key(item[0], parsed)
        else:
            return
        with self._items_lock:
            known = self._items.setdefault(item, _Item())
            current = known.current
            if (
                body is not None
                and current is not None
                and current.get("_etag") == body.get("_etag")
            ):
                return  # the same version read again
            if known.current is not None:
                known.previous = known.current
            known.current = body
            if body is None and known.previous is None:
                del self._items[item]


__all__ = ["FAULTS", "HTTP_FAULTS", "CosmosFaultInjector", "FaultTransport"]
