"""DynamoDB's routine faults, injected at botocore's transport (the contract's fault mode).

:class:`DynamoDBFaultInjector` opens :class:`~agent_stores_dynamodb.kv.DynamoDBKV` stores
whose aiobotocore client carries one async ``before-send`` handler (aiobotocore awaits
async handlers, and the first response a ``before-send`` handler returns replaces the HTTP
send: the hook moto's in-process mock uses too). Per request it asks :meth:`BaseFaultInjector.next_fault` for a
fault, and carries it out where the SDK would meet it, so botocore's retry handlers, its
error parser and the store's own error mapping all run as they would against AWS; every
request that is not faulted reaches the real server (moto, DynamoDB Local, AWS).

Faults (name: kind, what the SDK sees), named after what the service sends:

* ``ThrottlingException``, ``ProvisionedThroughputExceededException``,
  ``RequestLimitExceeded``: transient; HTTP 400 with that error, any data operation;
* ``InternalServerError``: transient; HTTP 500 with that error;
* ``HTTP500``, ``HTTP503``: transient; the bare status, empty body;
* ``TransactionConflictException``: conflict; on PutItem, UpdateItem, DeleteItem;
* ``TransactionCanceledException:TransactionConflict``: conflict, and
  ``TransactionCanceledException:ThrottlingError``: transient; on TransactWriteItems;
* ``reset``: reset; the connection breaks before the request is sent;
* ``lost_reply``: lost_reply; the request is sent and applied, then the connection breaks;
* ``blackhole``: blackhole; the request goes to a socket that accepts and never answers.

A cancelled transaction carries one CancellationReasons entry per operation: the named code
on the last operation (the state write of a session save) and ``None`` on the others, as
DynamoDB reports the items that were fine. ``ConditionalCheckFailed`` is deliberately not
offered: the service never reports it unless the condition really failed, so injecting it
would be a false verdict, not a routine fault (a real failed condition reaches the store
from the server itself, and maps to a ConflictError naming that operation). Strongly
consistent reads never lag, so there is no ``stale_read`` fault either.

Operation names for :meth:`~BaseFaultInjector.arm` are DynamoDB's: ``GetItem``,
``PutItem``, ``DeleteItem``, ``Query``, ``BatchGetItem``, ``BatchWriteItem``,
``TransactWriteItems``, … Control-plane requests (``DescribeTable``, ``CreateTable``,
``UpdateTimeToLive``) are never faulted.
"""

from __future__ import annotations

import json
import socket
import threading
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from agent_stores.backend import BaseFaultInjector, FaultKind, KVStore, StoreURL

from .kv import DynamoDBKV

T = FaultKind
_TYPE_PREFIX = "com.amazonaws.dynamodb.v20120810#"

#: Every fault offered, by name, with its standard kind.
FAULTS: dict[str, FaultKind] = {
    "ThrottlingException": T.TRANSIENT,
    "ProvisionedThroughputExceededException": T.TRANSIENT,
    "RequestLimitExceeded": T.TRANSIENT,
    "InternalServerError": T.TRANSIENT,
    "HTTP500": T.TRANSIENT,
    "HTTP503": T.TRANSIENT,
    "TransactionConflictException": T.CONFLICT,
    "TransactionCanceledException:TransactionConflict": T.CONFLICT,
    "TransactionCanceledException:ThrottlingError": T.TRANSIENT,
    "reset": T.RESET,
    "lost_reply": T.LOST_REPLY,
    "blackhole": T.BLACKHOLE,
}

#: The data-plane operations faults are injected into.
DATA_OPERATIONS = frozenset(
    {
        "GetItem",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "Query",
        "Scan",
        "BatchGetItem",
        "BatchWriteItem",
        "TransactGetItems",
        "TransactWriteItems",
    }
)
_SINGLE_ITEM_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
_ANY_OPERATION = frozenset(name for name in FAULTS if not name.startswith("Transaction"))

_MESSAGES = {
    "ThrottlingException": "Rate of requests exceeds the allowed throughput.",
    "ProvisionedThroughputExceededException": (
        "The level of configured provisioned throughput for the table was exceeded. "
        "Consider increasing your provisioning level with the UpdateTable API."
    ),
    "RequestLimitExceeded": (
        "Throughput exceeds the current throughput limit for your account. "
        "Please contact AWS Support at https://aws.amazon.com/support request a limit increase"
    ),
    "InternalServerError": "Internal server error",
    "TransactionConflictException": "Transaction is ongoing for the item",
}
_REASON_MESSAGES = {
    "TransactionConflict": "Transaction is ongoing for the item",
    "ThrottlingError": "Throughput exceeds the current capacity for one or more global "
    "secondary indexes. DynamoDB is automatically scaling your index so please be patient.",
}


def eligible_faults(operation: str) -> frozenset[str]:
    """The faults a request of ``operation`` can carry (DynamoDB's own rules)."""
    if operation not in DATA_OPERATIONS:
        return frozenset()
    if operation == "TransactWriteItems":
        return _ANY_OPERATION | {
            "TransactionCanceledException:TransactionConflict",
            "TransactionCanceledException:ThrottlingError",
        }
    if operation in _SINGLE_ITEM_WRITES:
        return _ANY_OPERATION | {"TransactionConflictException"}
    return _ANY_OPERATION


def _response(status: int, body: bytes, error_type: str | None = None) -> Any:
    """An aiobotocore HTTP response, as the transport would have produced it."""
    from aiobotocore.awsrequest import AioAWSResponse  # type: ignore[import-untyped]
    from botocore.awsrequest import HeadersDict  # type: ignore[import-untyped]

    headers = HeadersDict(
        {
            "x-amzn-requestid": "AGENTSTORESFAULTINJECTED0000000000000000000000000000",
            "content-type": "application/x-amz-json-1.0",
            "content-length": str(len(body)),
        }
    )
    if error_type is not None:
        headers["x-amzn-errortype"] = error_type
    response = AioAWSResponse("https://dynamodb.invalid/", status, headers, None)
    response._content = body  # read by convert_to_response_dict instead of the raw stream
    return response


def _error(code: str, status: int = 400, **extra: Any) -> Any:
    message = _MESSAGES.get(code, code)
    body = json.dumps({"__type": _TYPE_PREFIX + code, "message": message, **extra}).encode()
    return _response(status, body, f"{code}:")


def _cancelled(reason: str, body: bytes | None) -> Any:
    try:
        items = len(json.loads(body or b"{}").get("TransactItems", [])) or 1
    except ValueError:
        items = 1
    reasons: list[dict[str, str]] = [{"Code": "None"} for _ in range(items - 1)]
    reasons.append({"Code": reason, "Message": _REASON_MESSAGES[reason]})
    codes = ", ".join(r["Code"] for r in reasons)
    body_out = json.dumps(
        {
            "__type": _TYPE_PREFIX + "TransactionCanceledException",
            "Message": "Transaction cancelled, please refer cancellation reasons for specific "
            f"reasons [{codes}]",
            "CancellationReasons": reasons,
        }
    ).encode()
    return _response(400, body_out, "TransactionCanceledException:")


class Blackhole:
    """A local TCP socket that accepts connections (in the kernel's backlog) and never
    answers: connect succeeds, the reply never comes. Thread- and loop-agnostic."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(1024)
        self.host, self.port = self._socket.getsockname()[:2]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._socket.close()


class DynamoDBFaultInjector(BaseFaultInjector):
    """:class:`~agent_stores.faults.FaultInjector` for DynamoDB (see the module doc)."""

    faults: Mapping[str, FaultKind] = FAULTS
    #: Throttling and a write meeting a transaction are rejected, nothing applied; a 500
    #: (InternalServerError) on a write "may have succeeded or failed" (AWS), so it is not one.
    rejections: frozenset[str] | None = frozenset(
        {
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
            "TransactionConflictException",
        }
    )

    def __init__(self) -> None:
        super().__init__()
        self._blackhole: Blackhole | None = None
        self._blackhole_lock = threading.Lock()

    async def open_kv(self, url: StoreURL | str, **options: Any) -> KVStore:
        """A DynamoDB store for ``url`` whose every client carries this injector's hook."""
        return DynamoDBKV.from_url(url, on_client=self.install, **options)

    def install(self, client: Any) -> None:
        """Register the injector on an aiobotocore DynamoDB client (any client: the store's,
        or a ready one passed to ``open_kv(client, table=…)``)."""

        async def before_send(request: Any, event_name: str = "", **_: Any) -> Any:
            return await self._before_send(client, request, event_name.rsplit(".", 1)[-1])

        client.meta.events.register("before-send.dynamodb", before_send)

    def close(self) -> None:
        """Close the blackhole socket, if one was opened."""
        with self._blackhole_lock:
            if self._blackhole is not None:
                self._blackhole.close()
                self._blackhole = None

    def _blackhole_url(self) -> str:
        with self._blackhole_lock:
            if self._blackhole is None:
                self._blackhole = Blackhole()
                # Closed by close(), or with the injector (the protocol has no close).
                weakref.finalize(self, self._blackhole.close)
            return self._blackhole.url

    async def _before_send(self, client: Any, request: Any, operation: str) -> Any:
        self.count_request(operation)
        eligible = eligible_faults(operation)
        if not eligible:
            return None
        fault = self.next_fault(operation, eligible=eligible)
        if fault is None:
            return None
        from botocore.exceptions import (  # type: ignore[import-untyped]
            ConnectionClosedError,
            EndpointConnectionError,
        )

        if fault == "reset":
            # Broken before the request left: botocore knows nothing was sent.
            raise EndpointConnectionError(endpoint_url=request.url)
        if fault == "lost_reply":
            # The request really reaches the server and is applied; the SDK never sees
            # the reply. aiobotocore's own HTTP session sends it (the transport the SDK
            # would have used), and the body is read whole so the server has finished.
            sent = await client._endpoint.http_session.send(request)
            await sent.content
            raise ConnectionClosedError(endpoint_url=request.url)
        if fault == "blackhole":
            # Sent by the SDK's transport to a peer that accepts and never answers: its
            # read timeout (and the store's deadline) are what end the wait.
            path = request.url.split("://", 1)[-1].partition("/")[2]
            request.url = f"{self._blackhole_url()}/{path}"
            return None
        if fault == "HTTP500":
            return _response(500, b"")
        if fault == "HTTP503":
            return _response(503, b"")
        if fault == "InternalServerError":
            return _error("InternalServerError", 500)
        if fault.startswith("TransactionCanceledException:"):
            return _cancelled(fault.partition(":")[2], request.body)
        return _error(fault)


def fault_injector_for(url: StoreURL) -> DynamoDBFaultInjector | None:
    """The injector for a ``dynamodb://`` URL (the plugin's ``fault_injector`` hook)."""
    return DynamoDBFaultInjector() if url.scheme == "dynamodb" else None


def proxied(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """``url`` reaching its endpoint through a TCP proxy at ``host:port`` (plain HTTP).

    Only for an explicit ``http://`` endpoint (an emulator); AWS itself is reached over
    HTTPS with its certificate, which a plain TCP proxy cannot stand in for.
    """
    endpoint = url.query_get("endpoint_url") or ""
    if url.scheme != "dynamodb" or not endpoint.startswith("http://"):
        return None
    return url.with_query(endpoint_url=f"http://{host}:{port}")


def endpoint_address(url: StoreURL) -> tuple[str, int] | None:
    """``(host, port)`` of ``url``'s ``http://`` ``endpoint_url`` (port 80 if none given)."""
    endpoint = url.query_get("endpoint_url") or ""
    if url.scheme != "dynamodb" or not endpoint.startswith("http://"):
        return None
    parts = urlsplit(endpoint)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or 80
