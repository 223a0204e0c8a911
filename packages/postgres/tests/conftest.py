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

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pg_test_support import URL_ENV, drop_schema, libpq_conninfo, servers, with_options


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of an empty database for this test session."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    with servers.postgres_server() as urls:
        yield urls["postgres"]


@pytest.fixture(scope="session")
def contract_url(postgres_url: str) -> Iterator[str]:
    """The session's database in a schema of its own, shared by the contract classes."""
    schema = f"contract_{uuid.uuid4().hex[:10]}"
    yield with_options(postgres_url, schema=schema)
    drop_schema(postgres_url, schema)


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
