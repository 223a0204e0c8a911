"""What if the lease lived in columns of its own? A what-if beside the format floors, not
part of ``nox -s bench``: the session turn's format floor (``format_floors.py``) with the
lease moved out of the state's bytes on PostgreSQL and SQLite, timed in the same trials
as agent-stores, the floor and the format floor.

It answers issue 26's open question: would that stored-format change bring the session
turn within 1.25 times its floor? The acquire writes a version, an owner and an expiry
(``lease_owner``, ``lease_expires``) over the version this client saved last, as the
floor writes a version; the header is kept as the object the last save encoded, so
nothing is spliced, sent or decoded for it; the save clears the lease. Everything else is
the format floor's (the tail decoded, the caller's list checked, a spilled chunk decoded
for the cache, the save's header with its chunk refs, the renewal timer), and there is no
store logic at all. ``--keep-objects`` also skips the spilled chunk's decode, keeping the
caller's objects as the floor does (which a correct store cannot: Pydantic AI edits saved
messages in place), to show what that decode costs.

Usage: ``python benchmarks/lease_column_floors.py [--postgres URL] [--keep-objects]``
(SQLite always; PostgreSQL with a URL, in tables and a schema of its own, dropped after).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_stores.backend import StateHeader, decode_state, new_version
from format_floors import (
    LEASE_SECONDS,
    OWNER,
    FormatTurns,
    PostgresFormatFloor,
    Saved,
    SQLiteFormatFloor,
)
from memory_floors import drop_floor_table, sqlite_floor_file
from session_floors import (
    POSTGRES_SAVE,
    SCOPE_PREFIX,
    SQLITE_SAVE,
    TTL_SECONDS,
    PostgresSessionFloor,
    SessionFloor,
    SQLiteSessionFloor,
    postgres_save,
    postgres_session_table,
    sqlite_save,
)
from side_by_side import (
    close,
    drop_schema,
    history,
    in_schema,
    ours_sessions,
    session_trials,
    set_history,
)

#: the take: the lease's columns and a new version over the version saved last
_TAKE_SQLITE = (
    "UPDATE kv SET version = ?, lease_owner = ?, lease_expires = ?, expires_at = ? "
    "WHERE scope = ? AND key = 'state' AND version = ? "
    "AND (expires_at IS NULL OR expires_at > ?)"
)
_TAKE_POSTGRES = (
    "UPDATE {kv} SET version = %(version)s, lease_owner = %(owner)s, "
    "lease_expires = %(lease)s, expires_at = %(expires_at)s WHERE scope = %(scope)s "
    "AND key = 'state' AND version = %(expected)s "
    "AND (expires_at IS NULL OR expires_at > %(now)s)"
)
#: the fenced saves, the lease cleared
_SAVE_POSTGRES = POSTGRES_SAVE.replace(
    "expires_at = %(expires_at)s WHERE",
    "expires_at = %(expires_at)s, lease_owner = NULL, lease_expires = NULL WHERE",
)
_SAVE_SQLITE = SQLITE_SAVE.replace(
    "expires_at = ? WHERE", "expires_at = ?, lease_owner = NULL, lease_expires = NULL WHERE"
)
assert _SAVE_POSTGRES != POSTGRES_SAVE and _SAVE_SQLITE != SQLITE_SAVE


class LeaseColumnTurns(FormatTurns):
    """:class:`FormatTurns` with each session's last saved header kept as an object;
    ``keep_objects``: the spilled messages are the caller's objects, not decoded."""

    def __init__(self, *, keep_objects: bool) -> None:
        super().__init__()
        self._headers: dict[str, StateHeader] = {}
        self.keep_objects = keep_objects

    def first(self, sid: str, messages: Sequence[Any]) -> tuple[bytes, str]:
        state, version = super().first(sid, messages)
        self._headers[sid] = decode_state(state)[0]
        return state, version

    def taking(self, sid: str) -> tuple[bytes, str, StateHeader]:
        """The state saved last, its version and its header."""
        state, version = self._known[sid]
        return state, version, self._headers[sid]

    def saving(self, sid: str, header: StateHeader, new: list[Any], now: float) -> Saved:
        saved = super().saving(sid, header, new, now)
        self._headers[sid] = saved.header
        return saved


class SQLiteLeaseColumnFloor:
    """See the module docstring."""

    def __init__(self, path: Path, *, keep_objects: bool) -> None:
        self._conn = sqlite_floor_file(path)
        self._conn.execute("ALTER TABLE kv ADD COLUMN lease_owner TEXT")
        self._conn.execute("ALTER TABLE kv ADD COLUMN lease_expires REAL")
        self._turns = LeaseColumnTurns(keep_objects=keep_objects)

    async def start(self, sid: str, messages: Sequence[Any]) -> None:
        state, version = self._turns.first(sid, messages)
        self._conn.execute(
            "INSERT INTO kv (scope, key, value, version) VALUES (?, 'state', ?, ?)",
            (SCOPE_PREFIX + sid, state, version),
        )

    async def turn(self, sid: str, added: Sequence[Any]) -> None:
        conn, scope, now, turns = self._conn, SCOPE_PREFIX + sid, time.time(), self._turns
        state, expected, header = turns.taking(sid)
        token = new_version()
        params = (token, OWNER, now + LEASE_SECONDS, now + TTL_SECONDS, scope, expected, now)
        assert conn.execute(_TAKE_SQLITE, params).rowcount == 1
        header, messages = turns.acquired_known(sid, state, header)
        saved = turns.saving(sid, header, [*messages, *added], now)  # the caller's list
        expires_at = now + TTL_SECONDS
        version = sqlite_save(
            conn, scope, saved.state, token, expires_at, saved.chunk, _SAVE_SQLITE
        )
        turns.saved(sid, saved.state, version)

    async def close(self) -> None:
        self._conn.close()  # the file is in a temporary folder, removed with it


class PostgresLeaseColumnFloor:
    """See the module docstring. Create with :meth:`open`."""

    def __init__(self, conn: Any, table: Any, statements: dict[str, bytes], turns: Any) -> None:
        self._conn, self._table, self._sql, self._turns = conn, table, statements, turns
        self._cursor = conn.cursor()

    @classmethod
    async def open(cls, url: str, table: str, *, keep_objects: bool) -> PostgresLeaseColumnFloor:
        from psycopg import sql

        conn, name, statements = await postgres_session_table(
            url, table, _TAKE_POSTGRES, save=_SAVE_POSTGRES
        )
        await conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN lease_owner text, ADD COLUMN lease_expires float8"
            ).format(name)
        )
        return cls(conn, name, statements, LeaseColumnTurns(keep_objects=keep_objects))

    async def start(self, sid: str, messages: Sequence[Any]) -> None:
        state, version = self._turns.first(sid, messages)
        await self._conn.execute(self._sql["insert"], (SCOPE_PREFIX + sid, state, version))

    async def turn(self, sid: str, added: Sequence[Any]) -> None:
        cursor, scope, now, turns = self._cursor, SCOPE_PREFIX + sid, time.time(), self._turns
        state, expected, header = turns.taking(sid)
        token = new_version()
        params = {
            "version": token,
            "owner": OWNER,
            "lease": now + LEASE_SECONDS,
            "expires_at": now + TTL_SECONDS,
            "scope": scope,
            "expected": expected,
            "now": now,
        }
        await cursor.execute(self._sql["take"], params, prepare=True)
        assert cursor.rowcount == 1
        header, messages = turns.acquired_known(sid, state, header)
        saved = turns.saving(sid, header, [*messages, *added], now)  # the caller's list
        version = await postgres_save(
            cursor, self._sql, scope, saved.state, token, now + TTL_SECONDS, saved.chunk
        )
        turns.saved(sid, saved.state, version)

    async def close(self) -> None:
        await drop_floor_table(self._conn, self._table)


async def compare(
    label: str, ours: Any, floors: dict[str, SessionFloor], trials: int, turns: int
) -> None:
    """agent-stores and the floors, one turn each in turn (``one_at_a_time``), per size."""
    names = ("ours", *floors)
    for size in (10, 100, 1000):
        sid = f"lc-{uuid.uuid4().hex[:8]}-{size}"
        await set_history(ours, sid, size)
        for floor in floors.values():
            await floor.start(sid, history(size))
        samples, cpu = await session_trials(ours, floors, sid, trials, turns)
        wall = {n: statistics.median(v) for n, v in samples.items()}
        used = {n: statistics.median(v) for n, v in cpu.items()}
        print(f"\n{label}, history {size}: ÷ the floor (time, client CPU)")
        for name in names:
            print(
                f"  {name:26} {wall[name] * 1e3:6.3f} ms, CPU {used[name] * 1e3:6.3f} ms   "
                f"{wall[name] / wall['floor']:.2f}, {used[name] / used['floor']:.2f}"
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="a PostgreSQL URL (trust auth is fine)")
    parser.add_argument("--keep-objects", action="store_true")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    keep = args.keep_objects
    name = "lease-column floor" + (" (caller's objects)" if keep else "")
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        ours = ours_sessions(f"sqlite:///{workdir}/ours.db")
        floors: dict[str, SessionFloor] = {
            "floor": SQLiteSessionFloor(workdir / "floor.db"),
            "format floor": SQLiteFormatFloor(workdir / "format.db"),
            name: SQLiteLeaseColumnFloor(workdir / "lease.db", keep_objects=keep),
        }
        try:
            await compare("SQLite (WAL + NORMAL)", ours, floors, args.trials, args.turns)
        finally:
            await close(ours)
            for floor in floors.values():
                await floor.close()
    if args.postgres:
        schema = f"lc_{run}_ses"
        ours = ours_sessions(in_schema(args.postgres, schema))
        await ours.kv.setup()
        floors = {
            "floor": await PostgresSessionFloor.open(args.postgres, f"lc_{run}_f"),
            "format floor": await PostgresFormatFloor.open(args.postgres, f"lc_{run}_ff"),
            name: await PostgresLeaseColumnFloor.open(
                args.postgres, f"lc_{run}_lc", keep_objects=keep
            ),
        }
        try:
            await compare("PostgreSQL", ours, floors, args.trials, args.turns)
        finally:
            await close(ours)
            for floor in floors.values():
                await floor.close()
            await drop_schema(args.postgres, schema)


if __name__ == "__main__":
    asyncio.run(main())
