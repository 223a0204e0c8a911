"""The session, memory and checkpointer contracts on PostgreSQL through the generic KV ports.

Stores built as a user builds them take the native ports (the plugin's ``*_port`` hooks);
``nox -s contract -- postgres`` runs that path. Here the same contracts run with the
core's generic ports (``store_path = "generic"``), so both paths stay correct.
"""

from __future__ import annotations

from agent_stores_contract import CheckpointerContract, MemoryContract, SessionContract
from pg_test_support import PostgresURL


class TestPostgresSessionsGeneric(PostgresURL, SessionContract):
    """The session contract on PostgreSQL through the generic KV port."""

    store_path = "generic"


class TestPostgresMemoryGeneric(PostgresURL, MemoryContract):
    """The memory contract on PostgreSQL through the generic KV port."""

    store_path = "generic"


class TestPostgresCheckpointerGeneric(PostgresURL, CheckpointerContract):
    """The checkpointer contract on PostgreSQL through the generic two-step append."""

    store_path = "generic"
