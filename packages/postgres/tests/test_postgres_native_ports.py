"""The native memory and journal ports: one write transaction per memory write and per
step append, counted by the server (transaction ids assigned on a private cluster)."""

from __future__ import annotations

from typing import Any

import psycopg
from agent_stores import connect
from agent_stores.checkpointer import Checkpointer, JournalEvent
from agent_stores.memory import KVMemoryStore
from agent_stores.memory._harness import MemoryOperation
from agent_stores_postgres.kv import PostgresKV
from agent_stores_postgres.ports import PostgresJournalPort, PostgresMemoryPort
from pg_test_support import libpq_conninfo


class WriteTransactions:
    """Counts write transactions on a private cluster: the next transaction id to be
    assigned, read without assigning one (read-only transactions take none)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(libpq_conninfo(url), autocommit=True)

    def next_xid(self) -> int:
        row = self.conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        self.conn.close()


async def test_memory_write_and_step_append_are_one_transaction(cluster: Any) -> None:
    url = cluster.url()
    counter = WriteTransactions(url)
    try:
        async with connect(url) as conn:
            await conn.kv.setup()
            memory = conn.memory()
            assert isinstance(memory, KVMemoryStore)
            before = counter.next_xid()
            created = await memory.write(
                "u/new/dir/a.md", "v0", expected_version=None, operation=MemoryOperation("o0", "f")
            )
            assert counter.next_xid() - before == 1  # record, receipt index, 3 markers
            version = created.version
            for i in range(1, 6):
                before = counter.next_xid()
                done = await memory.write(
                    "u/new/dir/a.md",
                    f"v{i}",
                    expected_version=version,
                    operation=MemoryOperation(f"o{i}", "f"),
                )
                assert counter.next_xid() - before == 1
                version = done.version
            assert await memory.list_paths("u/", limit=5) == ["u/new/dir/a.md"]
            found = await memory.get_operation(MemoryOperation("o5", "f"))
            assert found is not None and found.version == version

            checkpointer = conn.checkpointer()
            assert isinstance(checkpointer, Checkpointer)
            await checkpointer.append("run", JournalEvent(step_id="000001-model", payload=0))
            for i in range(2, 8):
                before = counter.next_xid()
                result = await checkpointer.append(
                    "run", JournalEvent(step_id=f"{i:06d}-model", payload=i)
                )
                assert counter.next_xid() - before == 1 and result.seq == i - 1
            before = counter.next_xid()
            again = await checkpointer.append(
                "run", JournalEvent(step_id="000004-model", payload=4)
            )
            assert again.duplicate and again.seq == 3
            assert counter.next_xid() - before == 0  # a duplicate writes nothing
    finally:
        counter.close()


async def test_reused_operation_on_another_path_writes_nothing(schema_url: str) -> None:
    """The index check inside the statement: a reused operation id is refused, nothing written."""
    from agent_stores.memory._harness import MemoryOperationConflictError

    async with connect(schema_url) as conn:
        memory = conn.memory()
        port = memory.port
        assert isinstance(port, PostgresMemoryPort)
        await memory.write("a.md", "x", expected_version=None, operation=MemoryOperation("op", "1"))
        try:
            await memory.write(
                "b.md", "y", expected_version=None, operation=MemoryOperation("op", "2")
            )
        except MemoryOperationConflictError:
            pass
        else:  # pragma: no cover
            raise AssertionError("a reused operation id must be refused")
        assert await memory.read("b.md", max_chars=10) is None
        cp = conn.checkpointer()
        assert isinstance(cp.space.port, PostgresJournalPort)


async def test_index_entry_committed_concurrently_rolls_the_write_back(schema_url: str) -> None:
    """The index entry of the same operation committed by another transaction after the
    statement's snapshot (so the statement's own check missed it): the statement rolls
    back as a whole, the record stays unwritten, and the reuse is reported."""
    import asyncio

    import pytest
    from agent_stores.memory._harness import MemoryOperationConflictError
    from agent_stores.memory._records import IndexEntry, digest
    from psycopg import sql

    async with connect(schema_url) as conn:
        memory = conn.memory()
        kv = conn.kv
        assert isinstance(kv, PostgresKV)
        await memory.write("a.md", "x", expected_version=None)
        operation = MemoryOperation("op-race", "mine")
        scope, key = memory._index_key(operation)
        entry = IndexEntry(digest("theirs"), "v-theirs", False, "elsewhere.md").dump()
        other = await psycopg.AsyncConnection.connect(libpq_conninfo(schema_url))
        watcher = await psycopg.AsyncConnection.connect(libpq_conninfo(schema_url), autocommit=True)
        try:
            await other.execute(
                sql.SQL(
                    "INSERT INTO {} (scope, key, value, version, expires_at) "
                    "VALUES (%s, %s, %s, 'v-theirs', %s)"
                ).format(kv.names.kv),
                (scope, key, entry, kv.clock() + 3600),
            )  # uncommitted: invisible to the write's snapshot, but its row is locked
            write = asyncio.create_task(
                memory.write("b.md", "y", expected_version=None, operation=operation)
            )
            for _ in range(500):  # until the write waits on the uncommitted index row
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                row = await cur.fetchone()
                if row is not None and row[0] > 0:
                    break
                await asyncio.sleep(0.01)
            assert not write.done()
            await other.commit()
            with pytest.raises(MemoryOperationConflictError):
                await write
            assert await memory.read("b.md", max_chars=10) is None
            assert await memory.list_paths("", limit=10) == ["a.md"]
        finally:
            await other.close()
            await watcher.close()
