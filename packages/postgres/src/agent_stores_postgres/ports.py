"""The native memory and journal ports on PostgreSQL: one statement, one commit each.

* :class:`PostgresMemoryPort` — a memory write (the file record's conditional write, its
  receipt index entry and any directory markers) is one statement: data-modifying CTEs
  run in the statement's single transaction, and the record is written only if the index
  entry is absent, so a reused operation id writes nothing (the store then reads and
  answers the replay or the conflict).
* :class:`PostgresJournalPort` — a journal or step-event append (advance the log's
  position counter, create the entry unless its idempotency key exists) is one statement.

Both are handed to the core stores by this package's ``memory_store`` / ``checkpointer``
hooks. A statement whose connection breaks mid-flight (a lost reply) is confirmed by
reading back the record it wrote: the new version there means it applied (versions are
never reused). Otherwise the outcome is unknown (``BACKEND_UNAVAILABLE``); retrying with
the same operation replays.

Both apply the public KV API's checks (closed store, ids, value sizes, TTLs) to everything
they would write before sending anything: the generic ports get them from the KV calls
they make, and a port must refuse exactly what they refuse.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
from agent_stores.backend import (
    MARKER_VALUE,
    AppendOutcome,
    AppendRequest,
    Entry,
    FileWrite,
    check_append,
    check_file_write,
    new_version,
)
from agent_stores.errors import ConflictError
from psycopg import AsyncConnection, sql

from .kv import PostgresKV
from .pool import write_cursor

# The memory write is assembled from these parts, one statement text per shape (create or
# replace, with or without a receipt index entry, with or without directory markers), so
# each shape plans and binds only what it uses. Data-modifying CTEs always run to
# completion in the statement's one transaction (autocommit: one commit).
_LIVE_AT_NOW: LiteralString = "(expires_at IS NULL OR expires_at > %(now)s)"

_TAKEN: LiteralString = (
    "taken AS (SELECT 1 FROM {kv} WHERE scope = %(iscope)s AND key = %(ikey)s AND "
    + _LIVE_AT_NOW
    + ")"
)

_REPLACE: LiteralString = (
    "done AS (UPDATE {kv} SET value = %(value)b, version = %(version)s, "
    "expires_at = %(expires_at)s::float8 "
    "WHERE scope = %(scope)s AND key = %(key)s AND version = %(expected)s AND "
    + _LIVE_AT_NOW
    + "{unless_taken} RETURNING 1)"
)

_CREATE: LiteralString = (
    "done AS (INSERT INTO {kv} AS t (scope, key, value, version, expires_at) "
    "SELECT %(scope)s::text, %(key)s::text, %(value)b::bytea, %(version)s::text, "
    "%(expires_at)s::float8{where_untaken} "
    "ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value, "
    "version = EXCLUDED.version, expires_at = EXCLUDED.expires_at "
    "WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s RETURNING 1)"
)

# The index entry: created, or written over an expired one. A live entry committed by a
# concurrent write of the same operation (invisible to ``taken``, which reads the
# statement's snapshot) makes the insert do nothing; the final SELECT then divides by
# zero, which aborts the whole statement, so a record never commits without its index.
_INDEX: LiteralString = (
    "idx AS (INSERT INTO {kv} AS t (scope, key, value, version, expires_at) "
    "SELECT %(iscope)s::text, %(ikey)s::text, %(ivalue)b::bytea, %(iversion)s::text, "
    "%(iexpires_at)s::float8 WHERE EXISTS (SELECT 1 FROM done) "
    "ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value, "
    "version = EXCLUDED.version, expires_at = EXCLUDED.expires_at "
    "WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s RETURNING 1)"
)

_MARKERS: LiteralString = (
    "mark AS (INSERT INTO {kv} (scope, key, value, version, expires_at) "
    "SELECT m.s, m.k, %(marker)b::bytea, m.v, NULL "
    "FROM unnest(%(mscopes)s::text[], %(mkeys)s::text[], %(mversions)s::text[]) AS m(s, k, v) "
    "WHERE EXISTS (SELECT 1 FROM done) ON CONFLICT (scope, key) DO NOTHING)"
)

_RESULT_INDEXED: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM done), EXISTS (SELECT 1 FROM taken), "
    "CASE WHEN EXISTS (SELECT 1 FROM done) "
    "THEN 1 / (SELECT count(*)::int FROM idx) ELSE 1 END"
)
_RESULT_PLAIN: LiteralString = "SELECT EXISTS (SELECT 1 FROM done), false, 1"


def _memory_write_sql(*, replace: bool, index: bool, markers: bool) -> LiteralString:
    """The statement text of one write shape (identifiers still as ``{kv}``)."""
    parts: list[LiteralString] = []
    if index:
        parts.append(_TAKEN)
    if replace:
        unless: LiteralString = " AND NOT EXISTS (SELECT 1 FROM taken)" if index else ""
        parts.append(_REPLACE.replace("{unless_taken}", unless))
    else:
        where: LiteralString = " WHERE NOT EXISTS (SELECT 1 FROM taken)" if index else ""
        parts.append(_CREATE.replace("{where_untaken}", where))
    if index:
        parts.append(_INDEX)
    if markers:
        parts.append(_MARKERS)
    return "WITH " + ",\n".join(parts) + "\n" + (_RESULT_INDEXED if index else _RESULT_PLAIN)


# A journal append, one statement text per shape (the log's counter advanced or created).
_EXISTING: LiteralString = (
    "existing AS (SELECT value, version FROM {kv} WHERE scope = %(scope)s AND key = %(key)s "
    "AND " + _LIVE_AT_NOW + ")"
)
_HEAD_REPLACE: LiteralString = (
    "head AS (UPDATE {kv} SET value = %(hvalue)b, version = %(hversion_new)s, "
    "expires_at = %(expires_at)s::float8 "
    "WHERE scope = %(scope)s AND key = %(hkey)s AND version = %(hversion)s AND "
    + _LIVE_AT_NOW
    + " AND NOT EXISTS (SELECT 1 FROM existing) RETURNING 1)"
)
_HEAD_CREATE: LiteralString = (
    "head AS (INSERT INTO {kv} AS t (scope, key, value, version, expires_at) "
    "SELECT %(scope)s::text, %(hkey)s::text, %(hvalue)b::bytea, %(hversion_new)s::text, "
    "%(expires_at)s::float8 WHERE NOT EXISTS (SELECT 1 FROM existing) "
    "ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value, "
    "version = EXCLUDED.version, expires_at = EXCLUDED.expires_at "
    "WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s RETURNING 1)"
)
_ENTRY: LiteralString = (
    "entry AS (INSERT INTO {kv} AS t (scope, key, value, version, expires_at) "
    "SELECT %(scope)s::text, %(key)s::text, %(value)b::bytea, %(version)s::text, "
    "%(expires_at)s::float8 WHERE EXISTS (SELECT 1 FROM head) "
    "ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value, "
    "version = EXCLUDED.version, expires_at = EXCLUDED.expires_at "
    "WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s RETURNING 1)"
)
_APPEND_RESULT: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM head), EXISTS (SELECT 1 FROM entry), "
    "(SELECT value FROM existing), (SELECT version FROM existing)"
)


def _journal_append_sql(*, replace: bool) -> LiteralString:
    head = _HEAD_REPLACE if replace else _HEAD_CREATE
    return "WITH " + ",\n".join([_EXISTING, head, _ENTRY]) + "\n" + _APPEND_RESULT


def _query(kv: PostgresKV, text: LiteralString) -> bytes:
    return sql.SQL(text).format(kv=kv.names.kv).as_bytes(None)


def _prepare(kv: PostgresKV) -> bool:
    """Prepare the port's statements on first use (they run on every write, and a create
    shape may otherwise stay unprepared for its first executions on each connection),
    unless preparing is off (``prepare_threshold=none``, e.g. behind PgBouncer)."""
    return kv.config.prepare_threshold is not None


class PostgresMemoryPort:
    """:class:`~agent_stores.memory.port.MemoryPort` on :class:`PostgresKV` (atomic)."""

    atomic = True

    def __init__(self, kv: PostgresKV) -> None:
        self.kv = kv
        self._prepare = _prepare(kv)
        self._write_sql = {
            (replace, index, markers): _query(
                kv, _memory_write_sql(replace=replace, index=index, markers=markers)
            )
            for replace in (False, True)
            for index in (False, True)
            for markers in (False, True)
        }

    async def read(self, scope: str, key: str) -> Entry | None:
        """``kv.get``."""
        return await self.kv.get(scope, key)

    async def write(self, write: FileWrite) -> str:
        """Record, receipt index entry and markers in one statement (one commit)."""
        kv = self.kv
        check_file_write(kv, write)
        markers = write.markers
        index = write.index
        now = kv.clock()
        version = new_version()
        params: dict[str, Any] = {
            "scope": write.scope,
            "key": write.key,
            "value": write.value,
            "version": version,
            "expires_at": kv.expires_at(write.ttl, now),
            "now": now,
        }
        if write.expected_version is not None:
            params["expected"] = write.expected_version
        if index is not None:
            params["iscope"] = index.scope
            params["ikey"] = index.key
            params["ivalue"] = index.value
            params["iversion"] = new_version()
            params["iexpires_at"] = kv.expires_at(index.ttl, now)
        if markers:
            params["marker"] = MARKER_VALUE
            params["mscopes"] = [m[0] for m in markers]
            params["mkeys"] = [m[1] for m in markers]
            params["mversions"] = [new_version() for _ in markers]
        statement = self._write_sql[
            (write.expected_version is not None, index is not None, bool(markers))
        ]

        async def run(conn: AsyncConnection[Any]) -> tuple[bool, bool]:
            try:
                cur = await write_cursor(conn).execute(statement, params, prepare=self._prepare)
            except psycopg.errors.DivisionByZero:
                # The index entry was committed by a concurrent write of the same operation
                # after this statement's snapshot: the statement rolled back as a whole.
                return False, True
            row = await cur.fetchone()
            assert row is not None
            return bool(row[0]), bool(row[1])

        async def confirm() -> tuple[bool, bool] | None:
            found = await kv.version_of("memory write", write.scope, write.key)
            return (True, False) if found == version else None

        done, taken = await kv.run_native_write("memory write", run, confirm=confirm)
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
        self._prepare = _prepare(kv)
        self._append_sql = {
            replace: _query(kv, _journal_append_sql(replace=replace)) for replace in (False, True)
        }

    async def append(self, request: AppendRequest) -> AppendOutcome:
        """Counter and entry in one statement (one commit)."""
        kv = self.kv
        check_append(kv, request)
        now = kv.clock()
        version = new_version()
        head_version = new_version()
        params: dict[str, Any] = {
            "scope": request.scope,
            "key": request.key,
            "value": request.value,
            "version": version,
            "hkey": request.head_key,
            "hvalue": request.head_value,
            "hversion_new": head_version,
            "expires_at": kv.expires_at(request.ttl, now),
            "now": now,
        }
        if request.head_version is not None:
            params["hversion"] = request.head_version
        statement = self._append_sql[request.head_version is not None]

        async def run(conn: AsyncConnection[Any]) -> tuple[Any, ...]:
            cur = await write_cursor(conn).execute(statement, params, prepare=self._prepare)
            row = await cur.fetchone()
            assert row is not None
            return tuple(row)

        async def confirm() -> tuple[Any, ...] | None:
            found = await kv.version_of("journal append", request.scope, request.key)
            return (True, True, None, None) if found == version else None

        moved, created, value, existing_version = await kv.run_native_write(
            "journal append", run, confirm=confirm
        )
        if value is not None:
            return AppendOutcome(None, None, Entry(bytes(value), str(existing_version), None))
        if not moved:
            raise ConflictError("position counter moved", scope=request.scope, key=request.head_key)
        return AppendOutcome(version if created else None, head_version, None)
