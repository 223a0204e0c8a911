"""Format floors of the session turn on PostgreSQL and SQLite: the floor of
``session_floors.py`` plus what agent-stores' stored format itself asks of a warm turn,
and none of the store's other logic. It answers one question: how near the floor can a
store get that keeps agent-stores' records, however its code is arranged?

What the format asks beyond the floor, each done here with the core's own functions:

1. the lease lives in the state's header (owner, fence, expiry), so taking it writes the
   state (:func:`~agent_stores.backend.acquired_state`, the core's header splice) over the
   version this client wrote last, where the floor writes a new version and reads the
   state back; the state is decoded (:func:`~agent_stores.backend.decode_state`) and its
   tail decoded as the floor decodes its own;
2. the caller's new list is checked to begin with the history handed out (by identity):
   a store keeps what it already wrote only if the caller kept it;
3. a spilled chunk is written as the floor writes it and decoded again for the chunk
   cache: the next turn hands out copies read from the stored bytes, not the caller's
   objects, which Pydantic AI edits in place after a save;
4. the save's header lists the chunks and releases the lease
   (:func:`~agent_stores.backend.encode_state`); it lists at most the
   :data:`LISTED_CHUNKS` newest, about what the store's own header lists between merges
   (1 to 15 refs over 300 turns here); merging is store logic and not done;
5. a lease-renewal timer is armed when the turn begins and cancelled when it ends.

Left out, as the store's own logic: cold acquires, waiting clients and hand-over hints,
the catalog, chunk merges and their cleanup, deadlines, retries, error mapping,
telemetry. The statements are the floor's, with the state written on acquire; each
runs as the floor runs its own (psycopg, prepared, on one held cursor; ``sqlite3``
inline), into a table of its own shaped like agent-stores'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_stores.backend import (
    ChunkRef,
    StateHeader,
    acquired_state,
    decode_state,
    encode_state,
    new_version,
)
from memory_floors import drop_floor_table, sqlite_floor_file
from pydantic_ai.messages import ModelMessagesTypeAdapter
from session_floors import (
    POSTGRES_SAVE,
    SCOPE_PREFIX,
    TAIL_BYTES,
    TTL_SECONDS,
    postgres_save,
    postgres_session_table,
    sqlite_save,
)

OWNER = "format-floor-owner"
LEASE_SECONDS = 60.0
#: chunk refs the header lists at most (the newest); see the module docstring, item 4
LISTED_CHUNKS = 8


@dataclasses.dataclass(slots=True)
class Saved:
    """What a turn writes after the caller's work: the state, and a spilled chunk."""

    state: bytes
    #: the spilled chunk's one part: (its key, its bytes)
    chunk: tuple[str, bytes] | None
    #: the header ``state`` was encoded with
    header: StateHeader


class FormatTurns:
    """The client's work of format-floor turns around their two statements, by session:
    the state this client wrote last (and its version), and the messages before the
    tail, decoded once from the chunks they were spilled in."""

    #: True: the spilled messages are the caller's objects, not decoded from the chunk
    #: (the floor's shortcut, which a correct store cannot take; for
    #: ``lease_column_floors.py --keep-objects`` only)
    keep_objects = False

    def __init__(self) -> None:
        self._known: dict[str, tuple[bytes, str]] = {}
        self._held: dict[str, list[Any]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def first(self, sid: str, messages: Sequence[Any]) -> tuple[bytes, str]:
        """The first state of ``sid`` (released, the last message in the tail), and its
        version; the rest is held as if spilled."""
        now = time.time()
        header = StateHeader(fence=1, tail_count=1, created_at=now, updated_at=now)
        state = encode_state(header, ModelMessagesTypeAdapter.dump_json(list(messages)[-1:]))
        version = new_version()
        self._held[sid] = list(messages)[:-1]
        self._known[sid] = (state, version)
        return state, version

    def acquiring(self, sid: str, now: float) -> tuple[bytes, str, str]:
        """The state an acquire writes, its new version, and the version it replaces."""
        known, version = self._known[sid]
        state = acquired_state(known, owner=OWNER, lease_end=now + LEASE_SECONDS, now=now)
        assert state is not None
        return state, new_version(), version

    def acquired(self, sid: str, state: bytes) -> tuple[StateHeader, list[Any]]:
        """The header and the whole history handed to the caller, once the acquire wrote
        ``state``; the lease's renewal timer armed."""
        header, tail = decode_state(state)
        messages = ModelMessagesTypeAdapter.validate_json(tail)
        assert len(messages) == header.tail_count
        self._timer = asyncio.get_running_loop().call_later(LEASE_SECONDS / 3, _renew)
        return header, [*self._held[sid], *messages]

    def acquired_known(
        self, sid: str, state: bytes, header: StateHeader
    ) -> tuple[StateHeader, list[Any]]:
        """:meth:`acquired` for a client that kept the header it saved last (``state``'s)
        as an object: only the tail is decoded (``lease_column_floors.py``)."""
        messages = ModelMessagesTypeAdapter.validate_json(state[state.index(b"\n") + 1 :])
        assert len(messages) == header.tail_count
        self._timer = asyncio.get_running_loop().call_later(LEASE_SECONDS / 3, _renew)
        return header, [*self._held[sid], *messages]

    def saving(self, sid: str, header: StateHeader, new: list[Any], now: float) -> Saved:
        """What the save writes for the caller's list ``new``."""
        if self._timer is not None:
            self._timer.cancel()
        held = self._held[sid]
        # One list comparison (identity first, in C), as the store recognises a replacement
        # that extends the history it handed out.
        if new[: len(held)] != held:
            raise AssertionError("the bench's caller keeps the history it was handed")
        tail = ModelMessagesTypeAdapter.dump_json(new[len(held) :])
        chunks = header.chunks
        part = None
        if len(tail) > TAIL_BYTES:
            last = ModelMessagesTypeAdapter.dump_json(new[-1:])
            # "[a,b,c]" is "[a,b" + "," + "c]": the chunk is the rest, not encoded again
            chunk = tail[: len(tail) - len(last)] + b"]"
            spilled = (
                new[len(held) : -1]
                if self.keep_objects
                else ModelMessagesTypeAdapter.validate_json(chunk)  # the cache's copies
            )
            assert len(spilled) == len(new) - len(held) - 1
            held.extend(spilled)
            ref = ChunkRef(
                f"h/{new_version()}", len(spilled), len(chunk), 1, 0, expires_at=now + TTL_SECONDS
            )
            chunks = (*chunks, ref)[-LISTED_CHUNKS:]
            part = (ref.part_keys()[0], chunk)
            tail = last
        released = dataclasses.replace(
            header,
            lease=None,
            chunks=chunks,
            tail_count=len(new) - len(held),
            updated_at=now,
            released_by=OWNER,
            released_at=now,
        )
        return Saved(encode_state(released, tail), part, released)

    def saved(self, sid: str, state: bytes, version: str) -> None:
        self._known[sid] = (state, version)


def _renew() -> None:
    """The lease renewal a turn of a third of the lease would start (none here does)."""


class PostgresFormatFloor:
    """See the module docstring. Create with :meth:`open`."""

    def __init__(self, conn: Any, table: Any, statements: dict[str, bytes]) -> None:
        self._conn, self._table = conn, table
        self._cursor = conn.cursor()
        self._sql = statements
        self._turns = FormatTurns()

    @classmethod
    async def open(cls, url: str, table: str) -> PostgresFormatFloor:
        # The take is the save's statement with the state's expiry checked: it writes the
        # acquired state over the version this client wrote last.
        take = POSTGRES_SAVE + " AND (expires_at IS NULL OR expires_at > %(now)s)"
        conn, name, statements = await postgres_session_table(url, table, take)
        return cls(conn, name, statements)

    async def start(self, sid: str, messages: Sequence[Any]) -> None:
        state, version = self._turns.first(sid, messages)
        await self._conn.execute(self._sql["insert"], (SCOPE_PREFIX + sid, state, version))

    async def turn(self, sid: str, added: Sequence[Any]) -> None:
        cursor, scope, now, turns = self._cursor, SCOPE_PREFIX + sid, time.time(), self._turns
        state, token, expected = turns.acquiring(sid, now)
        params = {
            "value": state,
            "version": token,
            "expires_at": now + TTL_SECONDS,
            "scope": scope,
            "expected": expected,
            "now": now,
        }
        await cursor.execute(self._sql["take"], params, prepare=True)
        assert cursor.rowcount == 1
        header, history = turns.acquired(sid, state)
        saved = turns.saving(sid, header, [*history, *added], now)  # the caller's list
        expires_at = now + TTL_SECONDS
        version = await postgres_save(
            cursor, self._sql, scope, saved.state, token, expires_at, saved.chunk
        )
        turns.saved(sid, saved.state, version)

    async def close(self) -> None:
        await drop_floor_table(self._conn, self._table)


class SQLiteFormatFloor:
    """See the module docstring."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite_floor_file(path)
        self._turns = FormatTurns()

    async def start(self, sid: str, messages: Sequence[Any]) -> None:
        state, version = self._turns.first(sid, messages)
        self._conn.execute(
            "INSERT INTO kv VALUES (?, 'state', ?, ?, NULL)", (SCOPE_PREFIX + sid, state, version)
        )

    async def turn(self, sid: str, added: Sequence[Any]) -> None:
        conn, scope, now, turns = self._conn, SCOPE_PREFIX + sid, time.time(), self._turns
        state, token, expected = turns.acquiring(sid, now)
        taken = conn.execute(
            "UPDATE kv SET value = ?, version = ?, expires_at = ? WHERE scope = ? "
            "AND key = 'state' AND version = ? AND (expires_at IS NULL OR expires_at > ?)",
            (state, token, now + TTL_SECONDS, scope, expected, now),
        ).rowcount
        assert taken == 1
        header, history = turns.acquired(sid, state)
        saved = turns.saving(sid, header, [*history, *added], now)  # the caller's list
        version = sqlite_save(conn, scope, saved.state, token, now + TTL_SECONDS, saved.chunk)
        turns.saved(sid, saved.state, version)

    async def close(self) -> None:
        # The file is in the bench's temporary folder, removed with it.
        self._conn.close()
