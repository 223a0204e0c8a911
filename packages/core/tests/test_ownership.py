"""One ownership rule: a store closes only what it created."""

from __future__ import annotations

import pytest
from agent_stores import connect, open_checkpointer, open_memory, open_sessions
from agent_stores.backends.memory import MemoryKV


@pytest.mark.parametrize("opener", [open_sessions, open_memory, open_checkpointer])
async def test_a_passed_in_kv_store_stays_open(opener: object) -> None:
    kv = MemoryKV()
    async with opener(kv) as store:  # type: ignore[operator]
        assert store is not None
    assert not kv.closed
    await kv.create("s", "k", b"still usable")
    await kv.aclose()


@pytest.mark.parametrize("opener", [open_sessions, open_memory, open_checkpointer])
async def test_a_store_opened_from_a_url_closes_its_kv(opener: object) -> None:
    store = opener("memory://ownership")  # type: ignore[operator]
    async with store:
        kv = store.kv
    assert kv.closed


async def test_a_connection_leaves_a_passed_in_kv_open() -> None:
    kv = MemoryKV()
    connection = connect(kv)
    await connection.aclose()
    assert not kv.closed
    url_connection = connect("memory://ownership-url")
    await url_connection.aclose()
    assert url_connection.kv.closed
    await kv.aclose()
