"""The SQLite ports apply the public KV API's checks before their transaction (issue 24).

Invalid ids, oversized values and a closed client are the port contract's
(``ports.port_methods_refuse_what_the_kv_api_refuses`` and
``ports.port_methods_on_a_closed_client_raise_resource_closed``, on every backend); here
what it does not check: TTLs of zero or less.

Each test first shows what the KV API does with an input (the reference the generic ports
inherit, since they write through it), then that every native port method given the same
input raises the same typed error and writes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from agent_stores.backends.sqlite import SQLiteKV
from agent_stores.backends.sqlite_ports import (
    SQLiteJournalPort,
    SQLiteMemoryPort,
    SQLiteSessionPort,
)
from agent_stores.checkpointer.port import AppendRequest
from agent_stores.memory.port import FileWrite, IndexWrite
from agent_stores.sessions.port import ChunkWrite, SaveRequest, fresh_state
from agent_stores.sessions.records import STATE_KEY

LIMIT = 2048


@pytest_asyncio.fixture
async def kv(tmp_path: Path) -> AsyncIterator[SQLiteKV]:
    store = SQLiteKV(str(tmp_path / "ports.db"), max_value_bytes=LIMIT)
    await store.setup()
    try:
        yield store
    finally:
        await store.aclose()


def memory_write(
    *,
    scope: str = "dir",
    key: str = "f.md",
    value: bytes = b"record",
    ttl: float | None = None,
    index: IndexWrite | None = None,
    markers: tuple[tuple[str, str], ...] = (),
) -> FileWrite:
    return FileWrite(scope, key, value, None, ttl, index, list(markers))


def append(
    *,
    scope: str = "run",
    head_key: str = "head/j",
    head_value: bytes = b'{"next":1}',
    key: str = "j/a",
    value: bytes = b"entry",
    ttl: float | None = None,
) -> AppendRequest:
    return AppendRequest(scope, head_key, head_value, None, key, value, ttl)


async def saved_session(kv: SQLiteKV, scope: str) -> str:
    now = kv.clock()
    return await kv.create(scope, STATE_KEY, fresh_state("seed", now + 10, now))


async def test_ports_refuse_non_positive_ttls(kv: SQLiteKV) -> None:
    """A TTL of zero or less raises ValueError, as the KV API does, instead of writing an
    entry that is expired at once."""
    version = await saved_session(kv, "s")
    with pytest.raises(ValueError, match="ttl"):
        await kv.create("dir", "f.md", b"x", ttl=0)
    memory = SQLiteMemoryPort(kv)
    with pytest.raises(ValueError, match="ttl"):
        await memory.write(memory_write(ttl=0))
    with pytest.raises(ValueError, match="ttl"):
        await memory.write(memory_write(index=IndexWrite("ops", "op", b"receipt", -1)))
    with pytest.raises(ValueError, match="ttl"):
        await SQLiteJournalPort(kv).append(append(ttl=0))
    sessions = SQLiteSessionPort(kv)
    with pytest.raises(ValueError, match="ttl"):
        await sessions.save(SaveRequest("s", b"state", version, 0, None, []))
    chunk = ChunkWrite("h/c", [b"[]"], None)
    with pytest.raises(ValueError, match="ttl"):
        await sessions.save(SaveRequest("s", b"state", version, None, -5, [chunk]))
    assert await kv.scopes() == ["s"]
    assert [item.key for item in await kv.scan("s")] == [STATE_KEY]
