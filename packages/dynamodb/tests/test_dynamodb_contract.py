"""The shared contract suite on DynamoDB (moto server), nothing dropped or overridden.

``nox -s contract -- dynamodb`` runs the same suite through ``AGENT_STORES_CONTRACT_URL``;
this module lets ``pytest packages/dynamodb/tests`` run it too.
"""

from __future__ import annotations

import pytest
from agent_stores_contract import CheckpointerContract, KVContract, MemoryContract, SessionContract
from dynamodb_test_support import CONTRACT_TIMEOUT, with_fresh_prefix


# moto handles one request at a time (see scripts/servers/dynamodb.py): the tests that
# start worker processes need more than the contract's default deadline on a busy machine.
@pytest.mark.timeout(CONTRACT_TIMEOUT)
class DynamoDBURL:
    """Runs a contract class on the moto server, a fresh prefix per test."""

    @pytest.fixture
    def store_url(self, dynamodb_base_url: str) -> str:
        return with_fresh_prefix(dynamodb_base_url)


class TestDynamoDBKV(DynamoDBURL, KVContract):
    """The KV CAS contract on DynamoDB."""


class TestDynamoDBSessions(DynamoDBURL, SessionContract):
    """The session contract on DynamoDB."""


class TestDynamoDBMemory(DynamoDBURL, MemoryContract):
    """The memory contract on DynamoDB."""


class TestDynamoDBCheckpointer(DynamoDBURL, CheckpointerContract):
    """The checkpointer contract on DynamoDB."""
