"""The agent-stores plugin of agent-stores-dynamodb (entry point in group ``agent_stores``).

Importing this module must stay cheap: it never imports aiobotocore. The URL factory is
an import string resolved only when a ``dynamodb://`` URL is opened, and
:func:`kv_from_client` only looks at a client if aiobotocore is already imported (a
client object cannot exist otherwise). :func:`session_port` gives every session store on a
DynamoDB KV the native port of :mod:`agent_stores_dynamodb.sessions` (two requests per warm
turn); :func:`session_store` adds DynamoDB's wider hand-over courtesy for ``open_sessions``.
:func:`fault_injector`, :func:`server_address` and :func:`proxied_url` serve the
contract's fault mode.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from agent_stores.backend import KVStore, RegisterBackend, StoreURL, hookimpl

if TYPE_CHECKING:
    from agent_stores.backend import FaultInjector, MemoryPort, SessionPort

    from .kv import DynamoDBKV

FACTORY = "agent_stores_dynamodb.kv:DynamoDBKV.from_url"


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register ``dynamodb``."""
    register("dynamodb", FACTORY, description="Amazon DynamoDB (one table per app, aiobotocore)")


def is_dynamodb_client(client: Any) -> bool:
    """True for an aiobotocore client of the DynamoDB service."""
    if "aiobotocore" not in sys.modules:
        return False
    from aiobotocore.client import AioBaseClient  # type: ignore[import-untyped]

    if not isinstance(client, AioBaseClient):
        return False
    return bool(client.meta.service_model.service_name == "dynamodb")


@hookimpl
def kv_from_client(client: Any, options: dict[str, Any]) -> KVStore | None:
    """Wrap a ready aiobotocore DynamoDB client (options: ``table``, ``prefix``); never closed by the store."""
    if not is_dynamodb_client(client):
        return None
    from .kv import DynamoDBKV

    return DynamoDBKV.from_client(client, **options)


def _dynamodb(kv: KVStore) -> DynamoDBKV | None:
    # A DynamoDB store exists only once its module is imported: never import it here.
    kv_module = sys.modules.get("agent_stores_dynamodb.kv")
    if kv_module is None or not isinstance(kv, kv_module.DynamoDBKV):
        return None
    return cast("DynamoDBKV", kv)


@hookimpl
def session_port(kv: KVStore) -> SessionPort | None:
    """The native session port (two requests per warm turn) for a DynamoDB KV."""
    dynamodb_kv = _dynamodb(kv)
    if dynamodb_kv is None:
        return None
    from .sessions import DynamoDBSessionPort

    return DynamoDBSessionPort(dynamodb_kv)


@hookimpl
def memory_port(kv: KVStore) -> MemoryPort | None:
    """The native memory port (record, receipt and markers in one TransactWriteItems)."""
    dynamodb_kv = _dynamodb(kv)
    if dynamodb_kv is None:
        return None
    from .memory import DynamoDBMemoryPort

    return DynamoDBMemoryPort(dynamodb_kv)


@hookimpl
def session_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The session store on the native port, with DynamoDB's wider hand-over courtesy."""
    dynamodb_kv = _dynamodb(kv)
    if dynamodb_kv is None:
        return None
    from agent_stores.backend import SessionStore

    from .sessions import HANDOVER_COURTESY_SECONDS

    # A DynamoDB request takes milliseconds, not Redis's microseconds: a waiting client
    # needs a wider window to take a released session (only used when one is waiting).
    # The port comes from session_port above unless the caller passes one.
    options = {"handover_courtesy_seconds": HANDOVER_COURTESY_SECONDS, **options}
    return SessionStore(dynamodb_kv, **options)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """DynamoDB's fault injector (:mod:`agent_stores_dynamodb.faults`) for ``dynamodb://``."""
    if url.scheme != "dynamodb":
        return None
    from .faults import fault_injector_for

    return fault_injector_for(url)


@hookimpl
def proxied_url(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """``url`` with ``endpoint_url=http://host:port`` (only for an ``http://`` endpoint)."""
    if url.scheme != "dynamodb":
        return None
    from .faults import proxied

    return proxied(url, host, port)


@hookimpl
def server_address(url: StoreURL) -> tuple[str, int] | None:
    """The ``(host, port)`` of an ``http://`` ``endpoint_url`` (the only kind a plain TCP
    proxy can stand in for); None for AWS's own HTTPS endpoints and other schemes."""
    if url.scheme != "dynamodb":
        return None
    from .faults import endpoint_address

    return endpoint_address(url)
