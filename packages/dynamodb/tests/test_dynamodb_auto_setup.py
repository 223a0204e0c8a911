"""``?auto_setup=`` on DynamoDB (moto server): off by default, because a table is billable.
Off, nothing creates the table but ``agent-stores setup URL``, and first use names that
command; on, the first call or a store being entered creates it."""

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
from agent_stores_dynamodb.config import URL_OPTIONS, parse_url
from agent_stores_dynamodb.kv import DynamoDBKV, TableMissingError

OPENERS: list[Any] = [open_sessions, open_memory, open_checkpointer]


def _fresh_table(base_url: str, **options: str) -> str:
    table = f"agent-stores-auto-{uuid.uuid4().hex[:8]}"
    url = StoreURL.parse(base_url).set(host=table)
    return (url.with_query(**options) if options else url).render_with_secrets()


async def _table_exists(url: str) -> bool:
    async with open_kv(StoreURL.parse(url).without_query("auto_setup")) as kv:
        try:
            await kv.get("s", "probe")
        except TableMissingError:
            return False
        return True


def test_auto_setup_is_parsed_with_its_declared_default() -> None:
    assert parse_url("dynamodb://t-1").auto_setup is URL_OPTIONS["auto_setup"].default is False
    assert parse_url("dynamodb://t-1?auto_setup=true").auto_setup is True
    assert open_kv("dynamodb://t-1?auto_setup=yes").auto_setup is True
    with pytest.raises(ConfigError, match="auto_setup must be true or false"):
        parse_url("dynamodb://t-1?auto_setup=2")


def test_a_ready_client_takes_auto_setup_too() -> None:
    client = object()  # never used: nothing is sent before the first call
    assert DynamoDBKV.from_client(client, table="t-1").auto_setup is False
    assert DynamoDBKV.from_client(client, table="t-1", auto_setup=True).auto_setup is True
    with pytest.raises(ConfigError, match="auto_setup must be True or False"):
        DynamoDBKV.from_client(client, table="t-1", auto_setup="true")


@pytest.mark.parametrize("query", [{}, {"auto_setup": "false"}])
@pytest.mark.parametrize("opener", OPENERS)
async def test_auto_setup_off_creates_nothing_and_first_use_names_setup(
    opener: Any, query: dict[str, str], dynamodb_base_url: str
) -> None:
    url = _fresh_table(dynamodb_base_url, **query)
    async with opener(url) as store:
        assert store.kv.auto_setup is False
        with pytest.raises(TableMissingError) as info:
            await store.kv.create("s", "k", b"v")
    message = str(info.value)
    assert "agent-stores setup" in message and "?auto_setup=true" in message
    assert not await _table_exists(url)


@pytest.mark.parametrize("opener", OPENERS)
async def test_auto_setup_on_creates_the_table_when_a_store_is_entered(
    opener: Any, dynamodb_base_url: str
) -> None:
    url = _fresh_table(dynamodb_base_url, auto_setup="true")
    async with opener(url):
        pass
    assert await _table_exists(url)


async def test_auto_setup_on_creates_the_table_on_the_first_call(dynamodb_base_url: str) -> None:
    """The first request finds no table: setup() runs (table, then TTL) and it is sent again."""
    url = _fresh_table(dynamodb_base_url, auto_setup="true")
    async with open_kv(url) as kv:
        assert isinstance(kv, DynamoDBKV)
        version = await kv.create("s", "k", b"v")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"v" and entry.version == version
        client = await kv._get_client()  # inspect what setup created
        ttl = await client.describe_time_to_live(TableName=kv.table)
        assert ttl["TimeToLiveDescription"]["AttributeName"] == "ttl"
