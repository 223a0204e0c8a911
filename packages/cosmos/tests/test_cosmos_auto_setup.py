"""``?auto_setup=`` on Cosmos DB (the test server): off by default, because a database and
a container are billable. Off, entering a store creates nothing and first use names
``agent-stores setup URL``; on, entering a store creates them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from agent_stores import (
    ConfigError,
    StoreURL,
    open_checkpointer,
    open_kv,
    open_memory,
    open_sessions,
)
from agent_stores_cosmos.config import URL_OPTIONS, parse_url
from agent_stores_cosmos.kv import ContainerMissingError, CosmosKV

OPENERS: list[Any] = [open_sessions, open_memory, open_checkpointer]
KEY = "not-a-real-key"


def _fresh_database(cosmos_url: str, **options: str) -> tuple[str, str]:
    database = f"auto-{uuid.uuid4().hex[:8]}"
    url = StoreURL.parse(cosmos_url).set(path=f"/{database}/state").with_query(**options)
    return url.render_with_secrets(), database


async def _database_ids(cosmos_url: str) -> set[str]:
    settings = CosmosKV.from_url(cosmos_url)._settings
    assert settings is not None and settings.key is not None
    from azure.cosmos.aio import CosmosClient

    async with CosmosClient(
        settings.endpoint, credential=settings.key, enable_endpoint_discovery=False
    ) as client:
        return {str(d["id"]) async for d in client.list_databases()}


def test_auto_setup_is_parsed_with_its_declared_default() -> None:
    base = f"cosmos://localhost:8081/db?key={KEY}"
    assert parse_url(base).auto_setup is URL_OPTIONS["auto_setup"].default is False
    assert parse_url(f"{base}&auto_setup=true").auto_setup is True
    assert open_kv(f"{base}&auto_setup=on").auto_setup is True
    with pytest.raises(ConfigError, match="auto_setup must be true or false"):
        parse_url(f"{base}&auto_setup=perhaps")


@pytest.mark.parametrize("query", [{}, {"auto_setup": "false"}])
@pytest.mark.parametrize("opener", OPENERS)
async def test_auto_setup_off_creates_nothing_and_first_use_names_setup(
    opener: Any, query: dict[str, str], cosmos_url: str
) -> None:
    url, database = _fresh_database(cosmos_url, **query)
    async with opener(url) as store:
        assert store.kv.auto_setup is False
        with pytest.raises(ContainerMissingError, match="agent-stores setup URL"):
            await store.kv.get("s", "k")
    assert database not in await _database_ids(cosmos_url)


@pytest.mark.parametrize("opener", OPENERS)
async def test_auto_setup_on_creates_them_when_a_store_is_entered(
    opener: Any, cosmos_url: str
) -> None:
    url, database = _fresh_database(cosmos_url, auto_setup="true")
    async with opener(url) as store:
        assert database in await _database_ids(cosmos_url)
        version = await store.kv.create("s", "k", b"v")
        entry = await store.kv.get("s", "k")
        assert entry is not None and entry.version == version
