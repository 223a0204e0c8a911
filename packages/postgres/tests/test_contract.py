"""The shared contract suite on PostgreSQL, nothing dropped or overridden (native ports).

All classes share one schema for the session (the contract isolates tests by scope).
``nox -s contract -- postgres`` runs the same suite through ``--store-url``; this module
lets ``pytest packages/postgres/tests`` run it too. The generic path runs in
``test_postgres_generic_path``.
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
from pg_test_support import PostgresURL


class TestPostgresKV(PostgresURL, KVContract):
    """The KV CAS contract on PostgreSQL."""


class TestPostgresSessions(PostgresURL, SessionContract):
    """The session contract on PostgreSQL (through the native fast path when present)."""


class TestPostgresMemory(PostgresURL, MemoryContract):
    """The memory contract on PostgreSQL."""


class TestPostgresCheckpointer(PostgresURL, CheckpointerContract):
    """The checkpointer contract on PostgreSQL."""


class TestPostgresFaults(PostgresURL, FaultContract):
    """The fault contract on PostgreSQL (its own fault injector, the contract's TCP proxy)."""


class TestPostgresPorts(PostgresURL, PortContract):
    """The port contract on PostgreSQL (its session, memory and journal ports)."""


class TestPostgresConversations(PostgresURL, ConversationContract):
    """Pydantic AI's ConversationStore protocol on PostgreSQL (``open_conversations(url)``)."""
