"""``postgresql://`` — the KV CAS contract on one PostgreSQL table.

Every primitive is one statement whose condition the server evaluates atomically:

* create — ``INSERT … ON CONFLICT (scope, key) DO UPDATE … WHERE <existing row expired>``;
* replace — ``UPDATE … WHERE scope, key AND version = expected AND <live>``;
* delete — ``DELETE … WHERE scope, key [AND version = expected] RETURNING <was live>``;
* commit — one transaction (pipelined), rows locked in key order so two commits cannot
  deadlock; ``Check`` of an absent key locks the key's slot with a placeholder row that
  the same transaction removes again.

``now`` always comes from the core's clock: expiry is a ``double precision`` column
compared with the caller's time, never with the server's. Versions are the core's
random 128-bit :func:`~agent_stores.kv.base.new_version`.

Failures. Reads (get, get_many, scan, scopes) and idempotent maintenance (drop_scope,
purge, setup) are retried once on a fresh connection when the connection breaks. Writes
are never blindly re-sent, because a conditional write whose acknowledgement was lost
may have been applied. Instead the key is read back on a fresh connection:

* it holds the version this write generated → the write was applied: success;
* it still holds the version the write expected (replace, conditional delete) → the
  write was certainly not applied (versions are never reused, so an applied write would
  have replaced it) → re-sent once, with the same new version that nobody has seen;
* anything else → :class:`~agent_stores.errors.BackendUnavailableError` saying the outcome
  is unknown. Never a guess: a re-sent create could resurrect a key someone deleted in
  between, a re-sent delete could delete someone else's new entry.

Dead pooled connections (terminated backend, server restart) are detected before any
statement is sent on them (see :mod:`agent_stores_postgres.pool`), so the ambiguous case
is limited to a connection that dies while a statement is in flight.

A statement the server rolled back for a serialization failure (40001) or a deadlock
(40P01) certainly did not apply, so it is re-sent, a few times with jittered backoff,
and then reported as :class:`~agent_stores.errors.BackendUnavailableError` with the cause.

Deadline. Every call, retries and read-backs included, ends within ``deadline_seconds``
(``?deadline=``, 20 s by default): the core bounds the public KV calls, and this module
bounds the rest (the native ports' statements, ``setup``, ``schema_version``, purges).
libpq's ``connect_timeout`` and the pool's ``pool_timeout`` default to fit inside it. A
statement cut off by the deadline closes its connection (see :mod:`.pool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, ClassVar, LiteralString, TypeVar

import psycopg
import psycopg.errors
from agent_stores.backend import (
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
    StoreURL,
    URLOptions,
    new_version,
    prefix_upper_bound,
    within_deadline,
)
from agent_stores.errors import (
    AppError,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    InvalidIdError,
    ResourceClosedError,
)
from psycopg import AsyncConnection, AsyncCursor, sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .config import URL_OPTIONS, PostgresConfig
from .pool import KEPT_READ_BYTES, LoopBoundPool, WriteCursorConnection, read_cursor
from .schema import SCHEMA_VERSION, SchemaVersionError, TableNames, check_server, read_version
from .schema import setup_schema as _setup_schema

log = logging.getLogger("agent_stores.postgres")

T = TypeVar("T")

PURGE_BATCH = 1000
_COMMIT_RETRIES = 5
#: Re-sends of a statement the server rolled back (40001 serialization failure, 40P01
#: deadlock): it certainly did not apply. Backoff 10 ms, 20 ms, … (jittered).
ROLLED_BACK_RETRIES = 5
_LIVE: LiteralString = "(expires_at IS NULL OR expires_at > %s)"


class _ConnectionLost(Exception):
    """Internal: the connection broke; ``sent`` says whether the caller's statement may have run."""

    def __init__(self, cause: BaseException, *, sent: bool = True) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.sent = sent


class _RolledBack(Exception):
    """Internal: the server rolled the statement back (40001, 40P01): safe to re-send."""

    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Statements:
    """Every statement of one table, rendered once to bytes (identifiers quoted)."""

    def __init__(self, names: TableNames) -> None:
        kv = names.kv

        def q(text: LiteralString) -> bytes:
            return sql.SQL(text).format(kv=kv).as_bytes(None)

        self.get = q("SELECT value, version, expires_at FROM {kv} WHERE scope = %s AND key = %s")
        self.get_many = q(
            "SELECT key, value, version, expires_at FROM {kv} WHERE scope = %s AND key = ANY(%s)"
        )
        self.version_of = q("SELECT version FROM {kv} WHERE scope = %s AND key = %s")
        self.create = q(
            "INSERT INTO {kv} AS t (scope, key, value, version, expires_at) "
            "VALUES (%s, %s, %b, %s, %s) "
            "ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value, "
            "version = EXCLUDED.version, expires_at = EXCLUDED.expires_at "
            "WHERE t.expires_at IS NOT NULL AND t.expires_at <= %s"
        )
        self.replace = q(
            "UPDATE {kv} SET value = %b, version = %s, expires_at = %s "
            "WHERE scope = %s AND key = %s AND version = %s AND " + _LIVE
        )
        self.delete_any = q("DELETE FROM {kv} WHERE scope = %s AND key = %s RETURNING " + _LIVE)
        # A commit of unconditional deletes only (chunk cleanup): each always succeeds, so
        # one statement does them all, atomically, instead of one each.
        self.delete_keys = q("DELETE FROM {kv} WHERE scope = %s AND key = ANY(%s)")
        self.delete_version = q(
            "DELETE FROM {kv} WHERE scope = %s AND key = %s AND version = %s RETURNING " + _LIVE
        )
        # Check of a present version: share-lock the row until commit.
        self.check_present = q(
            "SELECT version, " + _LIVE + " FROM {kv} WHERE scope = %s AND key = %s FOR SHARE"
        )
        # Check of absence: there is no row to lock, so claim the slot with an already
        # expired placeholder (absent to every reader) that the transaction deletes again;
        # a concurrent create waits on it until commit.
        self.check_absent = q(
            "INSERT INTO {kv} AS t (scope, key, value, version, expires_at) "
            "VALUES (%s, %s, ''::bytea, %s, 0) "
            "ON CONFLICT (scope, key) DO UPDATE SET version = t.version "
            "RETURNING t.version, (t.expires_at IS NULL OR t.expires_at > %s)"
        )
        self.drop_placeholder = q("DELETE FROM {kv} WHERE scope = %s AND key = %s AND version = %s")
        self.drop_scope = q("DELETE FROM {kv} WHERE scope = %s")
        self.purge_batch = q(
            "DELETE FROM {kv} WHERE ctid = ANY(ARRAY("
            "SELECT ctid FROM {kv} WHERE expires_at <= %s LIMIT %s FOR UPDATE SKIP LOCKED"
            ")) AND expires_at <= %s"
        )
        # scan: the lower bounds (prefix, start_after) are always given ('' matches all,
        # keys are never empty); the upper bound only when the prefix has one.
        self.scan: dict[tuple[bool, bool], bytes] = {}
        for values in (True, False):
            for bounded in (True, False):
                cols: LiteralString = "key, value, version, expires_at" if values else "key"
                upper: LiteralString = " AND key < %s" if bounded else ""
                self.scan[values, bounded] = q(
                    "SELECT "
                    + cols
                    + " FROM {kv} WHERE scope = %s AND key >= %s AND key > %s"
                    + upper
                    + " AND "
                    + _LIVE
                    + " ORDER BY key LIMIT %s"
                )
        # scopes: a loose index scan (one index probe per distinct scope) instead of
        # DISTINCT over every row, then a liveness probe per scope. The probe is a scalar
        # subquery on purpose: an EXISTS would be planned as a hash semi-join, which loses
        # the recursion's ascending order; CTE scan -> filter -> limit keeps it and stops
        # the recursion as soon as ``limit`` scopes are found (no ORDER BY, which would
        # have to visit every scope of the range first). The probe's ORDER BY key pins it
        # to the primary key, so a scope whose entries all expired costs its own rows, not
        # a table scan.
        self.scopes: dict[bool, bytes] = {}
        for bounded in (True, False):
            upper_s: LiteralString = " AND scope < %(hi)s" if bounded else ""
            upper_k: LiteralString = " AND k.scope < %(hi)s" if bounded else ""
            self.scopes[bounded] = q(
                "WITH RECURSIVE s(scope) AS ("
                "(SELECT scope FROM {kv} WHERE scope >= %(lo)s AND scope > %(after)s"
                + upper_s
                + " ORDER BY scope LIMIT 1) "
                "UNION ALL "
                "SELECT (SELECT k.scope FROM {kv} AS k WHERE k.scope > s.scope"
                + upper_k
                + " ORDER BY k.scope LIMIT 1) FROM s WHERE s.scope IS NOT NULL) "
                "SELECT s.scope FROM s WHERE s.scope IS NOT NULL AND (SELECT true FROM {kv} AS e "
                "WHERE e.scope = s.scope AND (e.expires_at IS NULL OR e.expires_at > %(now)s) "
                "ORDER BY e.key LIMIT 1) LIMIT %(limit)s"
            )


class PostgresKV(KVStore):
    """KV store in one PostgreSQL table, through a bounded psycopg 3 async pool.

    Build it from a URL (:meth:`from_url`), or around a ready
    ``psycopg_pool.AsyncConnectionPool`` (:meth:`from_pool`; that pool is never closed
    by the store). The schema is created by :meth:`setup` and, unless ``auto_setup`` is
    off, on first use.
    """

    backend_name = "postgresql"
    capabilities = KVCapabilities(commit=True, shared_across_processes=True)
    url_options: ClassVar[URLOptions] = URL_OPTIONS

    def __init__(
        self,
        config: PostgresConfig,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        clock: Clock | None = None,
        connection_class: type[WriteCursorConnection] = WriteCursorConnection,
    ) -> None:
        super().__init__(clock=clock)
        self.config = config
        self.deadline_seconds = config.deadline
        self.names = TableNames(config.schema, config.table)
        self.limits = KVLimits(max_value_bytes=config.max_value_bytes)
        self._sql = _Statements(self.names)
        self._secrets = config.secrets
        if pool is None:
            try:
                conninfo = make_conninfo("", **config.conninfo)
            except psycopg.ProgrammingError as exc:
                raise ConfigError(detail=f"{config.display}: {self._scrub(str(exc))}") from None
            self._pools = LoopBoundPool(
                conninfo=conninfo,
                kwargs={"autocommit": True, "prepare_threshold": config.prepare_threshold},
                min_size=config.min_size,
                max_size=config.max_size,
                timeout=config.pool_timeout,
                name=f"agent-stores-{config.schema}.{config.table}",
                connection_class=connection_class,
            )
        else:
            self._pools = LoopBoundPool(external=pool)
        self._ready = False
        self._last_purge = time.monotonic()
        self._purge_tasks: set[asyncio.Task[None]] = set()

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: StoreURL | str, **options: Any) -> PostgresKV:
        """Open a store for a ``postgresql://`` or ``postgres://`` URL (see :mod:`.config`).

        ``options`` may override any :class:`PostgresConfig` field and pass ``clock``.
        """
        clock, overrides = _split_options(options)
        return cls(PostgresConfig.from_url(url, **overrides), clock=clock)

    @classmethod
    def from_pool(cls, pool: AsyncConnectionPool[Any], **options: Any) -> PostgresKV:
        """Wrap a ready pool (``schema``, ``table``, … as keyword options). The pool stays yours."""
        if not isinstance(pool, AsyncConnectionPool):
            raise ConfigError(
                detail=f"expected a psycopg_pool.AsyncConnectionPool, got {type(pool).__name__}"
            )
        clock, overrides = _split_options(options)
        config = PostgresConfig(
            conninfo={}, display=f"postgresql (pool {pool.name!r})", **overrides
        )
        return cls(config, pool=pool, clock=clock)

    def describe(self) -> str:
        return f"{self.config.display} [{self.names.schema}.{self.names.kv_name}]"

    # -- plumbing -------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _error(self, action: str, exc: BaseException) -> AppError:
        """The typed error for a driver failure; never carries a secret."""
        if isinstance(exc, AppError):
            return exc
        if isinstance(exc, PoolTimeout):
            return BackendUnavailableError(
                detail=f"{self.describe()}: {action}: no connection within {self._pools.timeout:g}s "
                f"(server unreachable, or all {self._pools.max_size} pooled connections busy)"
            )
        if isinstance(exc, PoolClosed):
            return ResourceClosedError(detail=f"{self.describe()}: the connection pool is closed")
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            return SchemaVersionError(
                detail=f"{self.describe()}: the agent-stores tables are missing "
                f"({self._scrub(_first_line(exc))}); run `agent-stores setup URL`"
            )
        if isinstance(exc, psycopg.errors.ProgramLimitExceeded):
            return InvalidIdError(
                detail=f"{self.describe()}: scope and key are too long together for the primary "
                f"key index (about 2,700 bytes of UTF-8 after compression): {self._scrub(_first_line(exc))}"
            )
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return ConfigError(
                detail=f"{self.describe()}: {action}: permission denied: {self._scrub(_first_line(exc))}"
            )
        if isinstance(exc, psycopg.Error):
            state = f" [{exc.sqlstate}]" if exc.sqlstate else ""
            return BackendUnavailableError(
                detail=f"{self.describe()}: {action} failed{state}: {self._scrub(_first_line(exc))}"
            )
        return BackendUnavailableError(
            detail=f"{self.describe()}: {action} failed: {type(exc).__name__}"
        )

    async def _on_connection(
        self,
        action: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        check_ready: bool,
    ) -> T:
        """``fn`` on a ready connection; driver errors leave as typed errors or as
        :class:`_ConnectionLost` / :class:`_RolledBack` (no context managers: this runs on
        every request)."""
        try:
            pool, conn = await self._pools.acquire()
            try:
                if check_ready and not self._ready:
                    try:
                        await self._ensure_ready(conn)
                    except psycopg.Error as exc:
                        if conn.closed:
                            raise _ConnectionLost(exc, sent=False) from exc
                        raise
                try:
                    return await fn(conn)
                except psycopg.Error as exc:
                    if conn.closed:
                        raise _ConnectionLost(exc) from exc
                    if isinstance(
                        exc, psycopg.errors.SerializationFailure | psycopg.errors.DeadlockDetected
                    ):
                        raise _RolledBack(exc) from exc
                    raise
            finally:
                await self._pools.release(pool, conn)
        except (_ConnectionLost, _RolledBack, AppError):
            raise
        except psycopg.Error as exc:
            raise self._error(action, exc) from exc

    async def _attempt(
        self,
        action: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        check_ready: bool = True,
    ) -> T:
        """Run ``fn`` once; a connection that broke before ``fn`` sent anything is replaced
        once, and a statement the server rolled back (40001, 40P01) is re-sent a few times."""
        for attempt in range(ROLLED_BACK_RETRIES + 1):
            try:
                return await self._attempt_once(action, fn, check_ready=check_ready)
            except _RolledBack as rolled_back:
                if attempt >= ROLLED_BACK_RETRIES:
                    raise self._error(action, rolled_back.cause) from rolled_back.cause
                log.debug(
                    "%s: %s rolled back by the server (%s); re-sending",
                    self.describe(),
                    action,
                    rolled_back.cause.sqlstate,
                )
                await asyncio.sleep(0.01 * 2**attempt * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    async def _attempt_once(
        self,
        action: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        check_ready: bool,
    ) -> T:
        try:
            return await self._on_connection(action, fn, check_ready)
        except _ConnectionLost as lost:
            if lost.sent:
                raise
        return await self._on_connection(action, fn, check_ready)

    async def _idempotent(
        self,
        action: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        check_ready: bool = True,
    ) -> T:
        """Run ``fn``; once more on a fresh connection if the connection broke."""
        try:
            return await self._attempt(action, fn, check_ready=check_ready)
        except _ConnectionLost:
            log.info("%s: connection lost during %s; retrying once", self.describe(), action)
        try:
            return await self._attempt(action, fn, check_ready=check_ready)
        except _ConnectionLost as lost:
            raise BackendUnavailableError(
                detail=f"{self.describe()}: {action}: connection lost twice: "
                f"{self._scrub(_first_line(lost.cause))}"
            ) from lost.cause

    def _outcome_unknown(self, action: str, lost: _ConnectionLost) -> BackendUnavailableError:
        return BackendUnavailableError(
            detail=f"{self.describe()}: {action}: the connection broke while the write was in "
            f"flight and its outcome could not be confirmed (it was not re-sent): "
            f"{self._scrub(_first_line(lost.cause))}"
        )

    async def _ensure_ready(self, conn: AsyncConnection[Any]) -> None:
        check_server(conn)
        version = await read_version(conn, self.names)
        if version == SCHEMA_VERSION:
            self._ready = True
            return
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                detail=f"{self.describe()}: schema version {version} is newer than this "
                f"agent-stores-postgres knows ({SCHEMA_VERSION}); upgrade agent-stores-postgres"
            )
        if not self.config.auto_setup:
            raise SchemaVersionError(
                detail=f"{self.describe()}: the schema is at version {version}, {SCHEMA_VERSION} is "
                "needed, and auto_setup is off; run `agent-stores setup URL`"
            )
        await _setup_schema(conn, schema=self.names.schema, table=self.names.table)
        self._ready = True

    async def _aclose(self) -> None:
        tasks = [t for t in self._purge_tasks if not t.done()]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for task in tasks:
            if task.get_loop() is loop:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._purge_tasks.clear()
        await self._pools.aclose()

    async def run_native_write(
        self,
        action: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        *,
        confirm: Callable[[], Awaitable[T | None]] | None = None,
    ) -> T:
        """Run a native multi-row statement (the ports' fast paths) on a ready connection,
        within the store's deadline.

        Same error handling as the primitives; it is sent once (again only when the server
        rolled it back). When the connection breaks while it is in flight, ``confirm``
        (if given) reads back whether the statement applied and returns its result, or
        None when it cannot tell; otherwise :class:`BackendUnavailableError` (outcome
        unknown) is raised for the caller to resolve by reading.
        """
        self.check_open()
        return await within_deadline(self, self._native_write(action, fn, confirm))

    async def _native_write(
        self,
        action: str,
        fn: Callable[[AsyncConnection[Any]], Awaitable[T]],
        confirm: Callable[[], Awaitable[T | None]] | None,
    ) -> T:
        try:
            result = await self._attempt(action, fn)
        except _ConnectionLost as lost:
            confirmed = None if confirm is None else await confirm()
            if confirmed is None:
                raise self._outcome_unknown(action, lost) from lost.cause
            result = confirmed
        self._after_write()
        return result

    async def run_native_idempotent(
        self, action: str, fn: Callable[[AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        """Run a native read, or a write whose repetition is harmless (the vector port's
        derived index), on a ready connection within the store's deadline; sent once
        more on a fresh connection when the connection breaks. Errors as for the
        primitives."""
        self.check_open()
        return await within_deadline(self, self._idempotent(action, fn))

    async def version_of(self, action: str, scope: str, key: str) -> str | None:
        """The stored version of ``(scope, key)``, expired or not (for confirming a native
        write whose reply was lost: versions are never reused)."""
        return await self._version_of(action, scope, key)

    # -- administration -------------------------------------------------------------------

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default true): create the schema on first use and on entering a store."""
        return self.config.auto_setup

    async def setup(self) -> None:
        """Create or upgrade the schema now (idempotent, safe to run concurrently)."""
        self.check_open()

        async def run(conn: AsyncConnection[Any]) -> None:
            await _setup_schema(conn, schema=self.names.schema, table=self.names.table)

        await within_deadline(self, self._idempotent("setup", run, check_ready=False))
        self._ready = True

    async def schema_version(self) -> int:
        """The schema version in the database (0: not set up)."""
        self.check_open()
        return await within_deadline(
            self,
            self._idempotent(
                "schema_version", lambda c: read_version(c, self.names), check_ready=False
            ),
        )

    async def purge_expired(self) -> int:
        """Delete every expired entry, in batches of :data:`PURGE_BATCH`; returns how many."""
        self.check_open()
        total = 0
        while True:
            removed = await self._purge_batch(self.clock())
            total += removed
            if removed < PURGE_BATCH:
                return total

    async def _purge_batch(self, now: float) -> int:
        async def run(conn: AsyncConnection[Any]) -> int:
            cur = await conn.execute(self._sql.purge_batch, (now, PURGE_BATCH, now))
            return cur.rowcount

        return await within_deadline(self, self._idempotent("purge", run))

    def _after_write(self) -> None:
        """Opportunistic purge: at most one background batch per ``purge_interval``."""
        interval = self.config.purge_interval
        if interval <= 0 or self._closed:
            return
        tick = time.monotonic()
        if tick - self._last_purge < interval:
            return
        self._last_purge = tick
        task = asyncio.get_running_loop().create_task(self._background_purge())
        self._purge_tasks.add(task)
        task.add_done_callback(self._purge_tasks.discard)

    async def _background_purge(self) -> None:
        try:
            removed = await self._purge_batch(self.clock())
            if removed:
                log.debug("%s: purged %d expired entries", self.describe(), removed)
        except Exception as exc:  # garbage collection must never disturb the caller
            log.debug("%s: background purge failed: %s", self.describe(), exc)

    # -- reads ----------------------------------------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        async def run(conn: AsyncConnection[Any]) -> Entry | None:
            cur = await read_cursor(conn).execute(self._sql.get, (scope, key), binary=True)
            row = await cur.fetchone()
            if row is None:
                return None
            value = bytes(row[0])
            if len(value) > KEPT_READ_BYTES:
                await cur.close()  # the reply is not kept: the next read makes a new cursor
            return Entry(value, row[1], row[2])

        return await self._idempotent("get", run)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        async def run(conn: AsyncConnection[Any]) -> dict[str, Entry]:
            cur = await conn.execute(self._sql.get_many, (scope, list(keys)), binary=True)
            return {r[0]: Entry(bytes(r[1]), r[2], r[3]) for r in await cur.fetchall()}

        return await self._idempotent("get_many", run)

    async def _version_of(self, action: str, scope: str, key: str) -> str | None:
        async def run(conn: AsyncConnection[Any]) -> str | None:
            cur = await conn.execute(self._sql.version_of, (scope, key))
            row = await cur.fetchone()
            return str(row[0]) if row is not None else None

        return await self._idempotent(f"{action} (confirming after a lost connection)", run)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        upper = prefix_upper_bound(prefix) if prefix else None
        params: list[Any] = [scope, prefix, start_after or ""]
        if upper is not None:
            params.append(upper)
        params += [now, limit]
        query = self._sql.scan[values, upper is not None]

        async def run(conn: AsyncConnection[Any]) -> list[ScanItem]:
            cur = await conn.execute(query, params, binary=True)
            rows = await cur.fetchall()
            if values:
                return [ScanItem(r[0], Entry(bytes(r[1]), r[2], r[3])) for r in rows]
            return [ScanItem(r[0], None) for r in rows]

        return await self._idempotent("scan", run)

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        upper = prefix_upper_bound(prefix) if prefix else None
        params: dict[str, Any] = {
            "lo": prefix,
            "after": start_after or "",
            "now": now,
            "limit": limit,
        }
        if upper is not None:
            params["hi"] = upper
        query = self._sql.scopes[upper is not None]

        async def run(conn: AsyncConnection[Any]) -> list[str]:
            cur = await conn.execute(query, params)
            return [r[0] for r in await cur.fetchall()]

        return await self._idempotent("scopes", run)

    # -- writes ---------------------------------------------------------------------------

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        version = new_version()

        async def run(conn: AsyncConnection[Any]) -> int:
            cur = await conn.execute(
                self._sql.create, (scope, key, bytes(value), version, expires_at, now)
            )
            return cur.rowcount

        try:
            applied = await self._attempt("create", run) == 1
        except _ConnectionLost as lost:
            if await self._version_of("create", scope, key) == version:
                applied = True
            else:
                raise self._outcome_unknown("create", lost) from lost.cause
        if not applied:
            raise ConflictError("key exists", scope=scope, key=key)
        self._after_write()
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
        version = new_version()

        async def run(conn: AsyncConnection[Any]) -> int:
            cur = await conn.execute(
                self._sql.replace,
                (bytes(value), version, expires_at, scope, key, expected_version, now),
            )
            return cur.rowcount

        try:
            applied = await self._attempt("replace", run) == 1
        except _ConnectionLost as lost:
            current = await self._version_of("replace", scope, key)
            if current == version:
                applied = True
            elif current == expected_version:
                # The pre-image is intact, so the statement never committed: re-send it.
                try:
                    applied = await self._attempt("replace", run) == 1
                except _ConnectionLost as again:
                    raise self._outcome_unknown("replace", again) from again.cause
            else:
                raise self._outcome_unknown("replace", lost) from lost.cause
        if not applied:
            raise ConflictError("version mismatch", scope=scope, key=key)
        self._after_write()
        return version

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        async def run(conn: AsyncConnection[Any]) -> bool:
            if expected_version is None:
                cur = await conn.execute(self._sql.delete_any, (scope, key, now))
            else:
                cur = await conn.execute(
                    self._sql.delete_version, (scope, key, expected_version, now)
                )
            row = await cur.fetchone()
            return bool(row is not None and row[0])

        try:
            deleted = await self._attempt("delete", run)
        except _ConnectionLost as lost:
            if expected_version is None or (
                await self._version_of("delete", scope, key) != expected_version
            ):
                raise self._outcome_unknown("delete", lost) from lost.cause
            try:
                deleted = await self._attempt("delete", run)
            except _ConnectionLost as again:
                raise self._outcome_unknown("delete", again) from again.cause
        self._after_write()
        return deleted

    async def _drop_scope(self, scope: str) -> int:
        # Erasure is idempotent: re-running after a lost connection deletes the same rows.
        async def run(conn: AsyncConnection[Any]) -> int:
            cur = await conn.execute(self._sql.drop_scope, (scope,))
            return cur.rowcount

        return await self._idempotent("drop_scope", run)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        versions: list[str | None] = [
            new_version() if isinstance(op, Create | Replace) else None for op in ops
        ]
        placeholders = {
            i: new_version()
            for i, op in enumerate(ops)
            if isinstance(op, Check) and op.expected_version is None
        }

        async def run(conn: AsyncConnection[Any]) -> list[str | None]:
            for attempt in range(_COMMIT_RETRIES):
                try:
                    await self._commit_once(conn, scope, ops, versions, placeholders, now)
                    return versions
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                    # Rolled back whole: safe to run again.
                    if attempt == _COMMIT_RETRIES - 1:
                        raise
                    await asyncio.sleep(0.005 * (attempt + 1))
            raise AssertionError("unreachable")

        try:
            result = await self._attempt("commit", run)
        except _ConnectionLost as lost:
            result = await self._resolve_commit(scope, ops, versions, run, lost)
        self._after_write()
        return result

    async def _commit_once(
        self,
        conn: AsyncConnection[Any],
        scope: str,
        ops: list[Operation],
        versions: list[str | None],
        placeholders: dict[int, str],
        now: float,
    ) -> None:
        s = self._sql
        if all(isinstance(op, Delete) and op.expected_version is None for op in ops):
            # Its rows are locked in the order the server finds them: a deadlock with
            # another commit is detected and this one run again (see _commit).
            await conn.execute(s.delete_keys, (scope, [op.key for op in ops]))
            return
        # Lock rows in one global order (key bytes) so concurrent commits cannot deadlock.
        order = sorted(range(len(ops)), key=lambda i: ops[i].key.encode())
        async with conn.pipeline() as pipeline, conn.transaction():
            cursors: list[tuple[int, AsyncCursor[Any]]] = []
            for i in order:
                op = ops[i]
                cur = conn.cursor()
                if isinstance(op, Create):
                    await cur.execute(
                        s.create,
                        (
                            scope,
                            op.key,
                            bytes(op.value),
                            versions[i],
                            self.expires_at(op.ttl, now),
                            now,
                        ),
                    )
                elif isinstance(op, Replace):
                    await cur.execute(
                        s.replace,
                        (
                            bytes(op.value),
                            versions[i],
                            self.expires_at(op.ttl, now),
                            scope,
                            op.key,
                            op.expected_version,
                            now,
                        ),
                    )
                elif isinstance(op, Delete):
                    if op.expected_version is None:
                        await cur.execute(s.delete_any, (scope, op.key, now))
                    else:
                        await cur.execute(
                            s.delete_version, (scope, op.key, op.expected_version, now)
                        )
                elif op.expected_version is None:
                    await cur.execute(s.check_absent, (scope, op.key, placeholders[i], now))
                else:
                    await cur.execute(s.check_present, (now, scope, op.key))
                cursors.append((i, cur))
            for i, placeholder in placeholders.items():
                await conn.execute(s.drop_placeholder, (scope, ops[i].key, placeholder))
            await pipeline.sync()
            failed: list[int] = []
            for i, cur in cursors:
                if not await _op_succeeded(ops[i], cur, placeholders.get(i)):
                    failed.append(i)
            if failed:
                index = min(failed)
                # Raised inside the transaction block: everything is rolled back.
                raise ConflictError(
                    f"operation {index} ({type(ops[index]).__name__}) failed",
                    scope=scope,
                    key=ops[index].key,
                    index=index,
                )

    async def _resolve_commit(
        self,
        scope: str,
        ops: list[Operation],
        versions: list[str | None],
        run: Callable[[AsyncConnection[Any]], Awaitable[list[str | None]]],
        lost: _ConnectionLost,
    ) -> list[str | None]:
        # All-or-nothing: one key proving either outcome decides for the whole batch.
        for i, op in enumerate(ops):
            if versions[i] is not None:
                if await self._version_of("commit", scope, op.key) == versions[i]:
                    return versions
                break
        for op in ops:
            expected = op.expected_version if isinstance(op, Replace | Delete | Check) else None
            if isinstance(op, Replace) or (isinstance(op, Delete) and expected is not None):
                if await self._version_of("commit", scope, op.key) == expected:
                    try:
                        return await self._attempt("commit", run)
                    except _ConnectionLost as again:
                        raise self._outcome_unknown("commit", again) from again.cause
                break
        raise self._outcome_unknown("commit", lost) from lost.cause


async def _op_succeeded(op: Operation, cur: AsyncCursor[Any], placeholder: str | None) -> bool:
    if isinstance(op, Create | Replace):
        return cur.rowcount == 1
    if isinstance(op, Delete):
        if op.expected_version is None:
            return True
        row = await cur.fetchone()
        return bool(row is not None and row[0])
    row = await cur.fetchone()
    if op.expected_version is None:
        # Our placeholder went in (nothing was there) or what is there has expired.
        return row is not None and (row[0] == placeholder or not row[1])
    return row is not None and bool(row[1]) and row[0] == op.expected_version


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_CONFIG_FIELDS = frozenset(f.name for f in fields(PostgresConfig)) - {"conninfo", "display"}


def _split_options(options: dict[str, Any]) -> tuple[Clock | None, dict[str, Any]]:
    options = dict(options)
    clock = options.pop("clock", None)
    unknown = set(options) - _CONFIG_FIELDS
    if unknown:
        raise ConfigError(
            detail=f"postgresql: unknown option(s) {sorted(unknown)}; known: {sorted(_CONFIG_FIELDS)}"
        )
    if clock is not None and not callable(clock):
        raise ConfigError(detail="postgresql: clock must be a callable returning unix seconds")
    return clock, options


__all__ = ["PURGE_BATCH", "PostgresKV"]
