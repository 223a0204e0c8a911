"""agent-stores-dynamodb: the Amazon DynamoDB backend of agent-stores.

Installing the distribution is enough: ``dynamodb://TABLE?region=…`` URLs then work with
``agent_stores.connect`` / ``open_sessions`` / ``open_memory`` / ``open_checkpointer``,
and a ready aiobotocore DynamoDB client can be passed instead of a URL (with
``table=…``). Create the table once with ``agent-stores setup URL``.

Attributes are imported lazily so that loading the plugin does not import aiobotocore.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import DynamoDBSettings, parse_url
    from .kv import DynamoDBKV, StaleConditionError, TableMissingError

_LAZY = {
    "DynamoDBKV": "agent_stores_dynamodb.kv",
    "StaleConditionError": "agent_stores_dynamodb.kv",
    "TableMissingError": "agent_stores_dynamodb.kv",
    "DynamoDBSettings": "agent_stores_dynamodb.config",
    "parse_url": "agent_stores_dynamodb.config",
}

__all__ = [
    "DynamoDBKV",
    "DynamoDBSettings",
    "StaleConditionError",
    "TableMissingError",
    "parse_url",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
