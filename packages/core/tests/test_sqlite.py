"""SQLite specifics the contract cannot see: the event loop keeps running, files, purge."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from agent_stores import BackendUnavailableError, open_kv
from agent_stores.backends.sqlite import SQLiteKV


async def test_event_loop_runs_while_sqlite_waits_for_a_lock(tmp_path: Path) -> None:
    """A write blocked by another connection's lock waits in the worker thread, not on the loop."""
    db = tmp_path / "locked.db"
    kv = SQLiteKV(db, busy_timeout_ms=10_000)
    await kv.setup()
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    ticks = 0
    write_started = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        await write_started.wait()
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    async def write() -> str:
        write_started.set()
        return await kv.create("s", "k", b"v")

    tick_task = asyncio.create_task(ticker())
    write_task = asyncio.create_task(write())
    await write_started.wait()
    await asyncio.sleep(0.3)
    assert not write_task.done(), "the write should be waiting for the lock"
    ticks_while_blocked = ticks
    # Release the lock from another thread, as another process would.
    threading.Thread(target=blocker.execute, args=("COMMIT",)).start()
    await asyncio.wait_for(write_task, timeout=10)
    tick_task.cancel()
    assert ticks_while_blocked >= 5, "the event loop was blocked while SQLite waited"
    blocker.close()
    await kv.aclose()


async def test_store_works_across_event_loops(tmp_path: Path) -> None:
    """The same store can be used from one event loop and then another."""
    kv = SQLiteKV(tmp_path / "loops.db")
    version = await kv.create("s", "k", b"1")

    def other_loop() -> bytes:
        async def read() -> bytes:
            entry = await kv.get("s", "k")
            assert entry is not None and entry.version == version
            return entry.value

        return asyncio.run(read())

    assert await asyncio.to_thread(other_loop) == b"1"
    await kv.aclose()


async def test_parent_directories_are_created(tmp_path: Path) -> None:
    kv = open_kv(f"sqlite:///{tmp_path}/a/b/c/store.db")
    await kv.create("s", "k", b"v")
    assert (tmp_path / "a" / "b" / "c" / "store.db").exists()
    await kv.aclose()


async def test_not_a_database_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a sqlite database" * 100)
    kv = SQLiteKV(path)
    with pytest.raises(BackendUnavailableError, match=r"garbage\.db"):
        await kv.get("s", "k")
    assert path.read_bytes().startswith(b"this is not a sqlite database"), "the file was modified"
    await kv.aclose()


async def test_purge_expired_deletes_rows(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "purge.db")
    await kv.create("s", "old", b"v", ttl=10)
    await kv.create("s", "live", b"v")
    base = kv.clock
    kv.clock = lambda: base() + 11
    assert await kv.purge_expired() == 1
    assert [i.key for i in await kv.scan("s")] == ["live"]
    await kv.aclose()


async def test_wal_mode_is_on(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "wal.db")
    await kv.setup()
    conn = sqlite3.connect(tmp_path / "wal.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    await kv.aclose()


async def test_many_clients_opening_a_new_file_at_once(tmp_path: Path) -> None:
    """Clients racing to create a new database (WAL switch, schema) all succeed.

    SQLite answers the WAL switch with SQLITE_BUSY at once, without its busy handler,
    while another connection holds the file; the store must retry instead of failing.
    """
    for attempt in range(60):
        url = f"sqlite:///{tmp_path}/race-{attempt}.db"
        stores = [open_kv(url) for _ in range(6)]
        try:
            await asyncio.gather(*(stores[j % 6].create("s", f"k{j}", b"v") for j in range(24)))
            assert len(await stores[0].scan("s")) == 24
        finally:
            for store in stores:
                await store.aclose()


_FIRST_LAYOUT = """
CREATE TABLE agent_stores_kv (
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      BLOB NOT NULL,
    version    TEXT NOT NULL,
    expires_at REAL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX agent_stores_kv_expiry ON agent_stores_kv (expires_at)
    WHERE expires_at IS NOT NULL;
"""


def _table_sql(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'agent_stores_kv'"
        ).fetchone()
    return str(row[0])


@pytest.mark.parametrize("auto_setup", [True, False])
async def test_a_file_of_the_first_layout_is_moved_to_the_rowid_layout_once(
    tmp_path: Path, auto_setup: bool
) -> None:
    """Files written before the rowid layout (WITHOUT ROWID: a lookup beside a large value
    read that whole value) are moved on first open, every entry kept, expiry index too."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(_FIRST_LAYOUT)
        conn.executemany(
            "INSERT INTO agent_stores_kv VALUES (?, ?, ?, ?, ?)",
            [("s", "a", b"x" * 5_000_000, "v1", None), ("s", "b", b"small", "v2", 4e9)],
        )
    kv = open_kv(f"sqlite:///{db}?auto_setup={str(auto_setup).lower()}")
    try:
        assert (await kv.get("s", "b")) is not None
        entries = {item.key: item.entry for item in await kv.scan("s")}
        assert entries["a"] is not None and entries["a"].value == b"x" * 5_000_000
        assert entries["b"] is not None
        assert (entries["b"].version, entries["b"].expires_at) == ("v2", 4e9)
        assert await kv.replace("s", "b", b"new", expected_version="v2")
    finally:
        await kv.aclose()
    assert "WITHOUT ROWID" not in _table_sql(db).upper()
    with sqlite3.connect(db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "agent_stores_kv_expiry" in names and "agent_stores_kv_upgrading" not in names
    again = open_kv(f"sqlite:///{db}")
    try:
        assert len(await again.scan("s")) == 2
    finally:
        await again.aclose()
