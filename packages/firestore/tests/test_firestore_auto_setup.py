"""``?auto_setup=`` on Firestore: accepted with the meaning it has on every backend, though
Firestore has nothing to create (no schema); ``false`` only keeps entering a store from
running ``setup()``'s connection probe."""

from __future__ import annotations

from typing import Any

import pytest
from agent_stores import ConfigError, open_checkpointer, open_kv, open_memory, open_sessions
from agent_stores_firestore.config import URL_OPTIONS, parse_url
from agent_stores_firestore.kv import FirestoreKV

OPENERS: list[Any] = [open_sessions, open_memory, open_checkpointer]


def test_auto_setup_is_parsed_with_its_declared_default() -> None:
    assert parse_url("firestore://p/c").auto_setup is URL_OPTIONS["auto_setup"].default is True
    assert parse_url("firestore://p/c?auto_setup=false").auto_setup is False
    assert open_kv("firestore://p/c?auto_setup=off").auto_setup is False
    with pytest.raises(ConfigError, match="auto_setup must be true or false"):
        parse_url("firestore://p/c?auto_setup=later")


@pytest.mark.parametrize("flag", ["false", "true"])
@pytest.mark.parametrize("opener", OPENERS)
async def test_entering_a_store_creates_nothing_either_way(
    opener: Any, flag: str, firestore_url: str
) -> None:
    async with opener(f"{firestore_url}&auto_setup={flag}") as store:
        kv = store.kv
        assert isinstance(kv, FirestoreKV) and kv.auto_setup is (flag == "true")
        # setup() (the probe) builds the client: only entering with auto_setup on runs it.
        assert (kv._client is not None) is (flag == "true")
        assert await kv.scopes() == []  # entering wrote nothing under the prefix
        version = await kv.create("s", "k", b"v")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.version == version
