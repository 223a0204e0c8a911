"""The moto server for the DynamoDB backend's tests.

The URL comes from ``AGENT_STORES_TEST_DYNAMODB_URL`` (set by ``nox -s tests``); when it
is absent, a private ``moto_server`` is started with ``scripts/servers/dynamodb.py`` for
the test session and stopped afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import pytest_asyncio
from dynamodb_test_support import (
    URL_ENV,
    load_server_module,
    on_a_table_of_its_own,
    with_fresh_prefix,
)


@pytest.fixture(scope="session")
def dynamodb_base_url() -> Iterator[str]:
    """The moto server's URL (shared by the session; tests add a fresh prefix)."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    server = load_server_module()
    if not server.available():
        pytest.fail(f"set {URL_ENV}, or install moto's server: {server.INSTALL_HINT}")
    with server.dynamodb_server() as urls:
        yield urls["dynamodb"]


@pytest.fixture
def dynamodb_url(dynamodb_base_url: str) -> str:
    """The moto server with a fresh prefix."""
    return with_fresh_prefix(dynamodb_base_url)


@pytest_asyncio.fixture
async def own_table_url(dynamodb_base_url: str) -> str:
    """The moto server on a new table of its own, with a fresh prefix: for tests of
    transactions, which moto makes as slow as the whole table is big."""
    return await on_a_table_of_its_own(dynamodb_base_url)
