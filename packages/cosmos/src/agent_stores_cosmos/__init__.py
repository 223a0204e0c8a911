"""Azure Cosmos DB for NoSQL backend for agent-stores (azure-cosmos aio).

``cosmos://ACCOUNT_HOST[:PORT]/DATABASE[/CONTAINER]?prefix=…`` (see ``docs/cosmos.md``).
Importing this package does not import the Azure SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kv import CosmosKV

__all__ = ["CosmosKV"]


def __getattr__(name: str) -> Any:
    if name == "CosmosKV":
        from .kv import CosmosKV

        return CosmosKV
    raise AttributeError(name)
