"""Floors of the memory rows: a CAS write with its operation receipt, and a read, done by
the database client alone with agent-stores' own statements and record shapes, and no
store code (no path checks, no pool, no deadline). The record is JSON: a write encodes it
(``json.dumps``) and a read decodes it (``json.loads``) to hand back the file's content,
the work any client of this record shape does (and the harness's stores do for theirs).

* PostgreSQL: psycopg on one held connection and cursor, the memory port's one prepared
  statement for a replace with a receipt (record CAS + receipt index entry, one commit);
  the read is the KV's one prepared ``SELECT``.
* SQLite: the stdlib ``sqlite3`` on one connection in WAL with ``synchronous=NORMAL``, the
  SQLite port's transaction (``BEGIN IMMEDIATE``, the receipt's absence checked, the record
  CAS, the receipt inserted, ``COMMIT``) run inline, as the store runs it when its
  connection is free; the read is the KV's ``SELECT``.

Each floor writes into a table of its own shaped like agent-stores' (PostgreSQL: dropped
after; SQLite: a file in the bench's temporary folder), its partial index on
``expires_at`` included: a row written with an expiry costs an index entry to any store
that can find its expired rows without reading the whole table.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Protocol

from agent_stores.kv.base import new_version

#: a receipt's lifetime as the memory store sets it (about 12 months; its value is irrelevant)
RECEIPT_SECONDS = 365 * 86_400.0


def record(content: str, version: str) -> bytes:
    """A memory record shaped like agent-stores' (format, size, version, length, operation)."""
    return json.dumps(
        {"f": 1, "s": 1, "v": version, "n": len(content), "o": fresh_version(), "c": content},
        separators=(",", ":"),
    ).encode()


def content_of(value: bytes) -> str:
    """The content of a record made by :func:`record`."""
    content: str = json.loads(value)["c"]
    return content


def receipt(path: str, version: str) -> bytes:
    return json.dumps(
        {"f": 1, "fp": fresh_version(), "v": version, "e": 1, "p": path}, separators=(",", ":")
    ).encode()


def fresh_version() -> str:
    # The store's own generator: ``uuid.uuid4`` costs four times as much (2 µs), which a
    # floor must not spend where the store does not.
    return new_version()


async def postgres_floor_table(url: str, table: str) -> tuple[Any, Any]:
    """An autocommit psycopg connection and a fresh table ``table`` shaped like
    agent-stores' KV table (logged: durable commits, as the stores'), as (conn, name)."""
    import psycopg
    from psycopg import sql

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    name = sql.Identifier(table)
    await conn.execute(
        sql.SQL(
            'CREATE TABLE {} (scope text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL, '
            "value bytea NOT NULL, version text NOT NULL, expires_at double precision, "
            "PRIMARY KEY (scope, key))"
        ).format(name)
    )
    await conn.execute(
        sql.SQL("CREATE INDEX {} ON {} (expires_at) WHERE expires_at IS NOT NULL").format(
            sql.Identifier(f"{table}_expiry"), name
        )
    )
    return conn, name


async def drop_floor_table(conn: Any, name: Any) -> None:
    """Drop a floor's table made by :func:`postgres_floor_table` and close its connection."""
    from psycopg import sql

    await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
    await conn.close()


class MemoryFloor(Protocol):
    """One file written over and over with receipts, and read."""

    async def write(self, content: str) -> None: ...
    async def read(self) -> str: ...
    async def close(self) -> None: ...


class PostgresMemoryFloor:
    """See the module docstring. Create with :meth:`open`."""

    def __init__(self, conn: Any, cursor: Any, table: Any, write_sql: bytes, read_sql: bytes):
        self._conn, self._cursor, self._table = conn, cursor, table
        self._write_sql, self._read_sql = write_sql, read_sql
        self._version = ""
        self._read_cursor = conn.cursor()

    @classmethod
    async def open(cls, url: str, table: str) -> PostgresMemoryFloor:
        from agent_stores_postgres.ports import _memory_write_sql  # the port's own statement
        from psycopg import sql

        conn, name = await postgres_floor_table(url, table)
        write_sql = (
            sql.SQL(_memory_write_sql(replace=True, index=True, markers=False))
            .format(kv=name)
            .as_bytes(None)
        )
        read_sql = (
            sql.SQL("SELECT value, version, expires_at FROM {} WHERE scope = %s AND key = %s")
            .format(name)
            .as_bytes(None)
        )
        floor = cls(conn, conn.cursor(), name, write_sql, read_sql)
        floor._version = fresh_version()
        await conn.execute(
            sql.SQL("INSERT INTO {} VALUES ('memory:floor', 'MEMORY.md', %s, %s, NULL)").format(
                name
            ),
            (record("", floor._version), floor._version),
        )
        return floor

    async def write(self, content: str) -> None:
        version, op = fresh_version(), fresh_version()
        now = time.time()
        params = {
            "scope": "memory:floor",
            "key": "MEMORY.md",
            "value": record(content, version),
            "version": version,
            "expires_at": None,
            "now": now,
            "expected": self._version,
            "iscope": f"memory:~ops/{op[:2]}",
            "ikey": op,
            "ivalue": receipt("MEMORY.md", version),
            "iversion": fresh_version(),
            "iexpires_at": now + RECEIPT_SECONDS,
        }
        await self._cursor.execute(self._write_sql, params, prepare=True)
        row = await self._cursor.fetchone()
        assert row is not None and row[0], row
        self._version = version

    async def read(self) -> str:
        await self._read_cursor.execute(self._read_sql, ("memory:floor", "MEMORY.md"), prepare=True)
        row = await self._read_cursor.fetchone()
        assert row is not None
        return content_of(row[0])

    async def close(self) -> None:
        await drop_floor_table(self._conn, self._table)


#: agent-stores' SQLite table and expiry index (``agent_stores.backends.sqlite``), in the
#: floor's own file
SQLITE_FLOOR_TABLE = (
    "CREATE TABLE kv (scope TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
    "version TEXT NOT NULL, expires_at REAL, PRIMARY KEY (scope, key))",
    "CREATE INDEX kv_expiry ON kv (expires_at) WHERE expires_at IS NOT NULL",
)
_LIVE = "(expires_at IS NULL OR expires_at > ?)"


def wal_connection(path: Path, **options: Any) -> sqlite3.Connection:
    """A ``sqlite3`` connection in WAL with ``synchronous=NORMAL`` (agent-stores' own
    setting), for the floors and the harness's stores alike."""
    conn: sqlite3.Connection = sqlite3.connect(path, check_same_thread=False, **options)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def sqlite_floor_file(path: Path) -> sqlite3.Connection:
    """A new floor database: autocommit connection (see :func:`wal_connection`), the table."""
    conn = wal_connection(path, isolation_level=None)
    for statement in SQLITE_FLOOR_TABLE:
        conn.execute(statement)
    return conn


_CREATE = (
    "INSERT INTO kv (scope, key, value, version, expires_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, "
    "version = excluded.version, expires_at = excluded.expires_at "
    "WHERE kv.expires_at IS NOT NULL AND kv.expires_at <= ?"
)


def floor_transaction(
    conn: sqlite3.Connection,
    absent: tuple[str, str] | None,
    swap: tuple[str, str, bytes, str, str],
    create: tuple[str, str, bytes, str, float | None],
    swap_expires_at: float | None = None,
) -> None:
    """The SQLite ports' transaction shapes, by ``sqlite3`` alone, one commit: ``absent``
    (scope, key) checked absent, ``swap`` (scope, key, value, new version, expected
    version) replaced by CAS with the expiry ``swap_expires_at``, ``create`` (scope, key,
    value, version, expiry) inserted (the journal port's shape); or, with ``absent``
    None, ``create`` inserted first, its row count the absence check, then the ``swap``
    (the memory port's shape)."""
    now = time.time()
    conn.execute("BEGIN IMMEDIATE")
    try:
        if absent is None:
            assert conn.execute(_CREATE, (*create, now)).rowcount == 1
        else:
            taken = conn.execute(
                f"SELECT version FROM kv WHERE scope = ? AND key = ? AND {_LIVE}", (*absent, now)
            ).fetchone()
            assert taken is None
        scope, key, value, version, expected = swap
        done = conn.execute(
            f"UPDATE kv SET value = ?, version = ?, expires_at = ? "
            f"WHERE scope = ? AND key = ? AND version = ? AND {_LIVE}",
            (value, version, swap_expires_at, scope, key, expected, now),
        ).rowcount
        assert done == 1
        if absent is not None:
            conn.execute(_CREATE, (*create, now))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class SQLiteMemoryFloor:
    """See the module docstring."""

    def __init__(self, path: Path) -> None:
        conn = sqlite_floor_file(path)
        self._version = fresh_version()
        conn.execute(
            "INSERT INTO kv VALUES ('memory:floor', 'MEMORY.md', ?, ?, NULL)",
            (record("", self._version), self._version),
        )
        self._conn = conn

    async def write(self, content: str) -> None:
        version, op = fresh_version(), fresh_version()
        iscope = f"memory:~ops/{op[:2]}"
        floor_transaction(
            self._conn,
            None,  # the receipt's insert is its absence check, as in the memory port
            ("memory:floor", "MEMORY.md", record(content, version), version, self._version),
            (
                iscope,
                op,
                receipt("MEMORY.md", version),
                fresh_version(),
                time.time() + RECEIPT_SECONDS,
            ),
        )
        self._version = version

    async def read(self) -> str:
        row = self._conn.execute(
            "SELECT value, version, expires_at FROM kv WHERE scope = ? AND key = ?",
            ("memory:floor", "MEMORY.md"),
        ).fetchone()
        assert row is not None
        return content_of(row[0])

    async def close(self) -> None:
        # The file is in the bench's temporary folder, removed with it.
        self._conn.close()
