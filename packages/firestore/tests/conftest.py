"""The Firestore emulator for the Firestore backend's tests.

The URL comes from ``AGENT_STORES_TEST_FIRESTORE_URL`` (set by ``nox -s tests`` or by
``python scripts/servers/firestore.py start``); its data is cleared once through the
emulator's REST endpoint before the run. When the variable is absent, this file starts
one private emulator for the whole test session (it is slow to boot) and stops it at
the end. Every test works under a fresh ``prefix``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from agent_stores import StoreURL
from firestore_test_support import URL_ENV, emulator_port, server, with_fresh_prefix


@pytest.fixture(scope="session")
def firestore_base_url() -> Iterator[str]:
    """The emulator's URL for this test session (from the environment, or a private one)."""
    given = os.environ.get(URL_ENV)
    if given:
        server.reset(emulator_port(given), StoreURL.parse(given).host or server.PROJECT)
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
