"""Servers and helpers for the PostgreSQL backend's tests.

The server comes from ``AGENT_STORES_TEST_POSTGRES_URL`` (nox sets it), pointing at an
empty database the tests may create schemas in. When it is absent, this file asks
``scripts/servers/postgres.py`` for a fresh database on the machine's server (or a
throwaway cluster) for the test session and removes it afterwards. Tests that restart a
server always get their own throwaway cluster (:func:`cluster`).

Every test works in its own schema (``schema_url``), dropped afterwards, so runs never
see each other's tables.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of an empty database for this test session."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    with servers.postgres_server() as urls:
        yield urls["postgres"]


@pytest.fixture
def schema_name() -> str:
    """A fresh schema name for one test."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def schema_url(postgres_url: str, schema_name: str) -> Iterator[str]:
    """``postgres_url`` in a schema of its own, dropped after the test."""
    yield with_options(postgres_url, schema=schema_name)
    drop_schema(postgres_url, schema_name)


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit superuser connection for inspecting and sabotaging the server."""
    with psycopg.connect(libpq_conninfo(postgres_url), autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    """A private throwaway cluster that tests may stop and restart."""
    with servers.throwaway_cluster() as running:
        yield running
