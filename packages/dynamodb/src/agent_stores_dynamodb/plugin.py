"""The agent-stores plugin of agent-stores-dynamodb (entry point in group ``agent_stores``).

Importing this module must stay cheap: it never imports aiobotocore. The URL factory is
an import string resolved only when a ``dynamodb://`` URL is opened, and
:func:`kv_from_client` only looks at a client if aiobotocore is already imported (a
client object cannot exist otherwise). :func:`session_store` hands the core's session
store the native port of :mod:`agent_stores_dynamodb.sessions` (two requests per warm turn).
"""

from __future__ import annotations

import sys
from typing import Any

from agent_stores.hookspecs import RegisterBackend, hookimpl
from agent_stores.kv.base import KVStore
from agent_stores.url import StoreURL

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


@hookimpl
def session_store(url: StoreURL | None, kv: KVStore, options: dict[str, Any]) -> Any | None:
    """The session store on the native port (two requests per warm turn) for a DynamoDB KV."""
    from .kv import DynamoDBKV

    if not isinstance(kv, DynamoDBKV):
        return None
    from agent_stores.sessions import SessionStore

    from .sessions import HANDOVER_COURTESY_SECONDS, DynamoDBSessionPort

    # A DynamoDB request takes milliseconds, not Redis's microseconds: a waiting client
    # needs a wider window to take a released session (only used when one is waiting).
    options = {"handover_courtesy_seconds": HANDOVER_COURTESY_SECONDS, **options}
    return SessionStore(kv, port=DynamoDBSessionPort(kv), **options)
