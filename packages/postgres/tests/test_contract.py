"""The shared contract suite on PostgreSQL, nothing dropped or overridden, on both paths.

All classes share one schema for the session (the contract isolates tests by scope).
``nox -s contract -- postgres`` runs the same suite through ``--store-url``; this module
lets ``pytest packages/postgres/tests`` run it too.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import KVStore
from agent_stores.checkpointer import Checkpointer
from agent_stores.checkpointer.port import KVJournalPort
from agent_stores.memory import KVMemoryStore
from agent_stores.memory.port import KVMemoryPort
from agent_stores.sessions import KVSessionPort, SessionStore
from agent_stores_contract import CheckpointerContract, KVContract, MemoryContract, SessionContract
from agent_stores_contract.base import KVFactory
from agent_stores_contract.checkpointer import CheckpointerFactory
from agent_stores_contract.memory import MemoryFactory
from agent_stores_contract.sessions import SessionsFactory
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


# -- the generic path of each store ---------------------------------------------------------
# The classes above build the stores as a user would, so they take the native ports (the
# plugin's *_port hooks); these run the same contracts with the generic KV ports.


class TestPostgresSessionsGeneric(PostgresURL, SessionContract):
    """The session contract on PostgreSQL through the generic KV port."""

    @pytest_asyncio.fixture
    async def sessions_factory(self, kv_factory: KVFactory) -> AsyncIterator[SessionsFactory]:
        made: list[SessionStore] = []

        async def make(**options: Any) -> SessionStore:
            kv = kv_factory()
            await kv.setup()
            store = SessionStore(kv, owns_kv=True, port=KVSessionPort(kv), **options)
            made.append(store)
            return store

        try:
            yield make
        finally:
            for store in made:
                await store.aclose(timeout_seconds=5)


class TestPostgresMemoryGeneric(PostgresURL, MemoryContract):
    """The memory contract on PostgreSQL through the generic KV port."""

    @pytest.fixture
    def memory_factory(self, memory_prefix: str) -> MemoryFactory:
        def make(kv: KVStore, **options: Any) -> KVMemoryStore:
            return KVMemoryStore(
                kv, port=KVMemoryPort(kv), **{"scope_prefix": memory_prefix, **options}
            )

        return make


class TestPostgresCheckpointerGeneric(PostgresURL, CheckpointerContract):
    """The checkpointer contract on PostgreSQL through the generic two-step append."""

    @pytest_asyncio.fixture
    async def checkpointer_factory(
        self, kv_factory: KVFactory, ns: str
    ) -> AsyncIterator[CheckpointerFactory]:
        opened: list[Checkpointer] = []

        def make(kv: KVStore | None = None, **options: Any) -> Checkpointer:
            kv = kv if kv is not None else kv_factory()
            checkpointer = Checkpointer(
                kv, owns_kv=True, scope_prefix=f"{ns}/", port=KVJournalPort(), **options
            )
            opened.append(checkpointer)
            return checkpointer

        try:
            yield make
        finally:
            for checkpointer in opened:
                await checkpointer.aclose()
            async with Checkpointer(kv_factory(), owns_kv=True, scope_prefix=f"{ns}/") as cleaner:
                while page := await cleaner.list_runs(limit=100):
                    for info in page:
                        await cleaner.delete_run(info.run_id)
                await cleaner.kv.drop_scope(cleaner.space.runs_scope)
