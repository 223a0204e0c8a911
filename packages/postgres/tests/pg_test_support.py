"""Helpers shared by the PostgreSQL backend's tests.

A uniquely named module (not ``conftest``), so tests can import it even when several
packages' test folders run in one pytest process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
from agent_stores import StoreURL
from agent_stores_postgres.config import PostgresConfig
from psycopg.conninfo import make_conninfo

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVERS_SCRIPT = REPO_ROOT / "scripts" / "servers" / "postgres.py"
URL_ENV = "AGENT_STORES_TEST_POSTGRES_URL"


def load_servers_module() -> ModuleType:
    """``scripts/servers/postgres.py`` loaded by path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("agent_stores_servers_postgres", SERVERS_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the file executes.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


servers = load_servers_module()


def libpq_conninfo(url: str) -> str:
    """The libpq connection string of a store URL (store-only query options removed)."""
    return make_conninfo("", **PostgresConfig.from_url(url).conninfo)


def with_options(url: str, **options: str) -> str:
    """``url`` with query options set (secrets kept: for handing to the store)."""
    return StoreURL.parse(url).with_query(**options).render_with_secrets()


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it."""
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(schema)
            )
        )


class PostgresURL:
    """Points a contract class at the schema the contract classes share (``contract_url``)."""

    @pytest.fixture
    def store_url(self, contract_url: str) -> str:
        return contract_url
