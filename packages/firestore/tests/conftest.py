"""The Firestore emulator for the Firestore backend's tests.

The URL comes from ``AGENT_STORES_TEST_FIRESTORE_URL`` (set by ``nox -s tests`` or by
``python scripts/servers/firestore.py start``). Its data is not cleared: another run may
be using the same emulator, and every test works under a fresh ``prefix`` anyway
(``python scripts/servers/firestore.py reset`` clears it by hand). When the variable is
absent, this file starts one private emulator for the whole test session (it is slow to
boot) and stops it at the end.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from agent_stores_firestore.kv import FirestoreKV
from firestore_test_support import URL_ENV, server, with_fresh_prefix


@pytest.fixture(scope="session")
def firestore_base_url() -> Iterator[str]:
    """The emulator's URL for this test session (from the environment, or a private one)."""
    given = os.environ.get(URL_ENV)
    if given:
        yield given
        return
    problems = server.missing()
    if problems:
        pytest.fail(f"set {URL_ENV}, or install {', '.join(problems)}: {server.INSTALL_HINT}")
    with server.firestore_server() as urls:
        yield urls["firestore"]


@pytest.fixture
def firestore_url(firestore_base_url: str) -> str:
    """The emulator with a fresh prefix."""
    return with_fresh_prefix(firestore_base_url)


@pytest_asyncio.fixture
async def kv(firestore_url: str) -> AsyncIterator[FirestoreKV]:
    """A Firestore store under a fresh prefix, closed after the test."""
    store = FirestoreKV.from_url(firestore_url)
    try:
        yield store
    finally:
        await store.aclose()
