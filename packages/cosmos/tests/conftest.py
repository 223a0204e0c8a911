"""The Cosmos test server for this package's tests.

The URL comes from ``AGENT_STORES_TEST_COSMOS_URL`` (set by ``nox -s tests``). When it is
absent, a private ``@vercel/cosmosdb-server`` is started with ``scripts/servers/cosmos.py``
for the test session and stopped afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from cosmos_test_support import URL_ENV, servers, with_fresh_prefix


@pytest.fixture(scope="session")
def cosmos_base_url() -> Iterator[str]:
    """The test server's URL, from the environment or a private server."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    if not servers.available():
        pytest.fail(f"set {URL_ENV}, or install Node.js >= 18 and npm so the tests can start one")
    with servers.cosmos_server() as urls:
        yield urls["cosmos"]


@pytest.fixture
def cosmos_url(cosmos_base_url: str) -> str:
    """The test server with a fresh prefix."""
    return with_fresh_prefix(cosmos_base_url)
