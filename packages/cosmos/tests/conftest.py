"""The Cosmos test server for this package's tests.

The URL comes from ``AGENT_STORES_TEST_COSMOS_URL`` (set by ``nox -s tests``). When it is
absent, a private ``@vercel/cosmosdb-server`` is started with ``scripts/servers/cosmos.py``
for the test session and stopped afterwards. Either way the database and container are
created once, as ``agent-stores setup URL`` does: the store never creates them on its own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from agent_stores import open_kv
from cosmos_test_support import URL_ENV, servers, with_fresh_prefix


def _setup(url: str) -> str:
    """``agent-stores setup URL``: create the database and container (idempotent)."""

    async def run() -> None:
        async with open_kv(url) as kv:
            await kv.setup()

    asyncio.run(run())
    return url


@pytest.fixture(scope="session")
def cosmos_base_url() -> Iterator[str]:
    """The test server's URL, from the environment or a private server."""
    url = os.environ.get(URL_ENV)
    if url:
        yield _setup(url)
        return
    if not servers.available():
        pytest.fail(f"set {URL_ENV}, or install Node.js >= 18 and npm so the tests can start one")
    with servers.cosmos_server() as urls:
        yield _setup(urls["cosmos"])


@pytest.fixture
def cosmos_url(cosmos_base_url: str) -> str:
    """The test server with a fresh prefix."""
    return with_fresh_prefix(cosmos_base_url)
