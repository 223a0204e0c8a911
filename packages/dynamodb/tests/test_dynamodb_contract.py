"""The shared contract suite on DynamoDB (moto server), nothing dropped or overridden.

``nox -s contract -- dynamodb`` runs the same suite through ``AGENT_STORES_CONTRACT_URL``;
this module lets ``pytest packages/dynamodb/tests`` run it too.
"""

from __future__ import annotations

from agent_stores_contract import (
    CheckpointerContract,
    ConversationContract,
    FaultContract,
    KVContract,
    MemoryContract,
    PortContract,
    SessionContract,
)
from dynamodb_test_support import DynamoDBURL


class TestDynamoDBKV(DynamoDBURL, KVContract):
    """The KV CAS contract on DynamoDB."""


class TestDynamoDBSessions(DynamoDBURL, SessionContract):
    """The session contract on DynamoDB."""


class TestDynamoDBMemory(DynamoDBURL, MemoryContract):
    """The memory contract on DynamoDB."""


class TestDynamoDBCheckpointer(DynamoDBURL, CheckpointerContract):
    """The checkpointer contract on DynamoDB."""


class TestDynamoDBFaults(DynamoDBURL, FaultContract):
    """The fault contract on DynamoDB (its own fault injector, the contract's TCP proxy)."""


class TestDynamoDBPorts(DynamoDBURL, PortContract):
    """The port contract on DynamoDB (its session port; generic memory and journal ports)."""


class TestDynamoDBConversations(DynamoDBURL, ConversationContract):
    """Pydantic AI's ConversationStore protocol on DynamoDB (``open_conversations(url)``)."""
