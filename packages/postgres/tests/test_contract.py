"""The shared contract suite on PostgreSQL, nothing dropped or overridden.

All classes share one schema for the session (the contract isolates tests by scope).
``nox -s contract -- postgres`` runs the same suite through ``--store-url``; this module
lets ``pytest packages/postgres/tests`` run it too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from agent_stores_contract import CheckpointerContract, KVContract, MemoryContract, SessionContract
from pg_test_support import drop_schema, with_options


@pytest.fixture(scope="session")
def contract_url(postgres_url: str) -> Iterator[str]:
    """The session's database, in a schema of its own."""
    schema = f"contract_{uuid.uuid4().hex[:10]}"
    yield with_options(postgres_url, schema=schema)
    drop_schema(postgres_url, schema)


class PostgresURL:
    """Points a contract class at the PostgreSQL database under test."""

    @pytest.fixture
    def store_url(self, contract_url: str) -> str:
        return contract_url


class TestPostgresKV(PostgresURL, KVContract):
    """The KV CAS contract on PostgreSQL."""


class TestPostgresSessions(PostgresURL, SessionContract):
    """The session contract on PostgreSQL (through the native fast path when present)."""


class TestPostgresMemory(PostgresURL, MemoryContract):
    """The memory contract on PostgreSQL."""


class TestPostgresCheckpointer(PostgresURL, CheckpointerContract):
    """The checkpointer contract on PostgreSQL."""
