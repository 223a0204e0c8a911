"""Helpers shared by the DynamoDB tests (a uniquely named module: ``conftest`` names collide
when several packages' tests run in one pytest process)."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest
import pytest_asyncio
from agent_stores import StoreURL, open_kv

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVER_SCRIPT = REPO_ROOT / "scripts" / "servers" / "dynamodb.py"
URL_ENV = "AGENT_STORES_TEST_DYNAMODB_URL"
#: Seconds per contract test on moto (``nox -s contract -- dynamodb --contract-timeout 600``).
CONTRACT_TIMEOUT = 600


def load_server_module() -> ModuleType:
    """``scripts/servers/dynamodb.py`` loaded by path (it is not a package)."""
    name = "agent_stores_dynamodb_test_server"
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, SERVER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def with_fresh_prefix(url: str) -> str:
    """``url`` with a new random ``prefix`` so tests never see each other's data."""
    parsed = StoreURL.parse(url)
    return parsed.with_query(prefix=f"t-{uuid.uuid4().hex[:12]}").render_with_secrets()


def with_options(url: str, **options: str) -> str:
    """``url`` with the given query options set."""
    return StoreURL.parse(url).with_query(**options).render_with_secrets()


async def on_a_table_of_its_own(url: str) -> str:
    """``url`` with a fresh prefix on a new table, created here.

    moto copies the whole table for every item of a TransactWriteItems (its rollback
    backup), so on one table shared by a whole contract run each transaction grows slower
    as earlier tests' items pile up: late in the run, concurrent memory writes (one
    transaction each) took seconds and hit the deadline. DynamoDB itself does no such
    thing; a table per test keeps moto's copy to the test's own items.
    """
    parsed = StoreURL.parse(with_fresh_prefix(url))
    fresh = parsed.set(host=f"agent-stores-test-{uuid.uuid4().hex[:12]}").render_with_secrets()
    kv = open_kv(fresh)
    try:
        await kv.setup()
    finally:
        await kv.aclose()
    return fresh


# moto handles one request at a time (see scripts/servers/dynamodb.py): the tests that
# start worker processes need more than the contract's default deadline on a busy machine.
@pytest.mark.timeout(CONTRACT_TIMEOUT)
class DynamoDBURL:
    """Runs a contract class on the moto server, a table of its own per test."""

    @pytest_asyncio.fixture
    async def store_url(self, dynamodb_base_url: str) -> str:
        return await on_a_table_of_its_own(dynamodb_base_url)
