"""The SQLite ports apply the public KV API's checks before their transaction (issue 24).

Each test first shows what the KV API does with an input (the reference the generic ports
inherit, since they write through it), then that every native port method given the same
input raises the same typed error and writes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agent_stores.backends.sqlite import SQLiteKV
from agent_stores.backends.sqlite_ports import (
    SQLiteJournalPort,
    SQLiteMemoryPort,
    SQLiteSessionPort,
)
from agent_stores.checkpointer.port import AppendRequest
from agent_stores.errors import InvalidIdError, ResourceClosedError, ValueTooLargeError
from agent_stores.memory.port import FileWrite, IndexWrite
from agent_stores.sessions.port import ChunkWrite, SaveRequest, fresh_state
from agent_stores.sessions.records import STATE_KEY

LIMIT = 2048


def bad_ids(limit: int) -> list[Any]:
    """Ids the KV API refuses with InvalidIdError: empty, NUL, too long, lone surrogate, not a str."""
    return ["", "a\x00b", "k" * (limit + 1), "bad\ud800", 7]


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


async def test_memory_write_refuses_invalid_ids(kv: SQLiteKV) -> None:
    """An invalid scope or key of the record, its index entry or a marker raises
    InvalidIdError, as kv.create does, and nothing of the write is stored."""
    port = SQLiteMemoryPort(kv)
    for bad in bad_ids(kv.limits.max_key_chars):
        with pytest.raises(InvalidIdError):
            await kv.create("dir", bad, b"x")
        for write in (
            memory_write(key=bad),
            memory_write(scope=bad),
            memory_write(index=IndexWrite("ops", bad, b"receipt", None)),
            memory_write(index=IndexWrite(bad, "op", b"receipt", None)),
            memory_write(markers=(("parent", bad),)),
            memory_write(markers=((bad, "dir/"),)),
        ):
            with pytest.raises(InvalidIdError):
                await port.write(write)
            assert await kv.get("dir", "f.md") is None, f"{write} stored the record"
    assert await kv.scopes() == []


async def test_session_save_refuses_invalid_ids(kv: SQLiteKV) -> None:
    """An invalid scope, or a chunk key making an invalid part key, raises InvalidIdError
    as the KV API does; the state stays as it was and no part is stored."""
    port = SQLiteSessionPort(kv)
    version = await saved_session(kv, "s")
    before = await kv.get("s", STATE_KEY)
    chunk = ChunkWrite("h/c", [b"[]"], None)
    for bad in bad_ids(kv.limits.max_scope_chars):
        with pytest.raises(InvalidIdError):
            await kv.replace(bad, STATE_KEY, b"state", expected_version=version)
        with pytest.raises(InvalidIdError):
            await port.save(SaveRequest(bad, b"state", version, None, None, [chunk]))
    for bad_key in ("h/\x00", "h/" + "k" * kv.limits.max_key_chars, "h/\ud800"):
        with pytest.raises(InvalidIdError):
            await kv.create("s", f"{bad_key}/0", b"[]")
        with pytest.raises(InvalidIdError):
            await port.save(
                SaveRequest(
                    "s", b"state", version, None, None, [ChunkWrite(bad_key, [b"[]"], None)]
                )
            )
    assert await kv.get("s", STATE_KEY) == before
    assert [item.key for item in await kv.scan("s")] == [STATE_KEY]


async def test_journal_append_refuses_invalid_ids(kv: SQLiteKV) -> None:
    """An invalid scope, counter key or entry key raises InvalidIdError, as kv.create does,
    and neither the counter nor the entry is stored."""
    port = SQLiteJournalPort(kv)
    for bad in bad_ids(kv.limits.max_key_chars):
        with pytest.raises(InvalidIdError):
            await kv.create("run", bad, b"entry")
        for request in (append(scope=bad), append(head_key=bad), append(key=bad)):
            with pytest.raises(InvalidIdError):
                await port.append(request)
    assert await kv.scopes() == []


async def test_journal_append_refuses_an_oversized_counter(kv: SQLiteKV) -> None:
    """A counter value over max_value_bytes raises ValueTooLargeError, as kv.create does,
    and writes neither the counter nor the entry."""
    big = b"9" * (LIMIT + 1)
    with pytest.raises(ValueTooLargeError):
        await kv.create("run", "head/j", big)
    with pytest.raises(ValueTooLargeError):
        await SQLiteJournalPort(kv).append(append(head_value=big))
    assert await kv.scopes() == []


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


async def test_closed_store_refuses_before_any_other_check(tmp_path: Path) -> None:
    """On a closed store every port method raises ResourceClosedError, as the KV API does,
    even for a value that is also too large (the KV API checks the store first)."""
    kv = SQLiteKV(str(tmp_path / "closed.db"), max_value_bytes=LIMIT)
    await kv.setup()
    version = await saved_session(kv, "s")
    await kv.aclose()
    big = b"x" * (LIMIT + 1)
    with pytest.raises(ResourceClosedError):
        await kv.create("dir", "f.md", big)
    with pytest.raises(ResourceClosedError):
        await SQLiteMemoryPort(kv).write(memory_write(value=big))
    with pytest.raises(ResourceClosedError):
        await SQLiteMemoryPort(kv).read("dir", "f.md")
    with pytest.raises(ResourceClosedError):
        await SQLiteJournalPort(kv).append(append(value=big))
    with pytest.raises(ResourceClosedError):
        await SQLiteSessionPort(kv).save(SaveRequest("s", big, version, None, None, []))
