"""``sqlite:///relative.db`` / ``sqlite:////absolute.db`` — the embedded default backend.

One dedicated worker thread per store owns the ``sqlite3`` connection; every primitive
(including a whole ``commit`` transaction) runs there as one function, so the event loop
never blocks and a multi-statement transaction is never interleaved with another task's
statement. (aiosqlite forwards single statements only, which is why it is not used.)

Cross-process safety comes from SQLite itself: WAL mode, a busy timeout, and every
conditional write being one ``INSERT … ON CONFLICT … WHERE`` / ``UPDATE … WHERE version``
/ ``DELETE … WHERE version`` statement (or a ``BEGIN IMMEDIATE`` transaction for commit),
so two processes doing CAS on one key never both win.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar
from urllib.parse import quote

from ..errors import BackendUnavailableError, ConfigError, ConflictError
from ..kv.base import (
    DEFAULT_DEADLINE_SECONDS,
    Check,
    Clock,
    Create,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    new_version,
    prefix_upper_bound,
)
from ..url import StoreURL, URLOption, URLOptions, check_options

T = TypeVar("T")

DEFAULT_MAX_VALUE_BYTES = 4 << 20
DEFAULT_BUSY_TIMEOUT_MS = 30_000
#: The command that creates the file and its table when ``auto_setup`` is off.
SETUP_COMMAND = "agent-stores setup"

URL_OPTIONS = URLOptions(
    URLOption("max_value_bytes", "int", DEFAULT_MAX_VALUE_BYTES, "largest value per entry"),
    URLOption(
        "busy_timeout_ms",
        "int",
        DEFAULT_BUSY_TIMEOUT_MS,
        "milliseconds to wait for another process's write lock",
    ),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE_SECONDS,
        "seconds one call may take before `BackendUnavailableError`",
    ),
    URLOption.auto_setup(
        True,
        "the database file, its folder and its table; `false`: a missing file or table "
        "fails with a hint to run `agent-stores setup URL`",
    ),
)

# A rowid table, its (scope, key) key in an index of its own: values are up to many MB
# (history chunks, memory files), and in a WITHOUT ROWID table a value is part of the key
# record, so a lookup that compares against a large record on its way down the B-tree
# reads that whole record first (about 1.3 ms per statement beside a 5 MB chunk, measured).
log = logging.getLogger("agent_stores.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_stores_kv (
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      BLOB NOT NULL,
    version    TEXT NOT NULL,
    expires_at REAL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS agent_stores_kv_expiry ON agent_stores_kv (expires_at)
    WHERE expires_at IS NOT NULL;
"""

#: Moves a table of the first layout (WITHOUT ROWID) to the one above, in one transaction.
_UPGRADE = (
    "ALTER TABLE agent_stores_kv RENAME TO agent_stores_kv_upgrading",
    "DROP INDEX IF EXISTS agent_stores_kv_expiry",
    *[s for s in _SCHEMA.split(";") if s.strip()],
    "INSERT INTO agent_stores_kv (scope, key, value, version, expires_at) "
    "SELECT scope, key, value, version, expires_at FROM agent_stores_kv_upgrading",
    "DROP TABLE agent_stores_kv_upgrading",
)

_LIVE = "(expires_at IS NULL OR expires_at > ?)"
#: keys read by one ``IN (…)`` (SQLite allows 32,766 parameters a statement since 3.32)
_KEYS_PER_STATEMENT = 500


def _prefix_range(sql: str, params: list[Any], column: str, prefix: str) -> tuple[str, list[Any]]:
    """Turn a prefix into a primary-key range (BINARY collation is byte order)."""
    if not prefix:
        return sql, params
    sql += f" AND {column} >= ?"
    params = [*params, prefix]
    upper = prefix_upper_bound(prefix)
    if upper is not None:
        sql += f" AND {column} < ?"
        params.append(upper)
    return sql, params


class _Busy(Exception):
    """An inline statement met a lock held by another connection (nothing written)."""


class SQLiteKV(KVStore):
    """KV store in one SQLite file (WAL). Safe across tasks, threads and OS processes."""

    backend_name = "sqlite"
    capabilities = KVCapabilities(commit=True, shared_across_processes=True, answers_inline=True)
    url_options: ClassVar[URLOptions] = URL_OPTIONS

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        clock: Clock | None = None,
        auto_setup: bool = True,
    ) -> None:
        super().__init__(clock=clock)
        self._auto_setup = auto_setup
        if not isinstance(busy_timeout_ms, int) or busy_timeout_ms < 0:
            raise ConfigError(
                detail=f"busy_timeout_ms must be an integer >= 0, got {busy_timeout_ms!r}"
            )
        self.limits = KVLimits(max_value_bytes=max_value_bytes)
        self.path = str(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        # Whether the connection's busy timeout is the configured one (the worker thread
        # waits for locks) or 0 (inline calls never wait): switched only when the other
        # kind of call comes, not twice per inline call.
        self._conn_waits = False
        # Held by whoever uses the connection: the worker thread, or the event loop's
        # thread running a statement inline (see _run).
        self._conn_lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []

    @property
    def busy_timeout_ms(self) -> int:
        """Milliseconds a statement waits for another connection's write lock."""
        return self._busy_timeout_ms

    def close_with(self, close: Callable[[], None]) -> None:
        """Call ``close`` when this store closes (a port's own connection to the file)."""
        self._closers.append(close)

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> SQLiteKV:
        """``sqlite:///rel.db`` (relative), ``sqlite:////abs.db`` (absolute); options: :data:`URL_OPTIONS`."""
        if url.host not in (None, "", "localhost"):
            raise ConfigError(
                detail=f"{url}: a SQLite URL has no host; use sqlite:///relative.db or sqlite:////absolute/path.db"
            )
        path = url.path[1:] if url.path.startswith("/") else url.path
        if not path:
            raise ConfigError(detail=f"{url}: missing file path, e.g. sqlite:///agent.db")
        URL_OPTIONS.check(url)
        check_options("sqlite://", options, "clock", "max_value_bytes", "busy_timeout_ms")
        kwargs: dict[str, Any] = {
            name: options[name]
            for name in ("max_value_bytes", "busy_timeout_ms")
            if name in options
        }
        if url.query_get("max_value_bytes") is not None:
            kwargs["max_value_bytes"] = url.int_option("max_value_bytes", 0)
        if url.query_get("busy_timeout_ms") is not None:
            kwargs["busy_timeout_ms"] = url.int_option("busy_timeout_ms", 0)
        clock = options.get("clock")
        kv = cls(
            path,
            clock=clock if callable(clock) else None,
            auto_setup=url.bool_option("auto_setup", True),
            **kwargs,
        )
        kv.deadline_seconds = url.float_option("deadline", kv.deadline_seconds, minimum=0.001)
        return kv

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default true): create the file and its table on first use."""
        return self._auto_setup

    # -- worker thread --------------------------------------------------------------------

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        """The connection, opened on first use; ``create``: the file, folder and table too,
        else a missing file or table is refused with the setup hint."""
        if self._conn is None:
            path = Path(self.path).expanduser()
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
                target, uri = str(path), False
            else:
                # mode=rw: a file removed since would otherwise be created empty.
                if not path.is_file():
                    raise self._not_set_up(f"the database file {path} does not exist")
                target, uri = f"file:{quote(str(path))}?mode=rw", True
            conn = sqlite3.connect(
                target,
                uri=uri,
                timeout=self._busy_timeout_ms / 1000,
                isolation_level=None,  # autocommit; transactions are explicit
                check_same_thread=False,
            )
            try:
                if not create and not self._has_table(conn):
                    raise self._not_set_up(f"{path} has no agent_stores_kv table")
                self._open(conn, create=create)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self._conn_waits = True
        return self._conn

    def _not_set_up(self, what: str) -> ConfigError:
        return ConfigError(
            detail=f"{self.describe()}: {what}, and auto_setup is off; create it with "
            f"`{SETUP_COMMAND} {self.describe()}` (or drop ?auto_setup=false)"
        )

    @staticmethod
    def _has_table(conn: sqlite3.Connection) -> bool:
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'agent_stores_kv'"
        ).fetchone()
        return row is not None

    def _open(self, conn: sqlite3.Connection, *, create: bool) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        mode = self._enable_wal(conn)
        if mode != "wal":
            raise BackendUnavailableError(
                detail=f"{self.describe()}: could not enable WAL (got {mode})"
            )
        conn.execute("PRAGMA synchronous = NORMAL")
        if create:
            self._create_schema(conn)
        self._upgrade_layout(conn)

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        # Several processes may create the schema at once: do it under the write lock.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _first_layout(conn: sqlite3.Connection) -> bool:
        row = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'agent_stores_kv'"
        ).fetchone()
        return row is not None and "WITHOUT ROWID" in str(row[0]).upper()

    def _upgrade_layout(self, conn: sqlite3.Connection) -> None:
        """Move a file written by an earlier version to the current table layout, once:
        under the write lock, checked again there (another process may have done it)."""
        if not self._first_layout(conn):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._first_layout(conn):
                log.info("%s: moving the table to the rowid layout (once)", self.describe())
                for statement in _UPGRADE:
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _enable_wal(self, conn: sqlite3.Connection) -> str:
        """Switch to WAL, retrying: the switch needs an exclusive lock and SQLite reports
        SQLITE_BUSY for it at once, without calling the busy handler, when another
        connection is opening the same new file at the same moment."""
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        delay = 0.005
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.1)

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, setting_up: bool = False) -> T:
        conn = None if setting_up else self._conn
        if conn is not None and self._conn_lock.acquire(blocking=False):
            # Inline on the event loop's thread when the connection is free and no lock
            # must be waited for (busy timeout 0): a local statement takes microseconds,
            # a hop to the worker thread and back costs more than the statement. A busy
            # database (another process writing) goes to the worker, which waits.
            try:
                return self._inline(conn, fn)
            except _Busy:
                pass
            finally:
                self._conn_lock.release()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="agent-stores-sqlite"
            )

        def call() -> T:
            with self._conn_lock:
                try:
                    conn = self._connect(create=setting_up or self._auto_setup)
                    if not self._conn_waits:
                        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
                        self._conn_waits = True
                    return fn(conn)
                except sqlite3.OperationalError as exc:
                    raise BackendUnavailableError(detail=f"{self.describe()}: {exc}") from exc
                except sqlite3.DatabaseError as exc:
                    raise BackendUnavailableError(
                        detail=f"{self.describe()}: database error: {exc}"
                    ) from exc

        # Future from a private executor: independent of which event loop awaits it.
        return await asyncio.wrap_future(self._executor.submit(call))

    def _inline(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn_waits:
            conn.execute("PRAGMA busy_timeout = 0")
            self._conn_waits = False
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise _Busy from exc  # nothing was written: run it on the worker
            raise BackendUnavailableError(detail=f"{self.describe()}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise BackendUnavailableError(
                detail=f"{self.describe()}: database error: {exc}"
            ) from exc

    def get_inline(self, scope: str, key: str) -> Entry | Literal[False] | None:
        """:meth:`get` run at once on the event loop's thread, or False when it cannot be:
        the connection is not open yet or in use, or the database is locked (then await
        :meth:`get`, which waits on the worker thread).

        For the native ports' reads: a statement run inline finishes before anything else
        on the loop runs, so no deadline is armed for it (it never waits for a lock), and
        the call is not counted as a round trip in telemetry, as for other native paths.
        """
        self.check_open()
        self.check_ids(scope, key)
        conn = self._conn
        if conn is None or not self._conn_lock.acquire(blocking=False):
            return False
        try:
            entry = self._inline(conn, _get_op(scope, key))
        except _Busy:
            return False
        finally:
            self._conn_lock.release()
        if entry is None or entry.expired(self.clock()):
            return None
        return entry

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` (statements that only read) on the store's connection, outside any
        transaction (:meth:`autocommit`). For the native ports of the stores."""
        return await self.autocommit(fn)

    async def autocommit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the store's connection outside any explicit transaction: each of
        its statements commits by itself. For a native port's reads, and its write of one
        statement, which needs no ``BEGIN`` and ``COMMIT`` around it to be atomic."""
        self.check_open()
        return await self._run(fn)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside one ``BEGIN IMMEDIATE`` transaction on the worker thread (one
        commit; rolled back when ``fn`` raises). For the native ports of the stores."""
        self.check_open()

        def op(c: sqlite3.Connection) -> T:
            c.execute("BEGIN IMMEDIATE")
            try:
                result = fn(c)
                c.execute("COMMIT")
                return result
            except BaseException:
                c.execute("ROLLBACK")
                raise

        return await self._run(op)

    @staticmethod
    def entries_in(
        c: sqlite3.Connection, scope: str, keys: Sequence[str], now: float | None = None
    ) -> dict[str, Entry]:
        """The entries of ``keys`` in ``scope`` on connection ``c``, by key: the live ones
        at ``now``, or (None) expired ones too. One statement per 500 keys."""
        live, extra = ("", ()) if now is None else (f" AND {_LIVE}", (now,))
        out: dict[str, Entry] = {}
        for start in range(0, len(keys), _KEYS_PER_STATEMENT):
            chunk = keys[start : start + _KEYS_PER_STATEMENT]
            marks = ",".join("?" * len(chunk))
            for key, value, version, expires_at in c.execute(
                "SELECT key, value, version, expires_at FROM agent_stores_kv "
                f"WHERE scope = ? AND key IN ({marks}){live}",
                (scope, *chunk, *extra),
            ):
                out[key] = Entry(bytes(value), version, expires_at)
        return out

    async def _aclose(self) -> None:
        for close_port in self._closers:
            close_port()
        self._closers.clear()
        executor = self._executor
        if executor is None:
            return

        def close() -> None:
            with self._conn_lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await asyncio.wrap_future(executor.submit(close))
        executor.shutdown(wait=False)
        self._executor = None

    async def setup(self) -> None:
        """Create the file, its folder and its table (idempotent, whatever ``auto_setup``)."""

        def create_missing(conn: sqlite3.Connection) -> None:
            # The connection may have been opened on a file set up earlier (auto_setup off).
            if not self._has_table(conn):
                self._create_schema(conn)

        await self._run(create_missing, setting_up=True)

    async def purge_expired(self) -> int:
        now = self.clock()
        return await self._run(
            lambda c: (
                c.execute(
                    "DELETE FROM agent_stores_kv WHERE expires_at IS NOT NULL AND expires_at <= ?",
                    (now,),
                ).rowcount
            )
        )

    # -- primitives -----------------------------------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        return await self._run(_get_op(scope, key))

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        return await self._run(lambda c: self.entries_in(c, scope, keys))

    @staticmethod
    def _create_in(
        c: sqlite3.Connection,
        scope: str,
        key: str,
        value: bytes,
        expires_at: float | None,
        now: float,
    ) -> str | None:
        """Create-if-absent on ``c`` (inside :meth:`transaction`): the version, or None."""
        version = new_version()
        cur = c.execute(
            "INSERT INTO agent_stores_kv (scope, key, value, version, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, version = excluded.version, "
            "expires_at = excluded.expires_at "
            "WHERE agent_stores_kv.expires_at IS NOT NULL AND agent_stores_kv.expires_at <= ?",
            (scope, key, bytes(value), version, expires_at, now),
        )
        return version if cur.rowcount == 1 else None

    @staticmethod
    def _replace_in(
        c: sqlite3.Connection,
        scope: str,
        key: str,
        value: bytes,
        expected: str,
        expires_at: float | None,
        now: float,
    ) -> str | None:
        """Replace-if-version on ``c`` (inside :meth:`transaction`): the version, or None."""
        version = new_version()
        cur = c.execute(
            f"UPDATE agent_stores_kv SET value = ?, version = ?, expires_at = ? "
            f"WHERE scope = ? AND key = ? AND version = ? AND {_LIVE}",
            (bytes(value), version, expires_at, scope, key, expected, now),
        )
        return version if cur.rowcount == 1 else None

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        version = await self._run(lambda c: self._create_in(c, scope, key, value, expires_at, now))
        if version is None:
            raise ConflictError("key exists", scope=scope, key=key)
        return version

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        version = await self._run(
            lambda c: self._replace_in(c, scope, key, value, expected_version, expires_at, now)
        )
        if version is None:
            raise ConflictError("version mismatch", scope=scope, key=key)
        return version

    @staticmethod
    def _delete_in(
        c: sqlite3.Connection, scope: str, key: str, expected: str | None, now: float
    ) -> bool:
        """Delete (if at ``expected``, when given) on ``c`` (inside :meth:`transaction`)."""
        if expected is None:
            cur = c.execute(
                f"DELETE FROM agent_stores_kv WHERE scope = ? AND key = ? AND {_LIVE}",
                (scope, key, now),
            )
        else:
            cur = c.execute(
                f"DELETE FROM agent_stores_kv WHERE scope = ? AND key = ? AND version = ? AND {_LIVE}",
                (scope, key, expected, now),
            )
        return cur.rowcount == 1

    # The native ports' names for the primitives above: the same functions, so a port's
    # statement costs no second call.
    create_in = _create_in
    replace_in = _replace_in
    delete_in = _delete_in

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        return await self._run(lambda c: self._delete_in(c, scope, key, expected_version, now))

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        cols = "key, value, version, expires_at" if values else "key"
        sql = f"SELECT {cols} FROM agent_stores_kv WHERE scope = ? AND {_LIVE}"
        params: list[Any] = [scope, now]
        sql, params = _prefix_range(sql, params, "key", prefix)
        if start_after is not None:
            sql += " AND key > ?"
            params.append(start_after)
        sql += " ORDER BY key LIMIT ?"
        params.append(limit)

        def op(c: sqlite3.Connection) -> list[ScanItem]:
            rows = c.execute(sql, params).fetchall()
            if values:
                return [ScanItem(r[0], Entry(bytes(r[1]), r[2], r[3])) for r in rows]
            return [ScanItem(r[0], None) for r in rows]

        return await self._run(op)

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        sql = f"SELECT DISTINCT scope FROM agent_stores_kv WHERE {_LIVE}"
        params: list[Any] = [now]
        sql, params = _prefix_range(sql, params, "scope", prefix)
        if start_after is not None:
            sql += " AND scope > ?"
            params.append(start_after)
        sql += " ORDER BY scope LIMIT ?"
        params.append(limit)
        return await self._run(lambda c: [r[0] for r in c.execute(sql, params).fetchall()])

    async def _drop_scope(self, scope: str) -> int:
        return await self._run(
            lambda c: c.execute("DELETE FROM agent_stores_kv WHERE scope = ?", (scope,)).rowcount
        )

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        def op(c: sqlite3.Connection) -> list[str | None]:
            c.execute("BEGIN IMMEDIATE")
            try:
                results: list[str | None] = []
                for index, item in enumerate(ops):
                    ok: bool
                    result: str | None = None
                    if isinstance(item, Create):
                        result = self._create_in(
                            c, scope, item.key, item.value, self.expires_at(item.ttl, now), now
                        )
                        ok = result is not None
                    elif isinstance(item, Replace):
                        result = self._replace_in(
                            c,
                            scope,
                            item.key,
                            item.value,
                            item.expected_version,
                            self.expires_at(item.ttl, now),
                            now,
                        )
                        ok = result is not None
                    elif isinstance(item, Delete):
                        deleted = self._delete_in(c, scope, item.key, item.expected_version, now)
                        # Without a version, absent (or expired) is as good as deleted.
                        ok = deleted or item.expected_version is None
                    else:
                        assert isinstance(item, Check)
                        row = c.execute(
                            f"SELECT version FROM agent_stores_kv WHERE scope = ? AND key = ? AND {_LIVE}",
                            (scope, item.key, now),
                        ).fetchone()
                        ok = (row[0] if row else None) == item.expected_version
                    if not ok:
                        raise ConflictError(
                            f"operation {index} ({type(item).__name__}) failed",
                            scope=scope,
                            key=item.key,
                            index=index,
                        )
                    results.append(result)
                c.execute("COMMIT")
                return results
            except BaseException:
                c.execute("ROLLBACK")
                raise

        return await self._run(op)


def _get_op(scope: str, key: str) -> Callable[[sqlite3.Connection], Entry | None]:
    def op(c: sqlite3.Connection) -> Entry | None:
        row = c.execute(
            "SELECT value, version, expires_at FROM agent_stores_kv WHERE scope = ? AND key = ?",
            (scope, key),
        ).fetchone()
        return Entry(bytes(row[0]), row[1], row[2]) if row else None

    return op
