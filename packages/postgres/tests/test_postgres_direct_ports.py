"""Stores built directly on a PostgreSQL KV store get the native ports, like open_*."""

from __future__ import annotations

from agent_stores import open_kv
from agent_stores.checkpointer import Checkpointer
from agent_stores.memory import KVMemoryStore
from agent_stores.sessions import SessionStore
from agent_stores_postgres.ports import PostgresJournalPort, PostgresMemoryPort
from agent_stores_postgres.sessions import PostgresSessionPort


async def test_direct_stores_are_native(schema_url: str) -> None:
    async with open_kv(schema_url) as kv:
        assert isinstance(SessionStore(kv).storage.port, PostgresSessionPort)
        assert isinstance(KVMemoryStore(kv).port, PostgresMemoryPort)
        assert isinstance(Checkpointer(kv).space.port, PostgresJournalPort)
