"""The shared contract suite on the Cosmos test server (npm ``@vercel/cosmosdb-server``).

Nothing is dropped or overridden: the backend works around the server's gaps (see
``docs/cosmos.md``) and declares ``commit`` unsupported there. ``nox -s contract -- cosmos``
runs the same suite through ``AGENT_STORES_CONTRACT_URL``.
"""

from __future__ import annotations

import pytest
from agent_stores_contract import (
    CheckpointerContract,
    ConversationContract,
    FaultContract,
    KVContract,
    MemoryContract,
    PortContract,
    SessionContract,
)


class CosmosURL:
    """Runs a contract class on the Cosmos test server, with a fresh prefix per test."""

    @pytest.fixture
    def store_url(self, cosmos_url: str) -> str:
        return cosmos_url


class TestCosmosKV(CosmosURL, KVContract):
    """The KV CAS contract on Cosmos."""


class TestCosmosSessions(CosmosURL, SessionContract):
    """The session contract on Cosmos (generic store)."""


class TestCosmosMemory(CosmosURL, MemoryContract):
    """The memory contract on Cosmos (generic store)."""


class TestCosmosCheckpointer(CosmosURL, CheckpointerContract):
    """The checkpointer contract on Cosmos (generic store)."""


class TestCosmosFaults(CosmosURL, FaultContract):
    """The fault contract on Cosmos DB (its own fault injector, the contract's TCP proxy)."""


class TestCosmosPorts(CosmosURL, PortContract):
    """The port contract on Cosmos DB (the generic ports, as it offers no native ones)."""


class TestCosmosConversations(CosmosURL, ConversationContract):
    """Pydantic AI's ConversationStore protocol on Cosmos DB (``open_conversations(url)``)."""
