"""The native memory and journal ports on PostgreSQL: one statement, one commit each.

* :class:`PostgresMemoryPort` — a memory write (the file record's conditional write, its
  receipt index entry and any directory markers) is one statement: data-modifying CTEs
  run in the statement's single transaction, and the record is written only if the index
  entry is absent, so a reused operation id writes nothing (the store then reads and
  answers the replay or the conflict).
* :class:`PostgresJournalPort` — a journal or step-event append (advance the log's
  position counter, create the entry unless its idempotency key exists) is one statement.

Both are handed to the core stores by this package's ``memory_store`` / ``checkpointer``
hooks. A statement whose connection breaks mid-flight surfaces as an unknown outcome
(``BACKEND_UNAVAILABLE``); retrying with the same operation replays.
"""

from __future__ import annotations

from typing import Any, LiteralString

from agent_stores.checkpointer.port import AppendOutcome, AppendRequest
from agent_stores.errors import ConflictError
from agent_stores.kv.base import Entry, new_version
from agent_stores.memory.port import MARKER_VALUE, FileWrite
from psycopg import AsyncConnection, sql

from .kv import PostgresKV

_MEMORY_WRITE: LiteralString = """
WITH taken AS (
    SELECT 1 FROM {kv}
    WHERE %(has_index)s AND scope = %(iscope)s AND key = %(ikey)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
),
upd AS (
    UPDATE {kv}
    SET value = %(value)s, version = %(version)s, expires_at = %(expires_at)s::float8
    WHERE %(expected)s::text IS NOT NULL AND scope = %(scope)s AND key = %(key)s
      AND version = %(expected)s AND (expires_at IS NULL OR expires_at > %(now)s)
      AND NOT EXISTS (SELECT 1 FROM taken)
    RETURNING 1
),
ins AS (
    INSERT INTO {kv} AS t (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, %(key)s::text, %(value)s::bytea, %(version)s::text,
           %(expires_at)s::float8
    WHERE %(expected)s::text IS NULL AND NOT EXISTS (SELECT 1 FROM taken)
    ON CONFLICT (scope, key) DO UPDATE
        SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at
        WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s
    RETURNING 1
),
done AS (
    SELECT 1 FROM upd UNION ALL SELECT 1 FROM ins
),
idx AS (
    INSERT INTO {kv} AS t (scope, key, value, version, expires_at)
    SELECT %(iscope)s::text, %(ikey)s::text, %(ivalue)s::bytea, %(iversion)s::text,
           %(iexpires_at)s::float8
    WHERE %(has_index)s AND EXISTS (SELECT 1 FROM done)
    ON CONFLICT (scope, key) DO UPDATE
        SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at
        WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s
    RETURNING 1
),
mark AS (
    INSERT INTO {kv} (scope, key, value, version, expires_at)
    SELECT m.s, m.k, %(marker)s::bytea, m.v, NULL
    FROM unnest(%(mscopes)s::text[], %(mkeys)s::text[], %(mversions)s::text[]) AS m(s, k, v)
    WHERE EXISTS (SELECT 1 FROM done)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM done), EXISTS (SELECT 1 FROM taken),
       (SELECT count(*) FROM idx), (SELECT count(*) FROM mark)
"""

_JOURNAL_APPEND: LiteralString = """
WITH existing AS (
    SELECT value, version FROM {kv}
    WHERE scope = %(scope)s AND key = %(key)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
),
upd AS (
    UPDATE {kv}
    SET value = %(hvalue)s, version = %(hversion_new)s, expires_at = %(expires_at)s::float8
    WHERE %(hversion)s::text IS NOT NULL AND scope = %(scope)s AND key = %(hkey)s
      AND version = %(hversion)s AND (expires_at IS NULL OR expires_at > %(now)s)
      AND NOT EXISTS (SELECT 1 FROM existing)
    RETURNING 1
),
ins AS (
    INSERT INTO {kv} AS t (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, %(hkey)s::text, %(hvalue)s::bytea, %(hversion_new)s::text,
           %(expires_at)s::float8
    WHERE %(hversion)s::text IS NULL AND NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (scope, key) DO UPDATE
        SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at
        WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s
    RETURNING 1
),
head AS (
    SELECT 1 FROM upd UNION ALL SELECT 1 FROM ins
),
entry AS (
    INSERT INTO {kv} AS t (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, %(key)s::text, %(value)s::bytea, %(version)s::text,
           %(expires_at)s::float8
    WHERE EXISTS (SELECT 1 FROM head)
    ON CONFLICT (scope, key) DO UPDATE
        SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at
        WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM head), (SELECT count(*) FROM entry),
       (SELECT value FROM existing), (SELECT version FROM existing)
"""


def _query(kv: PostgresKV, text: LiteralString) -> bytes:
    return sql.SQL(text).format(kv=kv.names.kv).as_bytes(None)


class PostgresMemoryPort:
    """:class:`~agent_stores.memory.port.MemoryPort` on :class:`PostgresKV` (atomic)."""

    atomic = True

    def __init__(self, kv: PostgresKV) -> None:
        self.kv = kv
        self._write_sql = _query(kv, _MEMORY_WRITE)

    async def read(self, scope: str, key: str) -> Entry | None:
        """``kv.get``."""
        return await self.kv.get(scope, key)

    async def write(self, write: FileWrite) -> str:
        """Record, receipt index entry and markers in one statement (one commit)."""
        kv = self.kv
        now = kv.clock()
        kv._check_value(write.scope, write.key, write.value)
        index = write.index
        if index is not None:
            kv._check_value(index.scope, index.key, index.value)
        version = new_version()
        params: dict[str, Any] = {
            "scope": write.scope,
            "key": write.key,
            "value": write.value,
            "version": version,
            "expected": write.expected_version,
            "expires_at": None if write.ttl is None else now + write.ttl,
            "now": now,
            "has_index": index is not None,
            "iscope": index.scope if index else "",
            "ikey": index.key if index else "",
            "ivalue": index.value if index else b"",
            "iversion": new_version(),
            "iexpires_at": None if index is None or index.ttl is None else now + index.ttl,
            "marker": MARKER_VALUE,
            "mscopes": [m[0] for m in write.markers],
            "mkeys": [m[1] for m in write.markers],
            "mversions": [new_version() for _ in write.markers],
        }

        async def run(conn: AsyncConnection[Any]) -> tuple[int, bool]:
            cur = await conn.execute(self._write_sql, params)
            row = await cur.fetchone()
            assert row is not None
            return int(row[0]), bool(row[1])

        done, taken = await kv.run_native_write("memory write", run)
        if not done:
            if taken and index is not None:
                raise ConflictError("operation already indexed", scope=index.scope, key=index.key)
            raise ConflictError("record changed", scope=write.scope, key=write.key)
        return version


class PostgresJournalPort:
    """:class:`~agent_stores.checkpointer.port.JournalPort` on :class:`PostgresKV` (atomic)."""

    atomic = True

    def __init__(self, kv: PostgresKV) -> None:
        self.kv = kv
        self._append_sql = _query(kv, _JOURNAL_APPEND)

    async def append(self, request: AppendRequest) -> AppendOutcome:
        """Counter and entry in one statement (one commit)."""
        kv = self.kv
        now = kv.clock()
        kv._check_value(request.scope, request.key, request.value)
        version = new_version()
        head_version = new_version()
        params: dict[str, Any] = {
            "scope": request.scope,
            "key": request.key,
            "value": request.value,
            "version": version,
            "hkey": request.head_key,
            "hvalue": request.head_value,
            "hversion": request.head_version,
            "hversion_new": head_version,
            "expires_at": None if request.ttl is None else now + request.ttl,
            "now": now,
        }

        async def run(conn: AsyncConnection[Any]) -> tuple[Any, ...]:
            cur = await conn.execute(self._append_sql, params)
            row = await cur.fetchone()
            assert row is not None
            return tuple(row)

        moved, created, value, existing_version = await kv.run_native_write("journal append", run)
        if value is not None:
            return AppendOutcome(None, None, Entry(bytes(value), str(existing_version), None))
        if not moved:
            raise ConflictError("position counter moved", scope=request.scope, key=request.head_key)
        return AppendOutcome(version if created else None, head_version, None)
