"""The session and memory contracts on DynamoDB through the generic KV ports.

Session and memory stores built as a user builds them take the DynamoDB ports (the
plugin's ``session_port`` and ``memory_port`` hooks); ``nox -s contract -- dynamodb`` runs
that path. Here the same contracts run with the core's generic ports
(``store_path = "generic"``). The checkpointer has no DynamoDB port: the contract session
already runs its only path.
"""

from __future__ import annotations

from agent_stores_contract import MemoryContract, SessionContract
from dynamodb_test_support import DynamoDBURL


class TestDynamoDBSessionsGeneric(DynamoDBURL, SessionContract):
    """The session contract on DynamoDB through the generic KV port."""

    store_path = "generic"


class TestDynamoDBMemoryGeneric(DynamoDBURL, MemoryContract):
    """The memory contract on DynamoDB through the generic KV port."""

    store_path = "generic"
