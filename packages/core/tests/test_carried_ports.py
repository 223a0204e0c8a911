"""KV wrappers carry their inner store's native ports (issue 24: no test bypasses the port).

A store built on ``CountingKV(sqlite)`` or on the KV-level fault injector's wrapper must run
SQLite's own ports, each port call counted or faulted as one request; ``native_ports=False``
and a ``ports`` attribute set by hand decide instead of the plugins.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores import BackendUnavailableError
from agent_stores.backend import NativePorts
from agent_stores.backends.sqlite import SQLiteKV
from agent_stores.backends.sqlite_ports import SQLiteJournalPort, SQLiteMemoryPort
from agent_stores.checkpointer import Checkpointer, JournalEvent, make_step_id
from agent_stores.kv.carried import CarriedJournalPort, CarriedMemoryPort, CarriedSessionPort
from agent_stores.kv.counting import CountingKV
from agent_stores.kv.faulty import KVFaultInjector
from agent_stores.memory import KVMemoryStore
from agent_stores.memory.port import KVMemoryPort
from agent_stores.sessions import SessionStore
from agent_stores.sessions.port import KVSessionPort
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai_harness.memory import MemoryOperation


def pair(tag: str) -> list[ModelRequest | ModelResponse]:
    return [
        ModelRequest(parts=[UserPromptPart(f"q:{tag}")]),
        ModelResponse(parts=[TextPart(f"a:{tag}")]),
    ]


@pytest.fixture
async def sqlite(tmp_path: Path) -> SQLiteKV:
    kv = SQLiteKV(tmp_path / "carried.db")
    await kv.setup()
    return kv


async def test_counting_kv_runs_the_native_ports_and_counts_each_call(sqlite: SQLiteKV) -> None:
    counting = CountingKV(sqlite)
    async with SessionStore(counting) as sessions:
        assert isinstance(sessions.storage.port, CarriedSessionPort)
        async with sessions.turn("s") as session:
            session.replace(pair("one"))
        assert counting.calls["sessions.save"] >= 1
        assert counting.calls["replace"] == 0, "the state was written by the port, not the KV API"
        assert counting.bytes_written > 0
    memory = KVMemoryStore(counting, scope_prefix="m:")
    assert isinstance(memory.port, CarriedMemoryPort)
    assert isinstance(memory.port.inner, SQLiteMemoryPort)
    await memory.write("u/main/a.md", "hello", expected_version=None)
    assert counting.calls["memory.write"] == 1
    checkpointer = Checkpointer(counting, scope_prefix="j:")
    assert isinstance(checkpointer.port, CarriedJournalPort)
    assert isinstance(checkpointer.port.inner, SQLiteJournalPort)
    await checkpointer.append("r", JournalEvent.attempted(make_step_id(0, "model"), {}))
    assert counting.calls["journal.append"] == 1
    await sqlite.aclose()


async def test_native_ports_false_gives_the_generic_ports(sqlite: SQLiteKV) -> None:
    counting = CountingKV(sqlite, native_ports=False)
    async with SessionStore(counting) as sessions:
        assert isinstance(sessions.storage.port, KVSessionPort)
    assert isinstance(KVMemoryStore(counting).port, KVMemoryPort)
    await sqlite.aclose()


async def test_a_lost_reply_on_a_native_memory_write_replays(sqlite: SQLiteKV) -> None:
    """The fault lands on the whole port call: the write is applied, the caller hears of a
    lost connection, and the retry with the same operation replays it."""
    injector = KVFaultInjector()
    faulty = injector.wrap(sqlite)
    memory = KVMemoryStore(faulty, scope_prefix="m:")
    assert isinstance(memory.port, CarriedMemoryPort)
    operation = MemoryOperation(id="op-1", fingerprint="fp")
    injector.arm("LostReply", operation="memory.write")
    with pytest.raises(BackendUnavailableError):
        await memory.write("u/main/a.md", "landed", expected_version=None, operation=operation)
    assert injector.injected() == {"LostReply": 1}
    retry = await memory.write("u/main/a.md", "landed", expected_version=None, operation=operation)
    assert retry.replayed
    read = await memory.read("u/main/a.md", max_chars=100)
    assert read is not None and read.content == "landed"
    await sqlite.aclose()


async def test_ports_set_on_the_kv_store_win_over_the_plugins(sqlite: SQLiteKV) -> None:
    sqlite.ports = NativePorts()  # "generic everywhere", decided by the user
    assert isinstance(KVMemoryStore(sqlite).port, KVMemoryPort)
    mine = KVMemoryPort(sqlite)
    sqlite.ports = NativePorts(memory=mine)
    assert KVMemoryStore(sqlite).port is mine
    await sqlite.aclose()
