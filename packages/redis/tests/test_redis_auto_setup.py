"""``?auto_setup=`` on Redis: accepted with the meaning it has on every backend, though Redis
has nothing to create (no schema), so the stores work the same either way."""

from __future__ import annotations

from typing import Any

import pytest
from agent_stores import ConfigError, open_checkpointer, open_kv, open_memory, open_sessions
from agent_stores_redis.config import URL_OPTIONS, parse_url
from agent_stores_redis.kv import DEFAULT_MAX_CONNECTIONS
from redis_test_support import with_fresh_prefix

OPENERS: list[Any] = [open_sessions, open_memory, open_checkpointer]


def test_auto_setup_is_parsed_with_its_declared_default() -> None:
    assert parse_url("redis://h").auto_setup is URL_OPTIONS["auto_setup"].default is True
    assert parse_url("redis://h?auto_setup=false").auto_setup is False
    assert parse_url("redis+cluster://h:7000?auto_setup=off").auto_setup is False
    assert open_kv("redis://h?auto_setup=no").auto_setup is False
    assert open_kv("unix:///run/redis.sock").auto_setup is True
    with pytest.raises(ConfigError, match="auto_setup must be true or false"):
        parse_url("redis://h?auto_setup=sometimes")


def test_the_declared_pool_size_is_the_one_used() -> None:
    """The declaration lives in config.py, which must not import the driver kv.py needs."""
    assert URL_OPTIONS["max_connections"].default_text().startswith(f"{DEFAULT_MAX_CONNECTIONS} ")


@pytest.mark.parametrize("flag", ["false", "true"])
@pytest.mark.parametrize("opener", OPENERS)
async def test_entering_a_store_creates_nothing_either_way(
    opener: Any, flag: str, redis_url: str
) -> None:
    url = f"{with_fresh_prefix(redis_url)}&auto_setup={flag}"
    async with opener(url) as store:
        assert store.kv.auto_setup is (flag == "true")
        assert await store.kv.scopes() == []  # entering wrote nothing under the prefix
        version = await store.kv.create("s", "k", b"v")
        entry = await store.kv.get("s", "k")
        assert entry is not None and entry.version == version
