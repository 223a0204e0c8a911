"""A SessionStore built directly on a DynamoDB KV store gets the native port (no I/O needed)."""

from __future__ import annotations

from agent_stores import open_kv, open_sessions
from agent_stores.sessions import SessionStore
from agent_stores_dynamodb.sessions import HANDOVER_COURTESY_SECONDS, DynamoDBSessionPort

URL = "dynamodb://direct?region=us-east-1&endpoint_url=http://127.0.0.1:9"


async def test_direct_and_opened_session_stores_are_native() -> None:
    async with open_kv(URL) as kv:
        assert isinstance(SessionStore(kv).storage.port, DynamoDBSessionPort)
    async with open_sessions(URL) as sessions:
        assert isinstance(sessions.storage.port, DynamoDBSessionPort)
        assert sessions.storage.handover_courtesy_seconds == HANDOVER_COURTESY_SECONDS
