"""The agent-stores plugin of agent-stores-cosmos (entry point ``cosmos`` in group ``agent_stores``).

Importing this module must stay cheap: it never imports the Azure SDK. The URL factory is
an import string resolved only when a ``cosmos://`` URL is opened, and
:func:`kv_from_client` looks at a client only if ``azure.cosmos`` is already imported (a
client object cannot exist otherwise). Sessions, memory and checkpointer use the generic
stores built on :class:`agent_stores_cosmos.kv.CosmosKV`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from agent_stores.backend import RegisterBackend, hookimpl

if TYPE_CHECKING:
    from agent_stores.backend import FaultInjector, KVStore, StoreURL

FACTORY = "agent_stores_cosmos.kv:CosmosKV.from_url"


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    """Register ``cosmos://``."""
    register("cosmos", FACTORY, description="Azure Cosmos DB for NoSQL (azure-cosmos aio)")


@hookimpl
def kv_from_client(client: Any, options: dict[str, Any]) -> KVStore | None:
    """Wrap a ready ``azure.cosmos.aio`` ``CosmosClient`` or ``ContainerProxy`` (never closed).

    A synchronous ``azure.cosmos`` client is refused with a clear error; anything else is
    not ours.
    """
    if "azure.cosmos" not in sys.modules:
        return None
    from azure.cosmos import ContainerProxy as SyncContainer
    from azure.cosmos import CosmosClient as SyncClient
    from azure.cosmos.aio import ContainerProxy, CosmosClient

    if not isinstance(client, ContainerProxy | CosmosClient | SyncContainer | SyncClient):
        return None
    from .kv import CosmosKV

    return CosmosKV.from_client(client, **options)


@hookimpl
def fault_injector(url: StoreURL) -> FaultInjector | None:
    """Azure Cosmos DB's routine faults at the azure-core transport, for ``cosmos://`` URLs.

    See :mod:`agent_stores_cosmos.faults` for the faults and operations it offers.
    """
    if url.scheme != "cosmos":
        return None
    from .faults import CosmosFaultInjector

    return CosmosFaultInjector()


@hookimpl
def proxied_url(url: StoreURL, host: str, port: int) -> StoreURL | None:
    """``url`` through a TCP proxy at ``host:port`` (endpoint discovery off, or the SDK
    would follow the account's regional endpoints around the proxy).

    Over TLS the proxy must be on loopback: the SDK skips certificate checks only for
    127.0.0.1 and localhost, and the certificate names the account. A URL without a host
    (the endpoint in ``$AZURE_COSMOS_CONNECTION_STRING``) is not proxied.
    """
    if url.scheme != "cosmos" or not url.host:
        return None
    return url.set(host=host, port=port).with_query(endpoint_discovery="false")
