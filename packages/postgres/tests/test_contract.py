"""The shared contract suite on PostgreSQL, nothing dropped or overridden.

All classes share one schema for the session (the contract isolates tests by scope).
The store contracts (sessions, memory, checkpointer) are imported lazily: they run as
soon as the contract-tests distribution ships them, and a missing one is reported as a
skip by :func:`test_store_contract_present` instead of silently not running.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator

import pytest
from agent_stores_contract import KVContract
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


def _contract(name: str) -> type | None:
    """A store contract class, or None when this checkout does not have it yet."""
    contracts = importlib.import_module("agent_stores_contract")
    try:
        return getattr(contracts, name)  # type: ignore[no-any-return]
    except ModuleNotFoundError:
        return None


_SessionContract = _contract("SessionContract")
_MemoryContract = _contract("MemoryContract")
_CheckpointerContract = _contract("CheckpointerContract")

if _SessionContract is not None:

    class TestPostgresSessions(PostgresURL, _SessionContract):  # type: ignore[misc,valid-type]
        """The session contract on PostgreSQL (through the native fast path when present)."""


if _MemoryContract is not None:

    class TestPostgresMemory(PostgresURL, _MemoryContract):  # type: ignore[misc,valid-type]
        """The memory contract on PostgreSQL."""


if _CheckpointerContract is not None:

    class TestPostgresCheckpointer(PostgresURL, _CheckpointerContract):  # type: ignore[misc,valid-type]
        """The checkpointer contract on PostgreSQL."""


@pytest.mark.parametrize(
    ("name", "contract"),
    [
        ("SessionContract", _SessionContract),
        ("MemoryContract", _MemoryContract),
        ("CheckpointerContract", _CheckpointerContract),
    ],
)
def test_store_contract_present(name: str, contract: type | None) -> None:
    """Says loudly when a store contract is not in this checkout (so it did not run here)."""
    if contract is None:
        pytest.skip(f"agent_stores_contract.{name} does not exist yet in this checkout")
