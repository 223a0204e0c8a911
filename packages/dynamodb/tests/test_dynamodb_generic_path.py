"""The session contract on DynamoDB through the generic KV port.

Session stores built as a user builds them take the DynamoDB session port (the plugin's
``session_port`` hook); ``nox -s contract -- dynamodb`` runs that path. Here the same
contract runs with the core's generic port (``store_path = "generic"``). Memory and the
checkpointer have no DynamoDB port: the contract session already runs their only path.
"""

from __future__ import annotations

from agent_stores_contract import SessionContract
from dynamodb_test_support import DynamoDBURL


class TestDynamoDBSessionsGeneric(DynamoDBURL, SessionContract):
    """The session contract on DynamoDB through the generic KV port."""

    store_path = "generic"
