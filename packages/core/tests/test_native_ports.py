"""The SQLite ports: the contracts on the generic path too, and one transaction per store write.

Stores on a SQLite KV take the SQLite ports by default (the ``*_port`` hooks of the
builtin plugin), so ``nox -s contract -- sqlite`` runs the native path; the classes here
run the same contracts with the generic KV ports given explicitly (and semantic search
without the sqlite-vec index).

Transactions are counted from SQLite's own statement trace (``set_trace_callback`` on the
store's connection), never timed.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import connect
from agent_stores.backend import AcquireReply, AcquireRequest
from agent_stores.backends.sqlite import SQLiteKV
from agent_stores.backends.sqlite_ports import SQLiteSessionPort
from agent_stores.checkpointer import JournalEvent
from agent_stores.memory import KVMemoryStore
from agent_stores.memory._harness import MemoryOperation
from agent_stores.memory.port import KVMemoryPort
from agent_stores.sessions import KVSessionPort, SessionBusyError, SessionStore
from agent_stores_contract import (
    CheckpointerContract,
    MemoryContract,
    SemanticContract,
    SessionContract,
)
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart


class SQLiteURL:
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/native.db?max_value_bytes=16384"


class TestSQLiteSessionsGeneric(SQLiteURL, SessionContract):
    """The session contract on SQLite through the generic KV port."""

    store_path = "generic"


class TestSQLiteMemoryGeneric(SQLiteURL, MemoryContract):
    """The memory contract on SQLite through the generic KV port."""

    store_path = "generic"


class TestSQLiteSemanticGeneric(SQLiteURL, SemanticContract):
    """The semantic search contract on SQLite through the generic path (no sqlite-vec)."""

    store_path = "generic"


class TestSQLiteCheckpointerGeneric(SQLiteURL, CheckpointerContract):
    """The checkpointer contract on SQLite through the generic two-step append."""

    store_path = "generic"


# -- one transaction per write -----------------------------------------------------------------


class Trace:
    """SQLite's statement trace of one store connection."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    async def attach(self, kv: SQLiteKV) -> None:
        await kv.transaction(lambda c: c.set_trace_callback(self.statements.append))
        self.statements.clear()

    def transactions(self) -> int:
        """Committed transactions: explicit ones plus writes run outside them (autocommit)."""
        count = 0
        inside = False
        for statement in self.statements:
            word = statement.strip().split()[0].upper()
            if word == "BEGIN":
                inside = True
            elif word in ("COMMIT", "END"):
                inside = False
                count += 1
            elif not inside and word in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
                count += 1
        return count

    def writes_outside_transactions(self) -> list[str]:
        out: list[str] = []
        inside = False
        for statement in self.statements:
            word = statement.strip().split()[0].upper()
            if word == "BEGIN":
                inside = True
            elif word in ("COMMIT", "END", "ROLLBACK"):
                inside = False
            elif not inside and word in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
                out.append(statement)
        return out


@pytest_asyncio.fixture
async def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/{uuid.uuid4().hex[:8]}.db"


async def test_memory_write_is_one_transaction(sqlite_url: str) -> None:
    """A create in a new directory and each replace with a receipt: one BEGIN IMMEDIATE … COMMIT."""
    async with connect(sqlite_url) as conn:
        memory = conn.memory()
        kv = conn.kv
        assert isinstance(kv, SQLiteKV)
        trace = Trace()
        await trace.attach(kv)
        created = await memory.write(
            "u/deep/a.md", "v0", expected_version=None, operation=MemoryOperation("op0", "f0")
        )
        assert trace.transactions() == 1 and trace.writes_outside_transactions() == []
        version = created.version
        for i in range(1, 5):
            trace.statements.clear()
            done = await memory.write(
                "u/deep/a.md",
                f"v{i}",
                expected_version=version,
                operation=MemoryOperation(f"op{i}", f"f{i}"),
            )
            assert trace.transactions() == 1, trace.statements
            version = done.version
        # Everything a write promises holds: listing, receipts, the index.
        assert await memory.list_paths("u/", limit=10) == ["u/deep/a.md"]
        found = await memory.get_operation(MemoryOperation("op4", "f4"))
        assert found is not None and found.version == version
        replay = await memory.write(
            "u/deep/a.md", "v4", expected_version="stale", operation=MemoryOperation("op4", "f4")
        )
        assert replay.replayed and replay.version == version


async def test_step_append_is_one_transaction(sqlite_url: str) -> None:
    async with connect(sqlite_url) as conn:
        checkpointer = conn.checkpointer()
        kv = conn.kv
        assert isinstance(kv, SQLiteKV)
        await checkpointer.append("r", JournalEvent(step_id="000001-model", payload=1))
        trace = Trace()
        await trace.attach(kv)
        for i in range(2, 12):
            trace.statements.clear()
            result = await checkpointer.append(
                "r", JournalEvent(step_id=f"{i:06d}-model", payload=i)
            )
            assert result.seq == i - 1 and not result.duplicate
            assert trace.transactions() == 1, trace.statements
        again = await checkpointer.append("r", JournalEvent(step_id="000003-model", payload=3))
        assert again.duplicate and again.seq == 2
        state = await checkpointer.load("r")
        assert [e.seq for e in state.entries] == list(range(11))


def pair(i: int) -> list[Any]:
    return [
        ModelRequest(parts=[UserPromptPart(f"q{i} " + "x" * 300)]),
        ModelResponse(parts=[TextPart(f"a{i} " + "y" * 300)]),
    ]


async def test_session_save_is_one_transaction(sqlite_url: str) -> None:
    """Saves that spill chunks write them with the state in one transaction; a save that
    spills none is the state's fenced UPDATE alone (atomic by itself); chunks a merge
    replaced are deleted together, in one more (no other write runs on its own)."""
    async with connect(sqlite_url) as conn:
        sessions = conn.sessions(tail_bytes=600, fanout=2)
        assert isinstance(sessions.storage.port, SQLiteSessionPort)
        kv = conn.kv
        assert isinstance(kv, SQLiteKV)
        trace = Trace()
        await trace.attach(kv)
        collected = 0
        for i in range(6):
            async with sessions.turn("s") as session:
                trace.statements.clear()
                session.replace([*session.messages, *pair(i)])
            await sessions.storage.drain()
            saves = [s for s in trace.statements if s.upper().startswith("BEGIN")]
            # The save's transaction, and the merged chunks' collection in one commit.
            assert 1 <= len(saves) <= 2 and trace.writes_outside_transactions() == []
            collected += sum(s.upper().startswith("DELETE") for s in trace.statements)
        assert collected, "merges collected the chunks they replaced"
        info = await sessions.inspect("s")
        assert info is not None and info.chunk_count >= 1 and info.message_count == 12
        # Within the tail: the save is one statement, the fenced swap of the state.
        async with sessions.turn("s") as session:
            trace.statements.clear()
            session.replace([*session.messages])
        await sessions.storage.drain()
        writes = trace.writes_outside_transactions()
        assert len(writes) == 1 and writes[0].startswith("UPDATE"), trace.statements
        assert not any(s.upper().startswith("BEGIN") for s in trace.statements)
        await sessions.aclose()


def words_of(trace: Trace) -> list[str]:
    words = [s.strip().split()[0].upper() for s in trace.statements]
    return [w for w in words if w != "PRAGMA"]  # the busy timeout, inline or not


async def test_session_turn_warm_and_cold(sqlite_url: str) -> None:
    """A warm turn on SQLite (this store wrote the session last) is one UPDATE taking the
    lease over the state it knows, and the save's transaction; a cold one (another store
    object wrote last) is the acquire's transaction (state and hint read, lease taken,
    the chunks it lacks read) after one UPDATE that matched nothing (when the store had
    written the session before), and the save's. Nothing else, and no read before."""
    async with connect(sqlite_url) as conn:
        kv = conn.kv
        assert isinstance(kv, SQLiteKV)
        first, second = conn.sessions(tail_bytes=600), conn.sessions(tail_bytes=600)
        trace = Trace()
        await trace.attach(kv)
        for i in range(8):
            store = (first, second)[(i // 2) % 2]  # each store takes two turns in a row
            trace.statements.clear()
            async with store.turn("s") as session:
                assert len(session.messages) == 2 * i
                acquire = list(trace.statements)
                session.replace([*session.messages, *pair(i)])
            acquire = [s for s in acquire if not s.startswith("PRAGMA")]
            acquire_words = [s.split()[0].upper() for s in acquire]
            save_words = words_of(trace)[len(acquire) :]
            if i % 2 == 1:  # warm
                assert acquire_words == ["UPDATE"], acquire
            else:
                known = 1 if i >= 4 else 0  # this store wrote the session before
                assert acquire_words[:known] == ["UPDATE"] * known, acquire
                assert acquire_words[known] == "BEGIN" and acquire_words[-1] == "COMMIT", acquire
                assert acquire_words.count("BEGIN") == 1, acquire
            # The save: chunks spill at every turn (tail_bytes=600), so one transaction
            # (a merge's collection may follow, in a transaction of its own).
            save = save_words[: save_words.index("COMMIT") + 1]
            assert save[0] == "BEGIN" and set(save[1:-1]) <= {"INSERT", "UPDATE"}, save
            assert trace.writes_outside_transactions() == (
                [acquire[0]] if acquire_words[0] == "UPDATE" else []
            ), trace.statements
        for store in (first, second):
            await store.aclose()


async def test_a_known_state_that_did_not_take_the_lease_is_not_sent_again(
    sqlite_url: str,
) -> None:
    """A store's acquire carries the state it saved last (``AcquireRequest.known``) until
    an acquire finds the session held: the known state is stale then (or a client waits),
    so the polls that follow send none (on DynamoDB trying it would cost a request each)."""
    async with connect(sqlite_url) as conn:
        first, second = conn.sessions(), conn.sessions()
        port = first.storage.port
        sent: list[bool] = []
        acquire = port.acquire

        async def recording(request: AcquireRequest) -> AcquireReply:
            if request.store_id == first.storage.store_id:  # the port is the KV's: shared
                sent.append(request.known is not None)
            return await acquire(request)

        port.acquire = recording  # type: ignore[method-assign]
        async with first.turn("s") as session:
            session.replace(pair(0))
        async with second.turn("s") as held:
            with pytest.raises(SessionBusyError):
                async with first.turn("s", timeout_seconds=0.3):
                    pass
            held.replace([*held.messages, *pair(1)])
        assert sent[0] is False  # a new session: nothing known yet
        assert sent[1] is True  # the state it saved, tried once
        assert len(sent) > 2 and not any(sent[2:]), sent
        for store in (first, second):
            await store.aclose()


async def test_generic_port_on_sqlite_still_passes_the_basics(sqlite_url: str) -> None:
    """The generic stores on the same file (no port) read what the native ones wrote."""
    async with connect(sqlite_url) as conn:
        await conn.memory().write("a.md", "x", expected_version=None)
        generic = KVMemoryStore(conn.kv, port=KVMemoryPort(conn.kv))
        found = await generic.read("a.md", max_chars=10)
        assert found is not None and found.content == "x"
        store = SessionStore(conn.kv, port=KVSessionPort(conn.kv))
        async with store.turn("g") as session:
            session.replace(pair(0))
        async with conn.sessions() as native, native.turn("g") as session:
            assert len(session.messages) == 2
        await store.aclose()


def test_trace_counts_autocommit_writes() -> None:
    trace = Trace()
    trace.statements = ["INSERT INTO t VALUES (1)", "BEGIN IMMEDIATE", "UPDATE t", "COMMIT"]
    assert trace.transactions() == 2
    assert sqlite3.sqlite_version
