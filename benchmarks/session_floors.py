"""Floors of the session turn on PostgreSQL and SQLite: what any session store with
leases and fencing does on the client with the database client and Pydantic AI alone,
and no store code.

A turn is two statements, the physical minimum of a store that takes a lease and saves
fenced (the Redis floor's two ``EVALSHA`` in ``side_by_side.py`` likewise):

1. take the lease: ``UPDATE … SET version = <new> … RETURNING value`` — the new version is
   the fencing token, and the stored state comes back in the same statement;
2. save: ``UPDATE … SET value = <new state>, version = <newer> WHERE version = <token>``.

Between them the client decodes the inline tail (Pydantic AI's
``ModelMessagesTypeAdapter``), hands the caller the whole history, takes back one new list
of it and the turn's two messages (as agent-stores' caller in the bench makes it) and
encodes the new tail; past agent-stores' 4 KiB tail bound the tail keeps its last message
and the rest (cut from the encoded bytes, not encoded again) is written as a history chunk
in the save's statement or transaction, as a store must to keep the history. The messages
before the tail are the very objects the floor was given (the initial history, then each
spill's), held in memory and never decoded: no store can undercut that. The state is
agent-stores' header line (:func:`~agent_stores.backend.acquired_header`) and the tail.

* PostgreSQL: psycopg on one held autocommit connection and cursor, prepared statements.
* SQLite: the stdlib ``sqlite3`` inline on one connection in WAL with
  ``synchronous=NORMAL`` (agent-stores' setting), autocommit.

Each floor writes into a table of its own shaped like agent-stores' (PostgreSQL: dropped
after; SQLite: a file in the bench's temporary folder).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from agent_stores.backend import acquired_header, new_version
from memory_floors import drop_floor_table, postgres_floor_table, sqlite_floor_file
from pydantic_ai.messages import ModelMessagesTypeAdapter

#: agent-stores' inline tail bound (the core's default: 4 KiB), as the Redis floor's
TAIL_BYTES = 4 << 10
SCOPE_PREFIX = "sessions:floor/"
#: the lifetime a save gives the state and its spilled chunk (the bench's session TTL)
TTL_SECONDS = 3600.0


def next_state(stored: bytes, held: list[Any], added: Sequence[Any]) -> tuple[bytes, bytes | None]:
    """The client's work between the statements: the tail decoded, the caller's new list
    of the history (``held``, the messages before the tail, then the tail's) and ``added``,
    the new tail encoded behind the stored header line; past :data:`TAIL_BYTES` the tail
    keeps its last message and the rest joins ``held``. Returns (new state, the spilled
    chunk or None)."""
    cut = stored.index(b"\n") + 1
    messages = ModelMessagesTypeAdapter.validate_json(stored[cut:])
    new = [*held, *messages, *added]  # the caller's list
    tail = ModelMessagesTypeAdapter.dump_json(new[len(held) :])
    spilled = None
    if len(tail) > TAIL_BYTES:
        last = ModelMessagesTypeAdapter.dump_json(new[-1:])
        # "[a,b,c]" is "[a,b" + "," + "c]": the chunk is the rest, without encoding it again
        spilled = tail[: len(tail) - len(last)] + b"]"
        tail = last
        held.extend(new[len(held) : -1])
    return stored[:cut] + tail, spilled


def first_state(messages: Sequence[Any]) -> bytes:
    now = time.time()
    header = acquired_header(1, "floor-owner", now + 30, now)
    return header + b"\n" + ModelMessagesTypeAdapter.dump_json(list(messages)[-1:])


#: The fenced save of a session floor on PostgreSQL (``{kv}``: its table): the state
#: swapped for the new one if it still holds the version the acquire wrote.
POSTGRES_SAVE = (
    "UPDATE {kv} SET value = %(value)s, version = %(version)s, "
    "expires_at = %(expires_at)s WHERE scope = %(scope)s AND key = 'state' "
    "AND version = %(expected)s"
)


async def postgres_session_table(
    url: str, table: str, take: str, save: str = POSTGRES_SAVE
) -> tuple[Any, Any, dict[str, bytes]]:
    """A session floor's new table on PostgreSQL (:func:`postgres_floor_table`) and its
    statements, each with ``{kv}`` filled in: ``take`` as given, ``save`` (by default
    :data:`POSTGRES_SAVE`), ``spill`` (a chunk's insert with the save, one statement)
    and ``insert`` (a first state). Returns (connection, table name, statements)."""
    from psycopg import sql

    conn, name = await postgres_floor_table(url, table)

    def text(statement: str) -> bytes:
        return sql.SQL(statement).format(kv=name).as_bytes(None)

    return (
        conn,
        name,
        {
            "take": text(take),
            "save": text(save),
            "spill": text(
                "WITH chunk AS (INSERT INTO {kv} VALUES (%(scope)s, %(chunk_key)s, %(chunk)s, "
                "%(chunk_version)s, %(expires_at)s)) " + save
            ),
            "insert": text("INSERT INTO {kv} VALUES (%s, 'state', %s, %s, NULL)"),
        },
    )


async def postgres_save(
    cursor: Any,
    statements: dict[str, bytes],
    scope: str,
    state: bytes,
    expected: str,
    expires_at: float,
    chunk: tuple[str, bytes] | None,
) -> str:
    """The fenced save of a session floor on PostgreSQL, in one prepared statement of
    ``statements`` (:func:`postgres_session_table`): ``state`` if the stored one still
    holds ``expected`` (the acquire's version), with a spilled ``chunk`` (key, bytes)
    inserted by the same statement. Returns the state's new version."""
    version = new_version()
    params: dict[str, Any] = {
        "value": state,
        "version": version,
        "expires_at": expires_at,
        "scope": scope,
        "expected": expected,
    }
    if chunk is None:
        await cursor.execute(statements["save"], params, prepare=True)
    else:
        params.update(chunk_key=chunk[0], chunk=chunk[1], chunk_version=expected)
        await cursor.execute(statements["spill"], params, prepare=True)
    assert cursor.rowcount == 1
    return version


#: The fenced save of a session floor on SQLite: the state swapped for the new one if it
#: still holds the version the acquire wrote.
SQLITE_SAVE = (
    "UPDATE kv SET value = ?, version = ?, expires_at = ? "
    "WHERE scope = ? AND key = 'state' AND version = ?"
)


def sqlite_save(
    conn: sqlite3.Connection,
    scope: str,
    state: bytes,
    expected: str,
    expires_at: float,
    chunk: tuple[str, bytes] | None,
    save: str = SQLITE_SAVE,
) -> str:
    """The fenced save of a session floor on SQLite: ``state`` if the stored one still
    holds ``expected`` (the acquire's version), one ``UPDATE`` (``save``, with
    :data:`SQLITE_SAVE`'s parameters); with a spilled ``chunk`` (key, bytes), its insert
    and the ``UPDATE`` in one transaction. Returns the state's new version."""
    version = new_version()
    if chunk is not None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO kv (scope, key, value, version, expires_at) VALUES (?, ?, ?, ?, ?)",
            (scope, *chunk, expected, expires_at),
        )
    done = conn.execute(save, (state, version, expires_at, scope, expected)).rowcount
    if chunk is not None:
        conn.execute("COMMIT")
    assert done == 1
    return version


class SessionFloor(Protocol):
    """Sessions turned by the client libraries alone."""

    async def start(self, sid: str, messages: Sequence[Any]) -> None: ...
    async def turn(self, sid: str, added: Sequence[Any]) -> None: ...
    async def close(self) -> None: ...


class PostgresSessionFloor:
    """See the module docstring. Create with :meth:`open`."""

    def __init__(self, conn: Any, table: Any, statements: dict[str, bytes]) -> None:
        self._conn, self._table = conn, table
        self._held: dict[str, list[Any]] = {}  # by session: the messages before the tail
        self._cursor = conn.cursor()
        self._sql = statements

    @classmethod
    async def open(cls, url: str, table: str) -> PostgresSessionFloor:
        conn, name, statements = await postgres_session_table(
            url,
            table,
            take="UPDATE {kv} SET version = %(version)s WHERE scope = %(scope)s "
            "AND key = 'state' AND (expires_at IS NULL OR expires_at > %(now)s) "
            "RETURNING value",
        )
        return cls(conn, name, statements)

    async def start(self, sid: str, messages: Sequence[Any]) -> None:
        await self._conn.execute(
            self._sql["insert"], (SCOPE_PREFIX + sid, first_state(messages), new_version())
        )
        self._held[sid] = list(messages)[:-1]

    async def turn(self, sid: str, added: Sequence[Any]) -> None:
        cursor, scope, now = self._cursor, SCOPE_PREFIX + sid, time.time()
        token = new_version()
        await cursor.execute(
            self._sql["take"], {"version": token, "scope": scope, "now": now}, prepare=True
        )
        row = await cursor.fetchone()
        assert row is not None
        state, spilled = next_state(row[0], self._held[sid], added)
        chunk = None if spilled is None else (f"h/{new_version()}", spilled)
        await postgres_save(cursor, self._sql, scope, state, token, now + TTL_SECONDS, chunk)

    async def close(self) -> None:
        await drop_floor_table(self._conn, self._table)


class SQLiteSessionFloor:
    """See the module docstring."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite_floor_file(path)
        self._held: dict[str, list[Any]] = {}  # by session: the messages before the tail

    async def start(self, sid: str, messages: Sequence[Any]) -> None:
        self._conn.execute(
            "INSERT INTO kv VALUES (?, 'state', ?, ?, NULL)",
            (SCOPE_PREFIX + sid, first_state(messages), new_version()),
        )
        self._held[sid] = list(messages)[:-1]

    async def turn(self, sid: str, added: Sequence[Any]) -> None:
        conn, scope, now = self._conn, SCOPE_PREFIX + sid, time.time()
        token = new_version()
        rows = conn.execute(
            "UPDATE kv SET version = ? WHERE scope = ? AND key = 'state' "
            "AND (expires_at IS NULL OR expires_at > ?) RETURNING value",
            (token, scope, now),
        ).fetchall()  # all: the statement (and its write) ends with its last row
        assert len(rows) == 1
        state, spilled = next_state(rows[0][0], self._held[sid], added)
        chunk = None if spilled is None else (f"h/{new_version()}", spilled)
        sqlite_save(conn, scope, state, token, now + TTL_SECONDS, chunk)

    async def close(self) -> None:
        # The file is in the bench's temporary folder, removed with it.
        self._conn.close()
